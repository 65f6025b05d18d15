"""Test helpers: polling, server settings, a duck-typed store, metric readers, a fresh Python
process. Messages of both client shapes and a clock the test moves: rocketmq_dedup.testing
(public)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.stores.base import Claim

REPO = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("DEDUP_REDIS_URL", "redis://127.0.0.1:16379/0")
REDIS_CLUSTER_URL = os.environ.get("DEDUP_REDIS_CLUSTER_URL", "redis://127.0.0.1:17000/0")
MYSQL = {
    "host": os.environ.get("DEDUP_MYSQL_HOST", "127.0.0.1"),
    "port": int(os.environ.get("DEDUP_MYSQL_PORT", "13306")),
    "user": os.environ.get("DEDUP_MYSQL_USER", "dedup"),
    "password": os.environ.get("DEDUP_MYSQL_PASSWORD", "dedup"),
    "database": os.environ.get("DEDUP_MYSQL_DATABASE", "dedup_test"),
}


def _rocketmq_address(variable: str, port_variable: str, port: str) -> str:
    """``variable`` (``services.sh env`` sets it), else 127.0.0.1 and the port that
    ``scripts/rocketmq.sh`` used (its ``ROCKETMQ_DEDUP_*_PORT`` variable, or the default)."""
    return os.environ.get(variable) or f"127.0.0.1:{os.environ.get(port_variable) or port}"


ROCKETMQ_NAMESRV = _rocketmq_address("ROCKETMQ_NAMESRV", "ROCKETMQ_DEDUP_NAMESRV_PORT", "9876")
ROCKETMQ_PROXY = _rocketmq_address("ROCKETMQ_PROXY", "ROCKETMQ_DEDUP_GRPC_PORT", "8081")


def mysql_connect(driver: str = "mysqlclient", **overrides: Any) -> Callable[[], Any]:
    """A zero-argument connection factory, as users pass it to DedupConfig: ``driver`` is
    ``mysqlclient``, ``pymysql`` or ``mysql-connector`` (mysql-connector-python)."""
    params = {**MYSQL, **overrides}
    if driver == "pymysql":
        import pymysql

        return functools.partial(pymysql.connect, **params)
    if driver == "mysql-connector":
        import mysql.connector

        return functools.partial(mysql.connector.connect, **params)
    if driver != "mysqlclient":
        raise ValueError(f"unknown MySQL driver {driver!r}")
    import MySQLdb

    return functools.partial(MySQLdb.connect, **params)


def fresh_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` (this interpreter) in a fresh process at the repository's root, its
    output as text; the test fails with the process's stderr unless it exits 0."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def last_json_line(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON value a process printed last (its report)."""
    return json.loads(result.stdout.splitlines()[-1])


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


class DuckStore:
    """A user's own store, duck-typed (``claim``, ``mark_consumed``, ``release``, ``renew``,
    ``get_status``), as ``DedupConfig`` accepts it through the adapter; records in memory."""

    def __init__(self) -> None:
        from rocketmq_dedup import MemoryDedupStore

        self._records = MemoryDedupStore()

    def claim(self, element: Any, owner: str, lease_ms: int) -> Any:
        return self._records.claim(Claim(element, owner), lease_ms)

    def mark_consumed(self, element: Any, owner: str, retention_ms: int) -> None:
        self._records.mark_consumed(Claim(element, owner), retention_ms)

    def release(self, element: Any, owner: str) -> bool:
        return self._records.release(Claim(element, owner))

    def renew(self, element: Any, owner: str, lease_ms: int) -> bool:
        return self._records.renew_many([Claim(element, owner)], lease_ms)[0]

    def get_status(self, element: Any) -> Any:
        return self._records.get_status(element)


def outcome(result: Any) -> Any:
    """A claim result without its holder: what a claim decided."""
    return (result.claimed, result.status)


def claims(elements: Sequence[Any], owners: Sequence[str]) -> List[Claim]:
    """Claims of ``elements`` by ``owners`` (pairwise)."""
    return [Claim(e, o) for e, o in zip(elements, owners, strict=True)]


def prometheus_value(registry: Any, name: str, **labels: str) -> Optional[float]:
    """One sample of a prometheus_client ``CollectorRegistry``; None when it has none."""
    value: Optional[float] = registry.get_sample_value(name, labels)
    return value


def otel_points(reader: Any) -> Dict[Tuple[str, Optional[str]], float]:
    """The data points of an OpenTelemetry ``InMemoryMetricReader`` by (instrument, outcome
    attribute or None): a counter's value, a histogram's count, summed over other labels."""
    found: Dict[Tuple[str, Optional[str]], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, dict(p.attributes or {}).get("outcome"))
                    value = getattr(p, "value", None)
                    found[key] = found.get(key, 0) + (value if value is not None else p.count)
    return found
