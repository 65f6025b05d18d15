"""Consume, write, publish: a classic-client consumer that records each order's payment in MySQL
or MariaDB and sends "ship it" for the order. The payment row, the order's dedup record and the
"ship it" message (a row of the outbox) commit in one transaction, or none of them does; a relay
in this process sends the message after the commit, with the same message key on every attempt
("<order>:ship"), in the order the order's transactions committed (its sharding key).

    pip install 'rocketmq-dedup[mysql,rocketmq]'
    python outbox_payments.py   # runs until Ctrl-C or SIGTERM

Environment (the defaults are the servers scripts/services.sh and scripts/rocketmq.sh start):
    ROCKETMQ_NAMESRV   name server               127.0.0.1:9876
    MYSQL_HOST         the business database     127.0.0.1
    MYSQL_PORT         (tables t_payment,        13306
    MYSQL_USER          t_rocketmq_dedup and     dedup
    MYSQL_PASSWORD      its outbox)              dedup
    MYSQL_DATABASE                               dedup_test
    ORDER_TOPIC        topic to consume          ORDER-TOPIC
    ORDER_GROUP        consumer group            order-consumer-group
    SHIP_TOPIC         where "ship it" goes      SHIP-TOPIC
"""

import contextlib
import functools
import logging
import os
import signal
import threading
from typing import Any

import MySQLdb
from rocketmq.client import Producer, PushConsumer

from rocketmq_dedup import DedupConfig, TransactionalDedupListener
from rocketmq_dedup.adapters.classic import set_name_server
from rocketmq_dedup.message import message_body, message_keys
from rocketmq_dedup.outbox import Outbox

logger = logging.getLogger("payments")

PAYMENTS = """CREATE TABLE IF NOT EXISTS t_payment (
  order_id VARCHAR(191) NOT NULL, body VARBINARY(1024) NOT NULL,
  paid_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), KEY (order_id)
) ENGINE=InnoDB"""
SHIP_TOPIC = os.environ.get("SHIP_TOPIC", "SHIP-TOPIC")


class PaymentListener(TransactionalDedupListener):
    """Records an order's payment and sends "ship it", in the message's own transaction."""

    def __init__(self, config: DedupConfig, outbox: Outbox) -> None:
        super().__init__(config)
        self.outbox = outbox

    def dedup_message_key(self, msg: Any) -> Any:
        keys = message_keys(msg)  # the order id, set by the producer as the message's key
        return keys[0] if keys else super().dedup_message_key(msg)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:  # conn: this message's transaction
        order, body = self.dedup_message_key(msg), message_body(msg)
        with contextlib.closing(conn.cursor()) as cur:
            cur.execute("INSERT INTO t_payment (order_id, body) VALUES (%s, %s)", (order, body))
        # a row of the outbox, in the same transaction: sent after the COMMIT, never without it
        self.outbox.send(conn, SHIP_TOPIC, body, keys=f"{order}:ship", sharding_key=order)
        logger.info("order %s paid; ship it queued", order)
        return True  # commit the payment, the message and the dedup record; False: none


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    connect = functools.partial(  # connections to the BUSINESS database
        MySQLdb.connect,
        host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("MYSQL_PORT", "13306")),
        user=os.environ.get("MYSQL_USER", "dedup"),
        password=os.environ.get("MYSQL_PASSWORD", "dedup"),
        database=os.environ.get("MYSQL_DATABASE", "dedup_test"),
    )
    config = DedupConfig.enable_dedup_consume_config("payment-service", connect)
    config.persist.create_table()  # the dedup table, its sequence table, the outbox's tables
    with contextlib.closing(connect()) as admin, contextlib.closing(admin.cursor()) as cur:
        cur.execute(PAYMENTS)  # the business table (yours already exists)
    namesrv = os.environ.get("ROCKETMQ_NAMESRV", "127.0.0.1:9876")
    producer = Producer("payment-relay", max_message_size=4 * 1024 * 1024)  # the relay's
    set_name_server(producer, namesrv)
    producer.start()
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    outbox = Outbox(config)  # <table>_outbox beside the dedup table
    with PaymentListener(config, outbox) as listener:  # closing it stops the relay
        outbox.relay(producer).start()  # woken by each commit that sent; polls every second
        consumer = PushConsumer(os.environ.get("ORDER_GROUP", "order-consumer-group"))
        set_name_server(consumer, namesrv)
        consumer.subscribe(os.environ.get("ORDER_TOPIC", "ORDER-TOPIC"), listener)
        consumer.start()
        logger.info("consuming; Ctrl-C to stop")
        while not stopping.wait(1):  # a timeout: the signal may land on a client thread
            pass
        consumer.shutdown()
    producer.shutdown()
    logger.info("stopped")


if __name__ == "__main__":
    main()
