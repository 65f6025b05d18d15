"""The exactly-once decision table, without a database: TransactionalStrategy over a fake of its
transaction port (tests/unit/fake_transactions.py). The MySQL port itself is tested against
MariaDB in tests/integration/exactly_once/."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Tuple

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    DedupConfigError,
    DedupStatus,
    MemoryDedupStore,
    PermanentFailure,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import Decision, DedupMetrics
from rocketmq_dedup.status import Outcome
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.transaction import Entity, current_transaction
from rocketmq_dedup.strategy.exactly_once import RECENT_KEYS, RecentKeys
from rocketmq_dedup.testing import ClassicMessage
from tests.unit.fake_transactions import FakeConn, FakeTransactionalStore, FakeTransactions

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER

Handler = Callable[[Any, FakeConn], Any]


class Outcomes(DedupMetrics):
    """Records each message's outcome."""

    def __init__(self) -> None:
        self.outcomes: List[Outcome] = []

    def message(self, decision: Decision) -> None:
        self.outcomes.append(decision.outcome)


class Listener(TransactionalDedupListener):
    """Writes the message id through ``conn``, then answers what ``handler`` says (True by
    default); counts its runs."""

    def __init__(
        self,
        config: DedupConfig,
        handler: Optional[Handler] = None,
        sequence: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        self.handler = handler
        self.sequence = sequence
        self.runs: List[str] = []
        super().__init__(config)

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        self.runs.append(msg.id)
        conn.write(msg.id)
        return True if self.handler is None else self.handler(msg, conn)

    def sequence_key(self, msg: Any) -> Any:
        return self.sequence(msg) if self.sequence is not None else None


class World:
    """A fake database, a config on it, and the outcomes reported."""

    def __init__(self, **settings: Any) -> None:
        self.store = FakeTransactionalStore()
        self.metrics = Outcomes()
        self.config = DedupConfig("app", self.store, metrics=self.metrics, **settings)

    @property
    def db(self) -> FakeTransactions:
        return self.store.transactions

    def listener(self, handler: Optional[Handler] = None, **kwargs: Any) -> Listener:
        return Listener(self.config, handler, **kwargs)

    def element(self, msg_id: str) -> DedupElement:
        return DedupElement("app", "TEST-TOPIC", "TagA", msg_id)

    def status(self, msg_id: str) -> Optional[DedupStatus]:
        return self.store.get_status(self.element(msg_id))

    def commit_elsewhere(self, msg_id: str) -> None:
        """Another consumer committed this message (its record exists)."""
        self.store.mark_consumed(Claim(self.element(msg_id), "other-owner"), 60_000)


def by_step(msg: Any) -> Tuple[str, int]:
    """Messages ``<entity>-<seq>``: the sequence key."""
    entity, _, seq = msg.id.rpartition("-")
    return entity, int(seq)


# -- commit, duplicate, rollback ---------------------------------------------------------------


def test_a_fresh_message_commits_its_writes_with_the_record() -> None:
    """The handler's write and the CONSUMED record commit together; answered SUCCESS."""
    world = World()
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == ["m1"]
    assert world.status("m1") is DedupStatus.CONSUMED
    assert world.metrics.outcomes == [Outcome.CONSUMED]
    assert world.db.open == 0  # every transaction closed


@pytest.mark.parametrize("answer", [False, None, "ok", RuntimeError("boom")], ids=repr)
def test_a_failed_handler_commits_nothing(answer: Any) -> None:
    """False, None, another value or an exception: nothing committed, no record, LATER."""

    def handler(msg: Any, conn: FakeConn) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    world = World()
    assert world.listener(handler)(ClassicMessage("m1")) is LATER
    assert world.db.committed == [] and world.status("m1") is None
    assert world.metrics.outcomes == [Outcome.FAILED]
    assert world.db.open == 0


def test_a_redelivered_duplicate_is_looked_up_and_acked_without_a_transaction() -> None:
    """A redelivery of a committed message: one look-up, acked, no handler, no transaction."""
    world = World()
    world.commit_elsewhere("m1")
    listener = world.listener()
    assert listener(ClassicMessage("m1", reconsume_times=1)) is SUCCESS
    assert listener.runs == [] and world.db.begun == 0
    assert world.metrics.outcomes == [Outcome.DUPLICATE_CONSUMED]


def test_a_key_committed_here_lately_is_looked_up_first() -> None:
    """A first delivery of a key this process committed lately: acked without a transaction."""
    world = World()
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.runs == ["m1"] and world.db.begun == 1


def test_the_recent_keys_remember_the_last_ones_and_stay_bounded() -> None:
    """RecentKeys keeps at least the last RECENT_KEYS keys added, and never more than twice
    as many."""
    recent = RecentKeys()
    keys = [DedupElement("app", "T", "tag", str(i)) for i in range(3 * RECENT_KEYS + 5)]
    for i, key in enumerate(keys):
        recent.add(key)
        assert key in recent
        assert keys[max(0, i - RECENT_KEYS + 1)] in recent
    remembered = sum(key in recent for key in keys)
    assert RECENT_KEYS <= remembered < 2 * RECENT_KEYS
    assert keys[0] not in recent


def test_a_copy_whose_twin_committed_meanwhile_is_rolled_back_and_acked() -> None:
    """at_commit: another consumer commits while this copy is in its handler; this copy's
    record is refused at its commit: its writes roll back, it is acked as a duplicate."""
    world = World()

    def handler(msg: Any, conn: FakeConn) -> bool:
        world.commit_elsewhere(msg.id)
        return True

    listener = world.listener(handler)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == []
    assert world.metrics.outcomes == [Outcome.DUPLICATE_CONSUMED]


@pytest.mark.parametrize(("wait", "expected"), [(0, LATER), (5000, SUCCESS)])
def test_a_twin_in_this_process_is_answered_at_once(wait: int, expected: ConsumeStatus) -> None:
    """While the first copy is in its handler, its twin in this process gets LATER without a
    transaction; with in_progress_wait it gets the first copy's outcome."""
    world = World(in_progress_wait_milli_seconds=wait)
    entered, finish = threading.Event(), threading.Event()

    def handler(msg: Any, conn: FakeConn) -> bool:
        if msg.body == b"first":
            entered.set()
            finish.wait(10)
        return True

    listener = world.listener(handler)
    first = threading.Thread(target=listener, args=(ClassicMessage("m1", body=b"first"),))
    first.start()
    assert entered.wait(10)
    if wait:
        threading.Timer(0.05, finish.set).start()
    assert listener(ClassicMessage("m1", body=b"twin")) is expected
    finish.set()
    first.join(10)
    assert listener.runs == ["m1"] and world.db.begun == 1


def test_a_message_without_a_key_commits_its_writes_alone() -> None:
    """Dedup key None: the handler's writes commit (or roll back) whole, no record."""

    class NoKey(Listener):
        def dedup_message_key(self, msg: Any) -> Any:
            return None

    world = World()
    listener = NoKey(world.config, lambda msg, conn: msg.body == b"ok")
    assert listener(ClassicMessage("m1", body=b"no")) is LATER
    assert listener(ClassicMessage("m1", body=b"ok")) is SUCCESS
    assert world.db.committed == ["m1"] and world.status("m1") is None


def test_local_retries_run_a_new_transaction_each() -> None:
    """local_retries=2: a handler failing twice runs a third time, in a third transaction."""
    world = World(local_retries=2, local_retry_backoff_milli_seconds=1)
    listener = world.listener(lambda msg, conn: len(listener.runs) >= 3)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.begun == 3 and world.db.committed == ["m1"]


# -- before_handler ------------------------------------------------------------------------------


def test_before_handler_answers_a_copy_held_elsewhere_at_once() -> None:
    """Another consumer's transaction holds the key's lock: LATER, the handler not run."""
    world = World(exactly_once_claim="before_handler")
    world.db.hold_key(world.element("m1"))
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is LATER
    assert listener.runs == [] and world.metrics.outcomes == [Outcome.DUPLICATE_IN_PROGRESS]


def test_before_handler_acks_a_committed_copy_without_its_handler() -> None:
    """The key's lock is taken and its record found: acked, the handler not run."""
    world = World(exactly_once_claim="before_handler")
    world.commit_elsewhere("m1")
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.runs == [] and world.db.committed == []
    assert world.db.steps[:2] == ["begin", "claim_key"]


def test_before_handler_runs_a_fresh_message_holding_the_key() -> None:
    """The key's lock taken, no record: the handler runs and commits; the lock is freed."""
    world = World(exactly_once_claim="before_handler")
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == ["m1"] and world.db.key_locks == {}


# -- the sequence guard -------------------------------------------------------------------------


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
@pytest.mark.parametrize(
    ("mode", "last", "seq", "answer", "runs", "outcome"),
    [
        ("strict", None, 1, SUCCESS, True, Outcome.CONSUMED),
        ("strict", 1, 2, SUCCESS, True, Outcome.CONSUMED),
        ("strict", 2, 2, SUCCESS, False, Outcome.DUPLICATE_CONSUMED),
        ("strict", 2, 1, SUCCESS, False, Outcome.DUPLICATE_CONSUMED),
        ("strict", 1, 3, LATER, False, Outcome.SEQUENCE_GAP),
        ("strict", None, 2, LATER, False, Outcome.SEQUENCE_GAP),
        ("latest", None, 7, SUCCESS, True, Outcome.CONSUMED),
        ("latest", 5, 7, SUCCESS, True, Outcome.CONSUMED),
        ("latest", 7, 7, SUCCESS, False, Outcome.DUPLICATE_CONSUMED),
        ("latest", 7, 5, SUCCESS, False, Outcome.DUPLICATE_CONSUMED),
    ],
)
def test_the_sequence_guard(
    claim: str,
    mode: str,
    last: Optional[int],
    seq: int,
    answer: ConsumeStatus,
    runs: bool,
    outcome: Outcome,
) -> None:
    """Each branch of the guard, under both claim modes: run, stale (acked without the
    handler, its record committed), gap (LATER, nothing committed)."""
    world = World(sequence_mode=mode, exactly_once_claim=claim)
    entity = Entity("app", "order")
    if last is not None:
        world.db.sequences[entity] = last
    listener = world.listener(sequence=by_step)
    assert listener(ClassicMessage(f"order-{seq}")) is answer
    assert bool(listener.runs) is runs
    assert world.metrics.outcomes == [outcome]
    recorded = world.status(f"order-{seq}")
    assert recorded is (None if answer is LATER else DedupStatus.CONSUMED)
    expected_last = seq if runs else last
    assert world.db.sequences.get(entity) == expected_last


def test_a_bad_sequence_key_is_a_key_error_without_a_transaction() -> None:
    """sequence_key returning something else than (str, int): LATER, no transaction."""
    world = World()
    listener = world.listener(sequence=lambda msg: ("e", "1"))
    assert listener(ClassicMessage("m1")) is LATER
    assert world.db.begun == 0 and world.metrics.outcomes == [Outcome.KEY_ERROR]


# -- failures and misuse -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "error", "outcome", "level", "text"),
    [
        (
            "begin",
            StoreUnavailableError("down"),
            Outcome.STORE_ERROR_LATER,
            "WARNING",
            "unavailable",
        ),
        (
            "commit_record",
            StoreUnavailableError("down"),
            Outcome.STORE_ERROR_LATER,
            "WARNING",
            "unavailable",
        ),
        (
            "commit_record",
            StoreLockConflictError("1205"),
            Outcome.LOCK_CONFLICT,
            "WARNING",
            "lock wait",
        ),
        (
            "lock_sequence",
            StoreLockConflictError("1213"),
            Outcome.LOCK_CONFLICT,
            "WARNING",
            "deadlock",
        ),
        ("commit_record", StoreError("no table"), Outcome.STORE_ERROR_LATER, "ERROR", "failed"),
        (
            "before_handler",
            StoreUnavailableError("down"),
            Outcome.STORE_ERROR_LATER,
            "WARNING",
            "unavailable",
        ),
        (
            "lock_sequence",
            StoreMisconfiguredError("UPDATE command denied", "GRANT UPDATE ON t_seq"),
            Outcome.STORE_MISCONFIGURED,
            "ERROR",
            "refused",
        ),
    ],
)
def test_a_failing_step_is_told_for_what_it_is(
    step: str,
    error: StoreError,
    outcome: Outcome,
    level: str,
    text: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An outage, a lock conflict, a defect: each LATER, logged as what it is and counted
    apart; nothing committed; never "run without dedup" (even with policy "consume")."""
    world = World(store_failure_policy="consume")
    world.db.fail[step] = error
    listener = world.listener(sequence=by_step)
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("order-1")) is LATER
    assert world.db.committed == [] and world.metrics.outcomes == [outcome]
    records = [r for r in caplog.records if text in r.getMessage()]
    assert records and records[0].levelname == level


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
@pytest.mark.parametrize("sequence", [None, by_step], ids=["no-entity", "entity"])
def test_the_transaction_is_made_ready_right_before_the_handler(claim: str, sequence: Any) -> None:
    """``before_handler`` (PostgreSQL: the BEGIN no statement carried yet) is called after the
    key and the sequence guard, right before the handler; when it fails (an outage) the
    handler never runs and the answer is a store error, not a failed handler."""
    world = World(exactly_once_claim=claim)
    listener = world.listener(sequence=sequence)
    assert listener(ClassicMessage("order-1")) is SUCCESS
    steps = world.db.steps
    assert steps[steps.index("before_handler") + 1] == "run_handler"
    world.db.fail["before_handler"] = StoreUnavailableError("down")
    assert listener(ClassicMessage("order-2")) is LATER
    assert listener.runs == ["order-1"]
    assert world.metrics.outcomes == [Outcome.CONSUMED, Outcome.STORE_ERROR_LATER]


def test_a_commit_whose_answer_was_lost_is_acked_as_the_duplicate_it_is() -> None:
    """The COMMIT landed but its answer was lost (an outage right after): the record is read
    back and the message acked, not retried."""
    world = World()
    world.db.fail["after_commit"] = StoreUnavailableError("lost after the commit")
    listener = world.listener()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == ["m1"] and listener.runs == ["m1"]


@pytest.mark.parametrize(
    "misuse", ["called commit() on its connection", "switched its session to autocommit mode"]
)
def test_a_handler_that_breaks_its_transaction_is_rolled_back(
    misuse: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that ended, left or broke its transaction and returned True: nothing
    committed, LATER, an error naming what it did; the retry commits once."""
    world = World()

    def handler(msg: Any, conn: FakeConn) -> bool:
        if len(listener.runs) == 1:
            conn.misuse = misuse
        return True

    listener = world.listener(handler)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    assert any(f"do_handle_msg {misuse}" in r.getMessage() for r in caplog.records)
    assert world.db.committed == [] and world.status("m1") is None
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == ["m1"]


def test_a_store_without_transactions_is_refused() -> None:
    """The memory store has no transaction port: DedupConfigError at construction."""
    config = DedupConfig("app", MemoryDedupStore())
    with pytest.raises(DedupConfigError, match="the MySQL or PostgreSQL store"):
        Listener(config)


# -- after-commit callbacks (the outbox's relay wake-up) -----------------------------------------


class Heard:
    """A handler that registers an after-commit callback (twice: it is called once) and then
    answers ``answer``; what the callbacks heard."""

    def __init__(self, answer: Any = True, refuse: bool = False) -> None:
        self.answer = answer
        self.refuse = refuse  # commit another copy meanwhile: this one's record is refused
        self.heard: List[str] = []
        self.inside: List[Any] = []
        self.world: Optional[World] = None

    def __call__(self, msg: Any, conn: FakeConn) -> Any:
        tx = current_transaction()
        self.inside.append(tx is not None and tx.conn is conn)
        assert tx is not None
        tx.call_after_commit(lambda: self.heard.append(msg.id))
        tx.call_after_commit(self.heard.clear)  # another callback...
        tx.call_after_commit(self.heard.clear)  # ...registered twice: called once
        tx.call_after_commit(lambda: self.heard.append("after"))
        if self.refuse:
            assert self.world is not None
            self.world.commit_elsewhere(msg.id)
        return self.answer


def test_a_transaction_that_committed_calls_its_after_commit_callbacks_once_in_order() -> None:
    """The handler sees its transaction (current_transaction(), whose conn is its conn); what it
    registered is called once each, in order, after the COMMIT; outside a handler there is no
    current transaction."""
    world = World()
    handler = Heard()
    assert world.listener(handler)(ClassicMessage("m1")) is SUCCESS
    assert handler.inside == [True]
    assert handler.heard == ["after"]  # m1 appended, cleared once, then "after"
    assert world.db.committed == ["m1"]
    assert current_transaction() is None


@pytest.mark.parametrize("answer", [False, RuntimeError("boom")], ids=repr)
def test_a_rolled_back_transaction_calls_no_after_commit_callback(answer: Any) -> None:
    """A handler that fails (or raises) after registering: nothing is called."""
    heard = Heard()

    def handler(msg: Any, conn: FakeConn) -> Any:
        heard(msg, conn)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert World().listener(handler)(ClassicMessage("m1")) is LATER
    assert heard.inside == [True] and heard.heard == []
    assert current_transaction() is None


def test_a_copy_whose_record_is_refused_calls_no_after_commit_callback() -> None:
    """Another copy committed while this one ran: this one rolls back, nothing is called."""
    world = World()
    handler = Heard(refuse=True)
    handler.world = world
    assert world.listener(handler)(ClassicMessage("m1")) is SUCCESS  # acked as a duplicate
    assert world.metrics.outcomes == [Outcome.DUPLICATE_CONSUMED]
    assert handler.heard == []


def test_a_message_without_a_key_calls_its_callbacks_after_its_commit() -> None:
    """Dedup key None: the handler's writes commit alone, and the callbacks are called."""

    class NoKey(Listener):
        def dedup_message_key(self, msg: Any) -> Any:
            return None

    world = World()
    handler = Heard()
    assert NoKey(world.config, handler)(ClassicMessage("m1")) is SUCCESS
    assert handler.heard == ["after"]


def test_an_after_commit_callback_that_raises_is_logged_and_the_message_acked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A callback's exception changes nothing: the next callback is called, the message acked."""
    world = World()
    later: List[str] = []

    def handler(msg: Any, conn: FakeConn) -> bool:
        tx = current_transaction()
        assert tx is not None
        tx.call_after_commit(lambda: 1 / 0)
        tx.call_after_commit(lambda: later.append("called"))
        return True

    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert world.listener(handler)(ClassicMessage("m1")) is SUCCESS
    assert later == ["called"]
    assert any("after-commit callback raised" in r.getMessage() for r in caplog.records)


# -- permanent failures ------------------------------------------------------------------------


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
@pytest.mark.parametrize(("policy", "answer"), [("dlq", LATER), ("ack", SUCCESS)])
def test_a_permanent_failure_rolls_the_writes_back_and_commits_the_failed_record_alone(
    claim: str, policy: str, answer: ConsumeStatus
) -> None:
    """The handler wrote, then raised PermanentFailure: its write rolled back, the FAILED
    record (with the reason) committed alone, answered as permanent_failure says; a redelivered
    copy is answered the same way without the handler."""

    def refuse(msg: Any, conn: FakeConn) -> Any:
        raise PermanentFailure("no such account")

    world = World(exactly_once_claim=claim, permanent_failure=policy)
    listener = world.listener(refuse)
    assert listener(ClassicMessage("m1")) is answer
    assert world.db.committed == []  # the handler's write, rolled back
    record = world.store.read(world.element("m1"))
    assert record is not None and (record.status, record.reason) == (
        DedupStatus.FAILED,
        "no such account",
    )
    assert "commit_failure" in world.db.steps
    assert listener(ClassicMessage("m1", reconsume_times=1)) is answer
    assert listener.runs == ["m1"]
    assert world.metrics.outcomes == [Outcome.PERMANENT_FAILURE, Outcome.DUPLICATE_FAILED]
    assert world.db.open == 0


def test_a_permanent_failure_whose_record_a_copy_beat_is_answered_as_that_copy() -> None:
    """Another copy committed CONSUMED while the handler ran: the FAILED record is refused
    (never over a success) and the message is acked as that copy's duplicate."""
    world = World()

    def refuse(msg: Any, conn: FakeConn) -> Any:
        world.commit_elsewhere(msg.id)
        raise PermanentFailure("too late")

    assert world.listener(refuse)(ClassicMessage("m1")) is SUCCESS
    assert world.status("m1") is DedupStatus.CONSUMED
    assert world.metrics.outcomes == [Outcome.DUPLICATE_CONSUMED]


def test_a_permanent_failure_without_a_key_commits_nothing_even_when_acked() -> None:
    """No dedup key, PermanentFailure, permanent_failure="ack": acked, its write rolled back,
    nothing recorded (there is no key to record it under)."""

    class Keyless(Listener):
        def dedup_message_key(self, msg: Any) -> Any:
            return None

    def refuse(msg: Any, conn: FakeConn) -> Any:
        raise PermanentFailure("bad")

    world = World(permanent_failure="ack")
    assert Keyless(world.config, refuse)(ClassicMessage("m1")) is SUCCESS
    assert world.db.committed == [] and world.status("m1") is None
    assert world.metrics.outcomes == [Outcome.PERMANENT_FAILURE]
