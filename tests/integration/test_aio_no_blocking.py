"""No blocking call on the event loop: the asyncio path, run in asyncio's debug mode against a
Redis that answers 200 ms late (a delaying proxy), logs no slow callback: the start-up check,
claims, marks, releases, lease renewal, the in-process wait, local retries, batches and the
push bridge all wait for the store by yielding the loop. The same run with a store that waits
for Redis by blocking (the sync store behind an asyncio face) is caught: the check can fail."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterator, List, Sequence

import pytest
import redis
import redis.asyncio

from rocketmq_dedup import ConsumeStatus, DedupConfig, RedisDedupStore
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.aio.consumers import PushBridge
from rocketmq_dedup.stores.aio import AsyncDedupStore
from rocketmq_dedup.stores.base import Claim, ClaimResult
from rocketmq_dedup.testing import ClassicMessage
from tests.aio_support import DelayProxy
from tests.support import REDIS_URL

DELAY = 0.2  # each way through the proxy
SLOW = 0.1  # asyncio's slow-callback threshold for these runs


class Orders(AsyncDedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.handled: List[Any] = []
        self.failures = 1  # the first handler run fails once (a local retry)

    async def do_handle_msg(self, msg: Any) -> bool:
        self.handled.append(msg)
        await asyncio.sleep(0.5)  # longer than the lease: renewed meanwhile
        if self.failures:
            self.failures -= 1
            return False
        return True


class BlockingRedis(AsyncDedupStore):
    """What the check must catch: an asyncio face over the sync store, waiting for Redis by
    blocking the loop."""

    def __init__(self, client: Any) -> None:
        self.sync = RedisDedupStore(client)

    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return self.sync.do_claim_many(claims, lease_ms)

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self.sync.do_claim(claim, lease_ms)

    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        self.sync.do_mark_consumed_many(claims, retention_ms)

    async def do_release_many(self, claims: Sequence[Claim]) -> int:
        return self.sync.do_release_many(claims)

    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return self.sync.do_renew_many(claims, lease_ms)

    async def do_read(self, element: Any) -> Any:
        return self.sync.do_read(element)


@pytest.fixture
def slow_redis() -> Iterator[DelayProxy]:
    """The shared Redis behind a proxy that holds each chunk 200 ms."""
    url = redis.Redis.from_url(REDIS_URL).connection_pool.connection_kwargs
    proxy = DelayProxy((url["host"], url["port"]), DELAY)
    yield proxy
    proxy.close()


def slow_callbacks(store_of: Any, app_name: str, caplog: pytest.LogCaptureFixture) -> List[str]:
    """Run a consumer's workload on a debug-mode loop; the slow callbacks asyncio logged."""

    async def workload() -> None:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = SLOW
        store, client = store_of()
        config = DedupConfig.enable_dedup_consume_config(
            app_name,
            store,
            dedup_processing_expire_milli_seconds=450,  # renewed every 150 ms while handlers run
            local_retries=1,
            local_retry_backoff_milli_seconds=10,
            in_progress_wait_milli_seconds=100,
        )
        try:
            async with Orders(config) as listener:
                msgs = [ClassicMessage(f"m{i}") for i in range(4)]
                answers = await asyncio.gather(*(listener(m) for m in msgs + msgs[:2]))
                assert answers.count(ConsumeStatus.CONSUME_SUCCESS) >= 4
                assert await listener.consume_each(msgs) == [ConsumeStatus.CONSUME_SUCCESS] * 4
                bridge = PushBridge(listener, loop)
                answer = await asyncio.to_thread(bridge, ClassicMessage("m9"))
                assert answer is ConsumeStatus.CONSUME_SUCCESS
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(workload(), debug=True)
    return [r.getMessage() for r in caplog.records if "took" in r.getMessage()]


def test_the_asyncio_path_never_blocks_the_loop(
    slow_redis: DelayProxy, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On a 200 ms Redis, asyncio's debug mode (slow callbacks over 100 ms logged) finds none in
    a run that goes through every step of the asyncio path, renewal included."""

    def async_store() -> Any:
        client = redis.asyncio.Redis(port=slow_redis.port)
        return client, client

    assert slow_callbacks(async_store, app_name, caplog) == []


def test_the_check_catches_a_store_that_blocks_the_loop(
    slow_redis: DelayProxy, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same run with the sync Redis store behind an asyncio face logs slow callbacks (of
    at least the proxy's round trip): the check above can fail."""

    class Closing:
        def __init__(self, client: Any) -> None:
            self.client = client

        async def aclose(self) -> None:
            self.client.close()

    def blocking_store() -> Any:
        client = redis.Redis(port=slow_redis.port)
        return BlockingRedis(client), Closing(client)

    slow = slow_callbacks(blocking_store, app_name, caplog)
    assert slow, "a store that blocks the loop went unnoticed"
    assert any("Task" in line for line in slow)
