"""OpenTelemetry metrics and spans (the ``[otel]`` extra: opentelemetry-api)."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from rocketmq_dedup.errors import MissingExtraError
from rocketmq_dedup.message import message_id
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - exercised by the no-extras import test
    raise MissingExtraError("opentelemetry-api", "otel") from exc

_SCOPE = "rocketmq_dedup"


class OpenTelemetryMetrics(DedupMetrics):
    """The same instruments as :class:`~rocketmq_dedup.metrics.PrometheusMetrics`, through an
    OpenTelemetry ``MeterProvider`` (the global one if None), and optionally a span per message
    decision.

    Instruments: ``rocketmq_dedup.messages`` (counter; attributes ``app``, ``topic``,
    ``outcome``), ``rocketmq_dedup.lease_renewals`` and ``rocketmq_dedup.leases_lost``
    (counters; ``app``), ``rocketmq_dedup.store.duration`` (histogram, s; ``app``, ``op``),
    ``rocketmq_dedup.handler.duration`` (histogram, s; ``app``, ``topic``),
    ``rocketmq_dedup.purge.deleted`` (counter; ``table``) and ``rocketmq_dedup.purge.lag``
    (observable gauge, s; ``table``) from a running :class:`~rocketmq_dedup.Purger`.

    With ``spans=True`` each decision is recorded as a span ``<topic> dedup`` (kind CONSUMER)
    from the message's arrival to its answer, with the messaging attributes
    (``messaging.system=rocketmq``, ``messaging.destination.name``,
    ``messaging.consumer.group.name`` = the application name, ``messaging.message.id``,
    ``messaging.operation.type=process``) and ``rocketmq_dedup.outcome``. It is a child of the
    span current on the consumer thread, if any.
    """

    def __init__(
        self,
        meter_provider: Optional[Any] = None,
        tracer_provider: Optional[Any] = None,
        spans: bool = False,
    ) -> None:
        meter = otel_metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self._messages = meter.create_counter(
            "rocketmq_dedup.messages", unit="{message}", description="Messages by outcome"
        )
        self._renewals = meter.create_counter(
            "rocketmq_dedup.lease_renewals", unit="{lease}", description="Leases extended"
        )
        self._lost = meter.create_counter(
            "rocketmq_dedup.leases_lost", unit="{lease}", description="Claims taken over"
        )
        self._store = meter.create_histogram(
            "rocketmq_dedup.store.duration", unit="s", description="Dedup store calls"
        )
        self._errors = meter.create_counter(
            "rocketmq_dedup.store.errors", unit="{call}", description="Failed dedup store calls"
        )
        self._handler = meter.create_histogram(
            "rocketmq_dedup.handler.duration", unit="s", description="do_handle_msg"
        )
        self._purged = meter.create_counter(
            "rocketmq_dedup.purge.deleted", unit="{row}", description="Expired rows purged"
        )
        self._purge_lag: Dict[str, float] = {}  # table: seconds, read by the gauge's callback
        meter.create_observable_gauge(
            "rocketmq_dedup.purge.lag",
            callbacks=[self._observe_purge_lag],
            unit="s",
            description="How long the longest-expired row the purge's current pass met had been "
            "expired",
        )
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider) if spans else None

    def message(self, decision: Decision) -> None:
        attributes = {
            "app": decision.application,
            "topic": decision.topic,
            "outcome": decision.outcome.value,
        }
        self._messages.add(1, attributes)
        if decision.handler_seconds is not None:
            self._handler.record(
                decision.handler_seconds, {"app": decision.application, "topic": decision.topic}
            )
        if self._tracer is not None:
            span = self._tracer.start_span(
                f"{decision.topic} dedup",
                kind=trace.SpanKind.CONSUMER,
                start_time=decision.started_ns,
                attributes={
                    "messaging.system": "rocketmq",
                    "messaging.operation.type": "process",
                    "messaging.destination.name": decision.topic,
                    "messaging.consumer.group.name": decision.application,
                    "messaging.message.id": message_id(decision.message) or "",
                    "rocketmq_dedup.outcome": decision.outcome.value,
                },
            )
            span.end()

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        if ok:
            self._store.record(seconds, {"app": application, "op": op.value})
        else:  # a call refused in a millisecond is not a fast call
            self._errors.add(1, {"app": application, "op": op.value})

    def leases(self, application: str, renewed: int, lost: int) -> None:
        if renewed:
            self._renewals.add(renewed, {"app": application})
        if lost:
            self._lost.add(lost, {"app": application})

    def purge(self, table: str, deleted: int, lag_seconds: float) -> None:
        self._purged.add(deleted, {"table": table})
        self._purge_lag[table] = lag_seconds

    def _observe_purge_lag(self, options: Any) -> Iterable[Any]:
        return [
            otel_metrics.Observation(lag, {"table": table})
            for table, lag in list(self._purge_lag.items())
        ]
