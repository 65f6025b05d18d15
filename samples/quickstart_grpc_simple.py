"""Quick start: a 5.x gRPC SimpleConsumer (rocketmq-python-client) that handles each order
once, however often the broker delivers it, with its dedup records in Redis. Each round
receives a batch, dedups it in one store call per phase, and acks the handled and the
duplicates; the rest becomes visible again after the invisible duration. The listener class is
the classic quick start's, unchanged.

    pip install 'rocketmq-dedup[redis,rocketmq5]'
    python quickstart_grpc_simple.py  # runs until Ctrl-C or SIGTERM

Environment (the defaults are the servers scripts/services.sh and scripts/rocketmq.sh start):
    ROCKETMQ_PROXY     gRPC proxy (endpoints)    127.0.0.1:8081
    REDIS_URL          where the records live    redis://127.0.0.1:16379/0
    ORDER_TOPIC        topic to consume          ORDER-TOPIC
    ORDER_GROUP        consumer group            order-group
"""

import logging
import os
import signal
import threading
from typing import Any

import redis
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, DedupStatus
from rocketmq_dedup.adapters.grpc import consume_simple
from rocketmq_dedup.message import message_body, message_keys

logger = logging.getLogger("orders")


class OrderListener(DedupConcurrentListener):
    """Handles an order; one class for both RocketMQ clients (rocketmq_dedup.message)."""

    def dedup_message_key(self, msg: Any) -> Any:
        keys = message_keys(msg)  # the order id, set by the producer as the message's key
        return keys[0] if keys else super().dedup_message_key(msg)  # else UNIQ_KEY/id

    def do_handle_msg(self, msg: Any) -> bool:  # True: done; False or raise: retry later
        order = message_body(msg).decode("utf-8", "replace")
        logger.info("order %s handled: %s", self.dedup_message_key(msg), order)
        return True

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:  # optional: see the replays
        logger.info("order %s: duplicate (%s), skipped", self.dedup_message_key(msg), status.name)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = DedupConfig.enable_dedup_consume_config(
        "order-service",
        redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")),
        dedup_processing_expire_milli_seconds=60_000,  # the CONSUMING lease
        dedup_record_reserve_minutes=1440,  # how long CONSUMED is remembered
    )
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    with OrderListener(config) as listener:
        consumer = SimpleConsumer(
            ClientConfiguration(os.environ.get("ROCKETMQ_PROXY", "127.0.0.1:8081"), Credentials()),
            os.environ.get("ORDER_GROUP", "order-group"),
            {os.environ.get("ORDER_TOPIC", "ORDER-TOPIC"): FilterExpression()},
            await_duration=5,  # long polling: a stop request is seen within 5 s
        )
        consumer.startup()
        logger.info("consuming; Ctrl-C to stop")
        while not stopping.is_set():
            try:
                consume_simple(consumer, listener, max_message_num=16, invisible_duration=30)
            except Exception as exc:  # e.g. the proxy has not synced this consumer's settings yet
                logger.warning("receive failed, retrying in 1 s: %s", exc)
                stopping.wait(1.0)  # unacked messages come back after their invisible time
        consumer.shutdown()
    logger.info("stopped")


if __name__ == "__main__":
    main()
