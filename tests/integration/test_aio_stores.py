"""The asyncio stores (Redis standalone, Cluster and Sentinel; PostgreSQL through a factory and
an application's pool; MariaDB through asyncmy): the store contract and the listener cases (the
asyncio listener through the classic push bridge), on the real servers."""

from __future__ import annotations

import pytest

from rocketmq_dedup.stores.base import DedupStore
from tests.aio_support import bound
from tests.conftest import AIO_STORE_KINDS, make_async_store
from tests.shared.aio_failure_cases import *  # noqa: F403
from tests.shared.listener_cases import *  # noqa: F403
from tests.shared.store_contract import *  # noqa: F403
from tests.support import REDIS_CLUSTER_URL, REDIS_URL

SERVER_KINDS = [kind for kind in AIO_STORE_KINDS if kind != "aio_memory"]


@pytest.fixture(params=SERVER_KINDS)
def store(request: pytest.FixtureRequest) -> DedupStore:
    """Every asyncio server store, bound to the test loop."""
    return bound(make_async_store(request.param, request))


@pytest.mark.parametrize("kind", ["aio_redis", "aio_redis_cluster"])
def test_scripts_the_server_lost_are_loaded_again(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Redis forgot the store's scripts (SCRIPT FLUSH on every node, as on a fresh server or
    after a restart without persistence): the next claims load them again and succeed. On a
    Cluster the asyncio store loaded them through a pipeline, where SCRIPT LOAD has no slot: it
    failed on every fresh cluster (found by a fresh clone's run; the shared servers had them
    loaded by the sync store)."""
    import redis

    from rocketmq_dedup import DedupElement
    from rocketmq_dedup.stores.base import Claim

    url = REDIS_CLUSTER_URL if kind == "aio_redis_cluster" else REDIS_URL
    if kind == "aio_redis_cluster":
        with redis.RedisCluster.from_url(url) as cluster:
            for node in cluster.get_nodes():
                cluster.execute_command("SCRIPT", "FLUSH", target_nodes=node)
    else:
        with redis.Redis.from_url(url) as single:
            single.script_flush()
    store = bound(make_async_store(kind, request))
    app = f"app-{kind}-{id(request)}"
    claims = [Claim(DedupElement(app, "T", "", f"k{n}"), "o1") for n in range(3)]
    assert [r.claimed for r in store.claim_many(claims, 10_000)] == [True, True, True]
    assert store.renew_many(claims, 10_000) == [True, True, True]
    assert store.release_many(claims) == 3
