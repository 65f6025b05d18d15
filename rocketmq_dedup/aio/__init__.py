"""asyncio: an async listener, its strategies, and the drivers that feed it from either
RocketMQ client. Nothing here blocks the event loop: store I/O goes through asyncio store
clients (:mod:`rocketmq_dedup.stores.aio`), lease renewal runs on the loop from the keeper's
thread, and the clients' threads hand messages to the loop and wait there.

Layout: :mod:`.listener` (:class:`AsyncDedupConcurrentListener`), :mod:`.strategy` (the
template's steps, awaited, on the shared decisions), :mod:`.meter` (metrics of awaited store
calls), :mod:`.consumers` (the 5.x SimpleConsumer's futures and the classic push client's
callback threads, bridged to the loop).
"""

from rocketmq_dedup.aio.listener import AsyncDedupConcurrentListener
from rocketmq_dedup.stores.aio import AsyncDedupStore, AsyncMemoryDedupStore

__all__ = ["AsyncDedupConcurrentListener", "AsyncDedupStore", "AsyncMemoryDedupStore"]
