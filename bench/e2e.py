"""End-to-end cases: consumer throughput through the real broker with the classic client
(``rocketmq-client-python``), without and with dedup on Redis.

Per repetition: a new consumer group subscribes to ``DEDUP-BENCH`` with a tag unique to the
repetition (so earlier repetitions' messages are filtered out by the broker, whatever offset a
new group starts from); probe messages are sent until the consumer has received one (it is
subscribed and has its queues); then N messages are produced while the callbacks wait at a
closed gate (the client pulls and buffers them). The timed part starts when the gate opens
and ends when the N-th distinct message has been handled.

With the classic client's defaults the timed part has two phases, and the JSON shows both
(:meth:`E2ECase.details`): the client buffers at most 1,000 messages per queue, so of 5,000
messages about 4,000 are handled at the consumer's own speed (``burst_msgs_per_s``: the callback
path is the bottleneck), then the client's pull flow control pauses (``stall_ms``: its back-off
is a fixed second, counted from when the buffer filled, before the gate opened) and the rest
arrive as the broker serves them. The whole-window rate (``msgs_per_s``) is what a consumer
draining a backlog with the default settings gets.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from typing import Any, Optional, Sequence

from bench.cases import (
    OK,
    BenchError,
    BenchListener,
    Case,
    LibraryMySQLCase,
    MySQLCase,
    delete_keys,
    library_key_pattern,
    listener_options,
)
from bench.settings import LIBRARY_KEY_PREFIX, TOPIC
from rocketmq_dedup import DedupConfig

PROBE_BODY = b"bench-probe"
PAYLOAD_BODY = b'{"order": 1}'
HANDSHAKE_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 1.0
DRAIN_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 30.0
# A send the client refuses (its cached route briefly empty: "No route info of this topic") is
# retried with backoff, about 12 s in all, rather than failing the whole run.
SEND_ATTEMPTS = 8
# Both e2e cases run the same consumer: 8 callback threads (the classic client's default is
# one per core; production consumers of I/O-bound handlers run more, Java's default is 20).
CONSUMER_THREADS = 8


class E2ECase(Case):
    """A consumer of the real broker; ``consume`` is what its callback does per message."""

    needs = frozenset({"broker"})
    quick_n, full_n = 2_000, 5_000
    in_quick = False
    chunked = False  # a live consumer in the background would disturb the other cases

    def setup(self) -> None:
        from rocketmq.client import Producer

        self.producer = Producer(f"dedup-bench-producer-{self.ctx.run_id}-{self.name}")
        self.producer.set_namesrv_addr(self.ctx.servers.namesrv_addr)
        self.producer.start()
        self.consumer: Optional[Any] = None
        self.gate = threading.Event()

    def prepare(self, rep: object) -> None:
        self.tag = f"Bench{self.ctx.run_id}{self.name.replace('_', '')}{rep}"
        self.gate = threading.Event()
        self.done = threading.Event()
        self.probed = threading.Event()
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.finished_at = 0.0
        self.started_at = 0.0
        self.completions: list[float] = []  # perf_counter() of each distinct completion
        self.consumer = self.start_consumer(f"dedup-bench-{self.ctx.run_id}-{self.name}-{rep}")
        self.handshake()
        for i in range(self.n):
            self.send(PAYLOAD_BODY, f"{self.tag}-{i}")

    def start_consumer(self, group: str) -> Any:
        from rocketmq.client import PushConsumer

        consumer = PushConsumer(group)
        consumer.set_namesrv_addr(self.ctx.servers.namesrv_addr)
        consumer.set_thread_count(CONSUMER_THREADS)
        consumer.subscribe(TOPIC, self.callback, self.tag)
        consumer.start()
        return consumer

    def send(self, body: bytes, keys: str, tag: Optional[str] = None) -> None:
        """Send one message (the repetition's tag, or ``tag``); a refused send is retried."""
        from rocketmq.client import Message, SendStatus

        msg = Message(TOPIC)
        msg.set_tags(tag or self.tag)
        msg.set_keys(keys)
        msg.set_body(body)
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                result = self.producer.send_sync(msg)
                break
            except Exception as exc:  # e.g. ProducerSendSyncFailed: No route info of this topic
                if attempt == SEND_ATTEMPTS:
                    raise BenchError(f"{self.name}: send failed {attempt} times: {exc}") from exc
                print(f"warning: {self.name}: send failed ({exc}); retrying", file=sys.stderr)
                time.sleep(min(0.2 * 2**attempt, 2.0))
        if result.status != SendStatus.OK:
            raise BenchError(f"{self.name}: send failed: {result.status!r}")

    def handshake(self) -> None:
        """Send probes until the consumer receives one: it is subscribed and pulling."""
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while not self.probed.is_set():
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.name}: the consumer received no probe within "
                    f"{HANDSHAKE_TIMEOUT_S:.0f}s; is the broker up?"
                )
            self.send(PROBE_BODY, "probe")
            self.probed.wait(PROBE_INTERVAL_S)

    def callback(self, msg: Any) -> Any:
        """The consumer's callback: probes are acked; payloads wait at the gate, are consumed,
        and the N-th distinct one stops the clock."""
        if msg.body == PROBE_BODY:
            self.probed.set()
            return OK
        self.gate.wait()
        status = self.consume(msg)
        with self.lock:
            if msg.id not in self.seen:
                self.seen.add(msg.id)
                self.completions.append(time.perf_counter())
            if len(self.seen) == self.n:
                self.finished_at = self.completions[-1]
                self.done.set()
        return status

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        """Timed: open the gate, wait until all N messages were handled (``items`` unused:
        the broker delivers them)."""
        start = self.started_at = time.perf_counter()
        self.gate.set()
        if not self.done.wait(DRAIN_TIMEOUT_S):
            raise BenchError(
                f"{self.name}: {len(self.seen)} of {self.n} messages consumed "
                f"in {DRAIN_TIMEOUT_S:.0f}s"
            )
        return self.finished_at - start

    def details(self) -> dict[str, float]:
        """The two phases of the timed pass: the longest pause between two completions (the
        client's flow control), and the rate before it (the consumer's own speed)."""
        times = [self.started_at, *self.completions]
        pairs = enumerate(itertools.pairwise(times))
        gaps = [(later - earlier, i) for i, (earlier, later) in pairs]
        stall, before = max(gaps) if gaps else (0.0, 0)
        burst_s = times[before] - self.started_at
        return {
            "stall_ms": stall * 1000,
            "burst_msgs": float(before),
            "burst_msgs_per_s": before / burst_s if burst_s > 0 else 0.0,
        }

    def cleanup(self) -> None:
        self.gate.set()  # callbacks held at the gate (a failed prepare) must drain first
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            # The C++ client's shutdown has been seen to hang after a failed repetition: give
            # it a deadline rather than hang the whole run.
            closer = threading.Thread(target=consumer.shutdown, daemon=True)
            closer.start()
            closer.join(SHUTDOWN_TIMEOUT_S)
            if closer.is_alive():
                raise BenchError(
                    f"{self.name}: the consumer did not shut down in {SHUTDOWN_TIMEOUT_S:.0f}s"
                )

    def close(self) -> None:
        super().close()
        self.producer.shutdown()


class E2ENoDedup(E2ECase):
    name = "e2e_nodedup"

    def consume(self, item: Any) -> Any:
        return OK if self.handler(item) else None


class E2ERedis(E2ECase):
    """The library's listener on Redis as the callback's consumer (default dedup key: the
    UNIQ_KEY the producer set)."""

    name = "e2e_redis"
    needs = frozenset({"broker", "redis"})

    def setup(self) -> None:
        super().setup()
        self.client = self.ctx.servers.redis_client()
        config = DedupConfig.enable_dedup_consume_config(
            self.app, self.client, key_prefix=LIBRARY_KEY_PREFIX, **listener_options()
        )
        self.listener = BenchListener(config, self.handler)

    def consume(self, item: Any) -> Any:
        return self.listener(item)

    def cleanup(self) -> None:
        super().cleanup()
        delete_keys(self.client, library_key_pattern(self.app))

    def close(self) -> None:
        super().close()
        self.client.close()


class E2EMySQL(E2ECase, LibraryMySQLCase):
    """The library's listener on MySQL (mysqlclient, the store's connection pool) as the
    callback's consumer; the table and its cleanup are the mysql_* cases'."""

    name = "e2e_mysql"
    needs = frozenset({"broker", "mysql"})

    def setup(self) -> None:
        E2ECase.setup(self)
        LibraryMySQLCase.setup(self)

    def cleanup(self) -> None:
        E2ECase.cleanup(self)
        MySQLCase.cleanup(self)


E2E_CASES: tuple[type[Case], ...] = (E2ENoDedup, E2ERedis, E2EMySQL)
