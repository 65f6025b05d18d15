"""The outbox's cases (issue 35), through the real broker with the classic client, on MariaDB.

A consumer (8 callback threads, as the other e2e cases) runs the exactly-once listener with a
two-statement business transaction (``mysql_tx_*``'s) per message A, and sends a message B:

* ``e2e_tx_publish``: B published directly after the listener acked A (``send_sync`` in the
  callback): at most once (a crash between the two loses B). The baseline.
* ``e2e_tx_outbox``: B written through ``conn`` by ``outbox.send`` and sent after the commit by
  an in-process relay (woken by the commit; the same process, the same CPU). The timed part ends
  when every A was handled **and** every B acknowledged by the broker.
* ``e2e_tx_outbox_apart``: the same consumer, its relay deployed apart: the consumer's own
  throughput (the relay sends once the consumer is done; its drain is a detail).

``e2e_tx_outbox_apart / e2e_tx_publish`` is the issue's ">= 0.9" target (the consumer's
throughput with the outbox beside the same handler publishing directly);
``e2e_tx_outbox / e2e_tx_publish`` is reported beside it: on one CPU the relay's sends cost what
the direct sends cost, plus the row and the relay's own work.

Latency (``e2e_outbox_latency``, ``e2e_outbox_latency_poll``): A arrives paced (``PACE``
messages a second, well under what the consumer takes), so a relay is idle when a commit wakes
it; each B's commit-to-send latency is the time from its transaction's COMMIT (an after-commit
callback of the handler's) to the broker's acknowledgement of B (the relay's sender). The first
relay is woken by the commit; the poll-only one (``poll_interval_s`` 1 s, never woken) is what a
relay in another process, or a transaction outside the listener, gets. Their p50/p99 are the
cases' details (``latency_p50_ms``, ``latency_p99_ms``).

Relay throughput (``outbox_relay``, ``outbox_relay_sharded``): N rows already committed (untimed),
then one relay (batches of 64, 4 sends at a time) sends them all: rows without a sharding key,
or over 16 sharding keys (runs of up to 16, in order).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, ClassVar, Dict, Optional, Sequence

from bench.cases import OK, BenchError, BenchTxListener, Case, MySQLTxCase, listener_options
from bench.e2e import CONSUMER_THREADS, DRAIN_TIMEOUT_S, PAYLOAD_BODY, E2ECase
from bench.settings import LIBRARY_TABLE, TOPIC
from rocketmq_dedup import DedupConfig, MySQLDedupStore
from rocketmq_dedup.message import message_keys
from rocketmq_dedup.outbox import Outbox, OutboxMessage, OutboxRelay
from rocketmq_dedup.outbox.senders import Sender, sender_for
from rocketmq_dedup.stores.transaction import current_transaction

#: B's tag: no bench consumer subscribes to it.
B_TAG = "BenchOutbox"
#: A messages a second in the latency cases.
PACE = 100
RELAY_BATCH, RELAY_CONCURRENCY = 64, 4


class TimedSender(Sender):
    """The relay's producer; records when the broker acknowledged each message (by key)."""

    def __init__(self, inner: Sender) -> None:
        self.inner = inner
        self.client = inner.client
        self.acked: Dict[str, float] = {}
        self.lock = threading.Lock()
        self.all_acked = threading.Event()
        self.expected = -1

    def reset(self, expected: int) -> None:
        with self.lock:
            self.acked = {}
            self.expected = expected
            self.all_acked.clear()

    def send(self, message: OutboxMessage) -> str:
        message_id = self.inner.send(message)
        now = time.perf_counter()
        with self.lock:
            self.acked.setdefault(message.message_key, now)
            if len(self.acked) >= self.expected >= 0:
                self.all_acked.set()
        return message_id


class OutboxListener(BenchTxListener):
    """The business transaction, then B through the outbox; the COMMIT's time, per B."""

    def __init__(self, config: DedupConfig, handler: Any, business: Any, outbox: Outbox) -> None:
        super().__init__(config, handler, business)
        self.outbox = outbox
        self.committed: Dict[str, float] = {}

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        self.handler(msg)
        self.business(conn, msg)
        key = f"{message_keys(msg)[0]}:B"  # the bench's key of A: <tag>-<i>
        tx = current_transaction()
        if tx is not None:
            tx.call_after_commit(lambda: self.committed.setdefault(key, time.perf_counter()))
        self.outbox.send(conn, TOPIC, PAYLOAD_BODY, keys=key, tag=B_TAG)
        return True


def make_outbox_tables(case: MySQLTxCase) -> MySQLDedupStore:
    """The library's bench table with its outbox; the outbox's tables dropped and created once
    per run (an older run's may have another schema)."""
    store = MySQLDedupStore(case.connect, LIBRARY_TABLE)
    if "outbox" not in case.ctx.tables_made:
        for suffix in ("_outbox", "_outbox_lane"):
            case.sql(f"DROP TABLE IF EXISTS `{LIBRARY_TABLE}{suffix}`")
        case.ctx.tables_made.add("outbox")
    store.create_table()
    return store


def drop_outbox_rows(case: MySQLTxCase) -> None:
    for suffix in ("_outbox", "_outbox_lane"):
        case.sql(f"DELETE FROM `{LIBRARY_TABLE}{suffix}`")


class TxE2ECase(E2ECase, MySQLTxCase):
    """A broker consumer whose callback is the exactly-once listener with the business
    transaction (the dedup table and the outbox beside it: the library's bench table)."""

    full_n = 2_000
    quick_n = 1_000

    def setup(self) -> None:
        E2ECase.setup(self)
        MySQLTxCase.setup(self)
        make_outbox_tables(self).close()
        self.config = DedupConfig.enable_dedup_consume_config(
            self.app,
            self.connect,
            table_name=LIBRARY_TABLE,
            pool_size=CONSUMER_THREADS + 2,
            **listener_options(),
        )

    def cleanup(self) -> None:
        E2ECase.cleanup(self)
        MySQLTxCase.cleanup(self)
        self.sql(f"DELETE FROM `{LIBRARY_TABLE}` WHERE application_name = %s", (self.app,))

    def close(self) -> None:
        E2ECase.close(self)  # and MySQLTxCase.close, next in the method order
        self.config.close()


class E2ETxPublish(TxE2ECase):
    """B published by the callback after the listener acked A (at most once)."""

    name = "e2e_tx_publish"

    def setup(self) -> None:
        super().setup()
        self.listener = BenchTxListener(self.config, self.handler, self.business)

    def consume(self, item: Any) -> Any:
        status = self.listener(item)
        if status is OK:
            self.send_b(message_keys(item)[0])
        return status

    def send_b(self, a_key: str) -> None:
        self.send(PAYLOAD_BODY, f"{a_key}:B", tag=B_TAG)  # (retried as the sends of A)


class OutboxCase(TxE2ECase):
    """B through the outbox, sent by a relay of this process; the timed part ends when every
    B is acknowledged (and every A handled)."""

    wake: ClassVar[bool] = True
    poll_interval_s: ClassVar[float] = 1.0

    def setup(self) -> None:
        super().setup()
        from rocketmq.client import Producer

        self.relay_producer = Producer(f"dedup-bench-relay-{self.ctx.run_id}-{self.name}")
        self.relay_producer.set_namesrv_addr(self.ctx.servers.namesrv_addr)
        self.relay_producer.start()
        self.outbox = Outbox(self.config)
        self.sender = TimedSender(sender_for(self.relay_producer))
        # the poll-only relay serves an Outbox object of its own: nothing wakes it
        self.relayed = (
            self.outbox if self.wake else Outbox(MySQLDedupStore(self.connect, LIBRARY_TABLE))
        )
        self.relay: Optional[OutboxRelay] = None
        self.listener = OutboxListener(self.config, self.handler, self.business, self.outbox)

    def start_relay(self) -> None:
        """This case's relay, for this repetition only (the cases share the outbox table: a
        relay of another case running now would take this one's rows)."""
        self.listener.committed = {}
        self.sender.reset(self.n)
        self.relay = OutboxRelay(
            self.relayed,
            self.sender,
            batch_size=RELAY_BATCH,
            concurrency=RELAY_CONCURRENCY,
            poll_interval_s=self.poll_interval_s,
        ).start()

    def prepare(self, rep: object) -> None:
        self.start_relay()
        super().prepare(rep)

    def consume(self, item: Any) -> Any:
        return self.listener(item)

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        super().measure(items)
        if not self.sender.all_acked.wait(DRAIN_TIMEOUT_S):
            raise BenchError(f"{self.name}: {len(self.sender.acked)} of {self.n} B acknowledged")
        return max(max(self.sender.acked.values()), self.finished_at) - self.started_at

    def details(self) -> dict[str, float]:
        latencies = sorted(
            (self.sender.acked[key] - at) * 1000
            for key, at in self.listener.committed.items()
            if key in self.sender.acked
        )
        if not latencies:
            return super().details()
        return {
            **super().details(),
            "latency_p50_ms": statistics.median(latencies),
            "latency_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        }

    def cleanup(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        super().cleanup()
        drop_outbox_rows(self)

    def close(self) -> None:
        super().close()
        self.relay_producer.shutdown()


class E2ETxOutbox(OutboxCase):
    name = "e2e_tx_outbox"


class E2ETxOutboxApart(TxE2ECase):
    """B through the outbox, the relay deployed apart: the consumer's own throughput (the timed
    part ends when every A is handled, and no relay runs meanwhile: on this two-CPU machine a
    relay process shares the servers' CPU and slows their answers, as a relay on another host
    does not). Then ``rocketmq-dedup relay`` (a process of its own, on the CPUs this one does
    not use) sends the rows: the time from the last A to the last B acknowledged, its start
    included, is the detail ``b_drained_ms``."""

    name = "e2e_tx_outbox_apart"

    def setup(self) -> None:
        super().setup()
        self.outbox = Outbox(self.config)
        self.listener = OutboxListener(self.config, self.handler, self.business, self.outbox)
        self.relay_proc: Optional[subprocess.Popen[bytes]] = None

    def consume(self, item: Any) -> Any:
        return self.listener(item)

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        elapsed = super().measure(items)
        self.relay_proc = start_relay_process(self.ctx.servers, self.name)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self.sent_rows() < self.n:
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: {self.sent_rows()} of {self.n} B sent")
            time.sleep(0.01)
        self.drained_at = time.perf_counter()
        return elapsed

    def sent_rows(self) -> int:
        cur = self.admin.cursor()
        try:
            cur.execute(
                f"SELECT COUNT(*) FROM `{LIBRARY_TABLE}_outbox` WHERE status = 'SENT' "
                "AND message_key LIKE %s",
                (f"{self.tag}-%",),
            )
            return int(cur.fetchone()[0])
        finally:
            cur.close()

    def details(self) -> dict[str, float]:
        return {
            **super().details(),
            "b_drained_ms": (self.drained_at - self.finished_at) * 1000,
        }

    def cleanup(self) -> None:
        if self.relay_proc is not None:
            self.relay_proc.terminate()
            try:
                self.relay_proc.wait(30)
            except subprocess.TimeoutExpired:
                self.relay_proc.kill()
            self.relay_proc = None
        super().cleanup()
        drop_outbox_rows(self)


def start_relay_process(servers: Any, name: str) -> subprocess.Popen[bytes]:
    """``rocketmq-dedup relay`` (classic producer) on the bench's outbox, pinned to the CPUs
    this process does not use (all of them if it uses all), polling every 20 ms (nothing in
    another process wakes it)."""
    mysql = servers.mysql
    url = "mysql://{user}:{password}@{host}:{port}/{database}".format(**mysql)
    own = os.sched_getaffinity(0)
    others = set(range(os.cpu_count() or 1)) - own or own

    def pin() -> None:
        os.sched_setaffinity(0, others)

    proc = subprocess.Popen(
        [sys.executable, "-m", "rocketmq_dedup", "relay", "--mysql", url, "--table",
         LIBRARY_TABLE, "--namesrv", servers.namesrv_addr, "--poll-interval", "20ms",
         "--group", f"dedup-bench-relay-{name}"],
        preexec_fn=pin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    if proc.poll() is not None:
        raise BenchError(f"{name}: the relay process exited at once ({proc.returncode})")
    return proc


class PacedOutboxCase(OutboxCase):
    """A arrives at PACE a second (the producer sends in the timed part, no backlog): a
    relay's latency when it is idle between messages."""

    full_n = quick_n = 600

    def prepare(self, rep: object) -> None:
        """The consumer and the handshake (no messages: they are sent paced in the timed
        part)."""
        self.start_relay()
        real_n, self.n = self.n, 0
        try:
            E2ECase.prepare(self, rep)
        finally:
            self.n = real_n
        self.gate.set()

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        self.started_at = begin = time.perf_counter()
        for i in range(self.n):
            delay = begin + i / PACE - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.send(PAYLOAD_BODY, f"{self.tag}-{i}")
        if not self.done.wait(DRAIN_TIMEOUT_S) or not self.sender.all_acked.wait(DRAIN_TIMEOUT_S):
            raise BenchError(f"{self.name}: {len(self.sender.acked)} of {self.n} B acknowledged")
        return max(max(self.sender.acked.values()), self.finished_at) - begin


class E2EOutboxLatency(PacedOutboxCase):
    name = "e2e_outbox_latency"


class E2EOutboxLatencyPoll(PacedOutboxCase):
    name = "e2e_outbox_latency_poll"
    wake = False


class OutboxRelayCase(MySQLTxCase):
    """One relay sending N committed rows (no consumer): its throughput."""

    needs = frozenset({"broker", "mysql"})
    quick_n, full_n = 2_000, 5_000
    in_quick = False
    chunked = False
    sharding_keys: ClassVar[int] = 0

    def setup(self) -> None:
        super().setup()
        from rocketmq.client import Producer

        self.outbox = Outbox(make_outbox_tables(self))
        self.producer = Producer(f"dedup-bench-relay-{self.ctx.run_id}-{self.name}")
        self.producer.set_namesrv_addr(self.ctx.servers.namesrv_addr)
        self.producer.start()
        self.sender = TimedSender(sender_for(self.producer))

    def prepare(self, rep: object) -> None:
        self.sender.reset(self.n)
        conn = self.connect()
        conn.autocommit(False)
        try:
            for i in range(self.n):
                shard = f"shard-{i % self.sharding_keys}" if self.sharding_keys else None
                key = f"{self.ctx.run_id}-{self.name}-{rep}-{i}"
                self.outbox.send(conn, TOPIC, PAYLOAD_BODY, keys=key, tag=B_TAG, sharding_key=shard)
                if i % 100 == 99:
                    conn.commit()
            conn.commit()
        finally:
            conn.close()

    def consume(self, item: Any) -> Any:  # pragma: no cover - measure() replaces the loop
        raise AssertionError

    def expected_calls(self) -> int:
        return 0

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        begin = time.perf_counter()
        relay = OutboxRelay(
            self.outbox,
            self.sender,
            batch_size=RELAY_BATCH,
            concurrency=RELAY_CONCURRENCY,
            poll_interval_s=0.05,
        ).start()
        try:
            if not self.sender.all_acked.wait(DRAIN_TIMEOUT_S):
                raise BenchError(f"{self.name}: {len(self.sender.acked)} of {self.n} acknowledged")
            return max(self.sender.acked.values()) - begin
        finally:
            relay.close()

    def cleanup(self) -> None:
        drop_outbox_rows(self)

    def close(self) -> None:
        super().close()
        self.producer.shutdown()
        self.outbox.tables.close()


class OutboxRelayPlain(OutboxRelayCase):
    name = "outbox_relay"


class OutboxRelaySharded(OutboxRelayCase):
    name = "outbox_relay_sharded"
    sharding_keys = 16


OUTBOX_CASES: tuple[type[Case], ...] = (
    E2ETxPublish,
    E2ETxOutbox,
    E2ETxOutboxApart,
    E2EOutboxLatency,
    E2EOutboxLatencyPoll,
    OutboxRelayPlain,
    OutboxRelaySharded,
)

__all__ = ["OUTBOX_CASES"]
