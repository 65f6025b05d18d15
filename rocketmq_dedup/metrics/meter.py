"""What the consume path tells a metrics object, chosen once per change of the settings.

The config's :class:`~rocketmq_dedup.config.Snapshot` carries a :class:`Meter`, made when a setting
changes (as structlog's filtering logger binds a disabled level to a no-op when it is configured,
not at each call). Without metrics it is :data:`UNMETERED`: its clock reads 0, its store calls are
the store's own and its reports do nothing, so the path of a message has no "are there metrics?"
branch. With metrics it is a :class:`Metered`:

* a store call serving several messages (a batch's claim, mark or release, the exactly-once mode's
  look-ups) is timed and reported when it returns (:meth:`Meter.store_call`);
* the store calls of one message on the single-message path (:meth:`Meter.claim`,
  :meth:`Meter.mark_consumed`, :meth:`Meter.release`) are timed and kept with it, and reported
  with its decision (:meth:`Meter.report_one`): a handled message in one
  :meth:`~rocketmq_dedup.metrics.DedupMetrics.handled` call.

An exception raised by the metrics object is logged (rate-limited) and changes no decision.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Iterable, Optional, Protocol, Tuple, TypeVar

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.message import DedupElement, message_topic
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.status import Outcome
from rocketmq_dedup.stores.base import Claim, ClaimResult, DedupStore

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)

T = TypeVar("T")

#: One store call of one message: the operation, its duration in seconds, whether it succeeded.
StoreCall = Tuple[StoreOp, float, bool]


class Reported(Protocol):
    """What a meter reads of a message (the strategies' ``Delivery``)."""

    msg: Any
    element: Optional[DedupElement]
    outcome: Optional[Outcome]
    """None: no decision to report (a batch's message not reached, an interrupted handler)."""
    started: int
    handler_seconds: Optional[float]
    claim_seconds: Optional[float]
    """The single-message path's claim, when it succeeded."""
    mark_seconds: Optional[float]
    """The single-message path's CONSUMED mark, when it succeeded."""
    store_calls: Tuple[StoreCall, ...]
    """The single-message path's other store calls (a failed claim or mark, a release)."""


def _no_time() -> int:
    return 0


def _no_clock() -> float:
    return 0.0


class Meter:
    """No metrics: nothing is timed or reported (:data:`UNMETERED`). :class:`Metered` overrides
    every method."""

    def __init__(self) -> None:
        #: When a message arrived, for metrics that want it (``time.time_ns``); else 0.
        self.arrival: Callable[[], int] = _no_time
        #: A reading of the clock durations are measured with (``time.perf_counter``); 0.0
        #: without metrics.
        self.clock: Callable[[], float] = _no_clock

    def claim(
        self, message: Reported, store: DedupStore, claim: Claim, lease_ms: int
    ) -> ClaimResult:
        """``store.claim(claim, lease_ms)`` for ``message``, timed with it."""
        return store.claim(claim, lease_ms)

    def mark_consumed(
        self, message: Reported, store: DedupStore, claim: Claim, retention_ms: int
    ) -> None:
        """``store.mark_consumed(claim, retention_ms)`` for ``message``, timed with it."""
        store.mark_consumed(claim, retention_ms)

    def release(self, message: Reported, store: DedupStore, claim: Claim) -> bool:
        """``store.release(claim)`` for ``message``, timed with it."""
        return store.release(claim)

    def store_call(self, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: a store call serving several messages (or none), timed and reported
        when it returns."""
        return fn(*args)

    def kept(self, message: Reported, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a store call of ``message`` alone (e.g. its FAILED record), timed
        and kept with it: reported with its decision, whichever path it took."""
        return fn(*args)

    def report(self, messages: Iterable[Reported]) -> None:
        """The decisions of these messages (their store calls were reported by
        :meth:`store_call`)."""

    def report_one(self, message: Reported) -> None:
        """One message's store calls and decision."""

    def leases(self, renewed: int, lost: int, seconds: float, ok: bool) -> None:
        """A lease renewal round: its store call and what it renewed and lost."""


#: The meter of a config without metrics.
UNMETERED = Meter()


class Metered(Meter):
    """Times and reports to ``metrics`` for ``application`` (the module docstring). A single
    message's claim and CONSUMED mark that succeed are kept as plain durations on the message
    (the path of most messages: no record built for them, one ``handled()`` call); any other
    store call of it as a :data:`StoreCall`."""

    def __init__(self, metrics: DedupMetrics, application: str) -> None:
        super().__init__()
        self.metrics = metrics
        self.application = application
        wants_start_time = getattr(metrics, "wants_start_time", True)
        self.arrival = time.time_ns if wants_start_time else _no_time
        self.clock = time.perf_counter
        handled = getattr(metrics, "handled", None)
        #: ``metrics.handled``, or the three calls it stands for on a duck-typed metrics object
        #: without it
        self._handled: Callable[..., None] = (
            handled if callable(handled) else functools.partial(DedupMetrics.handled, metrics)
        )

    def claim(
        self, message: Reported, store: DedupStore, claim: Claim, lease_ms: int
    ) -> ClaimResult:
        begin = time.perf_counter()
        try:
            result = store.claim(claim, lease_ms)
        except BaseException:
            _keep(message, StoreOp.CLAIM, begin, False)
            raise
        message.claim_seconds = time.perf_counter() - begin
        return result

    def mark_consumed(
        self, message: Reported, store: DedupStore, claim: Claim, retention_ms: int
    ) -> None:
        begin = time.perf_counter()
        try:
            store.mark_consumed(claim, retention_ms)
        except BaseException:
            _keep(message, StoreOp.MARK_CONSUMED, begin, False)
            raise
        message.mark_seconds = time.perf_counter() - begin

    def release(self, message: Reported, store: DedupStore, claim: Claim) -> bool:
        begin = time.perf_counter()
        try:
            released = store.release(claim)
        except BaseException:
            _keep(message, StoreOp.RELEASE, begin, False)
            raise
        _keep(message, StoreOp.RELEASE, begin, True)
        return released

    def store_call(self, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        begin = time.perf_counter()
        try:
            result = fn(*args)
        except BaseException:
            self._store_operation(op, time.perf_counter() - begin, False)
            raise
        self._store_operation(op, time.perf_counter() - begin, True)
        return result

    def kept(self, message: Reported, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        begin = time.perf_counter()
        try:
            result = fn(*args)
        except BaseException:
            _keep(message, op, begin, False)
            raise
        _keep(message, op, begin, True)
        return result

    def report(self, messages: Iterable[Reported]) -> None:
        for message in messages:
            for op, seconds, ok in message.store_calls:  # (kept: a message's own calls)
                self._store_operation(op, seconds, ok)
            outcome = message.outcome
            if outcome is not None:
                self._decided(message, outcome)

    def report_one(self, message: Reported) -> None:
        claim_seconds, mark_seconds = message.claim_seconds, message.mark_seconds
        if claim_seconds is not None and mark_seconds is not None:  # handled, and recorded:
            try:  # the path of most messages, its decision and two timings in one call
                self._handled(
                    self.application,
                    _topic(message),
                    message.msg,
                    message.started,
                    message.handler_seconds,
                    claim_seconds,
                    mark_seconds,
                )
            except Exception:
                _metrics_failed()
            return
        if claim_seconds is not None:
            self._store_operation(StoreOp.CLAIM, claim_seconds, True)
        for op, seconds, ok in message.store_calls:
            self._store_operation(op, seconds, ok)
        outcome = message.outcome
        if outcome is not None:
            self._decided(message, outcome)

    def leases(self, renewed: int, lost: int, seconds: float, ok: bool) -> None:
        try:
            self.metrics.store_operation(self.application, StoreOp.RENEW, seconds, ok)
            self.metrics.leases(self.application, renewed, lost)
        except Exception:
            _metrics_failed()

    # -- the calls to the metrics object ---------------------------------------------------

    def _store_operation(self, op: StoreOp, seconds: float, ok: bool) -> None:
        try:
            self.metrics.store_operation(self.application, op, seconds, ok)
        except Exception:
            _metrics_failed()

    def _decided(self, message: Reported, outcome: Outcome) -> None:
        """``metrics.message`` of one decision."""
        try:
            self.metrics.message(
                Decision(
                    self.application,
                    _topic(message),
                    outcome,
                    message.msg,
                    message.started,
                    message.handler_seconds,
                )
            )
        except Exception:
            _metrics_failed()


def meter_for(metrics: Optional[DedupMetrics], application: str) -> Meter:
    """The meter of a config: :data:`UNMETERED` without metrics."""
    return UNMETERED if metrics is None else Metered(metrics, application)


def _keep(message: Reported, op: StoreOp, begin: float, ok: bool) -> None:
    """Keep a store call's timing with its message (reported by :meth:`Meter.report_one`),
    as a :data:`StoreCall`."""
    message.store_calls += ((op, time.perf_counter() - begin, ok),)


def _topic(message: Reported) -> str:
    element = message.element
    return element.topic if element is not None else message_topic(message.msg)


def _metrics_failed() -> None:
    _log.log(logging.ERROR, "the metrics object raised; ignored", exc_info=True)
