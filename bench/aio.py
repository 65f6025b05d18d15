"""The cases of issue 37: the asyncio listener and deduplicated calls, beside the sync cases.

* ``aio_redis_tasks64_fresh``: :class:`AsyncDedupConcurrentListener` on ``redis.asyncio``, 64
  tasks on one event loop sharing one listener, each consuming its share of fresh messages
  (``redis_threads8_fresh``'s workload with tasks for threads; target: at least its rate);
* ``redis_call_fresh``: ``@deduplicated`` over the handler on the sync Redis store, one caller
  (beside ``redis_fresh``, the listener);
* ``memory_call_fresh``: the same on the memory store; its overhead over a bare call is this
  case's time per message less ``noop``'s (the handler called in a loop), set beside the
  listener's (``memory_fresh`` less ``noop``) in the report.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Sequence

from bench.cases import (
    OK,
    Case,
    LibraryRedisCase,
    RedisCase,
    library_key_pattern,
    listener_options,
)
from bench.messages import consume_all
from bench.settings import LIBRARY_KEY_PREFIX
from rocketmq_dedup import DedupConfig, deduplicated
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.message import message_id
from rocketmq_dedup.stores.memory import MemoryDedupStore

TASKS = 64


class AsyncBenchListener(AsyncDedupConcurrentListener):
    """The asyncio listener as a user writes it; the business code is the bench's handler."""

    def __init__(self, config: DedupConfig, handler: Any) -> None:
        super().__init__(config)
        self.handler = handler

    async def do_handle_msg(self, msg: Any) -> bool:
        return self.handler(msg)  # type: ignore[no-any-return]


class AioRedisTasks64Fresh(RedisCase):
    """64 tasks on one loop share an asyncio listener on redis.asyncio."""

    name = "aio_redis_tasks64_fresh"
    quick_n, full_n = 8_000, 30_000

    def setup(self) -> None:
        import redis.asyncio

        super().setup()
        self.loop = asyncio.new_event_loop()
        kwargs = self.client.connection_pool.connection_kwargs
        self.aclient = redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])
        config = DedupConfig.enable_dedup_consume_config(
            self.app,
            self.aclient,
            key_prefix=LIBRARY_KEY_PREFIX,
            check_store=False,
            **listener_options(),
        )
        self.listener = AsyncBenchListener(config, self.handler)

    @property
    def key_pattern(self) -> str:
        return library_key_pattern(self.app)

    def run(self, items: Sequence[Any]) -> int:
        return self.loop.run_until_complete(self._run(items))

    async def _run(self, items: Sequence[Any]) -> int:
        shares = [items[i::TASKS] for i in range(TASKS)]

        async def worker(share: Sequence[Any]) -> int:
            failures = 0
            for item in share:
                if await self.listener(item) is not OK:
                    failures += 1
            return failures

        return sum(await asyncio.gather(*(worker(share) for share in shares)))

    def consume(self, item: Any) -> Any:  # pragma: no cover - run() is overridden
        raise NotImplementedError

    def close(self) -> None:
        super().close()
        self.loop.run_until_complete(self.listener.aclose())
        self.loop.run_until_complete(self.aclient.aclose())
        self.loop.close()


class RedisCallFresh(LibraryRedisCase):
    """``@deduplicated(config, key=message id)`` over the handler, on the sync Redis store."""

    name = "redis_call_fresh"
    ok: ClassVar[Any] = True

    def setup(self) -> None:
        super().setup()
        self.call = deduplicated(self.listener.dedup_config, key=message_id)(self.handler)

    def consume(self, item: Any) -> Any:
        return self.call(item)


class MemoryCallFresh(Case):
    """``@deduplicated`` over the handler on the memory store (a new store each repetition)."""

    name = "memory_call_fresh"
    quick_n, full_n = 100_000, 300_000
    ok: ClassVar[Any] = True

    def prepare(self, rep: object) -> None:
        config = DedupConfig.enable_dedup_consume_config(
            self.app, MemoryDedupStore(), **listener_options()
        )
        self.call = deduplicated(config, key=message_id)(self.handler)
        super().prepare(rep)

    def consume(self, item: Any) -> Any:
        return self.call(item)

    def run(self, items: Sequence[Any]) -> int:
        return consume_all(self.call, items, True)


AIO_CASES: tuple[type[Case], ...] = (AioRedisTasks64Fresh, RedisCallFresh, MemoryCallFresh)
