"""Exactly-once order flow: create (1) -> pay (2) -> ship (3), each step a message of
ORDER-TOPIC, handled by a TransactionalDedupListener that writes ``t_order`` through the
transaction's connection, with the order's step as its sequence number (strict mode).

Whatever order the broker delivers the steps in, and however often, every order ends
``shipped`` with each step applied exactly once: a step that arrives before its predecessor
is answered RECONSUME_LATER (the broker's retry brings it back), a repeat is acked without
running, and the step's write commits together with its dedup record. (With the classic
client, a step and its predecessor that keep arriving in one pull can hold each other back
until the DLQ: librocketmq sends the rest of a pull back unrun after a RECONSUME_LATER;
README, "Under faults". The 5.x clients deliver one message per call.)

python -m samples.orders_exactly_once              # consume until Ctrl-C
python -m samples.orders_exactly_once --orders 5   # also send 5 orders' steps as 3, 1, 2 with
                                                   # duplicates, wait for them, report, exit

MariaDB/MySQL from DEDUP_MYSQL_HOST, _PORT, _USER, _PASSWORD, _DATABASE (the defaults are
scripts/services.sh's: 127.0.0.1:13306, dedup/dedup, dedup_test); the broker's name server is
ROCKETMQ_NAMESRV (default 127.0.0.1:9876, scripts/rocketmq.sh's). Needs mysqlclient and the
classic client.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup import DedupConfig, TransactionalDedupListener
from rocketmq_dedup.message import message_body
from rocketmq_dedup.stores.mysql import MySQLDedupStore

logger = logging.getLogger("samples.orders_exactly_once")

ORDER_TOPIC = "ORDER-TOPIC"
ORDER_GROUP = "order-consumer-group"
#: Step number -> the status it sets and the column counting its applications.
STEPS: Dict[int, Tuple[str, str]] = {
    1: ("created", "created_times"),
    2: ("paid", "paid_times"),
    3: ("shipped", "shipped_times"),
}
_ORDERS_DDL = """\
CREATE TABLE IF NOT EXISTS {table} (
  id            VARCHAR(64) NOT NULL PRIMARY KEY,
  status        VARCHAR(16) NOT NULL,
  created_times INT NOT NULL DEFAULT 0,
  paid_times    INT NOT NULL DEFAULT 0,
  shipped_times INT NOT NULL DEFAULT 0
) ENGINE=InnoDB"""


def order_message_body(order_id: str, step: int) -> bytes:
    """The body of one step's message."""
    return json.dumps({"order_id": order_id, "step": step}).encode()


def parse_order_message(msg: Any) -> Tuple[str, int]:
    """(order id, step) of a message; raises ValueError for anything else."""
    data = json.loads(message_body(msg))
    order_id, step = data["order_id"], data["step"]
    if not isinstance(order_id, str) or type(step) is not int or step not in STEPS:
        raise ValueError(f"not an order step: {data!r}")
    return order_id, step


class OrderListener(TransactionalDedupListener):
    """Applies order steps to the orders table, each in the transaction of its message (a
    DB-API connection: mysqlclient or PyMySQL)."""

    def __init__(self, config: DedupConfig, orders_table: str = "t_order") -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", orders_table):
            raise ValueError(f"invalid table name {orders_table!r}")
        self.orders_table = orders_table
        super().__init__(config)

    def create_tables(self, connect: Callable[[], Any]) -> None:
        """The dedup and sequence tables, and the orders table (all idempotent)."""
        store = self.dedup_config.persist if self.dedup_config is not None else None
        assert isinstance(store, MySQLDedupStore)
        store.create_table()
        query(connect, _ORDERS_DDL.format(table=self.orders_table))

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        """The business key: a producer's resend of a step is the same step."""
        order_id, step = parse_order_message(msg)
        return f"{order_id}:{step}"

    def sequence_key(self, msg: Any) -> Tuple[str, int]:
        return parse_order_message(msg)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        order_id, step = parse_order_message(msg)
        status, counter = STEPS[step]
        cur = conn.cursor()
        if step == 1:
            cur.execute(
                f"INSERT INTO {self.orders_table} (id, status, created_times) VALUES (%s, %s, 1)",
                (order_id, status),
            )
        else:
            cur.execute(
                f"UPDATE {self.orders_table} SET status = %s, {counter} = {counter} + 1 "
                "WHERE id = %s",
                (status, order_id),
            )
            if cur.rowcount != 1:  # cannot happen in strict mode; retried if it does
                logger.warning("order %s not found for step %d", order_id, step)
                return False
        logger.info("order %s: %s", order_id, status)
        return True

    def order_rows(self, connect: Callable[[], Any], orders: List[str]) -> Dict[str, Any]:
        """order id -> (status, created_times, paid_times, shipped_times)."""
        marks = ", ".join(["%s"] * len(orders))
        rows = query(
            connect,
            f"SELECT id, status, created_times, paid_times, shipped_times "
            f"FROM {self.orders_table} WHERE id IN ({marks})",
            orders,
        )
        return {row[0]: tuple(row[1:]) for row in rows}


def query(connect: Callable[[], Any], sql: str, params: Sequence[Any] = ()) -> List[Any]:
    """One statement on a new autocommit connection; its rows."""
    conn = connect()
    try:
        conn.autocommit(True)
        cur = conn.cursor()
        cur.execute(sql, params)
        return list(cur.fetchall())
    finally:
        conn.close()


def mysql_factory() -> Callable[[], Any]:
    """The connection factory, from the environment (scripts/services.sh's defaults)."""
    import MySQLdb  # the [mysql] extra

    env = os.environ.get
    return functools.partial(
        MySQLdb.connect,
        host=env("DEDUP_MYSQL_HOST", "127.0.0.1"),
        port=int(env("DEDUP_MYSQL_PORT", "13306")),
        user=env("DEDUP_MYSQL_USER", "dedup"),
        password=env("DEDUP_MYSQL_PASSWORD", "dedup"),
        database=env("DEDUP_MYSQL_DATABASE", "dedup_test"),
    )


def send_orders(count: int) -> List[str]:
    """Send ``count`` orders' steps out of order (3, 1, 2), each step twice; their ids."""
    from samples.rocketmq_clients import Producer

    producer = Producer("classic")
    orders = [f"order-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    try:
        for order_id in orders:
            for step in (3, 1, 2, 3, 1, 2):
                producer.send(ORDER_TOPIC, order_message_body(order_id, step), {})
    finally:
        producer.close()
    return orders


def report(rows: Dict[str, Any], orders: List[str]) -> bool:
    """Print one line per guarantee; True when all hold."""
    shipped = all(rows.get(o, ("",))[0] == "shipped" for o in orders)
    once = all(tuple(rows.get(o, (None, 0, 0, 0))[1:]) == (1, 1, 1) for o in orders)
    print("=== exactly-once order flow ===")
    print(f"  orders sent (steps 3, 1, 2, each twice)        {len(orders):>4}")
    print(f"  every order ended shipped                      {'yes' if shipped else 'NO'}")
    print(f"  each step applied exactly once                 {'yes' if once else 'NO'}")
    return shipped and once


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--orders", type=int, default=0, help="send this many orders, report")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for them")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    connect = mysql_factory()
    config = DedupConfig.enable_dedup_consume_config(
        "order-service", connect, sequence_mode="strict"
    )
    listener = OrderListener(config)  # keep a reference for as long as the consumer runs
    listener.create_tables(connect)
    from samples.rocketmq_clients import consume_until_interrupted, start_push_consumer

    if not args.orders:
        consume_until_interrupted("classic", ORDER_GROUP, ORDER_TOPIC, listener)
        return
    stop = start_push_consumer("classic", ORDER_GROUP, ORDER_TOPIC, listener)
    try:
        orders = send_orders(args.orders)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            rows = listener.order_rows(connect, orders)
            if all(rows.get(o, ("",))[0] == "shipped" for o in orders):
                break
            time.sleep(1.0)  # the broker's retries take seconds
    finally:
        stop()
        listener.close()
    raise SystemExit(0 if report(listener.order_rows(connect, orders), orders) else 1)


if __name__ == "__main__":
    main()
