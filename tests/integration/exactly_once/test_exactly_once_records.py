"""How the exactly-once mode writes and reads its records (issue 26): round trips per message,
an expired record taken over, a plain listener's claim in the way, and every decision seen by
the hooks and the metrics."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Dict, List, Tuple

import MySQLdb
import MySQLdb.connections
import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupStatus, Outcome
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    EffectListener,
    EffectTable,
    SequencedListener,
    make_config,
)
from tests.support import MYSQL

pytestmark = pytest.mark.mysql

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


def redelivered(msg_id: str) -> ClassicMessage:
    return ClassicMessage(msg_id, reconsume_times=1)


@pytest.mark.parametrize(
    ("claim", "fresh"), [("at_commit", 3), ("before_handler", 4)], ids=["at_commit", "before"]
)
def test_round_trips_per_message(table: str, effects: EffectTable, claim: str, fresh: int) -> None:
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


def test_an_expired_record_is_taken_over_at_commit(
    client: Any, table: str, effects: EffectTable
) -> None:
    """After its retention a record no longer refuses its key: the next copy's commit deletes
    it and writes its own (the handler runs again, as the retention says)."""
    config = make_config(client, table, dedup_record_reserve_minutes=0.005)  # 300 ms
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
    assert isinstance(config.persist, MySQLDedupStore)
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
    assert isinstance(config.persist, MySQLDedupStore)
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
