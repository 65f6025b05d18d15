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

if TYPE_CHECKING:  # the implementations import their extras; load them only when used
    from rocketmq_dedup.metrics._otel import OpenTelemetryMetrics
    from rocketmq_dedup.metrics._prometheus import PrometheusMetrics


class Outcome(enum.StrEnum):
    """What the listener did with one message (the ``outcome`` label)."""

    CONSUMED = "consumed"
    """Claimed; the handler ran and succeeded; marked CONSUMED."""
    FAILED = "failed"
    """Claimed; the handler asked for a retry or raised; the claim was released."""
    DUPLICATE_CONSUMED = "duplicate_consumed"
    """A duplicate of a CONSUMED message: acked without the handler."""
    DUPLICATE_IN_PROGRESS = "duplicate_in_progress"
    """A duplicate of a message still in its handler: RECONSUME_LATER without the handler."""
    NO_KEY = "no_key"
    """The dedup key was None or "": the handler ran without dedup."""
    KEY_ERROR = "key_error"
    """``dedup_message_key`` raised or returned a refused key: RECONSUME_LATER."""
    STORE_ERROR_CONSUMED = "store_error_consumed"
    """The store was unavailable (or held a record it cannot read) and the policy is
    ``consume``: the handler ran without dedup."""
    STORE_ERROR_LATER = "store_error_later"
    """The store was unavailable under the ``reconsume_later`` policy, or failed with a defect:
    RECONSUME_LATER."""
    PAYLOAD_MISMATCH = "payload_mismatch"
    """A duplicate key whose payload fingerprint differs from the first copy's: answered as the
    duplicate it claims to be with ``payload_mismatch="warn"`` (the default), RECONSUME_LATER
    with ``"reject"`` (it ends in the DLQ for a human to look at)."""


class StoreOp(enum.StrEnum):
    """The store operations that are timed (the ``op`` label)."""

    CLAIM = "claim"
    MARK_CONSUMED = "mark_consumed"
    RELEASE = "release"
    RENEW = "renew"


class Decision(NamedTuple):
    """One message's decision, as :meth:`DedupMetrics.message` receives it."""

    application: str
    topic: str
    outcome: Outcome
    message: Any
    """The client's message (its id: :func:`rocketmq_dedup.message.message_id`; never use a
    message id or key as a metric label)."""
    started_ns: int
    """``time.time_ns()`` when the listener received the message."""
    handler_seconds: Optional[float]
    """How long the handler ran; None when it did not run."""


class DedupMetrics:
    """The metrics protocol. Every method is a no-op: subclass and override what you need.

    Methods are called on the consumer's threads, so they must be thread-safe and quick. An
    exception raised by one is logged (rate-limited) and changes no decision.
    """

    def message(self, decision: Decision) -> None:
        """Called once per message decision (handled, duplicate, error...)."""

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        """Called once per store call (a batch is one call), with its duration; ``ok`` is False
        when the call raised (an outage or a store defect). The shipped implementations count
        failed calls apart and time only the calls that succeeded."""

    def leases(self, application: str, renewed: int, lost: int) -> None:
        """Called after each lease renewal round: leases extended, and claims found taken over."""


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
