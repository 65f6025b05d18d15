"""Quick start, asyncio: the classic client (rocketmq-client-python) feeding an asyncio
listener whose handler is an async def, with its dedup records in Redis (redis.asyncio). The
client's native threads hand each message to the event loop and wait for its answer.

    pip install 'rocketmq-dedup[redis,rocketmq]'
    python quickstart_asyncio.py      # runs until Ctrl-C or SIGTERM

Environment (the defaults are the servers scripts/services.sh and scripts/rocketmq.sh start):
    ROCKETMQ_NAMESRV   name server               127.0.0.1:9876
    REDIS_URL          where the records live    redis://127.0.0.1:16379/0
    ORDER_TOPIC        topic to consume          ORDER-TOPIC
    ORDER_GROUP        consumer group            order-consumer-group
"""

import asyncio
import logging
import os
import signal
from typing import Any

import redis.asyncio
from rocketmq.client import PushConsumer

from rocketmq_dedup import DedupConfig, DedupStatus
from rocketmq_dedup.adapters.classic import set_name_server
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.aio.consumers import PushBridge
from rocketmq_dedup.message import message_body, message_keys

logger = logging.getLogger("orders")


class OrderListener(AsyncDedupConcurrentListener):
    """Handles an order on the event loop; one class for both RocketMQ clients."""

    def dedup_message_key(self, msg: Any) -> Any:  # a plain def: no waiting in a key
        keys = message_keys(msg)  # the order id, set by the producer as the message's key
        return keys[0] if keys else super().dedup_message_key(msg)  # else UNIQ_KEY/id

    async def do_handle_msg(self, msg: Any) -> bool:  # True: done; False or raise: retry later
        order = message_body(msg).decode("utf-8", "replace")
        await asyncio.sleep(0.01)  # your async I/O: an HTTP call, an asyncpg write...
        logger.info("order %s handled: %s", self.dedup_message_key(msg), order)
        return True

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:  # optional: see the replays
        logger.info("order %s: duplicate (%s), skipped", self.dedup_message_key(msg), status.name)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    client = redis.asyncio.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"))
    config = DedupConfig.enable_dedup_consume_config(
        "order-service",
        client,
        dedup_processing_expire_milli_seconds=60_000,  # the CONSUMING lease
        dedup_record_reserve_minutes=1440,  # how long CONSUMED is remembered
    )
    async with OrderListener(config) as listener:  # the store's start-up check runs here
        consumer = PushConsumer(os.environ.get("ORDER_GROUP", "order-consumer-group"))
        set_name_server(consumer, os.environ.get("ROCKETMQ_NAMESRV", "127.0.0.1:9876"))
        # the client's threads hand each message to this loop (at most 64 at once)
        consumer.subscribe(os.environ.get("ORDER_TOPIC", "ORDER-TOPIC"), PushBridge(listener, loop))
        await asyncio.to_thread(consumer.start)  # the client's calls block: off the loop
        logger.info("consuming; Ctrl-C to stop")
        await stopping.wait()
        await asyncio.to_thread(consumer.shutdown)  # its callbacks finish on this loop
    await client.aclose()
    logger.info("stopped")


if __name__ == "__main__":
    asyncio.run(main())
