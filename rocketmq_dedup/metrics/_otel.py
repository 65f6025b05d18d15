"""OpenTelemetry metrics and spans (the ``[otel]`` extra: opentelemetry-api)."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterable, Optional, Tuple

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
    (observable gauge, s; ``table``) from a running :class:`~rocketmq_dedup.Purger`; the
    outbox's relays: ``rocketmq_dedup.outbox.sent``, ``rocketmq_dedup.outbox.failed``,
    ``rocketmq_dedup.outbox.parked`` (counters; ``outbox``, ``topic``) and the observable gauges
    ``rocketmq_dedup.outbox.backlog``, ``rocketmq_dedup.outbox.oldest_pending_age`` (s) and
    ``rocketmq_dedup.outbox.parked_rows`` (``outbox``).

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
        self._outbox = {
            kind: meter.create_counter(
                f"rocketmq_dedup.outbox.{kind}", unit="{message}", description=doc
            )
            for kind, doc in (
                ("sent", "Outbox messages the broker acknowledged"),
                ("failed", "Outbox sends that failed and will be tried again"),
                ("parked", "Outbox rows parked"),
            )
        }
        #: outbox -> (PENDING rows, the oldest one's write time (epoch s) or None, PARKED rows)
        self._backlog: Dict[str, Tuple[int, Optional[float], int]] = {}
        self._backlog_lock = threading.Lock()
        for name, unit, doc, value in (
            ("backlog", "{row}", "PENDING outbox rows", lambda v, now: v[0]),
            (
                "oldest_pending_age",
                "s",
                "Age of the oldest PENDING outbox row (0: none)",
                lambda v, now: 0.0 if v[1] is None else max(0.0, now - v[1]),
            ),
            ("parked_rows", "{row}", "PARKED outbox rows", lambda v, now: v[2]),
        ):
            meter.create_observable_gauge(
                f"rocketmq_dedup.outbox.{name}",
                callbacks=[self._observer(value)],
                unit=unit,
                description=doc,
            )

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

    def outbox_sent(self, outbox: str, topic: str, count: int) -> None:
        self._outbox["sent"].add(count, {"outbox": outbox, "topic": topic})

    def outbox_failed(self, outbox: str, topic: str, count: int) -> None:
        self._outbox["failed"].add(count, {"outbox": outbox, "topic": topic})

    def outbox_parked(self, outbox: str, topic: str, count: int) -> None:
        self._outbox["parked"].add(count, {"outbox": outbox, "topic": topic})

    def outbox_backlog(
        self, outbox: str, pending: int, oldest_pending_seconds: Optional[float], parked: int
    ) -> None:
        written = None if oldest_pending_seconds is None else time.time() - oldest_pending_seconds
        with self._backlog_lock:
            self._backlog[outbox] = (pending, written, parked)

    def _observer(self, value: Any) -> Any:
        """An observable gauge's callback: ``value(backlog, now)`` of every outbox."""

        def observe(options: Any) -> Iterable[Any]:
            with self._backlog_lock:
                backlog = dict(self._backlog)
            now = time.time()
            return [
                otel_metrics.Observation(value(values, now), {"outbox": outbox})
                for outbox, values in backlog.items()
            ]

        return observe

    def purge(self, table: str, deleted: int, lag_seconds: float) -> None:
        self._purged.add(deleted, {"table": table})
        self._purge_lag[table] = lag_seconds

    def _observe_purge_lag(self, options: Any) -> Iterable[Any]:
        return [
            otel_metrics.Observation(lag, {"table": table})
            for table, lag in list(self._purge_lag.items())
        ]
