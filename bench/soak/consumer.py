"""A soak consumer process: ``python -m bench.soak.consumer '<json settings>'``.

A listener of the mode's kind behind a real push consumer. Its business effect is a MariaDB
row (``soak_effects``; in exactly-once mode written through the transaction's connection, so a
row exists only if its message committed). What it decided about every message is one line in
its evidence file, written with ``os.write`` as it happens, so a SIGKILL loses nothing already
decided: ``<time> <pid> <key> <event> <detail>``. Events: ``effect`` (an effect row committed),
``effect_error`` (writing it raised: the row may still exist), ``decision`` (the listener's
outcome, from its metrics, with whether the message's CONSUMED mark succeeded), ``answer``
(what the client got: ``ack`` or ``later``, RECONSUME_LATER). Prints STARTED once consuming;
stops on SIGTERM.

Modes: ``plain-redis``, ``plain-mysql`` (:class:`DedupConcurrentListener`), ``exactly-once``
(:class:`TransactionalDedupListener`), and the control ``no-dedup``: the same handler behind a
plain listener (no dedup record, no library code but the 5.x client's status adapter), which
answers ``consumed`` or ``failed``. ``options`` (settings) go to the mode's ``DedupConfig``.
The slot's ``kind``: ``classic`` (push), ``orderly`` (the classic orderly consumer) or ``grpc``
(the 5.x ``PushConsumer``).
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

from bench.soak.plan import fails_first, handler_ms
from rocketmq_dedup import DedupConcurrentListener, DedupConfig, TransactionalDedupListener
from rocketmq_dedup.message import message_id, message_keys, reconsume_times
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.status import ConsumeStatus
from tests.e2e.clients import start_push_consumer
from tests.support import mysql_connect

EFFECT_SQL = "INSERT INTO soak_effects (run_id, biz_key, pid, at) VALUES (%s, %s, %s, %s)"


class Evidence(DedupMetrics):
    """The evidence file, also the listener's metrics object (a decision per message; the
    last CONSUMED mark's success per thread)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()
        self.marks = threading.local()

    def write(self, key: str, event: str, detail: str = "-") -> None:
        os.write(self.fd, f"{time.time():.4f} {self.pid} {key} {event} {detail}\n".encode())

    def message(self, decision: Decision) -> None:
        """``decision <outcome>``, ``:mark_ok``/``:mark_failed`` after a CONSUMED mark."""
        mark, self.marks.ok = getattr(self.marks, "ok", None), None
        detail = decision.outcome.value
        if mark is not None:
            detail += ":mark_ok" if mark else ":mark_failed"
        self.write(first_key(decision.message), "decision", detail)

    def store_operation(self, application: str, op: StoreOp, seconds: float, ok: bool) -> None:
        if op is StoreOp.MARK_CONSUMED:
            self.marks.ok = ok


def first_key(msg: Any) -> str:
    keys = message_keys(msg)
    return keys[0] if keys else "?"


class Handler:
    """The business code every listener runs: 1-20 ms of work, 5 % of the keys fail on
    their message's first attempt."""

    def __init__(self, settings: Dict[str, Any], evidence: Evidence) -> None:
        self.run_id = settings["run_id"]
        self.evidence = evidence
        self._connect = mysql_connect()
        self._local = threading.local()
        self._failed: set[str] = set()  # message ids failed once here (orderly retries
        self._failed_lock = threading.Lock()  # keep reconsume_times 0)

    def work(self, msg: Any) -> Optional[str]:
        """Sleep the key's handler time; the key, or None if this attempt fails."""
        key = first_key(msg)
        time.sleep(handler_ms(key) / 1000)
        if reconsume_times(msg) == 0 and fails_first(key):
            with self._failed_lock:
                first = (msg_id := message_id(msg) or key) not in self._failed
                self._failed.add(msg_id)
            if first:
                return None
        return key

    def effect(self, key: str) -> bool:
        """The plain modes' effect: one autocommitted row (a new connection after an error)."""
        try:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connect()
                conn.autocommit(True)
            conn.cursor().execute(EFFECT_SQL, (self.run_id, key, os.getpid(), time.time()))
        except Exception as exc:
            self._local.conn = None
            self.evidence.write(key, "effect_error", type(exc).__name__)
            raise
        self.evidence.write(key, "effect")
        return True


class PlainListener(DedupConcurrentListener):
    def __init__(self, config: DedupConfig, handler: Handler) -> None:
        super().__init__(config)
        self.handler = handler

    def dedup_message_key(self, msg: Any) -> str:
        return first_key(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        key = self.handler.work(msg)
        return key is not None and self.handler.effect(key)


class ExactlyOnceListener(TransactionalDedupListener):
    def __init__(self, config: DedupConfig, handler: Handler) -> None:
        super().__init__(config)
        self.handler = handler

    def dedup_message_key(self, msg: Any) -> str:
        return first_key(msg)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        key = self.handler.work(msg)
        if key is None:
            return False
        conn.cursor().execute(EFFECT_SQL, (self.handler.run_id, key, os.getpid(), time.time()))
        return True  # the row commits with the CONSUMED record, or not at all


class ControlListener:
    """The control (``no-dedup``): the handler behind a plain listener, no dedup at all."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def __call__(self, msg: Any) -> ConsumeStatus:
        key = first_key(msg)
        try:
            done = (applied := self.handler.work(msg)) is not None and self.handler.effect(applied)
        except Exception:
            done = False  # the effect's error is in the evidence already
        self.handler.evidence.write(key, "decision", "consumed" if done else "failed")
        return ConsumeStatus.CONSUME_SUCCESS if done else ConsumeStatus.RECONSUME_LATER


class Answering:
    """Writes what ``listener`` answered the client (``answer ack|later``) and returns it."""

    def __init__(self, listener: Any, evidence: Evidence) -> None:
        self.listener, self.evidence = listener, evidence

    def __call__(self, msg: Any) -> Any:
        status = self.listener(msg)  # never raises (the library's listeners, ControlListener)
        acked = status == ConsumeStatus.CONSUME_SUCCESS
        self.evidence.write(first_key(msg), "answer", "ack" if acked else "later")
        return status


def make_listener(settings: Dict[str, Any], handler: Handler, evidence: Evidence) -> Any:
    """The mode's listener, with the run's extra ``DedupConfig`` options."""
    if settings["mode"] == "no-dedup":
        return ControlListener(handler)
    common: Dict[str, Any] = {
        "dedup_processing_expire_milli_seconds": settings["lease_ms"],
        "metrics": evidence,
        "check_store": False,  # a consumer restarted during an outage still starts
        **settings.get("options", {}),
    }
    if settings["mode"] == "exactly-once":
        config = DedupConfig.enable_dedup_consume_config(
            settings["app"], mysql_connect(), pool_size=settings["threads"] + 2, **common
        )
        return ExactlyOnceListener(config, handler)
    if settings["mode"] == "plain-mysql":
        config = DedupConfig.enable_dedup_consume_config(
            settings["app"], mysql_connect(), pool_size=settings["threads"] + 2, **common
        )
        return PlainListener(config, handler)
    client = redis.Redis.from_url(settings["redis_url"], socket_timeout=5)
    config = DedupConfig.enable_dedup_consume_config(settings["app"], client, **common)
    return PlainListener(config, handler)


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(message)s")
    evidence = Evidence(settings["evidence"])
    handler = Handler(settings, evidence)
    listener = Answering(make_listener(settings, handler, evidence), evidence)
    kind = settings["kind"]
    stop = start_push_consumer(
        "grpc" if kind == "grpc" else "classic",
        settings["group"],
        settings["topic"],
        listener,
        settings["threads"],
        orderly=kind == "orderly",
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print("STARTED", flush=True)
    done.wait()
    stop()
    os._exit(0)  # the gRPC client leaves non-daemon threads behind


if __name__ == "__main__":
    main()
