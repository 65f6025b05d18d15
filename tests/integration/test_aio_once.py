"""Deduplicated calls on the asyncio Redis store (standalone and Cluster)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Tuple

import pytest
import redis.asyncio

from rocketmq_dedup import DedupConfig
from tests.shared.aio_call_cases import *  # noqa: F403
from tests.support import REDIS_CLUSTER_URL, REDIS_URL


@pytest.fixture(params=["aio_redis", "aio_redis_cluster"])
def make_config(
    request: pytest.FixtureRequest,
) -> Callable[..., Awaitable[Tuple[DedupConfig, Any]]]:
    async def make(app: str, **settings: Any) -> Tuple[DedupConfig, Any]:
        if request.param == "aio_redis":
            client: Any = redis.asyncio.Redis.from_url(REDIS_URL)
        else:
            client = redis.asyncio.RedisCluster.from_url(REDIS_CLUSTER_URL)
        config = DedupConfig.enable_dedup_consume_config(app, client, **settings)

        async def close() -> None:
            await config.aclose()
            await client.aclose()

        return config, close

    return make
