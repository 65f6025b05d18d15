"""Quick start, exactly once on PostgreSQL: a classic-client consumer whose handler records each
order's payment in PostgreSQL. The payment row and the order's dedup record commit in one
transaction, so however often the broker delivers an order (and whatever crashes), its payment
is written once.

    pip install 'rocketmq-dedup[postgres,rocketmq]'
    python quickstart_exactly_once_postgres.py   # runs until Ctrl-C or SIGTERM

Environment (the defaults are the servers scripts/services.sh and scripts/rocketmq.sh start):
    ROCKETMQ_NAMESRV   name server               127.0.0.1:9876
    POSTGRES_URL       the business database     (tables t_payment and t_rocketmq_dedup)
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

from rocketmq_dedup import DedupConfig, DedupStatus, TransactionalDedupListener
from rocketmq_dedup.adapters.classic import set_name_server
from rocketmq_dedup.message import message_body, message_keys

logger = logging.getLogger("orders")

PAYMENTS = """CREATE TABLE IF NOT EXISTS t_payment (
  order_id varchar(191) NOT NULL, body bytea NOT NULL,
  paid_at timestamptz NOT NULL DEFAULT now()
)"""


class PaymentListener(TransactionalDedupListener):
    """Records an order's payment in the message's own transaction."""

    def dedup_message_key(self, msg: Any) -> Any:
        keys = message_keys(msg)  # the order id, set by the producer as the message's key
        return keys[0] if keys else super().dedup_message_key(msg)  # else UNIQ_KEY/id

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:  # conn: this message's transaction
        order, body = self.dedup_message_key(msg), message_body(msg)
        conn.execute("INSERT INTO t_payment (order_id, body) VALUES (%s, %s)", (order, body))
        logger.info("order %s handled: %s", order, body.decode("utf-8", "replace"))
        return True  # commit the payment with the dedup record; False or raise: roll back

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:  # optional: see the replays
        logger.info("order %s: duplicate (%s), skipped", self.dedup_message_key(msg), status.name)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    connect = functools.partial(  # connections to the BUSINESS database (or a psycopg_pool pool)
        psycopg.connect,
        os.environ.get("POSTGRES_URL", "postgresql://dedup:dedup@127.0.0.1:15432/dedup_test"),
    )
    config = DedupConfig.enable_dedup_consume_config("payment-service", connect)
    config.persist.create_table()  # the dedup table (and <table>_seq); idempotent
    with connect() as admin:
        admin.execute(PAYMENTS)  # the business table (yours already exists); committed on exit
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    with PaymentListener(config) as listener:  # the listener is the consumer's callback
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
