"""Quick start: a classic-client consumer (rocketmq-client-python) that handles each order
once, however often the broker delivers it, with its dedup records in PostgreSQL.

    pip install 'rocketmq-dedup[postgres,rocketmq]'
    python quickstart_postgres.py     # runs until Ctrl-C or SIGTERM

Environment (the defaults are the servers scripts/services.sh and scripts/rocketmq.sh start):
    ROCKETMQ_NAMESRV   name server               127.0.0.1:9876
    POSTGRES_URL       where the records live    (table t_rocketmq_dedup)
                       postgresql://dedup:dedup@127.0.0.1:15432/dedup_test
    ORDER_TOPIC        topic to consume          ORDER-TOPIC
    ORDER_GROUP        consumer group            order-consumer-group
"""

import functools
import logging
import os
import signal
import threading
from typing import Any

import psycopg
from rocketmq.client import PushConsumer

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, DedupStatus
from rocketmq_dedup.adapters.classic import set_name_server
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
    connect = functools.partial(  # a zero-argument connection factory (or a psycopg_pool pool)
        psycopg.connect,
        os.environ.get("POSTGRES_URL", "postgresql://dedup:dedup@127.0.0.1:15432/dedup_test"),
    )
    config = DedupConfig.enable_dedup_consume_config(
        "order-service",
        connect,
        dedup_processing_expire_milli_seconds=60_000,  # the CONSUMING lease
        dedup_record_reserve_minutes=1440,  # how long CONSUMED is remembered
    )
    config.persist.create_table()  # idempotent; purge_expired() from a cron job, off-peak
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    with OrderListener(config) as listener:  # the listener is the consumer's callback
        consumer = PushConsumer(os.environ.get("ORDER_GROUP", "order-consumer-group"))
        set_name_server(consumer, os.environ.get("ROCKETMQ_NAMESRV", "127.0.0.1:9876"))
        consumer.subscribe(os.environ.get("ORDER_TOPIC", "ORDER-TOPIC"), listener)
        consumer.start()
        logger.info("consuming; Ctrl-C to stop")
        while not stopping.wait(1):  # a timeout: the signal may land on a client thread
            pass
        consumer.shutdown()
    logger.info("stopped")


if __name__ == "__main__":
    main()
