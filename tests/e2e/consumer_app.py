"""A consumer process for the e2e tests: a DedupConcurrentListener behind a real push consumer.

Run as ``python -m tests.e2e.consumer_app '<json settings>'``. Every delivery and every
business effect is written to MariaDB, so the test process can count them. Prints STARTED
once the consumer runs; stops when its standard input closes or on SIGTERM.
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

import redis

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
from rocketmq_dedup.message import get_property, message_id, reconsume_times
from tests.e2e.clients import start_push_consumer
from tests.support import REDIS_URL, mysql_connect

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
]


class Recorder:
    """Writes deliveries and effects to MariaDB (one connection per thread)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._connect = mysql_connect()
        self._local = threading.local()

    def _execute(self, sql: str, *params: Any) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            conn.autocommit(True)
        conn.cursor().execute(sql, params)

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


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    if settings["store"] == "redis":
        client: Any = redis.Redis.from_url(REDIS_URL)
    else:
        client = mysql_connect()
    config = DedupConfig.enable_dedup_consume_config(
        settings["app"],
        client,
        dedup_processing_expire_milli_seconds=settings.get("lease_ms", 60_000),
        **({"table_name": settings["table"]} if settings["store"] == "mysql" else {}),
    )
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
