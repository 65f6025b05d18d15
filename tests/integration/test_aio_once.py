"""Deduplicated calls on every asyncio server store: Redis (standalone, Cluster, Sentinel),
PostgreSQL (a psycopg factory, an application's psycopg_pool) and MariaDB (asyncmy)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Tuple

import pytest

from rocketmq_dedup import DedupConfig
from tests.conftest import (
    AIO_STORE_KINDS,
    async_client,
    async_store_options,
    close_async_client,
)
from tests.shared.aio_call_cases import *  # noqa: F403


@pytest.fixture(params=[kind for kind in AIO_STORE_KINDS if kind != "aio_memory"])
def make_config(
    request: pytest.FixtureRequest,
) -> Callable[..., Awaitable[Tuple[DedupConfig, Any]]]:
    kind = request.param
    options = async_store_options(kind, request)

    async def make(app: str, **settings: Any) -> Tuple[DedupConfig, Any]:
        client, pool = async_client(kind)
        if pool is not None:
            await pool.open()
        config = DedupConfig.enable_dedup_consume_config(app, client, **options, **settings)

        async def close() -> None:
            await config.aclose()
            await close_async_client(client, pool)

        return config, close

    return make
