"""A process of the outbox's e2e tests (tests/e2e/test_e2e_outbox.py), one role each:

* ``upstream``: a TransactionalDedupListener consuming A; its handler writes A's effect and
  sends B through the outbox (body: the order's step number, read under the order's row lock,
  so B's bodies of one order follow the commit order), in one transaction; with ``"relay":
  true`` an in-process relay sends B.
* ``relay``: a relay alone. With ``"gate_key"``: once the broker acknowledged that key's B, it
  records ``relay-sent`` and waits while the file ``"gate"`` exists (the test SIGKILLs it there,
  between the send and the mark).
* ``downstream``: a TransactionalDedupListener consuming B, deduped on the outbox's message
  key; B's effect in its transaction; every delivery recorded (``e2e_obx_b_deliveries``).

Every role's dedup tables, outbox and business tables are on the database ``"db"`` names
(``mysql``: MariaDB, ``postgres``: PostgreSQL).

Run as ``python -m tests.e2e.outbox_app '<json settings>'``; prints STARTED once running; stops
when its standard input closes or on SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    MySQLDedupStore,
    PostgresDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import get_property, message_body
from rocketmq_dedup.outbox import Outbox, OutboxMessage, OutboxRelay, outbox_message_key
from rocketmq_dedup.outbox.senders import Sender, sender_for
from tests.e2e.clients import Producer, start_push_consumer
from tests.e2e.consumer_app import BIZ_KEY
from tests.integration.exactly_once.support import MYSQL_DB, POSTGRES_DB, Database
from tests.support import mysql_connect, pg_connect

#: The databases the e2e outbox runs on.
DATABASES = ("mysql", "postgres")

MYSQL_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS e2e_obx_a (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      a_key VARCHAR(128) NOT NULL, pid INT NOT NULL, KEY (run_id)) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_orders (
      run_id VARCHAR(64) NOT NULL, order_id VARCHAR(64) NOT NULL, steps INT NOT NULL,
      PRIMARY KEY (run_id, order_id)) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_b (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      b_key VARCHAR(128) NOT NULL, body VARCHAR(128) NOT NULL, pid INT NOT NULL,
      KEY (run_id)) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_b_deliveries (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      b_key VARCHAR(128) NOT NULL, status INT NOT NULL, KEY (run_id)) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_events (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      what VARCHAR(64) NOT NULL, detail VARCHAR(128) NOT NULL, KEY (run_id)) ENGINE=InnoDB""",
]
POSTGRES_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS e2e_obx_a (
      id bigserial PRIMARY KEY, run_id varchar(64) NOT NULL, a_key varchar(128) NOT NULL,
      pid int NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_orders (
      run_id varchar(64) NOT NULL, order_id varchar(64) NOT NULL, steps int NOT NULL,
      PRIMARY KEY (run_id, order_id))""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_b (
      id bigserial PRIMARY KEY, run_id varchar(64) NOT NULL, b_key varchar(128) NOT NULL,
      body varchar(128) NOT NULL, pid int NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_b_deliveries (
      id bigserial PRIMARY KEY, run_id varchar(64) NOT NULL, b_key varchar(128) NOT NULL,
      status int NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS e2e_obx_events (
      id bigserial PRIMARY KEY, run_id varchar(64) NOT NULL, what varchar(64) NOT NULL,
      detail varchar(128) NOT NULL)""",
    *(
        f"CREATE INDEX IF NOT EXISTS {table}_run ON {table} (run_id)"
        for table in ("e2e_obx_a", "e2e_obx_b", "e2e_obx_b_deliveries", "e2e_obx_events")
    ),
]
#: The business tables, per database.
SCHEMA = {"mysql": MYSQL_SCHEMA, "postgres": POSTGRES_SCHEMA}
#: An order's step counter: the next step, its row locked until the transaction ends.
ORDER_STEP_SQL = {
    "mysql": "INSERT INTO e2e_obx_orders (run_id, order_id, steps) VALUES (%s, %s, 1) "
    "ON DUPLICATE KEY UPDATE steps = steps + 1",
    "postgres": "INSERT INTO e2e_obx_orders AS o (run_id, order_id, steps) VALUES (%s, %s, 1) "
    "ON CONFLICT (run_id, order_id) DO UPDATE SET steps = o.steps + 1",
}


def database(db: str) -> Database:
    """The server ``db`` names, as the tests ask about it."""
    return POSTGRES_DB if db == "postgres" else MYSQL_DB


def connect(db: str) -> Any:
    """A connection factory of ``db``, as users pass it to DedupConfig."""
    return pg_connect() if db == "postgres" else mysql_connect()


def store(db: str, table: str) -> Any:
    """A store of ``db`` on ``table``."""
    kind = PostgresDedupStore if db == "postgres" else MySQLDedupStore
    return kind(connect(db), table)


def record(settings: Dict[str, Any], sql: str, *params: Any) -> None:
    """One autocommitted row (outside any message's transaction) in the run's database."""
    database(settings["db"]).sql(sql, params)


class Upstream(TransactionalDedupListener):
    """Consumes A (dedup key: its ``biz_key``, ``<order>:<step>``): A's effect, the order's
    step counter, and B through the outbox (sharding key: the order, with ``"sharding"``)."""

    def __init__(self, config: DedupConfig, outbox: Outbox, settings: Dict[str, Any]) -> None:
        super().__init__(config)
        self.outbox = outbox
        self.settings = settings
        self.failed_once: set[str] = set()

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return get_property(msg, BIZ_KEY)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        key = get_property(msg, BIZ_KEY) or ""
        run_id = self.settings["run_id"]
        order = key.rsplit(":", 1)[0]
        cur = conn.cursor()
        cur.execute(
            "INSERT INTO e2e_obx_a (run_id, a_key, pid) VALUES (%s, %s, %s)",
            (run_id, key, os.getpid()),
        )
        cur.execute(ORDER_STEP_SQL[self.settings["db"]], (run_id, order))
        cur.execute(
            "SELECT steps FROM e2e_obx_orders WHERE run_id = %s AND order_id = %s",
            (run_id, order),
        )
        (step,) = cur.fetchone()
        sharding = order if self.settings.get("sharding") else None
        self.outbox.send(
            conn,
            self.settings["out_topic"],
            f"{order}:{step}",
            keys=f"{key}:B",
            sharding_key=sharding,
        )
        if key in self.settings.get("fail_first", ()) and key not in self.failed_once:
            self.failed_once.add(key)
            return False  # rolled back: A's effect and B's row with it
        time.sleep(self.settings.get("handler_ms", 5) / 1000)
        return True


class Downstream(TransactionalDedupListener):
    """Consumes B, deduped on the outbox's message key; B's effect in its transaction."""

    def __init__(self, config: DedupConfig, settings: Dict[str, Any]) -> None:
        super().__init__(config)
        self.settings = settings

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return outbox_message_key(msg)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        conn.cursor().execute(
            "INSERT INTO e2e_obx_b (run_id, b_key, body, pid) VALUES (%s, %s, %s, %s)",
            (
                self.settings["run_id"],
                outbox_message_key(msg),
                message_body(msg).decode(),
                os.getpid(),
            ),
        )
        return True

    def __call__(self, msg: Any) -> ConsumeStatus:
        status = super().__call__(msg)
        record(
            self.settings,
            "INSERT INTO e2e_obx_b_deliveries (run_id, b_key, status) VALUES (%s, %s, %s)",
            self.settings["run_id"],
            outbox_message_key(msg) or "",
            int(status),
        )
        return status


class GatedSender(Sender):
    """The producer's sender; after the broker acknowledged ``gate_key``'s message, records it
    and waits while ``gate`` exists (the test kills the process there)."""

    def __init__(self, inner: Sender, settings: Dict[str, Any]) -> None:
        self.inner = inner
        self.client = inner.client
        self.settings = settings

    def send(self, message: OutboxMessage) -> str:
        message_id = self.inner.send(message)
        if message.message_key == self.settings.get("gate_key"):
            record(
                self.settings,
                "INSERT INTO e2e_obx_events (run_id, what, detail) VALUES (%s, %s, %s)",
                self.settings["run_id"],
                "relay-sent",
                message.message_key,
            )
            while os.path.exists(self.settings["gate"]):
                time.sleep(0.05)
        return message_id


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    role, client = settings["role"], settings["client"]
    stops = []
    relay = None
    if role == "downstream":
        config = DedupConfig.enable_dedup_consume_config(
            f"e2e-down-{settings['run_id']}", connect(settings["db"]), table_name=settings["table"]
        )
        listener: Any = Downstream(config, settings)
        stops.append(
            start_push_consumer(
                client,
                settings["group"],
                settings["topic"],
                listener,
                orderly=settings.get("orderly", False),
            )
        )
    else:
        producer = Producer(client, (settings["out_topic"],))
        if role == "upstream":
            config = DedupConfig.enable_dedup_consume_config(
                f"e2e-up-{settings['run_id']}",
                connect(settings["db"]),
                table_name=settings["table"],
            )
            outbox = Outbox(config)  # its relay is woken by the listener's commits
        else:
            outbox = Outbox(store(settings["db"], settings["table"]))
        if role == "relay" or settings.get("relay"):
            relay = OutboxRelay(
                outbox,
                GatedSender(sender_for(producer._producer), settings),
                lease_s=settings.get("lease_s", 30.0),
                poll_interval_s=0.2,
            ).start()
        if role == "upstream":
            upstream = Upstream(config, outbox, settings)
            stops.append(
                start_push_consumer(client, settings["group"], settings["topic"], upstream)
            )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("STARTED", flush=True)
    done.wait()
    for stop in stops:
        stop()
    if relay is not None:
        relay.close()
    os._exit(0)  # the gRPC client leaves non-daemon threads behind


if __name__ == "__main__":
    main()
