"""The outbox's rows commit with the handler's transaction, or never (real MariaDB and
PostgreSQL, every driver of the exactly-once mode); the relay of the process is woken by the
commit."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.errors import OutboxMessageError
from rocketmq_dedup.outbox import Outbox, OutboxRelay
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    EffectTable,
    database,
    dispose,
    is_postgres,
    make_client,
    make_config,
)
from tests.integration.outbox.support import (
    MYSQL_BACKEND,
    POSTGRES_BACKEND,
    Backend,
    RecordingSender,
    SendingListener,
    create_tables,
    drop_tables,
    outbox_rows,
)
from tests.support import wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


@pytest.fixture
def driver_config(driver: str) -> Iterator[DedupConfig]:
    """A config of ``driver`` on a dedup table of its own (with its outbox) on that driver's
    database."""
    backend = POSTGRES_BACKEND if is_postgres(driver) else MYSQL_BACKEND
    table = create_tables(backend)
    client = make_client(driver)
    config = make_config(client, table)
    yield config
    config.close()
    dispose(client)
    drop_tables(backend.db, table)


@pytest.fixture
def driver_effects(driver: str) -> Iterator[EffectTable]:
    effects = EffectTable(database(driver))
    yield effects
    effects.drop()


def test_a_row_commits_with_the_handlers_writes_on_every_driver(
    driver_config: DedupConfig, driver_effects: EffectTable
) -> None:
    """A handler that succeeds: its effect row and its outbox row both committed (PENDING);
    one that fails or raises: neither; a duplicate of a committed message: no second row. The
    relays' connections, from the same source, claim and settle it."""
    effects = driver_effects
    outbox = Outbox(driver_config)
    answers = {"ok": True, "no": False}

    def answer(msg: Any) -> Any:
        if msg.id == "boom":
            raise RuntimeError("business failure")
        return answers[msg.id]

    listener = SendingListener(driver_config, effects, outbox, answer)
    assert listener(ClassicMessage("ok")) is SUCCESS
    assert listener(ClassicMessage("no")) is LATER
    assert listener(ClassicMessage("boom")) is LATER
    assert listener(ClassicMessage("ok", reconsume_times=1)) is SUCCESS  # a redelivery
    assert effects.counts() == {"ok": 1}
    assert outbox_rows(outbox) == {"ok:B": ("PENDING", 0)}
    [row] = outbox.tables.claim("relay-1", 10, 4, 30_000)
    assert row.message.message_key == "ok:B" and row.message.body == b"ok:B"
    outbox.tables.settle("relay-1", [(row.id, "MSG-1")], [], [])
    assert outbox_rows(outbox) == {"ok:B": ("SENT", 1)}


def test_a_copy_whose_twin_committed_meanwhile_leaves_no_row(
    backend: Backend, config: DedupConfig, outbox: Outbox, table: str, effects: EffectTable
) -> None:
    """Two copies of one message in two consumers at once (at_commit): the one whose record
    is refused at its COMMIT is rolled back, its outbox row with it: one row."""
    entered, release = threading.Event(), threading.Event()
    other = make_config(backend.client(), table, application=config.application_name)

    def first(msg: Any) -> bool:
        entered.set()
        release.wait(10)
        return True

    slow = SendingListener(config, effects, outbox, first)
    fast = SendingListener(other, effects, Outbox(other))
    result = []
    thread = threading.Thread(target=lambda: result.append(slow(ClassicMessage("m1"))))
    thread.start()
    assert entered.wait(10)
    assert fast(ClassicMessage("m1")) is SUCCESS
    release.set()
    thread.join(10)
    assert result == [SUCCESS]  # acked as the duplicate it is
    assert effects.counts() == {"m1": 1}
    assert outbox_rows(outbox) == {"m1:B": ("PENDING", 0)}
    other.close()


def test_a_connection_in_autocommit_mode_is_refused(backend: Backend, outbox: Outbox) -> None:
    """A row through a connection in autocommit mode would commit on its own: refused, nothing
    written; one in a transaction commits with it."""
    conn = backend.connect()
    try:
        backend.set_autocommit(conn, True)
        with pytest.raises(OutboxMessageError, match="autocommit"):
            outbox.send(conn, "OUT", b"x")
        backend.set_autocommit(conn, False)
        receipt = outbox.send(conn, "OUT", b"x", keys="k1")
        assert outbox_rows(outbox) == {}  # not committed yet (another session)
        conn.commit()
        assert outbox_rows(outbox) == {"k1": ("PENDING", 0)}
        assert receipt.message_key == "k1" and receipt.id > 0
    finally:
        conn.close()


def test_a_generated_message_key_is_stored_with_the_row(backend: Backend, outbox: Outbox) -> None:
    """No keys: a 32-hex key is generated when the row is written, and stored with it."""
    conn = backend.connect()
    try:
        receipt = outbox.send(conn, "OUT", "text body")
        conn.commit()
    finally:
        conn.close()
    assert len(receipt.message_key) == 32
    assert outbox_rows(outbox) == {receipt.message_key: ("PENDING", 0)}


def test_the_commit_wakes_the_relay_without_waiting_for_its_poll(
    config: DedupConfig, outbox: Outbox, effects: EffectTable
) -> None:
    """A relay polling every 30 s sends the message within a second of the commit: the
    transaction that sent wakes it (before the after-commit hook, the send waited for the
    poll). The relay stops with the listener's config."""
    sender = RecordingSender()
    relay = OutboxRelay(outbox, sender, poll_interval_s=30.0).start()
    listener = SendingListener(config, effects, outbox)
    time.sleep(0.3)  # the relay's first (empty) claim is done: it waits for 30 s now
    begin = time.monotonic()
    assert listener(ClassicMessage("m1")) is SUCCESS
    wait_for(lambda: sender.message_keys() == ["m1:B"], timeout=5)
    assert sender.sent[0][1] - begin < 1.0
    listener.close()  # closes the config, which stops the relay
    assert not relay.running


def test_a_send_outside_the_listener_is_found_by_the_relays_poll(
    backend: Backend, outbox: Outbox
) -> None:
    """A row written in a transaction of the application's own (no listener): the relay's
    poll sends it; outbox.wake() after the commit sends it at once."""
    sender = RecordingSender()
    with OutboxRelay(outbox, sender, poll_interval_s=0.5):
        conn = backend.connect()
        try:
            outbox.send(conn, "OUT", b"polled", keys="polled")
            conn.commit()
            wait_for(lambda: "polled" in sender.message_keys(), timeout=5)
        finally:
            conn.close()
    with OutboxRelay(outbox, sender, poll_interval_s=30.0):
        time.sleep(0.3)
        conn = backend.connect()
        try:
            outbox.send(conn, "OUT", b"woken", keys="woken")
            conn.commit()
            begin = time.monotonic()
            outbox.wake()
            wait_for(lambda: "woken" in sender.message_keys(), timeout=5)
            assert time.monotonic() - begin < 2.0
        finally:
            conn.close()
    assert outbox_rows(outbox) == {"polled": ("SENT", 1), "woken": ("SENT", 1)}


def test_an_outbox_needs_a_sql_store_and_room_for_its_tables_names(backend: Backend) -> None:
    """A config on another store, or a table name leaving no room for the outbox's: a clear
    DedupConfigError (naming the databases, or the longest table name)."""
    from rocketmq_dedup import DedupConfigError, MemoryDedupStore

    with pytest.raises(DedupConfigError, match="MySQL/MariaDB or PostgreSQL"):
        Outbox(DedupConfig("app", MemoryDedupStore()))
    name, limit = backend.too_long
    with pytest.raises(DedupConfigError, match=f"at most {limit}"):
        Outbox(backend.store(name))


def test_a_rows_columns_round_trip(backend: Backend, outbox: Outbox) -> None:
    """Keys, tag, properties (non-ASCII), sharding key and a binary body come back from the
    claim as they were sent."""
    conn = backend.connect()
    body = bytes(range(256)) * 4
    try:
        outbox.send(
            conn,
            "OUT",
            body,
            keys=["订单-1", "second"],
            tag="TagA",
            properties={"区域": "上海 浦东", "n": "1"},
            sharding_key="订单 1",
        )
        conn.commit()
    finally:
        conn.close()
    [row] = outbox.tables.claim("me", 10, 4, 30_000)
    message = row.message
    assert message.body == body and message.topic == "OUT" and message.tag == "TagA"
    assert message.keys == ("订单-1", "second")
    assert dict(message.properties) == {"区域": "上海 浦东", "n": "1"}
    assert message.sharding_key == "订单 1"
    assert row.attempts == 0 and row.failing_for_ms is None


def test_two_transactions_sending_the_first_rows_of_a_new_sharding_key_both_commit(
    backend: Backend, outbox: Outbox
) -> None:
    """Two transactions send for a sharding key no row had yet: the second waits at the key's
    lock until the first commits, then writes (nothing in its transaction failed: on
    PostgreSQL a failed statement would have aborted it) and commits after it, with a later
    id; a claim gives them in that order."""
    first, second = backend.connect(), backend.connect()
    sent: list[Any] = []
    try:
        a = outbox.send(first, "OUT", b"a", keys="a", sharding_key="new-key")
        waiter = threading.Thread(
            target=lambda: sent.append(
                outbox.send(second, "OUT", b"b", keys="b", sharding_key="new-key")
            )
        )
        waiter.start()
        wait_for(lambda: backend.db.waiting_on(outbox.tables.lane_table), timeout=5)  # type: ignore[attr-defined]
        assert sent == []
        first.commit()
        waiter.join(5)
        second.commit()
    finally:
        first.close()
        second.close()
    [b] = sent
    assert b.id > a.id
    assert outbox_rows(outbox) == {"a": ("PENDING", 0), "b": ("PENDING", 0)}
    claimed = outbox.tables.claim("me", 10, 4, 30_000)
    assert [row.message.message_key for row in claimed] == ["a", "b"]


def test_an_exactly_once_function_sends_with_its_writes_or_not_at_all(
    config: DedupConfig, outbox: Outbox, effects: EffectTable
) -> None:
    """@exactly_once: a call that returns commits its effect and its outbox row; one that
    raises leaves neither (a later call runs again); a call with a committed key runs nothing
    and writes no second row (DuplicateConsumedError)."""
    from rocketmq_dedup import DuplicateConsumedError, exactly_once

    failing = {"o2"}

    @exactly_once(config, key=lambda order: order)
    def ship(conn: Any, order: str) -> str:
        effects.insert(conn, order)
        outbox.send(conn, "OUT", f"ship {order}", keys=f"{order}:ship", sharding_key=order)
        if order in failing:
            failing.discard(order)
            raise RuntimeError("business failure")
        return order

    assert ship("o1") == "o1"
    with pytest.raises(RuntimeError):
        ship("o2")
    assert outbox_rows(outbox) == {"o1:ship": ("PENDING", 0)}
    assert ship("o2") == "o2"  # runs again
    with pytest.raises(DuplicateConsumedError):
        ship("o1")
    assert effects.counts() == {"o1": 1, "o2": 1}
    assert outbox_rows(outbox) == {"o1:ship": ("PENDING", 0), "o2:ship": ("PENDING", 0)}
