"""The outbox's rows commit with the handler's transaction, or never (real MariaDB, every MySQL
driver of the exactly-once mode); the relay of the process is woken by the commit."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, MySQLDedupStore
from rocketmq_dedup.errors import OutboxMessageError
from rocketmq_dedup.outbox import Outbox, OutboxRelay
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import EffectTable, dispose, make_client, make_config
from tests.integration.outbox.support import RecordingSender, SendingListener, outbox_rows
from tests.support import mysql_connect, wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


@pytest.fixture
def driver_config(driver: str, table: str) -> Iterator[DedupConfig]:
    client = make_client(driver)
    config = make_config(client, table)
    yield config
    config.close()
    dispose(client)


def test_a_row_commits_with_the_handlers_writes_on_every_driver(
    driver_config: DedupConfig, table: str, effects: EffectTable
) -> None:
    """A handler that succeeds: its effect row and its outbox row both committed (PENDING);
    one that fails or raises: neither; a duplicate of a committed message: no second row."""
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
    assert outbox_rows(table) == {"ok:B": ("PENDING", 0)}


def test_a_copy_whose_twin_committed_meanwhile_leaves_no_row(
    config: DedupConfig, outbox: Outbox, table: str, effects: EffectTable
) -> None:
    """Two copies of one message in two consumers at once (at_commit): the one whose record
    is refused at its COMMIT is rolled back, its outbox row with it: one row."""
    entered, release = threading.Event(), threading.Event()
    other = make_config(mysql_connect(), table, application=config.application_name)

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
    assert outbox_rows(table) == {"m1:B": ("PENDING", 0)}
    other.close()


def test_a_connection_in_autocommit_mode_is_refused(outbox: Outbox, table: str) -> None:
    """A row through a connection in autocommit mode would commit on its own: refused, nothing
    written; one in a transaction commits with it."""
    conn = mysql_connect()()
    try:
        conn.autocommit(True)
        with pytest.raises(OutboxMessageError, match="autocommit"):
            outbox.send(conn, "OUT", b"x")
        conn.autocommit(False)
        receipt = outbox.send(conn, "OUT", b"x", keys="k1")
        assert outbox_rows(table) == {}  # not committed yet (another session)
        conn.commit()
        assert outbox_rows(table) == {"k1": ("PENDING", 0)}
        assert receipt.message_key == "k1" and receipt.id > 0
    finally:
        conn.close()


def test_a_generated_message_key_is_stored_with_the_row(outbox: Outbox, table: str) -> None:
    """No keys: a 32-hex key is generated when the row is written, and stored with it."""
    conn = mysql_connect()()
    try:
        conn.autocommit(False)
        receipt = outbox.send(conn, "OUT", "text body")
        conn.commit()
    finally:
        conn.close()
    assert len(receipt.message_key) == 32
    assert outbox_rows(table) == {receipt.message_key: ("PENDING", 0)}


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
    outbox: Outbox, table: str
) -> None:
    """A row written in a transaction of the application's own (no listener): the relay's
    poll sends it; outbox.wake() after the commit sends it at once."""
    sender = RecordingSender()
    with OutboxRelay(outbox, sender, poll_interval_s=0.5):
        conn = mysql_connect()()
        try:
            conn.autocommit(False)
            outbox.send(conn, "OUT", b"polled", keys="polled")
            conn.commit()
            wait_for(lambda: "polled" in sender.message_keys(), timeout=5)
        finally:
            conn.close()
    with OutboxRelay(outbox, sender, poll_interval_s=30.0):
        time.sleep(0.3)
        conn = mysql_connect()()
        try:
            conn.autocommit(False)
            outbox.send(conn, "OUT", b"woken", keys="woken")
            conn.commit()
            begin = time.monotonic()
            outbox.wake()
            wait_for(lambda: "woken" in sender.message_keys(), timeout=5)
            assert time.monotonic() - begin < 2.0
        finally:
            conn.close()
    assert outbox_rows(table) == {"polled": ("SENT", 1), "woken": ("SENT", 1)}


def test_an_outbox_needs_a_mysql_store(table: str) -> None:
    """A config on another store, or a table name leaving no room for the outbox's: a clear
    DedupConfigError."""
    from rocketmq_dedup import DedupConfigError, MemoryDedupStore

    with pytest.raises(DedupConfigError, match="MySQL"):
        Outbox(DedupConfig("app", MemoryDedupStore()))
    with pytest.raises(DedupConfigError, match="52"):
        Outbox(MySQLDedupStore(mysql_connect(), "t" * 60))


def test_a_rows_columns_round_trip(outbox: Outbox, table: str) -> None:
    """Keys, tag, properties (non-ASCII), sharding key and a binary body come back from the
    claim as they were sent."""
    conn = mysql_connect()()
    body = bytes(range(256)) * 4
    try:
        conn.autocommit(False)
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
