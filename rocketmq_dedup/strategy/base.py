"""How a listener consumes messages: the entry points every strategy offers, the pass-through
strategy (dedup off), and the one consume template the dedup strategies share.

The template, per batch (one message is a batch of one)::

    key      each message's key -> its element (None/"" -> no dedup; refused/raised -> LATER)
    claim    the strategy's claim step (:meth:`DedupTemplate._claim`): decides what it can
             before any handler runs (duplicates, store outages) and returns the deliveries it
             now holds
    run      each message not decided yet, in order (:meth:`DedupTemplate._run`); a batch that
             stops at its first failure leaves the rest to the broker
    finish   whatever happened: the held deliveries are settled (:meth:`DedupTemplate._finish`)
    report   one decision per answered message to the metrics, if any

The decisions shared by both dedup strategies live here too: what a refusing record means
(:meth:`DedupTemplate._duplicate_status`, with the payload check), what a store outage does
(:meth:`DedupTemplate._store_failed`), hooks that raise, local retries, metrics.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Sequence, TypeVar

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import StoreError, StoreUnavailableError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.message import DedupElement, message_topic, message_topic_tag
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.owner import fingerprint_in, fingerprint_of
from rocketmq_dedup.status import (
    ConsumeStatus,
    DedupStatus,
    Outcome,
    PayloadMismatch,
    StoreFailurePolicy,
)
from rocketmq_dedup.stores.base import Claim, DedupStore, Record
from rocketmq_dedup.strategy.rules import LATER, SUCCESS, KeyRefused, key_text, run_handler

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
        status = run_handler(self.hooks.listener.do_handle_msg, msg)
        if status is SUCCESS or snap is None or not snap.local_retries:
            return status
        return retry_locally(
            lambda: run_handler(self.hooks.listener.do_handle_msg, msg), snap, status
        )


def retry_locally(
    attempt: Callable[[], ConsumeStatus], snap: Snapshot, status: ConsumeStatus
) -> ConsumeStatus:
    """Run ``attempt`` again after a failed one, up to ``snap.local_retries`` times, waiting
    ``local_retry_backoff_ms`` before the first retry and twice as long before each next one;
    the last answer."""
    backoff = snap.local_retry_backoff_ms / 1000
    for _ in range(snap.local_retries):
        time.sleep(backoff)
        backoff *= 2
        status = attempt()
        if status is SUCCESS:
            break
    return status


class Delivery:
    """One message of a batch on its way through the template. The fields the template sets
    only for some messages default to None at class level, so making one sets two."""

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
    """Timed only with metrics."""
    fingerprint: Optional[str] = None
    """The payload's, with payload_fingerprint."""
    started: int = 0
    """``time.time_ns()`` when it arrived (with metrics that want it)."""

    position: int = 0
    """In the batch, and so in the statuses."""

    def __init__(self, position: int, msg: Any) -> None:
        self.position = position
        self.msg = msg


class DedupTemplate(Strategy):
    """The consume template of the dedup strategies (module docstring): subclasses supply the
    claim, run and finish steps."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        super().__init__(hooks)
        if config.persist is None:
            raise ValueError(f"{type(self).__name__} needs a config with a store")
        self.config = config
        self.store: DedupStore = config.persist
        self._log = RateLimitedLog(logger)

    def consume(self, msgs: Sequence[Any], stop_at_failure: bool = False) -> List[ConsumeStatus]:
        snap = self.config.snapshot()
        metrics = snap.metrics
        started = time.time_ns() if metrics is not None else 0
        deliveries = [Delivery(i, msg) for i, msg in enumerate(msgs)]
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
            if metrics is not None:
                self._report(metrics, snap, deliveries, len(statuses), started)
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
        """Set ``delivery.element`` (or its status when the key is refused); True if keyed."""
        msg = delivery.msg
        try:
            raw = self.hooks.key_of(msg)
            if raw is None:
                logger.debug("dedup key is None; consuming without dedup")
                delivery.outcome = Outcome.NO_KEY
                return False
            key = raw if type(raw) is str else key_text(raw)
        except KeyRefused as exc:
            self._log.log(logging.ERROR, "dedup_message_key: %s; consume later", exc)
            delivery.status, delivery.outcome = LATER, Outcome.KEY_ERROR
            return False
        except Exception:
            return self._hook_failed(delivery, "dedup_message_key")
        topic, tag = message_topic_tag(msg)
        if not key:
            self._log.log(
                logging.WARNING,
                "dedup key is empty for a message of topic %r; consuming without dedup",
                topic,
            )
            delivery.outcome = Outcome.NO_KEY
            return False
        payload_of = self.hooks.payload_of
        if payload_of is not None:
            try:
                payload = _payload_bytes(payload_of(msg))
                if payload is not None:
                    delivery.fingerprint = fingerprint_of(payload)
            except Exception:
                return self._hook_failed(delivery, "payload_fingerprint")
        delivery.element = DedupElement(snap.application_name, topic, tag, key)
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
        without dedup, or RECONSUME_LATER: :meth:`_outage_runs_without_dedup`); a defect is
        RECONSUME_LATER, logged as an error."""
        if not isinstance(exc, StoreUnavailableError):
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
            delivery.status, delivery.outcome = LATER, Outcome.STORE_ERROR_LATER

    #: Why an outage is answered RECONSUME_LATER, for the log line.
    _OUTAGE_LATER_REASON = "store_failure_policy='reconsume_later'"

    def _outage_runs_without_dedup(self, snap: Snapshot) -> bool:
        """Whether a store outage runs the handlers without dedup (``store_failure_policy``)."""
        return snap.store_failure_policy is StoreFailurePolicy.CONSUME

    def _duplicate_status(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> Optional[ConsumeStatus]:
        """The answer for a message whose key has a live ``record`` of another attempt; None
        means "run the handler without dedup" (a record this library cannot read, as the Java
        original does)."""
        status = record.status if record is not None else None
        if delivery.fingerprint is not None and status is not None:
            theirs = fingerprint_in(record.owner if record is not None else None)
            if theirs is not None and theirs != delivery.fingerprint:
                return self._payload_mismatch(delivery, status, snap)
        if status is DedupStatus.CONSUMED or status is DedupStatus.CONSUMING:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%r: a duplicate of a %s record", delivery.element, status.value)
            if self.hooks.on_duplicate is not None:
                return self._duplicate(delivery, status)
            # _duplicate without the hook, inlined: every duplicate passes here
            if status is DedupStatus.CONSUMED:
                delivery.outcome = Outcome.DUPLICATE_CONSUMED
                return SUCCESS
            delivery.outcome = Outcome.DUPLICATE_IN_PROGRESS
            return LATER
        self._log.log(
            logging.WARNING,
            "%r has a record this library cannot read; consuming without dedup",
            delivery.element,
        )
        delivery.outcome = Outcome.STORE_ERROR_CONSUMED
        return None

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
        if reject:
            delivery.outcome = Outcome.PAYLOAD_MISMATCH
            return LATER
        answer = self._duplicate(delivery, status)
        delivery.outcome = Outcome.PAYLOAD_MISMATCH
        return answer

    def _duplicate(self, delivery: Delivery, status: DedupStatus) -> ConsumeStatus:
        """A duplicate answered without its handler: acked when its twin is CONSUMED, else
        RECONSUME_LATER. Calls the listener's ``on_duplicate`` (its exceptions are logged, no
        more)."""
        if status is DedupStatus.CONSUMED:
            delivery.outcome, answer = Outcome.DUPLICATE_CONSUMED, SUCCESS
        else:
            delivery.outcome, answer = Outcome.DUPLICATE_IN_PROGRESS, LATER
        on_duplicate = self.hooks.on_duplicate
        if on_duplicate is not None:
            try:
                on_duplicate(delivery.msg, status)
            except Exception:
                self._log.log(logging.ERROR, "on_duplicate raised; ignored", exc_info=True)
        return answer

    # -- metrics -------------------------------------------------------------------------

    def _store_call(self, snap: Snapshot, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, timed for the metrics when there are any."""
        metrics = snap.metrics
        if metrics is None:
            return fn(*args)
        begin = time.perf_counter()
        try:
            result = fn(*args)
        except BaseException:
            self._time_store_call(metrics, snap, op, time.perf_counter() - begin, False)
            raise
        try:  # inline: the success path is per message
            metrics.store_operation(snap.application_name, op, time.perf_counter() - begin, True)
        except Exception:
            self._metrics_failed()
        return result

    def _time_store_call(
        self, metrics: DedupMetrics, snap: Snapshot, op: StoreOp, seconds: float, ok: bool
    ) -> None:
        try:
            metrics.store_operation(snap.application_name, op, seconds, ok)
        except Exception:
            self._metrics_failed()

    def _report(
        self,
        metrics: DedupMetrics,
        snap: Snapshot,
        deliveries: List[Delivery],
        reached: int,
        started: int,
    ) -> None:
        """One decision per message that got an answer (those after a batch's first failure
        are not counted: they are counted when they come back)."""
        for delivery in deliveries[:reached]:
            if delivery.outcome is not None:
                self._decided(metrics, snap, delivery, started)

    def _decided(
        self, metrics: DedupMetrics, snap: Snapshot, delivery: Delivery, started: int
    ) -> None:
        """Report one message's decision."""
        msg, element = delivery.msg, delivery.element
        topic = element.topic if element is not None else message_topic(msg)
        try:
            metrics.message(
                Decision(
                    snap.application_name,
                    topic,
                    delivery.outcome,  # type: ignore[arg-type]
                    msg,
                    started,
                    delivery.handler_seconds,
                )
            )
        except Exception:
            self._metrics_failed()

    def _metrics_failed(self) -> None:
        self._log.log(logging.ERROR, "the metrics object raised; ignored", exc_info=True)


def _payload_bytes(value: Any) -> Optional[bytes]:
    """A payload fingerprint's input as bytes (None: no check for this message)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return bytes(value)
