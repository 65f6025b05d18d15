"""A soak consumer process: ``python -m bench.soak.consumer '<json settings>'``.

A listener of the mode's kind behind a real push consumer. Its business effect is a MariaDB
row (``soak_effects``; in exactly-once mode written through the transaction's connection, so a
row exists only if its message committed). What it did about every message is one line in its
evidence file, written with ``os.write`` as it happens, so a SIGKILL loses nothing already
written: ``<time> <pid> <thread id> <key> <event> <detail>`` (the native thread id: a classic
client's callback runs on one native thread from the claim to the answer). Events:

* ``claim``: what the store answered a claim (:class:`Observed`, a subclass of the mode's store
  that only watches): ``claimed`` (a new record), ``taken_over`` (MySQL: the insert met a row
  that was no longer live and the claim took it over), ``refused`` (with the live record's
  ``status``, ``holder`` token and ``left`` ms), ``error`` (the store raised); with the claim's
  ``owner`` token and how long the call ``took``;
* ``renew_begin`` (``owner=<token>``) as the LeaseKeeper starts a renewal (a renewal that
  hangs until its process is killed leaves no other line), and ``renew``: per key, each lease
  renewal's answer: ``ok``, ``lost`` (taken over) or ``error``, with the ``owner`` and
  ``took``; ``mark`` (the CONSUMED mark: ``ok``, ``deferred``:
  queued to ride a later round trip, or ``error``)
  and ``release`` (``ok``, ``gone``: no longer ours, or ``error``), the same way;
* ``effect_begin`` before the handler writes its effect (the line's time is the row's ``at``),
  ``effect`` once the row committed (``took``: connecting and the INSERT), ``effect_error``
  (writing it raised: the row may still exist);
* ``decision``: the listener's outcome, from its metrics, with whether the message's CONSUMED
  mark succeeded; ``answer``: what the client got (``ack``, or ``later``: RECONSUME_LATER);
* ``stall`` (key ``-``): the process's watchdog thread woke ``gap`` seconds later than it
  asked: no Python thread of the process could run for that long (the GIL held, or the process
  not scheduled); with the process's CPU seconds over the gap (``cpu``: near ``gap``, a thread
  was busy holding the GIL; near 0, the process was not running or was blocked) and the host's
  1-minute load.

Prints STARTED once consuming; stops on SIGTERM.

Modes: ``plain-redis``, ``plain-mysql`` (:class:`DedupConcurrentListener`), ``exactly-once``
and ``exactly-once-postgres`` (:class:`TransactionalDedupListener` on MariaDB, on PostgreSQL:
the effect row in the same database, through the transaction's connection), and the control
``no-dedup``: the same handler behind a
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
from typing import Any, Callable, Dict, List, Optional, Sequence

import redis

from bench.soak.outbox import b_key
from bench.soak.plan import fails_first, handler_ms, key_index
from rocketmq_dedup import DedupConcurrentListener, DedupConfig, TransactionalDedupListener
from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import message_id, message_keys, reconsume_times
from rocketmq_dedup.metrics import Decision, DedupMetrics, StoreOp
from rocketmq_dedup.outbox import Outbox, OutboxMessage, OutboxRelay, outbox_message_key
from rocketmq_dedup.outbox.senders import Sender, sender_for
from rocketmq_dedup.status import ConsumeStatus
from rocketmq_dedup.stores import MySQLDedupStore, PostgresDedupStore, RedisDedupStore
from rocketmq_dedup.stores.base import Claim, ClaimResult, DedupStore
from tests.e2e.clients import Producer, start_push_consumer
from tests.support import mysql_connect, pg_connect

EFFECT_SQL = "INSERT INTO soak_effects (run_id, biz_key, pid, at) VALUES (%s, %s, %s, %s)"
B_EFFECT_SQL = "INSERT INTO soak_b_effects (run_id, b_key, pid, at) VALUES (%s, %s, %s, %s)"
#: A claim of the soak's relays holds its rows this long (a killed relay's rows go again then).
RELAY_LEASE_S = 10.0
#: The watchdog asks to wake this often, and writes a ``stall`` line when it woke this much
#: later than asked (seconds).
WATCH_TICK_S = 0.05
STALL_S = 0.25


class Evidence(DedupMetrics):
    """The evidence file, also the listener's metrics object (a decision per message; the
    last CONSUMED mark's success per thread)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()
        self.marks = threading.local()

    def write(self, key: str, event: str, detail: str = "-", at: Optional[float] = None) -> None:
        line = (
            f"{time.time() if at is None else at:.4f} {self.pid} {threading.get_native_id()} "
            f"{key} {event} {detail}\n"
        )
        os.write(self.fd, line.encode())

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

    def store_call_begins(self, event: str, claims: Sequence[Claim]) -> None:
        """One ``<event>_begin owner=<token>`` line per claim of a store call about to run."""
        for claim in claims:
            self.write(claim.element.key, f"{event}_begin", f"owner={claim.owner}")

    def store_call(
        self, event: str, claims: Sequence[Claim], outcomes: Sequence[str], began: float
    ) -> None:
        """One line per claim of a store call: ``<outcome>,owner=<token>,took=<s>``."""
        took = time.perf_counter() - began
        for claim, outcome in zip(claims, outcomes, strict=True):
            self.write(claim.element.key, event, f"{outcome},owner={claim.owner},took={took:.4f}")


def claim_outcome(result: ClaimResult, taken_over: bool) -> str:
    """A claim line's outcome: claimed / taken_over, or refused with the record in the way."""
    if result.claimed:
        return "taken_over" if taken_over else "claimed"
    record = result.record
    if record is None:
        return "refused"
    status = record.status.value if record.status is not None else "unreadable"
    left = "-" if record.expires_in_ms is None else record.expires_in_ms
    return f"refused,status={status},holder={record.owner or '-'},left={left}"


def error_outcome(exc: BaseException) -> str:
    return f"error,error={type(exc).__name__}"


class Observed(DedupStore):
    """Mixed into the mode's store class (:func:`observed`): every claim, renewal, mark and
    release is written to the evidence per key, then answered exactly as the store answered
    it. Only watches: the store's own methods run unchanged."""

    evidence: Evidence
    _resolved: threading.local

    def watch(self, evidence: Evidence) -> None:
        self.evidence = evidence
        self._resolved = threading.local()  # set by a MySQL claim that took over a row

    def _observe(
        self,
        event: str,
        claims: Sequence[Claim],
        call: Callable[[], Any],
        outcomes: Callable[[Any], Sequence[str]],
    ) -> Any:
        began = time.perf_counter()
        self._resolved.taken = False
        try:
            result = call()
        except StoreError as exc:
            self.evidence.store_call(event, claims, [error_outcome(exc)] * len(claims), began)
            raise
        self.evidence.store_call(event, claims, outcomes(result), began)
        return result

    def _claims(self, results: Sequence[ClaimResult]) -> List[str]:
        taken = getattr(self._resolved, "taken", False)
        return [claim_outcome(r, taken and r.claimed) for r in results]

    def claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self._observe(  # type: ignore[no-any-return]
            "claim", [claim], lambda: super(Observed, self).claim(claim, lease_ms),
            lambda result: self._claims([result]),
        )  # fmt: skip

    def claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return self._observe(  # type: ignore[no-any-return]
            "claim", claims, lambda: super(Observed, self).claim_many(claims, lease_ms),
            self._claims,
        )  # fmt: skip

    def _marked(self) -> str:
        """A mark's outcome once the call returned: ``deferred`` when the store queued it for a
        later round trip (it lands after the listener answered: a SIGKILL meanwhile loses it),
        else ``ok`` (written)."""
        return "deferred" if getattr(self, "marks_deferred", False) else "ok"

    def mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        outcome = self._marked()
        self._observe(
            "mark", [claim], lambda: super(Observed, self).mark_consumed(claim, retention_ms),
            lambda _: [outcome],
        )  # fmt: skip

    def mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        outcome = self._marked()
        self._observe(
            "mark", claims,
            lambda: super(Observed, self).mark_consumed_many(claims, retention_ms),
            lambda _: [outcome] * len(claims),
        )  # fmt: skip

    def release(self, claim: Claim) -> bool:
        return self._observe(  # type: ignore[no-any-return]
            "release", [claim], lambda: super(Observed, self).release(claim),
            lambda released: ["ok" if released else "gone"],
        )  # fmt: skip

    def release_many(self, claims: Sequence[Claim]) -> int:
        if len(claims) == 1:  # the store's own release_many calls release() for one
            return int(self.release(claims[0]))
        return self._observe(  # type: ignore[no-any-return]
            "release", claims, lambda: super(Observed, self).release_many(claims),
            lambda released: [f"batch,released={released}"] * len(claims),
        )  # fmt: skip

    def renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        self.evidence.store_call_begins("renew", claims)
        return self._observe(  # type: ignore[no-any-return]
            "renew", claims, lambda: super(Observed, self).renew_many(claims, lease_ms),
            lambda owned: ["ok" if ok else "lost" for ok in owned],
        )  # fmt: skip


class ObservedMySQL(Observed, MySQLDedupStore):
    """The MySQL store, observed; a claim whose insert met an existing row and was then won
    (the store's ``_resolve_refused``: an expired or released row taken over, or after a
    retried insert its own row found) is ``taken_over``. That private step is the only place
    the store tells the two apart; the override only notes that it ran."""

    def _resolve_refused(self, *args: Any, **kwargs: Any) -> Any:
        self._resolved.taken = True
        return super()._resolve_refused(*args, **kwargs)


class ObservedPostgres(Observed, PostgresDedupStore):
    """The PostgreSQL store, observed (one statement decides a claim: a takeover is
    ``claimed``)."""


class ObservedRedis(Observed, RedisDedupStore):
    """The Redis store, observed (a claim of a key whose lease lapsed is a new key there:
    ``claimed``)."""


def watch_stalls(evidence: Evidence) -> None:
    """The watchdog thread: sleeps WATCH_TICK_S at a time and writes a ``stall`` line when it
    woke STALL_S or more later than asked."""
    clock, cpu = time.monotonic(), time.process_time()
    while True:
        time.sleep(WATCH_TICK_S)
        now, used = time.monotonic(), time.process_time()
        gap = now - clock - WATCH_TICK_S
        if gap >= STALL_S:
            detail = f"gap={gap:.3f},cpu={used - cpu:.3f},load={os.getloadavg()[0]:.1f}"
            evidence.write("-", "stall", detail)
        clock, cpu = now, used


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
        #: The effect's connection per native thread (a classic client's callbacks get a fresh
        #: Python thread state each time, so a threading.local would connect per message).
        self._conns: Dict[int, Any] = {}
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
        """The plain modes' effect: one autocommitted row (a new connection after an error),
        its ``effect_begin`` line written first, with the row's time."""
        at = self.begin_effect(key)
        thread = threading.get_native_id()
        try:
            conn = self._conns.get(thread)
            if conn is None:
                conn = self._conns[thread] = self._connect()
                conn.autocommit(True)
            conn.cursor().execute(EFFECT_SQL, (self.run_id, key, os.getpid(), at))
        except Exception as exc:
            self._conns.pop(thread, None)
            self.evidence.write(key, "effect_error", type(exc).__name__)
            raise
        self.end_effect(key, at)
        return True

    def begin_effect(self, key: str) -> float:
        """The ``effect_begin`` line; its time is the effect row's ``at`` (how the row and the
        thread that wrote it are matched)."""
        at = time.time()
        self.evidence.write(key, "effect_begin", at=at)
        return at

    def end_effect(self, key: str, at: float) -> None:
        self.evidence.write(key, "effect", f"took={time.time() - at:.4f}")


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
        at = self.handler.begin_effect(key)
        conn.cursor().execute(EFFECT_SQL, (self.handler.run_id, key, os.getpid(), at))
        self.handler.end_effect(key, at)  # (the row commits with the CONSUMED record, or not)
        return True


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
    """The mode's listener, with the run's extra ``DedupConfig`` options, on an observed
    store (:class:`Observed`)."""
    if settings["mode"] == "no-dedup":
        return ControlListener(handler)
    options = dict(settings.get("options", {}))
    store: Observed
    if settings["mode"] == "plain-redis":
        client = redis.Redis.from_url(settings["redis_url"], socket_timeout=5)
        store = ObservedRedis(client, **_take(options, ("key_prefix",)))
    elif settings["mode"] == "exactly-once-postgres":
        store = ObservedPostgres(
            pg_connect(settings["pg_dsn"], connect_timeout=5),
            **{"pool_size": settings["threads"] + 2,
               **_take(options, ("table_name", "pool_size", "pool_timeout"))},
        )  # fmt: skip
    else:
        store = ObservedMySQL(
            mysql_connect(),
            **{"pool_size": settings["threads"] + 2,
               **_take(options, ("table_name", "pool_size", "pool_timeout"))},
        )  # fmt: skip
    store.watch(evidence)
    config = DedupConfig.enable_dedup_consume_config(
        settings["app"],
        store,
        dedup_processing_expire_milli_seconds=settings["lease_ms"],
        metrics=evidence,
        check_store=False,  # a consumer restarted during an outage still starts
        **options,
    )
    if settings["mode"] == "outbox":
        return OutboxUpstream(config, handler, Outbox(config), settings["b_topic"])
    if settings["mode"].startswith("exactly-once"):
        return ExactlyOnceListener(config, handler)
    return PlainListener(config, handler)


def _take(options: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """Remove the store's own options from ``options``; return them."""
    return {name: options.pop(name) for name in names if name in options}


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
    watchdog = threading.Thread(target=watch_stalls, args=(evidence,), daemon=True)
    watchdog.start()
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
