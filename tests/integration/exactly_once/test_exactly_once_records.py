"""How the exactly-once mode writes and reads its records (issue 26): round trips per message,
an expired record taken over, a plain listener's claim in the way, and every decision seen by
the hooks and the metrics."""

from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from typing import Any, Dict, List, Tuple
from urllib.parse import urlsplit

import MySQLdb
import MySQLdb.connections
import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupStatus, Outcome
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.transaction import Transaction, current_transaction
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    PG_DRIVERS,
    SQL_STORES,
    EffectListener,
    EffectTable,
    SequencedListener,
    dispose,
    execute,
    make_client,
    make_config,
    unique,
)
from tests.integration.relay import Relay
from tests.support import MYSQL, PG_DSN

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class CountingConnection(MySQLdb.connections.Connection):  # type: ignore[misc]
    """A mysqlclient connection counting its round trips (queries, COMMIT, ROLLBACK)."""

    trips = 0

    def query(self, sql: Any) -> Any:
        CountingConnection.trips += 1
        return super().query(sql)

    def commit(self) -> Any:
        CountingConnection.trips += 1
        return super().commit()

    def rollback(self) -> Any:
        CountingConnection.trips += 1
        return super().rollback()


class TwoStatements(EffectListener):
    """The bench's business transaction: an UPDATE and an INSERT."""

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        cur = conn.cursor()
        cur.execute(f"UPDATE {self.effects.name} SET v = v WHERE k = 'none'")
        cur.close()
        return super().do_handle_msg(msg, conn)


def trips(listener: Any, msg: Any) -> Tuple[Any, int]:
    """The listener's answer to ``msg`` and the round trips it took."""
    before = CountingConnection.trips
    answer = listener(msg)
    return answer, CountingConnection.trips - before


def status_of(config: DedupConfig, msg_id: str) -> Any:
    assert config.persist is not None
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", msg_id)
    return config.persist.get_status(element)


def redelivered(msg_id: str) -> ClassicMessage:
    return ClassicMessage(msg_id, reconsume_times=1)


@pytest.mark.parametrize("driver", ["mysqlclient"])
@pytest.mark.parametrize(
    ("claim", "fresh"), [("at_commit", 3), ("before_handler", 4)], ids=["at_commit", "before"]
)
def test_round_trips_per_message(
    driver: str, table: str, effects: EffectTable, claim: str, fresh: int
) -> None:
    """mysqlclient, a two-statement handler: a fresh message costs its two statements and one
    round trip for the record with the COMMIT (one more before the handler with
    claim="before_handler"); a redelivered duplicate of a committed message costs one; a twin
    of a message in its handler in this process, none."""
    connect = functools.partial(CountingConnection, **MYSQL)
    config = make_config(connect, table, exactly_once_claim=claim)
    assert isinstance(config.persist, MySQLDedupStore)
    config.persist.create_table()
    running, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.body == b"hold":
            running.set()
            assert finish.wait(10)
        return True

    listener = TwoStatements(config, effects, behaviour)
    try:
        listener(ClassicMessage("warm-up"))  # opens the connections, sets their session
        assert trips(listener, ClassicMessage("m1")) == (SUCCESS, fresh)
        assert trips(listener, redelivered("m1")) == (SUCCESS, 1)
        holder = threading.Thread(target=listener, args=(ClassicMessage("m2", body=b"hold"),))
        holder.start()
        assert running.wait(10)
        answer, taken = trips(listener, ClassicMessage("m2"))
        finish.set()
        holder.join(10)
        assert (answer, taken) == (LATER, 0)
        assert effects.counts() == {"warm-up": 1, "m1": 1, "m2": 1}
    finally:
        finish.set()
        config.close()


def relayed_client(driver: str, relay: Relay) -> Any:
    """A PostgreSQL client of ``driver`` whose connections go through ``relay``."""
    if driver == "psycopg_pool":
        return make_client(driver, kwargs={"port": relay.port})
    if driver.startswith("sqlalchemy"):
        return make_client(driver, connect_args={"port": relay.port})
    return make_client(driver, port=relay.port)


def pg_target() -> Tuple[str, int]:
    parts = urlsplit(PG_DSN)
    return parts.hostname or "127.0.0.1", parts.port or 5432


@pytest.mark.parametrize("driver", PG_DRIVERS)
@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
def test_round_trips_per_message_on_postgres(
    driver: str, claim: str, table: str, effects: EffectTable
) -> None:
    """PostgreSQL, counted on the wire (a relay): a fresh message with a two-statement handler
    costs 4 round trips, what the bare transaction costs through psycopg (its BEGIN, the two
    statements, COMMIT): [BEGIN, the hold(, the key's lock and record)], the two statements,
    [the record, COMMIT]; a redelivered duplicate of a committed message costs 1; a twin of a
    message in its handler in this process, none."""
    relay = Relay(pg_target())
    client = relayed_client(driver, relay)
    config = make_config(client, table, exactly_once_claim=claim)
    config.persist.create_table()  # type: ignore[union-attr]
    running, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        execute(conn, f"UPDATE {effects.name} SET v = v WHERE k = 'none'")
        if msg.body == b"hold":
            running.set()
            assert finish.wait(10)
        return True

    def trips_of(msg: Any) -> Tuple[Any, int]:
        before = relay.turns
        return listener(msg), relay.turns - before

    listener = EffectListener(config, effects, behaviour)
    try:
        listener(ClassicMessage("warm-up"))  # opens the connections
        assert trips_of(ClassicMessage("m1")) == (SUCCESS, 4)
        assert trips_of(redelivered("m1")) == (SUCCESS, 1)
        holder = threading.Thread(target=listener, args=(ClassicMessage("m2", body=b"hold"),))
        holder.start()
        assert running.wait(10)
        answer = trips_of(ClassicMessage("m2"))
        finish.set()
        holder.join(10)
        assert answer == (LATER, 0)
        assert effects.counts() == {"warm-up": 1, "m1": 1, "m2": 1}
    finally:
        finish.set()
        config.close()
        dispose(client)
        relay.close()


def test_a_messages_transaction_is_freed_as_soon_as_it_ends(
    config: DedupConfig, effects: EffectTable
) -> None:
    """Every driver: once the listener answered, a committed message's transaction and a
    rolled-back one's are freed by reference counting, the cyclic garbage collector off (the
    handler's conn refers back to its transaction: a cycle left each one to that collector,
    which then ran about five times as often as for the same work written by hand)."""
    transactions: List[weakref.ReferenceType[Transaction]] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        tx = current_transaction()
        assert tx is not None and tx.conn is conn
        transactions.append(weakref.ref(tx))
        return msg.body != b"no"

    listener = EffectListener(config, effects, behaviour)
    assert listener(ClassicMessage(unique("warm-up"))) is SUCCESS  # opens the connections
    gc.collect()
    gc.disable()
    try:
        assert listener(ClassicMessage(unique("m"))) is SUCCESS
        assert listener(ClassicMessage(unique("m"), body=b"no")) is LATER
        assert [ref() for ref in transactions[1:]] == [None, None]
    finally:
        gc.enable()


@pytest.mark.parametrize("driver", PG_DRIVERS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_connection_cut_around_the_commit_applies_the_message_once(
    driver: str, when: str, table: str, effects: EffectTable
) -> None:
    """PostgreSQL, the transaction's connection cut on the wire as its [record, COMMIT] goes
    out: cut before, nothing reaches the server (it rolls the dead session back), the answer is
    RECONSUME_LATER and the retry applies the message once; cut after, the server committed
    but the answer is lost: the record is read back and the message acked as the duplicate it
    is, its handler never run again. Either way: one effect, one CONSUMED record."""
    relay = Relay(pg_target())
    client = relayed_client(driver, relay)
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.body == b"cut":
            relay.cut_next(when)  # the next send of any connection: this one's COMMIT
        return True

    listener = EffectListener(config, effects, behaviour)
    try:
        listener(ClassicMessage("warm-up"))  # the store's connections open before the cut
        first = listener(ClassicMessage("m1", body=b"cut"))
        assert relay.cuts == [when]
        assert first is (LATER if when == "before" else SUCCESS)
        assert effects.count("m1") == (0 if when == "before" else 1)
        assert listener(redelivered("m1")) is SUCCESS
        assert effects.count("m1") == 1 and listener.calls["m1"] == (2 if when == "before" else 1)
        assert status_of(config, "m1") is DedupStatus.CONSUMED
    finally:
        config.close()
        dispose(client)
        relay.close()


@pytest.mark.parametrize("driver", PG_DRIVERS)
@pytest.mark.parametrize("other", ["commits", "rolls back"])
def test_a_copys_record_waits_for_the_one_another_transaction_is_writing(
    driver: str, other: str, client: Any, table: str, effects: EffectTable
) -> None:
    """PostgreSQL: another session's transaction has written the key's CONSUMED record and not
    committed yet (a copy between its record and its COMMIT). The listener's copy runs its
    handler, and its record waits for that row. The other commits: this copy's record is
    refused (its COMMIT never runs), it is rolled back and acked as the duplicate it is; the
    other rolls back: this copy's record is written and it commits."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
    listener = EffectListener(config, effects)
    import psycopg

    writer = psycopg.connect(PG_DSN)  # a transaction of its own, left open
    answers: List[ConsumeStatus] = []
    try:
        writer.execute(
            f"INSERT INTO {table} (dedup_key, application_name, topic, tag, msg_uniq_key, "
            "status, owner_token, expire_time) VALUES (%s, %s, 'TEST-TOPIC', 'TagA', 'm1', "
            "'CONSUMED', 'other-owner', now() + interval '1 hour')",
            (element.digest(), config.application_name),
        )
        copy = threading.Thread(target=lambda: answers.append(listener(ClassicMessage("m1"))))
        copy.start()
        deadline = time.monotonic() + 20
        while not effects.db.waiting_on(table):  # the copy's record waits for the row
            assert time.monotonic() < deadline, "the copy's record never waited"
            time.sleep(0.01)
        writer.commit() if other == "commits" else writer.rollback()
        copy.join(20)
    finally:
        writer.close()
        config.close()
    assert answers == [SUCCESS] and listener.calls == {"m1": 1}
    assert effects.count("m1") == (0 if other == "commits" else 1)
    assert status_of(config, "m1") is DedupStatus.CONSUMED


def test_an_expired_record_is_taken_over_at_commit(
    client: Any, table: str, effects: EffectTable
) -> None:
    """After its retention a record no longer refuses its key: the next copy's commit deletes
    it and writes its own (the handler runs again, as the retention says)."""
    config = make_config(client, table, dedup_record_reserve_minutes=0.005)  # 300 ms
    config.persist.create_table()  # type: ignore[union-attr]
    listener = EffectListener(config, effects)
    try:
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert listener(redelivered("m1")) is SUCCESS  # live: acked without the handler
        assert listener.calls == {"m1": 1}
        time.sleep(0.4)
        other = EffectListener(make_config(client, table, config.application_name), effects)
        assert other(ClassicMessage("m1")) is SUCCESS
        assert other.calls == {"m1": 1} and effects.count("m1") == 2
        assert config.persist is not None
        element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
        assert config.persist.get_status(element) is DedupStatus.CONSUMED
        other.close()
    finally:
        config.close()


def test_a_plain_listeners_claim_in_the_way_is_a_copy_in_progress(
    config: DedupConfig, effects: EffectTable
) -> None:
    """A CONSUMING claim on the key (a plain listener of the same application and table):
    the commit is refused and rolled back, RECONSUME_LATER; once the claim is released the
    message commits."""
    assert isinstance(config.persist, SQL_STORES)
    element = DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1")
    claim = Claim(element, "plain-owner")
    assert config.persist.claim(claim, 60_000).claimed
    listener = EffectListener(config, effects)
    assert listener(ClassicMessage("m1")) is LATER
    assert effects.count("m1") == 0  # rolled back
    assert config.persist.release(claim)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert effects.count("m1") == 1 and listener.calls == {"m1": 2}


class Recorder(DedupMetrics):
    """Keeps every decision and store call."""

    def __init__(self) -> None:
        self.outcomes: Dict[str, List[Outcome]] = {}
        self.ops: List[Tuple[StoreOp, bool]] = []

    def message(self, decision: Decision) -> None:
        self.outcomes.setdefault(decision.message.id, []).append(decision.outcome)

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        self.ops.append((op, ok))


class Steps(SequencedListener):
    """Sequence ``(entity, seq)`` from the body ``entity:seq``; records ``on_duplicate``."""

    def __init__(self, config: DedupConfig, effects: EffectTable) -> None:
        self.duplicates: List[Tuple[str, DedupStatus]] = []
        super().__init__(config, effects, self.parse)

    @staticmethod
    def parse(msg: Any) -> Tuple[str, int]:
        entity, seq = msg.body.decode().rsplit(":", 1)
        return entity, int(seq)

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:
        self.duplicates.append((msg.id, status))


def test_hooks_and_metrics_see_every_decision(
    client: Any, table: str, effects: EffectTable
) -> None:
    """A sequence gap is its own outcome; a stale step acked without its handler and a copy
    whose commit another consumer's record refused both reach on_duplicate; the record's
    write with the COMMIT and the look-ups are timed."""
    metrics = Recorder()
    config = make_config(client, table, metrics=metrics)
    assert isinstance(config.persist, SQL_STORES)
    config.persist.create_table()
    listener = Steps(config, effects)

    def step(msg_id: str, entity: str, seq: int, **kwargs: Any) -> ClassicMessage:
        return ClassicMessage(msg_id, body=f"{entity}:{seq}".encode(), **kwargs)

    try:
        assert listener(step("g2", "e", 2)) is LATER  # a gap: 1 never came
        assert listener(step("s1", "e", 1)) is SUCCESS
        assert listener(step("g2", "e", 2)) is SUCCESS
        assert listener(step("old", "e", 1)) is SUCCESS  # stale: acked without the handler
        assert listener(step("s1", "e", 1, reconsume_times=1)) is SUCCESS  # a duplicate
        assert metrics.outcomes == {
            "g2": [Outcome.SEQUENCE_GAP, Outcome.CONSUMED],
            "s1": [Outcome.CONSUMED, Outcome.DUPLICATE_CONSUMED],
            "old": [Outcome.DUPLICATE_CONSUMED],
        }
        assert listener.duplicates == [
            ("old", DedupStatus.CONSUMED),
            ("s1", DedupStatus.CONSUMED),
        ]
        assert (StoreOp.COMMIT, True) in metrics.ops and (StoreOp.LOOKUP, True) in metrics.ops
        assert metrics.ops.count((StoreOp.COMMIT, True)) == 3  # s1, g2 and the stale step
    finally:
        config.close()
