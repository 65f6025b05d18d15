"""Deduplicated calls without a server: what a store outage, a refusal, metrics, a disabled
config and a misused block do, and the exactly-once form on the fake transaction port (the
real port: tests/integration/exactly_once/test_exactly_once_calls.py)."""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Tuple

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rocketmq_dedup import (
    DedupConfig,
    DedupConfigError,
    DedupElement,
    DedupStatus,
    DuplicateConsumedError,
    DuplicateError,
    DuplicateInProgressError,
    MemoryDedupStore,
    StoreMisconfiguredError,
    StoreUnavailableError,
    TransactionMisuseError,
    deduplicated,
    exactly_once,
)
from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.once import block as block_module
from rocketmq_dedup.status import Outcome
from rocketmq_dedup.stores.base import Claim, ClaimResult
from rocketmq_dedup.testing import ManualClock
from tests.unit.fake_transactions import FakeTransactionalStore

CLOSED_PORT = 1  # nothing listens on 127.0.0.1:1


def unreachable(policy: str) -> DedupConfig:
    client = redis.Redis(port=CLOSED_PORT, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    return DedupConfig.enable_dedup_consume_config(
        "app", client, check_store=False, store_failure_policy=policy
    )


class Refusing(MemoryDedupStore):
    """A store whose server refuses every claim (a missing privilege)."""

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        raise PermissionError("INSERT command denied")

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        return "GRANT INSERT" if isinstance(exc, PermissionError) else None


class Outcomes(DedupMetrics):
    def __init__(self) -> None:
        self.decisions: List[Tuple[str, str, Outcome, Optional[float]]] = []
        self.ops: List[Tuple[StoreOp, bool]] = []

    def message(self, decision: Decision) -> None:
        self.decisions.append(
            (decision.application, decision.topic, decision.outcome, decision.handler_seconds)
        )

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        self.ops.append((op, ok))


# -- outages and refusals ------------------------------------------------------------------------


def test_an_outage_runs_the_call_without_dedup_under_the_consume_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """store_failure_policy="consume" (the default): the store unreachable, the block runs
    without dedup (run.dedup False) and a warning says so; so does the function."""
    config = unreachable("consume")
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"), config.once("k") as run:
        assert run and not run.dedup
    assert any("WITHOUT dedup" in r.getMessage() for r in caplog.records)

    @deduplicated(config, key=lambda k: k)
    def work(k: str) -> str:
        return k

    assert work("k") == work("k") == "k"


def test_an_outage_raises_the_store_error_under_the_reconsume_later_policy() -> None:
    """store_failure_policy="reconsume_later": nothing runs, the caller gets the
    StoreUnavailableError (try again later)."""
    config = unreachable("reconsume_later")
    ran: List[str] = []
    with pytest.raises(StoreUnavailableError), config.once("k"):
        ran.append("block")

    @deduplicated(config, key=lambda k: k)
    def work(k: str) -> None:
        ran.append("function")

    with pytest.raises(StoreUnavailableError):
        work("k")
    assert ran == []


def test_a_refusing_store_never_runs_the_call_whatever_the_policy() -> None:
    """A store that refuses (a missing privilege): StoreMisconfiguredError, nothing runs,
    under the consume policy too (never a run without dedup)."""
    config = DedupConfig.enable_dedup_consume_config("app", Refusing(), check_store=False)
    with pytest.raises(StoreMisconfiguredError, match="GRANT INSERT"), config.once("k"):
        pytest.fail("ran")


# -- metrics, a disabled config, misuse ---------------------------------------------------------


def test_each_call_is_one_decision_in_the_metrics() -> None:
    """Metrics see a call as a message of its topic: consumed (with its body's time and the
    claim and mark), duplicate_consumed, failed, duplicate_in_progress."""
    metrics = Outcomes()
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore(), metrics=metrics)
    with config.once("k", topic="steps") as run:
        assert run
    with config.once("k", topic="steps") as run:
        assert not run
    with pytest.raises(ValueError), config.once("bad", topic="steps"):
        raise ValueError
    with config.once("busy", topic="steps") as run:
        assert run
        with pytest.raises(DuplicateInProgressError), config.once("busy", topic="steps"):
            pass
    outcomes = [(app, topic, outcome) for app, topic, outcome, _ in metrics.decisions]
    assert outcomes == [
        ("app", "steps", Outcome.CONSUMED),
        ("app", "steps", Outcome.DUPLICATE_CONSUMED),
        ("app", "steps", Outcome.FAILED),
        ("app", "steps", Outcome.DUPLICATE_IN_PROGRESS),
        ("app", "steps", Outcome.CONSUMED),
    ]
    assert metrics.decisions[0][3] is not None  # the body's time
    assert (StoreOp.MARK_CONSUMED, True) in metrics.ops and (StoreOp.RELEASE, True) in metrics.ops


def test_a_disabled_config_runs_every_call() -> None:
    """Dedup disabled: every block and every call runs, nothing is recorded."""
    config = DedupConfig.disable_dedup_consume_config("app")
    for _ in range(2):
        with config.once("k") as run:
            assert run and not run.dedup

    @deduplicated(config, key=lambda k: k)
    def work(k: str) -> str:
        return k

    assert [work("k"), work("k")] == ["k", "k"]


def test_a_fresh_body_that_never_tests_run_is_warned_about(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh block whose body never tested ``run`` works, and a WARNING says that on a
    duplicate it would redo its work."""
    monkeypatch.setattr(block_module, "_log", RateLimitedLog(block_module.logger))
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"), config.once("k"):
        pass
    assert any("never tested its `run`" in r.getMessage() for r in caplog.records)


def test_a_block_is_entered_once() -> None:
    """A Once object is one block: entering it again is a usage error."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    block = config.once("k")
    with block as run:
        assert run
    with pytest.raises(TypeError, match="entered once"), block:
        pass


def test_bad_arguments_are_refused_when_the_call_is_made() -> None:
    """A payload that is not bytes or str, a wait that is not a duration, a key that is not a
    callable, a config that is not one: refused with a clear error before any store I/O."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    with pytest.raises(TypeError, match="payload"):
        config.once("k", payload={"amount": 1})
    with pytest.raises(DedupConfigError, match="in_progress_wait"):
        config.once("k", in_progress_wait_milli_seconds=-1)
    with pytest.raises(DedupConfigError, match="callable"):
        deduplicated(config, key="order_id")
    undecorated = deduplicated(object(), key=len)(len)
    with pytest.raises(DedupConfigError, match="DedupConfig"):
        undecorated("x")


def test_an_async_function_is_refused_by_the_sync_decorator() -> None:
    """``async def`` under the sync decorators (a sync store would block the event loop):
    DedupConfigError naming the function and the asyncio stores."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())

    async def work(k: str) -> None:
        pass

    with pytest.raises(DedupConfigError, match="async def"):
        deduplicated(config, key=lambda k: k)(work)


# -- the exactly-once form on the fake port --------------------------------------------------------


def fake_config(**options: Any) -> Tuple[DedupConfig, FakeTransactionalStore]:
    store = FakeTransactionalStore()
    return DedupConfig.enable_dedup_consume_config("app", store, **options), store


def test_an_exactly_once_function_commits_its_writes_with_its_record() -> None:
    """The function's writes through conn and its record commit together; its value is
    returned; a second call with the key is a DuplicateConsumedError without a transaction."""
    config, store = fake_config()

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> str:
        conn.write(f"paid {order}")
        return "ok"

    assert pay("o1") == "ok"
    assert store.transactions.committed == ["paid o1"]
    assert store.get_status(DedupElement("app", pay_topic(pay), "", "o1")) is (DedupStatus.CONSUMED)
    with pytest.raises(DuplicateConsumedError):
        pay("o1")
    assert store.transactions.committed == ["paid o1"]


def pay_topic(fn: Any) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def test_an_exactly_once_function_that_raises_commits_nothing_and_reraises() -> None:
    """An exception: the transaction rolls back (its writes never commit), no record, the
    exception propagates unchanged (and is not logged as a failed handler); the next call
    commits."""
    config, store = fake_config()
    calls: List[int] = []

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        calls.append(1)
        conn.write(f"paid {order}")
        if len(calls) == 1:
            raise LookupError("no such order")

    with pytest.raises(LookupError, match="no such order"):
        pay("o1")
    assert store.transactions.committed == []
    pay("o1")
    assert store.transactions.committed == ["paid o1"]


def test_an_exactly_once_function_that_breaks_its_transaction_is_rolled_back() -> None:
    """A function that ended or left its transaction (conn.commit(), autocommit): rolled
    back, TransactionMisuseError."""
    config, store = fake_config()

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        conn.write("paid")
        conn.misuse = "called commit() on its connection"

    with pytest.raises(TransactionMisuseError):
        pay("o1")
    assert store.transactions.committed == []


def test_an_exactly_once_key_locked_elsewhere_is_in_progress() -> None:
    """exactly_once_claim="before_handler": another transaction holds the key's lock ->
    DuplicateInProgressError, nothing run; once it lets go, the call commits."""
    config, store = fake_config(exactly_once_claim="before_handler")
    ran: List[str] = []

    @exactly_once(config, key=lambda order: order, topic="pay")
    def pay(conn: Any, order: str) -> None:
        ran.append(order)

    element = DedupElement("app", "pay", "", "o1")
    store.transactions.hold_key(element)
    with pytest.raises(DuplicateInProgressError):
        pay("o1")
    del store.transactions.key_locks[element]
    pay("o1")
    assert ran == ["o1"]


def test_an_exactly_once_store_failure_raises_whatever_the_policy() -> None:
    """A transaction that cannot begin (the database down): the StoreUnavailableError, under
    the consume policy too (the function needs that database)."""
    config, store = fake_config(store_failure_policy="consume")
    store.transactions.fail["begin"] = StoreUnavailableError("database down")

    @exactly_once(config, key=lambda order: order)
    def pay(conn: Any, order: str) -> None:
        pytest.fail("ran without its database")

    with pytest.raises(StoreUnavailableError, match="database down"):
        pay("o1")


def test_exactly_once_needs_a_store_with_transactions() -> None:
    """A config whose store has no transaction port (memory, Redis): refused when the
    function is decorated."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    with pytest.raises(DedupConfigError, match="transactions"):
        exactly_once(config, key=lambda order: order)


def test_a_callable_object_is_deduplicated_under_its_class_name() -> None:
    """A callable object (no __qualname__ of its own, e.g. a handler class instance) is
    decorated; its records' topic is its class's module and qualified name."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())

    class Handler:
        def __call__(self, order: str) -> str:
            return order

    handle = deduplicated(config, key=lambda order: order)(Handler())
    assert handle("o1") == "o1"
    topic = f"{Handler.__module__}.{Handler.__qualname__}"
    assert config.persist is not None
    assert config.persist.get_status(DedupElement("app", topic, "", "o1")) is DedupStatus.CONSUMED


def test_a_call_on_a_failed_key_raises_and_runs_nothing() -> None:
    """A key recorded FAILED (a listener's PermanentFailure) is not run by a call: it raises a
    DuplicateError saying so (before: a StoreError saying the record could not be read)."""
    store = MemoryDedupStore()
    config = DedupConfig.enable_dedup_consume_config("app", store)
    element = DedupElement("app", "once", "", "k")
    store.mark_failed(Claim(element, "other"), 60_000, "bad payload")
    with pytest.raises(DuplicateError, match="is FAILED") as raised, config.once("k"):
        pytest.fail("the body ran")
    assert raised.value.record.status is DedupStatus.FAILED


def test_a_call_whose_claims_lapsed_too_often_is_parked() -> None:
    """With max_lapsed_claims=1 a call that finds one lapsed claim of its key (a caller
    killed in it) does not run: its key is recorded FAILED and it raises DuplicateError."""
    clock = ManualClock()
    store = MemoryDedupStore(clock=clock)
    config = DedupConfig.enable_dedup_consume_config("app", store, max_lapsed_claims=1)
    element = DedupElement("app", "once", "", "k")
    assert store.claim(Claim(element, "killed"), 1_000).claimed
    clock.advance(2)
    with pytest.raises(DuplicateError, match="ended 1 consumers"), config.once("k"):
        pytest.fail("the body ran")
    record = store.read(element)
    assert record is not None and record.status is DedupStatus.FAILED
