"""How a listener consumes messages: the entry points every strategy offers, the pass-through
strategy (dedup off), and the one consume template the dedup strategies share.

The template, per batch (:meth:`DedupTemplate.consume`)::

    key      each message's key -> its element (None/"" -> no dedup; refused/raised -> LATER)
    claim    the strategy's claim step (:meth:`DedupTemplate._claim`): decides what it can
             before any handler runs (duplicates, store outages) and returns the deliveries it
             now holds
    run      each message not decided yet, in order (:meth:`DedupTemplate._run`); a batch that
             stops at its first failure leaves the rest to the broker
    finish   whatever happened: the held deliveries are settled (:meth:`DedupTemplate._finish`)
    report   one decision per answered message to the metrics (the snapshot's meter)

A strategy may take one message through the same steps without the batch's lists (the plain
strategy's ``consume_one``). What is timed and reported is chosen once per settings change, by
the snapshot's :class:`~rocketmq_dedup.metrics.meter.Meter`, not branched on per message.

The decisions shared by both dedup strategies live here too: what a refusing record means
(:data:`DUPLICATE_ANSWERS`, :meth:`DedupTemplate._duplicate_status` with the payload check),
what a store outage does (:meth:`DedupTemplate._store_failed`), what a message that can never
succeed gets (:meth:`DedupTemplate._permanent_failure`, :meth:`DedupTemplate._park`: the
``permanent_failure`` setting, :data:`FAILED_ANSWERS`), hooks that raise, local retries.
"""

from __future__ import annotations

import logging
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import (
    PermanentFailure,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
)
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.message import DedupElement, message_topic, message_topic_tag
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.metrics.meter import StoreCall
from rocketmq_dedup.owner import fingerprint_in, fingerprint_of
from rocketmq_dedup.status import (
    ConsumeStatus,
    DedupStatus,
    Outcome,
    PayloadMismatch,
    PermanentFailurePolicy,
    StoreFailurePolicy,
)
from rocketmq_dedup.stores.base import Claim, DedupStore, Record, new_element
from rocketmq_dedup.strategy.rules import (
    LATER,
    SUCCESS,
    HandlerResult,
    KeyRefused,
    failure_reason,
    key_text,
    run_handler,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BatchResult(NamedTuple):
    """The outcome of a batch, as the Java listener reports it through ``ackIndex``."""

    status: ConsumeStatus
    """CONSUME_SUCCESS when every message was handled or was a consumed duplicate."""
    ack_index: int
    """Index of the last message of the consumed prefix; -1 when none was consumed."""

    @property
    def consumed(self) -> int:
        """How many messages, from the start of the batch, were consumed."""
        return self.ack_index + 1


class Strategy:
    """How a listener consumes messages. :meth:`consume` is the one decision path; a single
    message (:meth:`consume_one`) and a stop-at-first-failure batch (:meth:`consume_batch`) are
    its special cases."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    def consume(self, msgs: Sequence[Any], stop_at_failure: bool = False) -> List[ConsumeStatus]:
        """Consume ``msgs`` and return each one's status. With ``stop_at_failure``, messages
        after the first one not consumed are not handled (RECONSUME_LATER). Raises only what a
        handler raised that is not an ``Exception`` (KeyboardInterrupt, SystemExit,
        CancelledError), after cleaning up."""
        raise NotImplementedError

    def consume_one(self, msg: Any) -> ConsumeStatus:
        """Consume one message."""
        return self.consume((msg,))[0]

    def consume_batch(self, msgs: Iterable[Any]) -> BatchResult:
        """Consume ``msgs`` in order, stopping at the first message that is not consumed (the
        Java listener's batch semantics)."""
        statuses = self.consume(list(msgs), stop_at_failure=True)
        consumed = next((i for i, s in enumerate(statuses) if s is not SUCCESS), len(statuses))
        return BatchResult(SUCCESS if consumed == len(statuses) else LATER, consumed - 1)

    def close(self) -> None:
        """Stop background work (lease renewal)."""


class PassThroughStrategy(Strategy):
    """Dedup disabled: every message goes to the handler, no store I/O (local retries, when
    the config asks for them, still apply)."""

    def __init__(self, hooks: Hooks, config: Optional[DedupConfig] = None) -> None:
        super().__init__(hooks)
        self.config = config

    def consume(self, msgs: Sequence[Any], stop_at_failure: bool = False) -> List[ConsumeStatus]:
        snap = self.config.snapshot() if self.config is not None else None
        statuses = [LATER] * len(msgs)
        for i, msg in enumerate(msgs):
            statuses[i] = status = self._handle(msg, snap)
            if stop_at_failure and status is not SUCCESS:
                break
        return statuses

    def _handle(self, msg: Any, snap: Optional[Snapshot]) -> ConsumeStatus:
        result = run_handler(self.hooks.listener.do_handle_msg, msg)
        if result is not SUCCESS and snap is not None and snap.local_retries:
            result = retry_locally(
                lambda: run_handler(self.hooks.listener.do_handle_msg, msg), snap, result
            )
        if not isinstance(result, PermanentFailure):
            return result
        policy = snap.permanent_failure if snap is not None else PermanentFailurePolicy.DLQ
        logger.warning(
            "do_handle_msg declared a permanent failure (%s); dedup is off, so nothing is "
            "recorded: answered %s (permanent_failure=%r)",
            failure_reason(result),
            FAILED_ANSWERS[policy].name,
            policy.value,
        )
        return FAILED_ANSWERS[policy]


def retry_locally(
    attempt: Callable[[], HandlerResult], snap: Snapshot, result: HandlerResult
) -> HandlerResult:
    """Run ``attempt`` again after a failed one, up to ``snap.local_retries`` times, waiting
    ``local_retry_backoff_ms`` before the first retry and twice as long before each next one;
    the last answer (a permanent failure ends the retries: it would only fail again)."""
    if isinstance(result, PermanentFailure):
        return result
    backoff = snap.local_retry_backoff_ms / 1000
    for _ in range(snap.local_retries):
        time.sleep(backoff)
        backoff *= 2
        result = attempt()
        if result is SUCCESS or isinstance(result, PermanentFailure):
            break
    return result


class Delivery:
    """One message of a batch on its way through the template. The fields the template sets
    only for some messages default to None at class level."""

    element: Optional[DedupElement] = None
    """None: consumed without dedup."""
    claim: Optional[Claim] = None
    """Set while this delivery holds a claim."""
    attempt: Any = None
    """The strategy's in-process attempt, when it keeps one."""
    status: Optional[ConsumeStatus] = None
    """Decided without the handler."""
    outcome: Optional[Outcome] = None
    """For metrics; set once decided."""
    handler_seconds: Optional[float] = None
    """How long the handler ran (0.0 without metrics: the meter's clock reads 0)."""
    fingerprint: Optional[str] = None
    """The payload's, with payload_fingerprint."""
    failure: Optional[str] = None
    """The reason to record it FAILED with: a permanent failure its handler declared, or a
    poison message parked."""
    claim_seconds: Optional[float] = None
    mark_seconds: Optional[float] = None
    store_calls: Tuple[StoreCall, ...] = ()
    """The single-message path's store timings (the claim's and the mark's when they
    succeed, any other call as a record), kept by the meter and reported with the decision;
    a batch's are reported as they return."""

    def __init__(self, position: int, msg: Any, started: int = 0) -> None:
        self.position = position
        """In the batch, and so in the statuses."""
        self.msg = msg
        self.started = started
        """``time.time_ns()`` when it arrived, for metrics that want it; else 0."""


#: The answer to a message whose key has a live record of another attempt, by the record's
#: status: its outcome and what the broker is told. A status not in it (None: a record this
#: library cannot read) is for the strategy to decide.
DUPLICATE_ANSWERS: Dict[Optional[DedupStatus], Tuple[Outcome, ConsumeStatus]] = {
    DedupStatus.CONSUMED: (Outcome.DUPLICATE_CONSUMED, SUCCESS),
    DedupStatus.CONSUMING: (Outcome.DUPLICATE_IN_PROGRESS, LATER),
    DedupStatus.FAILED: (Outcome.DUPLICATE_FAILED, LATER),  # the answer: FAILED_ANSWERS
}

#: (an enum member read from a module global: a class attribute read costs more, on the path of
#: every duplicate)
_FAILED = DedupStatus.FAILED

#: What a message that can never succeed is answered (recorded FAILED, and every copy of it
#: after), by the ``permanent_failure`` setting.
FAILED_ANSWERS: Dict[PermanentFailurePolicy, ConsumeStatus] = {
    PermanentFailurePolicy.DLQ: LATER,
    PermanentFailurePolicy.ACK: SUCCESS,
}


class DedupTemplate(Strategy):
    """The consume template of the dedup strategies (module docstring): subclasses supply the
    claim, run and finish steps."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        super().__init__(hooks)
        if config.store is None:
            raise ValueError(f"{type(self).__name__} needs a config with a store")
        self.config = config
        self.store: DedupStore = config.store
        self._log = RateLimitedLog(logger)

    def consume(self, msgs: Sequence[Any], stop_at_failure: bool = False) -> List[ConsumeStatus]:
        snap = self.config.snapshot()
        started = snap.meter.arrival()
        deliveries = [Delivery(i, msg, started) for i, msg in enumerate(msgs)]
        keyed = [d for d in deliveries if self._key(d, snap)]
        held = self._claim(keyed, snap) if keyed else []
        statuses: List[ConsumeStatus] = []
        try:
            for delivery in deliveries:
                status = delivery.status
                if status is None:
                    status = self._run(delivery, snap)
                statuses.append(status)
                if stop_at_failure and status is not SUCCESS:
                    break
        finally:  # whatever happened, nothing stays held by this call
            if held:
                self._finish(held, statuses, snap)
            # those after a batch's first failure are counted when they come back
            snap.meter.report(deliveries[: len(statuses)])
        if len(statuses) < len(deliveries):  # stopped at a failure
            statuses += [LATER] * (len(deliveries) - len(statuses))
        return statuses

    # -- the steps the strategies supply -------------------------------------------------

    def _claim(self, keyed: List[Delivery], snap: Snapshot) -> List[Delivery]:
        """Decide what can be decided before any handler runs (``delivery.status``); return
        the deliveries this call now holds (settled by :meth:`_finish`)."""
        raise NotImplementedError

    def _run(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        """Handle one delivery not decided by the claim step."""
        raise NotImplementedError

    def _finish(self, held: List[Delivery], statuses: List[ConsumeStatus], snap: Snapshot) -> None:
        """Settle the held deliveries; ``statuses`` holds the answers of the deliveries
        reached (a stopped batch reached fewer). Never raises a StoreError."""
        raise NotImplementedError

    # -- the key step ----------------------------------------------------------------------

    def _key(self, delivery: Delivery, snap: Snapshot) -> bool:
        """Set ``delivery.element`` (the key as text: :func:`key_text`) and return True;
        False when the message is consumed without dedup (no key, or an empty one: outcome
        NO_KEY) or is decided (a refused key, a hook that raised: status LATER)."""
        msg = delivery.msg
        try:
            raw = self.hooks.key_of(msg)
            key = raw if type(raw) is str or raw is None else key_text(raw)
        except KeyRefused as exc:
            self._log.log(logging.ERROR, "dedup_message_key: %s; consume later", exc)
            delivery.status, delivery.outcome = LATER, Outcome.KEY_ERROR
            return False
        except Exception:
            return self._hook_failed(delivery, "dedup_message_key")
        if not key:
            if key is None:
                logger.debug("dedup key is None; consuming without dedup")
            else:
                self._log.log(
                    logging.WARNING,
                    "dedup key is empty for a message of topic %r; consuming without dedup",
                    message_topic(msg),
                )
            delivery.outcome = Outcome.NO_KEY
            return False
        if self.hooks.payload_of is not None and not self._fingerprint(delivery):
            return False
        topic, tag = message_topic_tag(msg)
        delivery.element = new_element(snap.application_name, topic, tag, key)
        return True

    def _fingerprint(self, delivery: Delivery) -> bool:
        """Fingerprint the payload (listeners that define ``payload_fingerprint``); False
        when the hook raised (the message is then decided)."""
        try:
            payload = _payload_bytes(self.hooks.payload_of(delivery.msg))  # type: ignore[misc]
        except Exception:
            return self._hook_failed(delivery, "payload_fingerprint")
        if payload is not None:
            delivery.fingerprint = fingerprint_of(payload)
        return True

    def _hook_failed(self, delivery: Delivery, hook: str) -> bool:
        """A listener method that derives a message's key (or payload fingerprint, or sequence
        key) raised: logged, and the message answered RECONSUME_LATER. Returns False."""
        self._log.log(
            logging.ERROR, "%s raised; the message will be consumed later", hook, exc_info=True
        )
        delivery.status, delivery.outcome = LATER, Outcome.KEY_ERROR
        return False

    # -- shared decisions ----------------------------------------------------------------

    def _store_failed(self, deliveries: List[Delivery], exc: StoreError, snap: Snapshot) -> None:
        """The store could not decide for ``deliveries``: an outage applies the policy (run
        without dedup, or RECONSUME_LATER: :meth:`_outage_runs_without_dedup`); a refusal a
        person must fix (a missing privilege, a read-only server) and a defect are
        RECONSUME_LATER, logged as errors; a lock conflict is RECONSUME_LATER, logged as what it
        is (another session held the record's lock)."""
        if isinstance(exc, StoreLockConflictError):
            self._log.log(
                logging.WARNING,
                "a dedup store statement timed out waiting for a lock or lost a deadlock (%s); "
                "%d message(s) will be consumed later",
                exc,
                len(deliveries),
            )
            for delivery in deliveries:
                delivery.status, delivery.outcome = LATER, Outcome.LOCK_CONFLICT
            return
        outcome = Outcome.STORE_ERROR_LATER
        if isinstance(exc, StoreMisconfiguredError):
            outcome = Outcome.STORE_MISCONFIGURED
            self._log.log(
                logging.ERROR,
                "the dedup store refused the operation: %s; %d message(s) will be consumed "
                "later (a configuration a person must fix, not an outage: never consumed "
                "without dedup)",
                exc,
                len(deliveries),
            )
        elif not isinstance(exc, StoreUnavailableError):
            self._log.log(
                logging.ERROR,
                "dedup store error (%s); %d message(s) will be consumed later",
                exc,
                len(deliveries),
                exc_info=exc,
            )
        elif self._outage_runs_without_dedup(snap):
            self._log.log(
                logging.WARNING,
                "dedup store unavailable (%s); consuming %d message(s) WITHOUT dedup "
                "(store_failure_policy='consume')",
                exc,
                len(deliveries),
            )
            for delivery in deliveries:
                delivery.element, delivery.outcome = None, Outcome.STORE_ERROR_CONSUMED
            return
        else:
            self._log.log(
                logging.WARNING,
                "dedup store unavailable (%s); %d message(s) will be consumed later (%s)",
                exc,
                len(deliveries),
                self._OUTAGE_LATER_REASON,
            )
        for delivery in deliveries:
            delivery.status, delivery.outcome = LATER, outcome

    #: Why an outage is answered RECONSUME_LATER, for the log line.
    _OUTAGE_LATER_REASON = "store_failure_policy='reconsume_later'"

    def _outage_runs_without_dedup(self, snap: Snapshot) -> bool:
        """Whether a store outage runs the handlers without dedup (``store_failure_policy``)."""
        return snap.store_failure_policy is StoreFailurePolicy.CONSUME

    def _duplicate_status(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> Optional[ConsumeStatus]:
        """The answer for a message whose key has a live ``record`` of another attempt
        (:data:`DUPLICATE_ANSWERS`, after the payload check); None means "run the handler
        without dedup" (a record this library cannot read, as the Java original does)."""
        status = record.status if record is not None else None
        if status not in DUPLICATE_ANSWERS:
            self._log.log(
                logging.WARNING,
                "%r has a record this library cannot read; consuming without dedup",
                delivery.element,
            )
            delivery.outcome = Outcome.STORE_ERROR_CONSUMED
            return None
        if delivery.fingerprint is not None and _payload_differs(delivery, record):
            return self._payload_mismatch(delivery, status, snap)  # type: ignore[arg-type]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%r: a duplicate of a %s record", delivery.element, status)
        return self._duplicate(delivery, status, snap)  # type: ignore[arg-type]

    def _payload_mismatch(
        self, delivery: Delivery, status: DedupStatus, snap: Snapshot
    ) -> ConsumeStatus:
        """A duplicate key whose payload differs from the first copy's: a producer bug. Logged
        (and counted); with ``payload_mismatch="reject"`` answered RECONSUME_LATER so that it
        ends in the DLQ for a human to look at, else answered as the duplicate it claims to be.
        """
        reject = snap.payload_mismatch is PayloadMismatch.REJECT
        self._log.log(
            logging.WARNING,
            "%r: a duplicate key with a different payload (a producer reusing a key?); %s",
            delivery.element,
            "consume later (payload_mismatch='reject')" if reject else "treated as a duplicate",
        )
        answer = LATER if reject else self._duplicate(delivery, status, snap)
        delivery.outcome = Outcome.PAYLOAD_MISMATCH
        return answer

    def _duplicate(self, delivery: Delivery, status: DedupStatus, snap: Snapshot) -> ConsumeStatus:
        """A duplicate answered without its handler (:data:`DUPLICATE_ANSWERS`): acked when
        its twin is CONSUMED, RECONSUME_LATER when it is CONSUMING, and a copy of a FAILED
        message as ``permanent_failure`` says (:data:`FAILED_ANSWERS`). Calls the listener's
        ``on_duplicate`` (its exceptions are logged, no more)."""
        delivery.outcome, answer = DUPLICATE_ANSWERS[status]
        if status is _FAILED:
            answer = FAILED_ANSWERS[snap.permanent_failure]
        on_duplicate = self.hooks.on_duplicate
        if on_duplicate is not None:
            try:
                on_duplicate(delivery.msg, status)
            except Exception:
                self._log.log(logging.ERROR, "on_duplicate raised; ignored", exc_info=True)
        return answer

    def _permanent_failure(
        self, delivery: Delivery, failure: PermanentFailure, snap: Snapshot
    ) -> ConsumeStatus:
        """The handler declared that its message can never succeed: to be recorded FAILED
        with the reason (by the strategy's finish step, when it holds a claim), logged,
        counted, and answered as ``permanent_failure`` says (:data:`FAILED_ANSWERS`)."""
        delivery.failure = failure_reason(failure)
        delivery.outcome = Outcome.PERMANENT_FAILURE
        answer = FAILED_ANSWERS[snap.permanent_failure]
        self._log.log(
            logging.WARNING,
            "%r: do_handle_msg declared a permanent failure (%s); answered %s, without "
            "retries (permanent_failure=%r)",
            delivery.element or message_topic(delivery.msg),
            delivery.failure,
            answer.name,
            snap.permanent_failure.value,
        )
        return answer

    def _park(self, delivery: Delivery, lapsed: int, snap: Snapshot) -> bool:
        """Whether a message claimed after ``lapsed`` claims of it lapsed with their consumer
        gone is parked (``max_lapsed_claims``: its handler kills its consumer): then it is to be
        recorded FAILED, logged, counted and answered as ``permanent_failure`` says, and its
        handler does not run again."""
        most = snap.max_lapsed_claims
        if not most or lapsed < most:
            return False
        delivery.failure = f"its handler ended {lapsed} consumers (claims lapsed, never settled)"
        delivery.outcome = Outcome.POISON_PARKED
        delivery.status = answer = FAILED_ANSWERS[snap.permanent_failure]
        self._log.log(
            logging.ERROR,
            "%r: a poison message: %s; parked (recorded FAILED, not run again: "
            "max_lapsed_claims=%d), answered %s (permanent_failure=%r)",
            delivery.element,
            delivery.failure,
            most,
            answer.name,
            snap.permanent_failure.value,
        )
        return True

    # -- metrics -------------------------------------------------------------------------

    def _store_call(self, snap: Snapshot, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a store call for several messages (or none), timed and reported by
        the snapshot's meter."""
        return snap.meter.store_call(op, fn, *args)


def _payload_differs(delivery: Delivery, record: Optional[Record]) -> bool:
    """Whether the refusing record's owner carries another payload's fingerprint."""
    theirs = fingerprint_in(record.owner if record is not None else None)
    return theirs is not None and theirs != delivery.fingerprint


def _payload_bytes(value: Any) -> Optional[bytes]:
    """A payload fingerprint's input as bytes (None: no check for this message)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return bytes(value)
