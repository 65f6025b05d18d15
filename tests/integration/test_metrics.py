"""Every Prometheus and OpenTelemetry instrument, counted against each real store (Redis, Redis
Cluster, MariaDB through each driver), and the outage outcomes against unreachable servers."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Tuple

import pytest
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupElement, DedupStatus
from rocketmq_dedup.metrics import OpenTelemetryMetrics, PrometheusMetrics
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import mysql_connect, otel_points, pg_connect, prometheus_value, wait_for
from tests.unit.test_metrics import Listener

LATER = ConsumeStatus.RECONSUME_LATER
TOPIC = "TEST-TOPIC"


def run_every_case(
    config: DedupConfig, store: DedupStore, app: str, leases: Callable[[], Tuple[float, float]]
) -> None:
    """One message per outcome a reachable store can produce, a lease renewed while a handler
    runs, and a lease lost (an operator deletes the claim under the running handler);
    ``leases()`` reads (renewed, lost) from the metrics."""
    listener = Listener(config, bad=False)
    listener.keys.update(nokey=None, refused=object())
    for msg_id in ("m1", "m1", "bad", "nokey", "refused"):
        listener(ClassicMessage(msg_id))
    listener.gate = gate = threading.Event()
    slow = threading.Thread(target=listener, args=(ClassicMessage("slow"),))
    slow.start()
    try:
        element = DedupElement(app, TOPIC, "TagA", "slow")
        wait_for(lambda: store.get_status(element) is DedupStatus.CONSUMING)
        assert listener(ClassicMessage("slow")) is LATER  # in progress
        wait_for(lambda: leases()[0] >= 1, timeout=5)
        assert store.delete(element) is DedupStatus.CONSUMING
        wait_for(lambda: leases()[1] >= 1, timeout=5)
    finally:
        gate.set()
        slow.join()


class Prometheus(PrometheusMetrics):
    """PrometheusMetrics on its own registry, read back by sample."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        super().__init__(self.registry)

    def value(self, name: str, **labels: str) -> Optional[float]:
        return prometheus_value(self.registry, name, **labels)

    def lease_counts(self, app: str) -> Tuple[float, float]:
        renewed = self.value("rocketmq_dedup_lease_renewals_total", app=app)
        lost = self.value("rocketmq_dedup_leases_lost_total", app=app)
        return renewed or 0, lost or 0


def test_prometheus_instruments_on_a_real_store(store: DedupStore, app_name: str) -> None:
    """Each outcome, both lease counters and both histograms, on a real store."""
    metrics = Prometheus()
    config = DedupConfig.enable_dedup_consume_config(
        app_name, store, metrics=metrics, dedup_processing_expire_milli_seconds=600
    )
    run_every_case(config, store, app_name, lambda: metrics.lease_counts(app_name))
    base = {"app": app_name, "topic": TOPIC}
    # "slow" is counted once it returns: its claim was deleted, its mark then finds no claim
    expected = {
        "consumed": 2,
        "duplicate_consumed": 1,
        "duplicate_in_progress": 1,
        "failed": 1,
        "no_key": 1,
        "key_error": 1,
    }
    counts = {
        outcome: metrics.value("rocketmq_dedup_messages_total", **base, outcome=outcome)
        for outcome in expected
    }
    assert counts == expected
    renewed, lost = metrics.lease_counts(app_name)
    assert renewed >= 1 and lost == 1
    store_ops = {"claim": 5, "mark_consumed": 2, "release": 1}  # m1 m1 bad slow slow
    for op, count in store_ops.items():
        samples = metrics.value("rocketmq_dedup_store_seconds_count", app=app_name, op=op)
        assert samples == count, op
    assert metrics.value("rocketmq_dedup_store_seconds_count", app=app_name, op="renew")
    assert metrics.value("rocketmq_dedup_handler_seconds_count", **base) == 4  # m1 bad nokey slow


def unreachable(server: str) -> Any:
    """A Redis client, or a MySQL or PostgreSQL connection factory, for an address where
    nothing listens."""
    if server == "redis":
        return redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    if server == "postgres":
        return pg_connect("postgresql://dedup@127.0.0.1:1/dedup_test", connect_timeout=1)
    return mysql_connect(port=1, connect_timeout=1)


@pytest.mark.parametrize("server", ["redis", "mysql", "postgres"])
@pytest.mark.parametrize("policy", ["consume", "reconsume_later"])
def test_outage_outcomes_on_unreachable_servers(server: str, policy: str, app_name: str) -> None:
    """store_error_consumed / store_error_later, and the failed claim timed, when the Redis,
    MariaDB or PostgreSQL address answers nothing."""
    metrics = Prometheus()
    config = DedupConfig.enable_dedup_consume_config(
        app_name,
        unreachable(server),
        metrics=metrics,
        store_failure_policy=policy,
        check_store=False,
    )
    status = Listener(config)(ClassicMessage("m1"))
    outcome = "store_error_consumed" if policy == "consume" else "store_error_later"
    base = {"app": app_name, "topic": TOPIC}
    assert metrics.value("rocketmq_dedup_messages_total", **base, outcome=outcome) == 1
    assert (status is LATER) is (policy == "reconsume_later")
    # the failed claim is an error, not a (fast) call in the latency histogram
    assert metrics.value("rocketmq_dedup_store_errors_total", app=app_name, op="claim") == 1
    assert metrics.value("rocketmq_dedup_store_seconds_count", app=app_name, op="claim") == 0


@pytest.mark.parametrize("server", ["redis", "mysql", "postgres"])
def test_opentelemetry_counts_failed_calls_on_unreachable_servers(
    server: str, app_name: str
) -> None:
    """OpenTelemetry: the failed claim is counted in rocketmq_dedup.store.errors and recorded in
    no duration histogram, when the Redis, MariaDB or PostgreSQL address answers nothing."""
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    config = DedupConfig.enable_dedup_consume_config(
        app_name, unreachable(server), metrics=metrics, check_store=False
    )
    Listener(config)(ClassicMessage("m1"))
    points = otel_points(reader)
    assert points[("rocketmq_dedup.store.errors", None)] == 1
    assert ("rocketmq_dedup.store.duration", None) not in points


def test_opentelemetry_instruments_on_a_real_store(store: DedupStore, app_name: str) -> None:
    """The same cases through OpenTelemetryMetrics: the outcome counter, both lease counters and
    both histograms have data points."""
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))

    def leases() -> Tuple[float, float]:
        points = otel_points(reader)
        renewed = points.get(("rocketmq_dedup.lease_renewals", None), 0)
        return renewed, points.get(("rocketmq_dedup.leases_lost", None), 0)

    config = DedupConfig.enable_dedup_consume_config(
        app_name, store, metrics=metrics, dedup_processing_expire_milli_seconds=600
    )
    run_every_case(config, store, app_name, leases)
    found = otel_points(reader)
    assert found[("rocketmq_dedup.messages", "consumed")] == 2
    assert found[("rocketmq_dedup.messages", "duplicate_in_progress")] == 1
    assert found[("rocketmq_dedup.leases_lost", None)] == 1
    assert found[("rocketmq_dedup.store.duration", None)] >= 7
    assert found[("rocketmq_dedup.handler.duration", None)] == 4
