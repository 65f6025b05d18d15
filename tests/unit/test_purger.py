"""The in-process purger without a server (issue 36.5): what it accepts, and how the metrics
backends export its batches. Its behaviour on MariaDB: tests/integration/test_purger.py."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import pytest
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from rocketmq_dedup import DedupConfigError, MemoryDedupStore, MySQLDedupStore, Purger
from rocketmq_dedup.metrics import DedupMetrics, OpenTelemetryMetrics, PrometheusMetrics
from rocketmq_dedup.stores import RedisDedupStore
from rocketmq_dedup.stores.purge import PurgeableStore
from tests.support import mysql_connect


def test_stores_whose_records_expire_by_themselves_have_no_purger() -> None:
    """Redis (a TTL per key) and the memory store are refused with a clear error."""
    for store in (MemoryDedupStore(), RedisDedupStore(redis.Redis(port=1))):
        with pytest.raises(DedupConfigError, match="nothing to purge"):
            Purger(store)


def test_the_mysql_store_is_purgeable_and_nothing_connects_before_start() -> None:
    """MySQLDedupStore implements the purge interface; making a Purger opens nothing."""
    store = MySQLDedupStore(mysql_connect(port=1))
    assert isinstance(store, PurgeableStore)
    purger = Purger(store)
    assert (purger.running, purger.passes, store.pool.open_count) == (False, 0, 0)
    purger.close()


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 0},
        {"batch_size": 1.5},
        {"interval_seconds": 0},
        {"pause_seconds": -1},
        {"pause_seconds": True},
    ],
)
def test_bad_purger_options_are_refused(options: Dict[str, Any]) -> None:
    """Batch size a positive int, interval and pause positive seconds."""
    with pytest.raises(DedupConfigError):
        Purger(MySQLDedupStore(mysql_connect(port=1)), **options)


def test_the_metrics_protocol_takes_purge_batches_and_ignores_them() -> None:
    """DedupMetrics.purge exists and does nothing by default."""
    DedupMetrics().purge("t", 3, 1.5)
    assert callable(DedupMetrics.purge)


def test_prometheus_exports_rows_deleted_and_the_lag_per_table() -> None:
    """A counter of rows deleted and a gauge of the latest lag, labelled by table."""
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    assert registry.get_sample_value("rocketmq_dedup_purge_deleted_total", {"table": "t"}) is None
    metrics.purge("t", 3, 12.5)
    metrics.purge("t", 2, 40.0)
    labels = {"table": "t"}
    assert registry.get_sample_value("rocketmq_dedup_purge_deleted_total", labels) == 5
    assert registry.get_sample_value("rocketmq_dedup_purge_lag_seconds", labels) == 40.0


def test_opentelemetry_exports_rows_deleted_and_the_lag_per_table() -> None:
    """The same as an OpenTelemetry counter and an observable gauge."""
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    metrics.purge("t", 3, 12.5)
    metrics.purge("t", 2, 40.0)
    data = reader.get_metrics_data()
    assert data is not None
    points: Dict[Tuple[str, str], Any] = {
        (m.name, str((p.attributes or {})["table"])): getattr(p, "value", None)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
        if m.name.startswith("rocketmq_dedup.purge")
    }
    assert points == {
        ("rocketmq_dedup.purge.deleted", "t"): 5,
        ("rocketmq_dedup.purge.lag", "t"): 40.0,
    }
