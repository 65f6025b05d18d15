"""Deduplicated calls on every asyncio server store: Redis (standalone, Cluster, Sentinel),
PostgreSQL (a psycopg factory, an application's psycopg_pool) and MariaDB (asyncmy)."""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, Optional, Tuple

import pytest

from rocketmq_dedup import DedupConfig
from tests.conftest import AIO_STORE_KINDS
from tests.shared.aio_call_cases import *  # noqa: F403
from tests.support import (
    MYSQL,
    PG_DSN,
    REDIS_CLUSTER_URL,
    REDIS_SENTINEL,
    REDIS_SENTINEL_MASTER,
    REDIS_URL,
)


def async_client(kind: str) -> Tuple[Any, Optional[Any]]:
    """The client of an asyncio store of ``kind``, made on the running loop, and the pool to
    open and close with it (an application's psycopg_pool), if any."""
    if kind == "aio_mysql":
        import asyncmy

        params = {k: v for k, v in MYSQL.items() if k != "database"}
        return functools.partial(asyncmy.connect, db=MYSQL["database"], **params), None
    if kind == "aio_postgres":
        import psycopg

        return functools.partial(psycopg.AsyncConnection.connect, PG_DSN), None
    if kind == "aio_postgres_pool":
        import psycopg_pool

        pool = psycopg_pool.AsyncConnectionPool(PG_DSN, min_size=1, max_size=8, open=False)
        return pool, pool
    import redis.asyncio

    if kind == "aio_redis":
        return redis.asyncio.Redis.from_url(REDIS_URL), None
    if kind == "aio_redis_cluster":
        return redis.asyncio.RedisCluster.from_url(REDIS_CLUSTER_URL), None
    from redis.asyncio.sentinel import Sentinel

    host, port = REDIS_SENTINEL.rsplit(":", 1)
    return Sentinel([(host, int(port))]).master_for(REDIS_SENTINEL_MASTER), None


@pytest.fixture(params=[kind for kind in AIO_STORE_KINDS if kind != "aio_memory"])
def make_config(
    request: pytest.FixtureRequest,
) -> Callable[..., Awaitable[Tuple[DedupConfig, Any]]]:
    kind = request.param
    table: Optional[str] = None
    if kind.startswith("aio_postgres"):
        table = request.getfixturevalue("pg_table")
    elif kind == "aio_mysql":
        table = request.getfixturevalue("mysql_table")

    async def make(app: str, **settings: Any) -> Tuple[DedupConfig, Any]:
        client, pool = async_client(kind)
        if pool is not None:
            await pool.open()
        if table is not None:
            settings.setdefault("table_name", table)
        config = DedupConfig.enable_dedup_consume_config(app, client, **settings)

        async def close() -> None:
            await config.aclose()
            if pool is not None:
                await pool.close()
            elif hasattr(client, "aclose"):
                await client.aclose()

        return config, close

    return make
