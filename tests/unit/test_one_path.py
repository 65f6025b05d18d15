"""One decision path: a message taken alone (``listener(msg)``, the strategy's single-message
path) and the same message in a batch (``consume_each([msg])``, the template's batch path) get
the same answer, the same handler runs, the same record and the same metrics, for every case of
tests/shared/decision_cases.py and every store outcome."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupElement,
    DedupStatus,
    MemoryDedupStore,
    PermanentFailure,
)
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.owner import fingerprint_of, with_fingerprint
from rocketmq_dedup.stores.base import Claim, ClaimResult, DedupStore, Record
from rocketmq_dedup.strategy.rules import KeyRefused, key_text
from rocketmq_dedup.testing import ClassicMessage
from tests.shared.decision_cases import BASE_EXCEPTIONS, REFUSED_KEYS, RETURN_VALUES, VALUE_KEYS
from tests.support import wait_for

TOPIC, TAG, MSG_ID = "TEST-TOPIC", "TagA", "m1"


class Recorder(DedupMetrics):
    """Every call, in order (``handled`` is the default: its three calls)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[Any, ...]] = []

    def message(self, decision: Decision) -> None:
        ran = decision.handler_seconds is not None
        self.calls.append(("message", decision.topic, decision.outcome, ran))

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.calls.append(("store", op, ok))


class Listener(DedupConcurrentListener):
    """``result`` (a value, or a callable of the message) and ``key``; counts handler runs."""

    def __init__(self, config: DedupConfig, case: Case) -> None:
        super().__init__(config)
        self.case = case
        self.runs = 0
        self.duplicates: List[DedupStatus] = []

    def dedup_message_key(self, msg: Any) -> Any:
        key = self.case.key
        if isinstance(key, type) and issubclass(key, BaseException):
            raise key("no key")
        return key

    def do_handle_msg(self, msg: Any) -> Any:
        self.runs += 1
        result = self.case.result
        if isinstance(result, type) and issubclass(result, BaseException):
            raise result()
        return result


class Hooked(Listener):
    """With ``on_duplicate`` and ``payload_fingerprint`` (the body)."""

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:
        self.duplicates.append(status)

    def payload_fingerprint(self, msg: Any) -> Any:
        return msg.body


class Unreadable(MemoryDedupStore):
    """Refuses every claim with a record this library cannot read."""

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return ClaimResult(False, Record(None, "someone"))


class Failing(MemoryDedupStore):
    """One operation fails: an outage (a refused connection) or a defect (anything else)."""

    outage_errors = (ConnectionRefusedError,)

    def __init__(self, op: str, error: type) -> None:
        super().__init__()
        self.op, self.error = op, error

    def _fail(self, op: str) -> None:
        if op == self.op:
            raise self.error(f"{op} failed")

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        self._fail("claim")
        return super().do_claim(claim, lease_ms)

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self._fail("mark")
        super().do_mark_consumed(claim, retention_ms)

    def do_release(self, claim: Claim) -> bool:
        self._fail("release")
        return super().do_release(claim)

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        self._fail("mark_failed")
        super().do_mark_failed(claim, retention_ms, reason)


def element(app: str, key: str = MSG_ID) -> DedupElement:
    return DedupElement(app, TOPIC, TAG, key)


def _key_text(key: Any) -> str:
    """The text a case's key is stored under (the message id for one that is not stored)."""
    if key is None or isinstance(key, type):
        return MSG_ID
    try:
        return key_text(key) or MSG_ID
    except KeyRefused:
        return MSG_ID


@dataclass
class Case:
    """A message, its listener's behaviour, the store and what is in it already."""

    result: Any = True
    key: Any = MSG_ID
    store: Callable[[], DedupStore] = MemoryDedupStore
    before: Optional[str] = None
    """A record of another attempt: "consuming", "consumed", "failed", a "lapsed" claim (its
    lease over, never settled), or consumed with the "same payload" or an "other payload"."""
    hooked: bool = False
    options: Dict[str, Any] = field(default_factory=dict)


def prepare(case: Case, app: str, metrics: Optional[Recorder]) -> Tuple[Listener, DedupStore]:
    store = case.store()
    if case.before is not None:
        owner = "another"
        if case.before.endswith("payload"):  # the first copy's, with its payload's fingerprint
            body = b"pay 10" if case.before == "same payload" else b"pay 99"
            owner = with_fingerprint(owner, fingerprint_of(body))
        claim = Claim(element(app), owner)
        lapsed = case.before == "lapsed"
        assert store.claim(claim, 1 if lapsed else 60_000).claimed
        if lapsed:
            wait_for(lambda: store.read(element(app)) is None)
        elif case.before == "failed":
            store.mark_failed(claim, 60_000, "it never will")
        elif case.before != "consuming":
            store.mark_consumed(claim, 60_000)
    config = DedupConfig.enable_dedup_consume_config(app, store, metrics=metrics, **case.options)
    return (Hooked if case.hooked else Listener)(config, case), store


def consume(listener: Listener, single: bool) -> ConsumeStatus:
    """One message through one path, on a thread of its own (as a client calls)."""
    msg = ClassicMessage(MSG_ID, body=b"pay 10")
    answers: List[ConsumeStatus] = []

    def work() -> None:
        if single:
            answers.append(listener(msg))
        else:
            answers.extend(listener.consume_each([msg]))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    assert len(answers) == 1
    return answers[0]


def outcome_of(case: Case, app: str, single: bool, metrics: bool) -> Tuple[Any, ...]:
    """Everything the path decided: answer, handler runs, duplicate hook calls, the record left
    (read when the store can), and the metrics calls."""
    recorder = Recorder() if metrics else None
    listener, store = prepare(case, app, recorder)
    answer = consume(listener, single)
    record = store.read(element(app, _key_text(case.key)))
    left = (record.status, record.reason) if record is not None else None
    calls = recorder.calls if recorder is not None else None
    return answer, listener.runs, listener.duplicates, left, calls


OUTAGE, DEFECT = ConnectionRefusedError, TypeError

CASES: Dict[str, Case] = {
    **{f"returns {value!r}": Case(result=value) for value, _ in RETURN_VALUES},
    **{f"returns {value!r}": Case(result=value) for value in (1, "ok", [True], object())},
    **{f"raises {exc.__name__}": Case(result=exc) for exc in (ValueError, *BASE_EXCEPTIONS)},
    **{f"key {key!r}": Case(key=key) for key in VALUE_KEYS},
    **{f"refused key {key!r}": Case(key=key) for key in REFUSED_KEYS},
    "key None": Case(key=None),
    "key ''": Case(key=""),
    "key raises": Case(key=ValueError),
    "duplicate of CONSUMED": Case(before="consumed"),
    "duplicate in progress": Case(before="consuming"),
    "duplicate, hooked": Case(before="consumed", hooked=True),
    "in progress, hooked": Case(before="consuming", hooked=True),
    "same payload": Case(before="same payload", hooked=True),
    "other payload, warn": Case(before="other payload", hooked=True),
    "other payload, reject": Case(
        before="other payload", hooked=True, options={"payload_mismatch": "reject"}
    ),
    "unreadable record": Case(store=Unreadable),
    "claim outage, consume": Case(store=lambda: Failing("claim", OUTAGE)),
    "claim outage, later": Case(
        store=lambda: Failing("claim", OUTAGE), options={"store_failure_policy": "reconsume_later"}
    ),
    "claim defect": Case(store=lambda: Failing("claim", DEFECT)),
    "mark fails": Case(store=lambda: Failing("mark", OUTAGE)),
    "release fails": Case(result=False, store=lambda: Failing("release", OUTAGE)),
    "local retries": Case(
        result=False, options={"local_retries": 1, "local_retry_backoff_milli_seconds": 1}
    ),
    "no lease renewal": Case(options={"lease_renewal": False}),
    "raises PermanentFailure": Case(result=PermanentFailure),
    "returns PermanentFailure": Case(result=PermanentFailure("bad payload")),
    "PermanentFailure, ack": Case(result=PermanentFailure, options={"permanent_failure": "ack"}),
    "PermanentFailure, no key": Case(result=PermanentFailure, key=None),
    "PermanentFailure, local retries": Case(
        result=PermanentFailure,
        options={"local_retries": 2, "local_retry_backoff_milli_seconds": 1},
    ),
    "PermanentFailure, record fails": Case(
        result=PermanentFailure, store=lambda: Failing("mark_failed", OUTAGE)
    ),
    "duplicate of FAILED": Case(before="failed", hooked=True),
    "duplicate of FAILED, ack": Case(before="failed", options={"permanent_failure": "ack"}),
    "lapsed once, not parked": Case(before="lapsed", options={"max_lapsed_claims": 2}),
    "lapsed, parked": Case(before="lapsed", options={"max_lapsed_claims": 1}),
    "lapsed, parked, ack": Case(
        before="lapsed", options={"max_lapsed_claims": 1, "permanent_failure": "ack"}
    ),
    "lapsed, counting off": Case(before="lapsed"),
}


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics", "no-metrics"])
@pytest.mark.parametrize("name", list(CASES))
def test_one_message_alone_and_in_a_batch_is_decided_and_reported_alike(
    app_name: str, name: str, metrics: bool
) -> None:
    """The single-message path and the batch path: the same answer, handler runs, hook calls,
    record and metrics calls (in the same order)."""
    case = CASES[name]
    alone = outcome_of(case, f"{app_name}-alone", single=True, metrics=metrics)
    batched = outcome_of(case, f"{app_name}-batched", single=False, metrics=metrics)
    assert alone == batched


def test_the_comparison_sees_a_difference(app_name: str) -> None:
    """Control: two cases that differ (a handled message, a duplicate of one in progress)
    compare unequal on every part the test compares."""
    handled = outcome_of(Case(), app_name, single=True, metrics=True)
    twin = outcome_of(Case(before="consuming", hooked=True), f"{app_name}-2", True, True)
    assert all(a != b for a, b in zip(handled, twin, strict=True))


SUCCESS, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
FAILED = DedupStatus.FAILED
PARKED = "its handler ended 1 consumers (claims lapsed, never settled)"

#: What the permanent-failure and poison cases decide: the answer, handler runs, the record left
#: (status, reason), and the outcome reported.
FAILURE_CASES: Dict[str, Tuple[Any, ...]] = {
    "raises PermanentFailure": (LATER, 1, (FAILED, "PermanentFailure"), "permanent_failure"),
    "returns PermanentFailure": (LATER, 1, (FAILED, "bad payload"), "permanent_failure"),
    "PermanentFailure, ack": (SUCCESS, 1, (FAILED, "PermanentFailure"), "permanent_failure"),
    "PermanentFailure, no key": (LATER, 1, None, "permanent_failure"),
    "PermanentFailure, local retries": (
        LATER, 1, (FAILED, "PermanentFailure"), "permanent_failure",
    ),
    "PermanentFailure, record fails": (
        LATER, 1, (DedupStatus.CONSUMING, None), "permanent_failure",
    ),
    "duplicate of FAILED": (LATER, 0, (FAILED, "it never will"), "duplicate_failed"),
    "duplicate of FAILED, ack": (SUCCESS, 0, (FAILED, "it never will"), "duplicate_failed"),
    "lapsed once, not parked": (SUCCESS, 1, (DedupStatus.CONSUMED, None), "consumed"),
    "lapsed, parked": (LATER, 0, (FAILED, PARKED), "poison_parked"),
    "lapsed, parked, ack": (SUCCESS, 0, (FAILED, PARKED), "poison_parked"),
    "lapsed, counting off": (SUCCESS, 1, (DedupStatus.CONSUMED, None), "consumed"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FAILURE_CASES))
def test_a_message_that_can_never_succeed_is_recorded_failed_and_answered_by_the_setting(
    app_name: str, name: str
) -> None:
    """A permanent failure (raised or returned), a copy of a FAILED message and a message whose
    claims lapsed max_lapsed_claims times: the answer permanent_failure gives, the handler
    run at most once, the FAILED record with its reason, the outcome counted."""
    answer, runs, _, left, calls = outcome_of(CASES[name], app_name, single=True, metrics=True)
    decided = [call[2] for call in calls if call[0] == "message"]  # type: ignore[union-attr]
    assert (answer, runs, left, *[str(d) for d in decided]) == FAILURE_CASES[name]
