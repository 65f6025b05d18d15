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

``outbox`` (issue 35), by ``role``: ``upstream`` is the exactly-once listener on A whose
handler also sends B through the outbox (sharding key: a lane of 8 keys), with a relay in the
process (its slot's client: classic, or 5.x for ``grpc``); ``relay`` a relay alone (classic);
``downstream`` the exactly-once listener on B keyed on the outbox's message key, its effect a
``soak_b_effects`` row. Relays write ``b_sent <broker id>`` and B's consumers ``b_answer
ack|later`` to the B evidence file (``b_evidence``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

import redis

from bench.soak.outbox import b_key
from bench.soak.plan import fails_first, handler_ms, key_index
from rocketmq_dedup import (
    DedupConcurrentListener,
    DedupConfig,
    MySQLDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import message_id, message_keys, reconsume_times
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.outbox import Outbox, OutboxMessage, OutboxRelay, outbox_message_key
from rocketmq_dedup.outbox.senders import Sender, sender_for
from rocketmq_dedup.status import ConsumeStatus
from tests.e2e.clients import Producer, start_push_consumer
from tests.support import mysql_connect

EFFECT_SQL = "INSERT INTO soak_effects (run_id, biz_key, pid, at) VALUES (%s, %s, %s, %s)"
B_EFFECT_SQL = "INSERT INTO soak_b_effects (run_id, b_key, pid, at) VALUES (%s, %s, %s, %s)"
#: A claim of the soak's relays holds its rows this long (a killed relay's rows go again then).
RELAY_LEASE_S = 10.0


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
    """Writes what ``listener`` answered the client (``<event> ack|later``, the message's key
    by ``key_of``) and returns it."""

    def __init__(
        self,
        listener: Any,
        evidence: Evidence,
        event: str = "answer",
        key_of: Callable[[Any], Optional[str]] = first_key,
    ) -> None:
        self.listener, self.evidence, self.event, self.key_of = listener, evidence, event, key_of

    def __call__(self, msg: Any) -> Any:
        status = self.listener(msg)  # never raises (the library's listeners, ControlListener)
        acked = status == ConsumeStatus.CONSUME_SUCCESS
        self.evidence.write(self.key_of(msg) or "?", self.event, "ack" if acked else "later")
        return status


def lane(key: str) -> str:
    """B's sharding key: a lane of 8 consecutive keys (a probe its own)."""
    index = key_index(key)
    return f"{key.rpartition('-')[0]}-lane{int(index) // 8}" if index.isdigit() else key


class OutboxUpstream(ExactlyOnceListener):
    """The exactly-once mode's handler, and B through the outbox in A's transaction."""

    def __init__(self, config: DedupConfig, handler: Handler, outbox: Outbox, topic: str) -> None:
        super().__init__(config, handler)
        self.outbox, self.topic = outbox, topic

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        if not super().do_handle_msg(msg, conn):
            return False
        key = first_key(msg)
        self.outbox.send(conn, self.topic, key, keys=b_key(key), sharding_key=lane(key))
        return True  # A's effect and B's row commit with the CONSUMED record, or not at all


class OutboxDownstream(TransactionalDedupListener):
    """B's effect, deduped on the outbox's message key."""

    def __init__(self, config: DedupConfig, run_id: str) -> None:
        super().__init__(config)
        self.run_id = run_id

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        return outbox_message_key(msg)

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        key = outbox_message_key(msg)
        conn.cursor().execute(B_EFFECT_SQL, (self.run_id, key, os.getpid(), time.time()))
        return True


class EvidenceSender(Sender):
    """A relay's producer; every acknowledged send of B is a ``b_sent`` line."""

    def __init__(self, inner: Sender, evidence: Evidence) -> None:
        self.inner, self.evidence, self.client = inner, evidence, inner.client

    def send(self, message: OutboxMessage) -> str:
        message_id = self.inner.send(message)
        self.evidence.write(message.message_key, "b_sent", message_id or "-")
        return message_id


def start_relay(settings: Dict[str, Any], outbox: Outbox, b_evidence: Evidence) -> Any:
    """A relay of ``outbox`` through a producer of the slot's client; (relay, producer)."""
    client = "grpc" if settings["kind"] == "grpc" else "classic"
    producer = Producer(client, (settings["b_topic"],))
    sender = EvidenceSender(sender_for(producer._producer), b_evidence)
    relay = OutboxRelay(outbox, sender, lease_s=RELAY_LEASE_S, poll_interval_s=0.5)
    return relay.start(), producer


def outbox_config(settings: Dict[str, Any], evidence: Optional[Evidence], app: str) -> DedupConfig:
    options: Dict[str, Any] = {
        "dedup_processing_expire_milli_seconds": settings["lease_ms"],
        "check_store": False,
        "pool_size": settings["threads"] + 2,
        **settings.get("options", {}),
    }
    if evidence is not None:
        options["metrics"] = evidence
    return DedupConfig.enable_dedup_consume_config(app, mysql_connect(), **options)


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
    if settings["mode"] == "outbox":
        config = outbox_config(settings, evidence, settings["app"])
        return OutboxUpstream(config, handler, Outbox(config), settings["b_topic"])
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
    kind, role = settings["kind"], settings.get("role", "upstream")
    relay, producer = None, None
    if role == "relay":  # the outbox mode's relay process: no consumer
        outbox = Outbox(MySQLDedupStore(mysql_connect()))
        relay, producer = start_relay(settings, outbox, Evidence(settings["b_evidence"]))
        stop: Any = lambda: None  # noqa: E731
    elif role == "downstream":
        config = outbox_config(settings, None, f"{settings['app']}-b")
        listener: Any = Answering(
            OutboxDownstream(config, settings["run_id"]),
            Evidence(settings["b_evidence"]),
            "b_answer",
            outbox_message_key,
        )
        stop = start_push_consumer(
            "classic", settings["b_group"], settings["b_topic"], listener, settings["threads"]
        )
    else:
        handler = Handler(settings, evidence)
        upstream = make_listener(settings, handler, evidence)
        if isinstance(upstream, OutboxUpstream):  # a relay in the process, woken by commits
            relay, producer = start_relay(
                settings, upstream.outbox, Evidence(settings["b_evidence"])
            )
        listener = Answering(upstream, evidence)
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
    if relay is not None:
        relay.close(timeout=3.0)
        producer.close()
    os._exit(0)  # the gRPC client leaves non-daemon threads behind


if __name__ == "__main__":
    main()
