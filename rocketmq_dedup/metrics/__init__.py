"""Metrics and tracing hooks: what the listener decided for each message, and how long the
handler and the store took.

Pass an object to ``DedupConfig(..., metrics=...)``. :class:`DedupMetrics` is the protocol (every
method a no-op, override what you need); two implementations ship behind extras:

* :class:`PrometheusMetrics` (``[prometheus]``, prometheus_client)
* :class:`OpenTelemetryMetrics` (``[otel]``, opentelemetry-api), optionally with a span per
  message decision carrying the OpenTelemetry messaging attributes.

Without ``metrics`` the listener makes no metrics call and reads no clock for them.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from rocketmq_dedup.status import Outcome

if TYPE_CHECKING:  # the implementations import their extras; load them only when used
    from rocketmq_dedup.metrics._otel import OpenTelemetryMetrics
    from rocketmq_dedup.metrics._prometheus import PrometheusMetrics


class StoreOp(enum.StrEnum):
    """The store operations that are timed (the ``op`` label)."""

    CLAIM = "claim"
    MARK_CONSUMED = "mark_consumed"
    RELEASE = "release"
    RENEW = "renew"
    LOOKUP = "lookup"
    """Exactly-once mode: reading records (a redelivery's look-up, a refused commit's record)."""
    COMMIT = "commit"
    """Exactly-once mode: the dedup record's INSERT with the transaction's COMMIT."""
    MARK_FAILED = "mark_failed"
    """A FAILED record written (a permanent failure, a parked poison message); in the
    exactly-once mode with its own COMMIT, the handler's writes rolled back."""


class Decision(NamedTuple):
    """One message's decision, as :meth:`DedupMetrics.message` receives it."""

    application: str
    topic: str
    outcome: Outcome
    message: Any
    """The client's message (its id: :func:`rocketmq_dedup.message.message_id`; never use a
    message id or key as a metric label)."""
    started_ns: int
    """``time.time_ns()`` when the listener received the message (0 for a metrics object
    whose :attr:`~DedupMetrics.wants_start_time` is False)."""
    handler_seconds: Optional[float]
    """How long the handler ran; None when it did not run."""


class DedupMetrics:
    """The metrics protocol. Every method is a no-op: subclass and override what you need.

    Methods are called on the consumer's threads, so they must be thread-safe and quick. An
    exception raised by one is logged (rate-limited) and changes no decision.
    """

    #: Whether the decisions carry ``started_ns``, the wall-clock time a message arrived (a
    #: clock read per message); a backend that never reads it may set False, and then
    #: receives 0.
    wants_start_time: bool = True

    def message(self, decision: Decision) -> None:
        """Called once per message decision (handled, duplicate, error...)."""

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        """Called once per store call (a batch is one call), with its duration; ``ok`` is False
        when the call raised (an outage or a store defect). The shipped implementations count
        failed calls apart and time only the calls that succeeded."""

    def leases(self, application: str, renewed: int, lost: int) -> None:
        """Called after each lease renewal round: leases extended, and claims found taken over."""

    def purge(self, table: str, deleted: int, lag_seconds: float) -> None:
        """Called by a running :class:`~rocketmq_dedup.purger.Purger` after each batch: the
        expired rows it deleted, and the purge lag, how long the longest-expired row its
        current pass has met had been expired (seconds; it grows when the purge falls
        behind, and stays where the last pass left it between passes)."""

    def handled(
        self,
        application: str,
        topic: str,
        message: Any,
        started_ns: int,
        handler_seconds: float,
        claim_seconds: float,
        mark_seconds: float,
    ) -> None:
        """A message handled and recorded CONSUMED, in one call (the path of most messages):
        its decision's fields (the outcome is ``consumed``) and its claim's and CONSUMED
        mark's durations (both succeeded). The default makes the three calls it stands for
        (:meth:`store_operation` twice, :meth:`message`), so it also serves a duck-typed
        metrics object without ``handled`` (called as ``DedupMetrics.handled(obj, ...)``); a
        backend may take them in one go (:class:`PrometheusMetrics` does)."""
        self.store_operation(application, StoreOp.CLAIM, claim_seconds, True)
        self.store_operation(application, StoreOp.MARK_CONSUMED, mark_seconds, True)
        self.message(
            Decision(application, topic, Outcome.CONSUMED, message, started_ns, handler_seconds)
        )


def __getattr__(name: str) -> Any:
    if name == "PrometheusMetrics":
        from rocketmq_dedup.metrics._prometheus import PrometheusMetrics

        return PrometheusMetrics
    if name == "OpenTelemetryMetrics":
        from rocketmq_dedup.metrics._otel import OpenTelemetryMetrics

        return OpenTelemetryMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Decision",
    "DedupMetrics",
    "OpenTelemetryMetrics",
    "Outcome",
    "PrometheusMetrics",
    "StoreOp",
]
