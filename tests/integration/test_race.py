"""Case 4 across processes: many consumer processes, one key -> one handler run."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Dict, List

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
from rocketmq_dedup.testing import ClassicMessage
from tests.support import REDIS_CLUSTER_URL, REDIS_URL, mysql_connect, pg_connect

PROCESSES = 4
KEYS = 60


def _client(kind: str) -> Any:
    import redis

    if kind == "redis":
        return redis.Redis.from_url(REDIS_URL)
    if kind == "redis_cluster":
        return redis.RedisCluster.from_url(REDIS_CLUSTER_URL)
    return pg_connect() if kind == "postgres" else mysql_connect()


def _options(kind: str, table: str) -> Dict[str, Any]:
    return {"table_name": table} if kind in ("mysql", "postgres") else {}


def _worker(kind: str, app: str, table: str, barrier: Any, out: Any) -> None:
    handled: List[str] = []

    class Listener(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            handled.append(msg.id)
            time.sleep(0.002)  # widen the window in which the others deliver the same key
            return True

    options = _options(kind, table)
    listener = Listener(DedupConfig.enable_dedup_consume_config(app, _client(kind), **options))
    statuses = []
    barrier.wait(30)
    for i in range(KEYS):
        statuses.append(listener(ClassicMessage(f"k{i}")))
    out.put((handled, [int(s) for s in statuses]))


def test_processes_race_for_the_same_keys(
    shared_store_kind: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """4 processes deliver the same 60 keys at once: every key is handled exactly once, and
    the losers answer CONSUME_SUCCESS (already consumed) or RECONSUME_LATER (still running)."""
    table = {"mysql": "mysql_table", "postgres": "pg_table"}.get(shared_store_kind)
    table_name = request.getfixturevalue(table) if table else ""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(shared_store_kind, app_name, table_name, barrier, out))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    handled = [key for keys, _ in results for key in keys]
    assert sorted(handled) == sorted(f"k{i}" for i in range(KEYS))
    # Every loser's retry (RECONSUME_LATER now) is acked later without running the handler.
    late: List[str] = []

    class Redelivery(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            late.append(msg.id)
            return True

    config = DedupConfig.enable_dedup_consume_config(
        app_name, _client(shared_store_kind), **_options(shared_store_kind, table_name)
    )
    answers = [Redelivery(config)(ClassicMessage(f"k{i}")) for i in range(KEYS)]
    assert answers == [ConsumeStatus.CONSUME_SUCCESS] * KEYS
    assert late == []
