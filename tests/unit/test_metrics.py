"""Metrics, tracing and the duplicate hook: one decision per message, timings per store call,
lease renewals; Prometheus and OpenTelemetry; the default costs nothing."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, List, Optional, Tuple

import pytest
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupConfigError,
    DedupElement,
    DedupStatus,
    MemoryDedupStore,
)
from rocketmq_dedup.metrics import (
    Decision,
    DedupMetrics,
    OpenTelemetryMetrics,
    Outcome,
    PrometheusMetrics,
    StoreOp,
)
from rocketmq_dedup.metrics._prometheus import HANDLER_BUCKETS, STORE_BUCKETS
from rocketmq_dedup.stores.base import Claim, DedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import otel_points, prometheus_value, wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class Recorder(DedupMetrics):
    """Keeps every call."""

    def __init__(self) -> None:
        self.decisions: List[Decision] = []
        self.ops: List[Tuple[StoreOp, bool]] = []
        self.lease_rounds: List[Tuple[int, int]] = []

    def message(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.ops.append((op, ok))

    def leases(self, application: str, renewed: int, lost: int) -> None:
        self.lease_rounds.append((renewed, lost))


class Listener(DedupConcurrentListener):
    """Handler result per message id: ``results[id]`` (default True); key ``keys[id]``."""

    def __init__(self, config: Optional[DedupConfig], **results: Any) -> None:
        super().__init__(config)
        self.results = results
        self.keys: dict = {}  # type: ignore[type-arg]
        self.duplicates: List[Tuple[str, DedupStatus]] = []
        self.gate: Optional[threading.Event] = None

    def dedup_message_key(self, msg: Any) -> Any:
        return self.keys.get(msg.id, msg.id)

    def do_handle_msg(self, msg: Any) -> Any:
        if self.gate is not None:
            self.gate.wait(10)
        return self.results.get(msg.id, True)

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:
        self.duplicates.append((msg.id, status))


def outcomes(recorder: Recorder) -> List[Tuple[str, Outcome]]:
    return [(d.message.id, d.outcome) for d in recorder.decisions]


def test_every_decision_is_reported_once(app_name: str) -> None:
    """Handled, failed, duplicates, no key, refused key: one decision each, with the handler
    time only where the handler ran."""
    recorder = Recorder()
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=recorder)
    listener = Listener(config, bad=False)
    listener.keys.update(nokey=None, refused=object())
    for msg_id in ("m1", "m1", "bad", "nokey", "refused"):
        listener(ClassicMessage(msg_id))
    assert outcomes(recorder) == [
        ("m1", Outcome.CONSUMED),
        ("m1", Outcome.DUPLICATE_CONSUMED),
        ("bad", Outcome.FAILED),
        ("nokey", Outcome.NO_KEY),
        ("refused", Outcome.KEY_ERROR),
    ]
    ran = [d.handler_seconds is not None for d in recorder.decisions]
    assert ran == [True, False, True, True, False]
    assert all(d.application == app_name and d.topic == "TEST-TOPIC" for d in recorder.decisions)
    claims = [op for op in recorder.ops if op[0] is StoreOp.CLAIM]
    assert len(claims) == 3 and all(ok for _, ok in recorder.ops)  # m1, m1, bad
    assert (StoreOp.MARK_CONSUMED, True) in recorder.ops
    assert (StoreOp.RELEASE, True) in recorder.ops


def test_in_progress_duplicate_and_hook(app_name: str) -> None:
    """A duplicate of a message still in its handler: DUPLICATE_IN_PROGRESS, and on_duplicate
    is called with CONSUMING; once it is done, a duplicate gets CONSUMED."""
    recorder = Recorder()
    store = MemoryDedupStore()
    config = DedupConfig.enable_dedup_consume_config(app_name, store, metrics=recorder)
    listener = Listener(config)
    listener.gate = gate = threading.Event()
    first = threading.Thread(target=listener, args=(ClassicMessage("m1"),))
    first.start()
    element = DedupElement(app_name, "TEST-TOPIC", "TagA", "m1")
    wait_for(lambda: store.get_status(element) is DedupStatus.CONSUMING)
    assert listener(ClassicMessage("m1")) is LATER  # the handler is not entered: no wait
    gate.set()
    first.join()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.duplicates == [("m1", DedupStatus.CONSUMING), ("m1", DedupStatus.CONSUMED)]
    assert outcomes(recorder) == [
        ("m1", Outcome.DUPLICATE_IN_PROGRESS),
        ("m1", Outcome.CONSUMED),
        ("m1", Outcome.DUPLICATE_CONSUMED),
    ]


def test_outages_are_reported_by_policy(app_name: str) -> None:
    """An unreachable store: store_error_consumed under "consume", store_error_later under
    "reconsume_later", and the failed claim is timed with ok=False."""
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    for policy, outcome in (
        ("consume", Outcome.STORE_ERROR_CONSUMED),
        ("reconsume_later", Outcome.STORE_ERROR_LATER),
    ):
        recorder = Recorder()
        config = DedupConfig.enable_dedup_consume_config(
            app_name, client, metrics=recorder, store_failure_policy=policy, check_store=False
        )
        Listener(config)(ClassicMessage("m1"))
        assert outcomes(recorder) == [("m1", outcome)]
        assert recorder.ops == [(StoreOp.CLAIM, False)]


def test_lease_renewals_are_reported(store: DedupStore, app_name: str) -> None:
    """A renewal round reports the leases it extended."""
    recorder = Recorder()
    config = DedupConfig.enable_dedup_consume_config(
        app_name, store, metrics=recorder, dedup_processing_expire_milli_seconds=600
    )
    listener = Listener(config)
    listener.gate = threading.Event()
    worker = threading.Thread(target=listener, args=(ClassicMessage("m1"),))
    worker.start()
    try:
        wait_for(lambda: any(renewed for renewed, _ in recorder.lease_rounds), timeout=5)
    finally:
        listener.gate.set()
        worker.join()
    assert (StoreOp.RENEW, True) in recorder.ops


def test_a_failing_metrics_object_changes_nothing(app_name: str) -> None:
    """Exceptions from the metrics object and from on_duplicate are logged, never decisive."""

    class Broken(DedupMetrics):
        def message(self, decision: Decision) -> None:
            raise RuntimeError("metrics down")

        def store_operation(self, *args: Any) -> None:
            raise RuntimeError("metrics down")

    class BrokenHook(Listener):
        def on_duplicate(self, msg: Any, status: DedupStatus) -> None:
            raise RuntimeError("hook down")

    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=Broken())
    listener = BrokenHook(config)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener(ClassicMessage("m1")) is SUCCESS


def test_metrics_must_follow_the_protocol() -> None:
    """A metrics value without the protocol's methods is a configuration error."""
    with pytest.raises(DedupConfigError, match="metrics must be"):
        DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore(), metrics=object())


def test_prometheus_counts_and_times(app_name: str) -> None:
    """PrometheusMetrics: messages_total by outcome, store and handler histograms; labels carry
    app and topic, never a message id."""
    registry = CollectorRegistry()
    config = DedupConfig.enable_dedup_consume_config(
        app_name, MemoryDedupStore(), metrics=PrometheusMetrics(registry)
    )
    listener = Listener(config, bad=False)
    for msg_id in ("m1", "m1", "m2", "bad"):
        listener(ClassicMessage(msg_id))

    value = functools.partial(prometheus_value, registry)

    base = {"app": app_name, "topic": "TEST-TOPIC"}
    assert value("rocketmq_dedup_messages_total", **base, outcome="consumed") == 2
    assert value("rocketmq_dedup_messages_total", **base, outcome="duplicate_consumed") == 1
    assert value("rocketmq_dedup_messages_total", **base, outcome="failed") == 1
    assert value("rocketmq_dedup_store_seconds_count", app=app_name, op="claim") == 4
    assert value("rocketmq_dedup_store_seconds_count", app=app_name, op="mark_consumed") == 2
    assert value("rocketmq_dedup_handler_seconds_count", **base) == 3
    labels = {k for m in registry.collect() for s in m.samples for k in s.labels}
    assert labels <= {"app", "topic", "outcome", "op", "le"}


def test_prometheus_totals_are_exact_under_concurrent_scrapes() -> None:
    """Threads report while another scrapes (folding) the whole time: every decision and
    timing is counted once, in its bucket, with the right sum."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    threads, per_thread = 4, 5_000  # > FOLD_AT in all: reporters fold too
    stop = threading.Event()

    def report() -> None:
        for i in range(per_thread):
            seconds = 0.0002 if i % 2 else 0.003  # STORE_BUCKETS: le=0.00025 and le=0.005
            metrics.store_operation("app", StoreOp.CLAIM, seconds, True)
            handler = 0.02 if i % 4 == 0 else None  # HANDLER_BUCKETS: le=0.025
            metrics.message(Decision("app", "T", Outcome.CONSUMED, None, 0, handler))

    def scrape() -> None:
        while not stop.is_set():
            list(registry.collect())

    scraper = threading.Thread(target=scrape)
    scraper.start()
    workers = [threading.Thread(target=report) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stop.set()
    scraper.join()
    total = threads * per_thread

    value = functools.partial(prometheus_value, registry)

    assert value("rocketmq_dedup_messages_total", app="app", topic="T", outcome="consumed") == total
    store = {"app": "app", "op": "claim"}
    assert value("rocketmq_dedup_store_seconds_count", **store) == total
    assert value("rocketmq_dedup_store_seconds_bucket", **store, le="0.00025") == total / 2
    assert value("rocketmq_dedup_store_seconds_bucket", **store, le="0.0025") == total / 2
    assert value("rocketmq_dedup_store_seconds_bucket", **store, le="0.005") == total
    assert value("rocketmq_dedup_store_seconds_sum", **store) == pytest.approx(
        total / 2 * (0.0002 + 0.003)
    )
    handler = {"app": "app", "topic": "T"}
    assert value("rocketmq_dedup_handler_seconds_count", **handler) == total / 4
    assert value("rocketmq_dedup_handler_seconds_bucket", **handler, le="0.01") == 0
    assert value("rocketmq_dedup_handler_seconds_bucket", **handler, le="0.025") == total / 4
    assert value("rocketmq_dedup_handler_seconds_sum", **handler) == pytest.approx(total / 4 * 0.02)


def test_opentelemetry_metrics_and_spans(app_name: str) -> None:
    """OpenTelemetryMetrics: the same counter through a MeterProvider, and a span per decision
    with the messaging attributes and the outcome."""
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = OpenTelemetryMetrics(
        MeterProvider(metric_readers=[reader]), tracer_provider, spans=True
    )
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=metrics)
    listener = Listener(config)
    listener(ClassicMessage("m1"))
    listener(ClassicMessage("m1"))
    points = otel_points(reader)
    assert points[("rocketmq_dedup.messages", "consumed")] == 1
    assert points[("rocketmq_dedup.messages", "duplicate_consumed")] == 1
    spans = exporter.get_finished_spans()
    assert [s.attributes["rocketmq_dedup.outcome"] for s in spans] == [  # type: ignore[index]
        "consumed",
        "duplicate_consumed",
    ]
    attributes = dict(spans[0].attributes or {})
    assert attributes["messaging.system"] == "rocketmq"
    assert attributes["messaging.destination.name"] == "TEST-TOPIC"
    assert attributes["messaging.consumer.group.name"] == app_name
    assert attributes["messaging.message.id"] == "m1"


def test_no_metrics_means_no_calls(app_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without metrics the listener reads no clock for them (its snapshot's meter is the one
    that measures nothing); with metrics it does (so the check can fail)."""
    import rocketmq_dedup.metrics.meter
    import rocketmq_dedup.strategy.base

    reads: List[str] = []

    class Clock:
        def time_ns(self) -> int:
            reads.append("time_ns")
            return 0

        def perf_counter(self) -> float:
            reads.append("perf_counter")
            return 0.0

    clock = Clock()
    for module in (rocketmq_dedup.metrics.meter, rocketmq_dedup.strategy.base):
        monkeypatch.setattr(module, "time", clock)
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore())
    assert config.snapshot().meter is rocketmq_dedup.metrics.meter.UNMETERED
    listener = Listener(config)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.consume_each([ClassicMessage("m2")]) == [SUCCESS]
    assert reads == []
    config = DedupConfig.enable_dedup_consume_config(
        app_name, MemoryDedupStore(), metrics=Recorder()
    )
    assert Listener(config)(ClassicMessage("m3")) is SUCCESS
    assert "time_ns" in reads and "perf_counter" in reads


def test_a_backend_without_use_for_the_start_time_costs_no_wall_clock_read(
    app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metrics object with ``wants_start_time = False`` (PrometheusMetrics) is timed as any
    other, but the listener reads no wall clock for it and its decisions carry 0."""
    import rocketmq_dedup.metrics.meter

    reads: List[str] = []

    class Clock:
        perf_counter = staticmethod(time.perf_counter)

        def time_ns(self) -> int:
            reads.append("time_ns")
            return time.time_ns()

    monkeypatch.setattr(rocketmq_dedup.metrics.meter, "time", Clock())

    class NoStartTime(Recorder):
        wants_start_time = False

    assert PrometheusMetrics.wants_start_time is False
    metrics = NoStartTime()
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=metrics)
    listener = Listener(config)
    assert [listener(ClassicMessage(i)) for i in ("m1", "m1")] == [SUCCESS, SUCCESS]
    assert reads == []
    assert [(d.outcome, d.started_ns) for d in metrics.decisions] == [
        (Outcome.CONSUMED, 0),
        (Outcome.DUPLICATE_CONSUMED, 0),
    ]
    assert (StoreOp.CLAIM, True) in metrics.ops  # still timed

    wanting = Recorder()
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=wanting)
    assert Listener(config)(ClassicMessage("m3")) is SUCCESS
    assert reads == ["time_ns"] and wanting.decisions[0].started_ns > 0


class FastFailingStore(MemoryDedupStore):
    """Claims fail at once, as a store whose server refuses connections does."""

    outage_errors = (ConnectionRefusedError,)

    def do_claim(self, claim: Claim, lease_ms: int) -> Any:
        raise ConnectionRefusedError("store down")


def test_failed_store_calls_are_counted_apart_in_prometheus(app_name: str) -> None:
    """A claim that fails is an error (rocketmq_dedup_store_errors_total{app, op}), not a fast
    call: the latency histogram holds the calls that succeeded, and only those."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    good = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=metrics)
    Listener(good)(ClassicMessage("m1"))
    bad = DedupConfig.enable_dedup_consume_config(app_name, FastFailingStore(), metrics=metrics)
    for i in range(3):
        Listener(bad)(ClassicMessage(f"down-{i}"))
    value = functools.partial(prometheus_value, registry)
    assert value("rocketmq_dedup_store_errors_total", app=app_name, op="claim") == 3
    assert value("rocketmq_dedup_store_seconds_count", app=app_name, op="claim") == 1
    # every op of a seen application is exported from its first call, at 0 until it fails
    assert value("rocketmq_dedup_store_errors_total", app=app_name, op="mark_consumed") == 0


def test_prometheus_exports_every_series_at_zero_from_the_first_message(app_name: str) -> None:
    """A duplicate answered before any handler ran: every outcome of its topic, the handler
    histogram, each op's errors and histogram and both lease counters are there, at 0 where
    nothing happened, so that rate() and increase() count the first handled message, the first
    error, the first lease lost (a series born at 1 has no increase)."""
    registry = CollectorRegistry()
    store = MemoryDedupStore()
    store.claim(Claim(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"), "elsewhere"), 60_000)
    config = DedupConfig.enable_dedup_consume_config(
        app_name, store, metrics=PrometheusMetrics(registry)
    )
    assert Listener(config)(ClassicMessage("m1")) is LATER  # in progress elsewhere
    value = functools.partial(prometheus_value, registry)
    base = {"app": app_name, "topic": "TEST-TOPIC"}
    assert value("rocketmq_dedup_messages_total", **base, outcome="duplicate_in_progress") == 1
    for outcome in Outcome:
        if outcome is not Outcome.DUPLICATE_IN_PROGRESS:
            assert value("rocketmq_dedup_messages_total", **base, outcome=outcome.value) == 0
    assert value("rocketmq_dedup_handler_seconds_count", **base) == 0
    assert value("rocketmq_dedup_handler_seconds_bucket", **base, le="+Inf") == 0
    for op in StoreOp:
        assert value("rocketmq_dedup_store_errors_total", app=app_name, op=op.value) == 0
        expected = 1 if op is StoreOp.CLAIM else 0
        assert value("rocketmq_dedup_store_seconds_count", app=app_name, op=op.value) == expected
    assert value("rocketmq_dedup_lease_renewals_total", app=app_name) == 0
    assert value("rocketmq_dedup_leases_lost_total", app=app_name) == 0


def test_failed_store_calls_are_counted_apart_in_opentelemetry(app_name: str) -> None:
    """The same through OpenTelemetry: rocketmq_dedup.store.errors counts the failures, and
    rocketmq_dedup.store.duration records the calls that succeeded."""
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    good = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=metrics)
    Listener(good)(ClassicMessage("m1"))
    bad = DedupConfig.enable_dedup_consume_config(app_name, FastFailingStore(), metrics=metrics)
    for i in range(3):
        Listener(bad)(ClassicMessage(f"down-{i}"))
    points = otel_points(reader)
    assert points[("rocketmq_dedup.store.errors", None)] == 3
    assert points[("rocketmq_dedup.store.duration", None)] == 2  # m1's claim and mark


def _exposition(registry: CollectorRegistry) -> List[Tuple[str, Any, float]]:
    """Every sample: name, labels, value (rounded: sums may add in another order)."""
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), round(s.value, 9))
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    )


def test_prometheus_handled_counts_as_its_three_calls() -> None:
    """PrometheusMetrics.handled() exports what message() and the two store_operation() calls
    it stands for export: same series, same counts, same sums."""
    one, three = CollectorRegistry(), CollectorRegistry()
    combined, parts = PrometheusMetrics(one), PrometheusMetrics(three)
    for i in range(1_500):  # > FOLD_AT: folded by the reporter and by the scrape
        msg = ClassicMessage(f"m{i}")
        combined.handled("app", "T", msg, 0, 0.002, 0.0001, 0.03)
        DedupMetrics.handled(parts, "app", "T", msg, 0, 0.002, 0.0001, 0.03)
    assert _exposition(one) == _exposition(three)
    for name, labels in (
        ("rocketmq_dedup_messages_total", {"app": "app", "topic": "T", "outcome": "consumed"}),
        ("rocketmq_dedup_handler_seconds_sum", {"app": "app", "topic": "T"}),
        ("rocketmq_dedup_store_seconds_count", {"app": "app", "op": "claim"}),
        ("rocketmq_dedup_store_seconds_sum", {"app": "app", "op": "mark_consumed"}),
        ("rocketmq_dedup_store_seconds_bucket", {"app": "app", "op": "claim", "le": "0.001"}),
    ):
        got = prometheus_value(one, name, **labels)
        assert got is not None and got == pytest.approx(prometheus_value(three, name, **labels))
    assert (
        prometheus_value(
            one, "rocketmq_dedup_messages_total", app="app", topic="T", outcome="consumed"
        )
        == 1_500
    )


def test_prometheus_buckets_count_each_value_once_whatever_the_fold_path() -> None:
    """handled() rows folded by label set: a topic whose values all sit on one bound, a topic
    whose values spread over every bucket with some exactly on a bound (counted in that
    bound's ``le`` bucket), two applications, the claim and mark timings other values than
    the handler's; every cumulative bucket, count and sum is what the values give, counted
    directly."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    spread = [*STORE_BUCKETS, 0.00005, 0.0003, 0.07, 2.0]  # bounds themselves, between, +Inf
    sent: dict = {}  # type: ignore[type-arg]
    for i in range(1_300):  # > 2 * FOLD_AT
        app = "a1" if i % 5 else "a2"
        topic, value = ("SPREAD", spread[i % len(spread)]) if i % 2 else ("FLAT", 0.005)
        metrics.handled(app, topic, None, 0, value, value * 0.5, value * 2)
        sent.setdefault((app, topic), []).append(value)
    value_of = functools.partial(prometheus_value, registry)
    for (app, topic), values in sent.items():
        handler = {"app": app, "topic": topic}
        for bound in HANDLER_BUCKETS:
            expected = sum(v <= bound for v in values)
            assert value_of("rocketmq_dedup_handler_seconds_bucket", **handler, le=repr(bound)) == (
                expected
            )
        assert value_of("rocketmq_dedup_handler_seconds_count", **handler) == len(values)
        assert value_of("rocketmq_dedup_handler_seconds_sum", **handler) == pytest.approx(
            sum(values)
        )
        assert value_of("rocketmq_dedup_messages_total", **handler, outcome="consumed") == len(
            values
        )
    for app in ("a1", "a2"):
        values = [v for (a, _), vs in sent.items() if a == app for v in vs]
        for op, scale in (("claim", 0.5), ("mark_consumed", 2)):
            store = {"app": app, "op": op}
            for bound in STORE_BUCKETS:
                expected = sum(v * scale <= bound for v in values)
                assert value_of("rocketmq_dedup_store_seconds_bucket", **store, le=repr(bound)) == (
                    expected
                )
            assert value_of("rocketmq_dedup_store_seconds_bucket", **store, le="+Inf") == len(
                values
            )
            assert value_of("rocketmq_dedup_store_seconds_sum", **store) == pytest.approx(
                sum(values) * scale
            )


class DuckMetrics:
    """A metrics object by duck typing: the protocol's three methods, no ``handled``."""

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def message(self, decision: Decision) -> None:
        self.calls.append(("message", decision.outcome, decision.handler_seconds is not None))

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        self.calls.append(("store", op, ok))

    def leases(self, application: str, renewed: int, lost: int) -> None:
        self.calls.append(("leases", renewed, lost))


def test_metrics_without_handled_get_its_three_calls(app_name: str) -> None:
    """A duck-typed metrics object without handled() is told of a handled message by the
    claim's and the mark's store_operation and the decision, as before handled() existed."""
    metrics = DuckMetrics()
    config = DedupConfig.enable_dedup_consume_config(app_name, MemoryDedupStore(), metrics=metrics)
    assert Listener(config)(ClassicMessage("m1")) == SUCCESS
    assert metrics.calls == [
        ("store", StoreOp.CLAIM, True),
        ("store", StoreOp.MARK_CONSUMED, True),
        ("message", Outcome.CONSUMED, True),
    ]
