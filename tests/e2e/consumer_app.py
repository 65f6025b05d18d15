"""A consumer process for the e2e tests: a DedupConcurrentListener behind a real push consumer.

Run as ``python -m tests.e2e.consumer_app '<json settings>'``. Every delivery and every
business effect is written to MariaDB, so the test process can count them. Prints STARTED
once the consumer runs; stops when its standard input closes or on SIGTERM.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

import redis

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import get_property, message_id, reconsume_times
from tests.e2e.clients import start_push_consumer
from tests.support import REDIS_URL, mysql_connect, pg_connect

BIZ_KEY = "biz_key"

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS e2e_deliveries (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      biz_key VARCHAR(128) NOT NULL, msg_id VARCHAR(128) NOT NULL, attempt INT NOT NULL,
      status INT NOT NULL, handled TINYINT NOT NULL, pid INT NOT NULL, at DOUBLE NOT NULL,
      KEY (run_id))""",
    """CREATE TABLE IF NOT EXISTS e2e_effects (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      biz_key VARCHAR(128) NOT NULL, phase VARCHAR(16) NOT NULL, pid INT NOT NULL,
      KEY (run_id))""",
    # the exactly-once mode's business tables (tests/e2e/test_e2e_exactly_once.py): written
    # only through the transaction's connection, so a row exists only if its message committed
    """CREATE TABLE IF NOT EXISTS e2e_eo_effects (
      id BIGINT AUTO_INCREMENT PRIMARY KEY, run_id VARCHAR(64) NOT NULL,
      biz_key VARCHAR(128) NOT NULL, pid INT NOT NULL, KEY (run_id)) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS e2e_eo_orders (
      run_id VARCHAR(64) NOT NULL, order_id VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL,
      created_times INT NOT NULL DEFAULT 0, paid_times INT NOT NULL DEFAULT 0,
      shipped_times INT NOT NULL DEFAULT 0, PRIMARY KEY (run_id, order_id)) ENGINE=InnoDB""",
]

#: The exactly-once business tables on PostgreSQL (a PostgreSQL store's handler writes there).
PG_EO_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS e2e_eo_effects (
      id bigserial PRIMARY KEY, run_id varchar(64) NOT NULL, biz_key varchar(128) NOT NULL,
      pid int NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS e2e_eo_effects_run ON e2e_eo_effects (run_id)",
    """CREATE TABLE IF NOT EXISTS e2e_eo_orders (
      run_id varchar(64) NOT NULL, order_id varchar(64) NOT NULL, status varchar(16) NOT NULL,
      created_times int NOT NULL DEFAULT 0, paid_times int NOT NULL DEFAULT 0,
      shipped_times int NOT NULL DEFAULT 0, PRIMARY KEY (run_id, order_id))""",
]

#: Order steps of the exactly-once e2e flow: step -> (status it sets, column counting it).
ORDER_STEPS = {
    1: ("created", "created_times"),
    2: ("paid", "paid_times"),
    3: ("shipped", "shipped_times"),
}


class Recorder:
    """Writes deliveries and effects to MariaDB (one connection per thread)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._connect = mysql_connect()
        self._local = threading.local()

    def _execute(self, sql: str, *params: Any) -> None:
        """On a new connection once more when the thread's failed (a lost record would leave
        the test waiting for an answer the broker already had)."""
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None)
            try:
                if conn is None:
                    conn = self._local.conn = self._connect()
                    conn.autocommit(True)
                conn.cursor().execute(sql, params)
                return
            except Exception:
                logging.exception("recording failed (attempt %d): %s %r", attempt, sql, params)
                self._local.conn = None
                if attempt == 2:
                    raise

    def effect(self, key: str, phase: str) -> None:
        self._execute(
            "INSERT INTO e2e_effects (run_id, biz_key, phase, pid) VALUES (%s, %s, %s, %s)",
            self.run_id,
            key,
            phase,
            os.getpid(),
        )

    def delivery(self, key: str, msg: Any, status: ConsumeStatus, handled: bool) -> None:
        self._execute(
            "INSERT INTO e2e_deliveries (run_id, biz_key, msg_id, attempt, status, handled, pid,"
            " at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            self.run_id,
            key,
            message_id(msg) or "",
            reconsume_times(msg),
            int(status),
            int(handled),
            os.getpid(),
            time.time(),
        )


class E2EListener(DedupConcurrentListener):
    """Dedups on the ``biz_key`` property; the handler's behaviour comes from the settings."""

    def __init__(self, config: DedupConfig, settings: Dict[str, Any], recorder: Recorder) -> None:
        super().__init__(config)
        self.settings = settings
        self.recorder = recorder
        self._handled = threading.local()
        self._failed_once: set = set()  # message ids whose first attempt already failed

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return get_property(msg, BIZ_KEY)

    def do_handle_msg(self, msg: Any) -> bool:
        self._handled.value = True
        key = get_property(msg, BIZ_KEY) or ""
        msg_id = message_id(msg)
        first = msg_id not in self._failed_once  # (orderly retries keep reconsume_times 0)
        self.recorder.effect(key, "start")
        if key in self.settings.get("kill_on", ()):  # a poison message: it ends the process
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.settings.get("slow", {}).get(key, self.settings["handler_ms"]) / 1000)
        if first and key in self.settings.get("fail_first", ()):
            self._failed_once.add(msg_id)
            return False
        if first and key in self.settings.get("raise_first", ()):
            self._failed_once.add(msg_id)
            raise RuntimeError(f"business failure on the first attempt of {key}")
        self.recorder.effect(key, "done")
        return True

    def __call__(self, msg: Any) -> ConsumeStatus:
        self._handled.value = False
        status = super().__call__(msg)
        key = get_property(msg, BIZ_KEY) or ""
        self.recorder.delivery(key, msg, status, self._handled.value)
        return status


class E2EExactlyOnceListener(TransactionalDedupListener):
    """The exactly-once listener (settings ``"mode": "exactly_once"``, the MySQL or the
    PostgreSQL store, whose database holds the business tables): dedups on ``biz_key``; its
    handler writes one ``e2e_eo_effects`` row through ``conn`` (a DB-API or psycopg
    connection: the same cursor calls), and with
    ``"sequence": true`` applies the order step of a key ``<order>:<step>`` (sequence key
    ``(order, step)``) to ``e2e_eo_orders``. A key listed in ``"block"`` waits inside the
    transaction, after its writes, for as long as the file ``"gate"`` exists (the test
    SIGKILLs the process there); the wait is announced as the effect phase ``blocked``."""

    def __init__(self, config: DedupConfig, settings: Dict[str, Any], recorder: Recorder) -> None:
        super().__init__(config)
        self.settings = settings
        self.recorder = recorder
        self._handled = threading.local()

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return get_property(msg, BIZ_KEY)

    def sequence_key(self, msg: Any) -> Optional[Tuple[str, int]]:
        key = get_property(msg, BIZ_KEY) or ""
        if not self.settings.get("sequence") or ":" not in key:
            return None  # warm-up messages
        order_id, step = key.rsplit(":", 1)
        return order_id, int(step)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        self._handled.value = True
        key = get_property(msg, BIZ_KEY) or ""
        run_id = self.settings["run_id"]
        self.recorder.effect(key, "start")  # autocommit, outside the transaction
        cur = conn.cursor()
        cur.execute(
            "INSERT INTO e2e_eo_effects (run_id, biz_key, pid) VALUES (%s, %s, %s)",
            (run_id, key, os.getpid()),
        )
        sequence = self.sequence_key(msg)
        if sequence is not None:
            order_id, step = sequence
            status, counter = ORDER_STEPS[step]
            if step == 1:
                cur.execute(
                    "INSERT INTO e2e_eo_orders (run_id, order_id, status, created_times) "
                    "VALUES (%s, %s, %s, 1)",
                    (run_id, order_id, status),
                )
            else:
                cur.execute(
                    f"UPDATE e2e_eo_orders SET status = %s, {counter} = {counter} + 1 "
                    "WHERE run_id = %s AND order_id = %s",
                    (status, run_id, order_id),
                )
                if cur.rowcount != 1:  # cannot happen in strict mode
                    return False
        if key in self.settings.get("block", ()):
            self.recorder.effect(key, "blocked")
            deadline = time.monotonic() + 120
            while os.path.exists(self.settings["gate"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(self.settings["handler_ms"] / 1000)
        return True

    def __call__(self, msg: Any) -> ConsumeStatus:
        self._handled.value = False
        status = super().__call__(msg)
        key = get_property(msg, BIZ_KEY) or ""
        self.recorder.delivery(key, msg, status, self._handled.value)
        return status


def main() -> None:
    faulthandler.enable()  # a native crash leaves its stack in the consumer's log
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    if settings["store"] == "redis":
        client: Any = redis.Redis.from_url(REDIS_URL)
    elif settings["store"] == "postgres":
        client = pg_connect()
    else:
        client = mysql_connect()
    exactly_once = settings.get("mode") == "exactly_once"
    config = DedupConfig.enable_dedup_consume_config(
        settings["app"],
        client,
        dedup_processing_expire_milli_seconds=settings.get("lease_ms", 60_000),
        max_lapsed_claims=settings.get("max_lapsed_claims", 0),
        permanent_failure=settings.get("permanent_failure", "dlq"),
        **({"table_name": settings["table"]} if settings["store"] != "redis" else {}),
        **(
            {"pool_size": settings["threads"] + 4, "sequence_mode": "strict"}
            if exactly_once
            else {}
        ),
    )
    listener: Any
    if exactly_once:
        listener = E2EExactlyOnceListener(config, settings, Recorder(settings["run_id"]))
    else:
        listener = E2EListener(config, settings, Recorder(settings["run_id"]))
    stop = start_push_consumer(
        settings["client"],
        settings["group"],
        settings["topic"],
        listener,
        settings["threads"],
        orderly=settings.get("orderly", False),
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("STARTED", flush=True)
    done.wait()
    stop()
    os._exit(0)  # the gRPC client leaves non-daemon threads behind


if __name__ == "__main__":
    main()
