"""Draining a backlog, and keeping up with a paced producer: the two regimes of a consumer,
measured apart, with each client and store.

* ``*_drain``: the backlog is produced first (no consumer of the group running), then the
  consumer starts and the clock runs from its first delivery to the N-th distinct completion.
  The consumer runs in a process of its own pinned to one CPU (the bench's, CPU 0 by default),
  with a cache big enough for the whole backlog, so nothing but its own CPU limits it: the
  client's pulls, its callbacks, the listener. ``cpu_share`` in the JSON (CPU seconds over
  wall seconds) shows how close to 1 that was.
* ``*_paced``: the consumer runs first, then a producer sends N messages at ``rate`` per
  second; the consumer's CPU per message at that rate, the lag of each message (completion
  minus send time), and ``keeps_up`` (1 when it consumed at >= 90 % of the rate, from its first
  delivery to its last completion, with a p99 lag under a second).

Clients: the classic push consumer (``e2e_*``), the 5.x push consumer (``e2e_grpc_*``) and the
5.x SimpleConsumer with ``consume_simple`` rounds (``e2e_simple_*``), each with
:data:`CONSUMER_THREADS` consuming threads; stores: none (``nodedup``: the client's
own cost, a handler that counts), Redis, MySQL. The consumer and the producer are child
processes (:mod:`bench.drain_worker`): the two clients cannot share an environment, and the
consumer's CPU must be its own. The producer runs on the last CPU (with the servers).

With ``--baseline PATH`` the Redis and MySQL cases also run with the listener of the checkout at
``PATH`` (``baseline_e2e_*``), in their slots of the same repetitions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from bench.baseline import PREFIX, Child, RemoteHandler
from bench.cases import BenchError, Case, Context, delete_keys, library_key_pattern
from bench.settings import CONSUMER_TABLE, LEASE_MS, LIBRARY_KEY_PREFIX, RESERVE_MINUTES, TOPIC
from rocketmq_dedup.stores.mysql import schema_sql

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("drain_worker.py")
#: The environment of each client (both install a package named ``rocketmq``).
PYTHONS = {"classic": ".venv-classic", "grpc": ".venv-grpc", "simple": ".venv-grpc"}
#: Case name prefix per client.
CLIENT_PREFIX = {"classic": "e2e", "grpc": "e2e_grpc", "simple": "e2e_simple"}
#: Messages per second of the paced cases, per client: below what the dedup consumers drain at
#: on a 2-vCPU VM (the 5.x push consumer acks each message with a gRPC call of its own).
PACED_RATE = {"classic": 2000, "grpc": 1000, "simple": 1000}
#: Consuming threads (callback threads; SimpleConsumer receive loops) of every consumer here:
#: Java's default (consumeThreadMin). With 8, a consumer with dedup on MySQL waited for its round
#: trips (its CPU about half busy: 8 messages per round trip at most); with 20 its CPU is the
#: bottleneck again, and a consumer without dedup is as fast as with 8 (BENCHMARKS.md).
CONSUMER_THREADS = 20
WAIT_TIMEOUT_S = 180.0
KEEP_UP_SHARE = 0.9
KEEP_UP_P99_MS = 1000.0


def python_of(client: str) -> str:
    return str(REPO / PYTHONS[client] / "bin" / "python")


def consumer_cpu() -> int:
    """The consumer's CPU: the one the bench is pinned to, else CPU 0."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[0] if len(cpus) == 1 else 0


def producer_cpu() -> int:
    """The producer's CPU: the last one (the servers'), away from the consumer's."""
    return (os.cpu_count() or 1) - 1


class ConsumerCase(Case):
    """A consumer process of ``client`` with the listener of ``store`` (``none``: no dedup),
    draining a backlog (``rate`` None) or keeping up with a paced producer."""

    chunked = False  # a live consumer in the background would disturb the other cases
    in_quick = True
    client: ClassVar[str]
    store: ClassVar[str]
    rate: ClassVar[Optional[int]] = None
    checkout: ClassVar[Path] = REPO

    def __init__(self, ctx: Context, n: int) -> None:
        super().__init__(ctx, n)
        self.consumer: Optional[Child] = None
        self.producer: Optional[Child] = None
        self.answer: dict[str, Any] = {}
        self.tag = f"Bench{ctx.run_id}{self.name.replace('_', '')}"  # the case's, every rep
        self.marker = ""  # the rep's, at the start of each body
        #: a profiler command attached to the consumer for the next measure (bench.drain_profile)
        self.profile: Optional[list[str]] = None

    def setup(self) -> None:
        servers = self.ctx.servers
        python = python_of(self.client)
        if not Path(python).exists():
            raise BenchError(f"{self.name}: no {python} (scripts/bootstrap.sh makes it)")
        if self.store == "redis":
            self.redis = servers.redis_client()
        elif self.store == "mysql":
            self.mysql = servers.mysql_connect()()
            self.mysql.autocommit(True)
            if CONSUMER_TABLE not in self.ctx.tables_made:
                self.sql(f"DROP TABLE IF EXISTS `{CONSUMER_TABLE}`")
                self.sql(schema_sql(CONSUMER_TABLE))
                self.ctx.tables_made.add(CONSUMER_TABLE)
        where = {
            "namesrv": servers.namesrv_addr,
            "proxy": servers.proxy_addr,
            "redis_url": servers.redis_url,
            "mysql": servers.mysql,
        }
        group = f"dedup-bench-{self.ctx.run_id}-{self.name}"
        self.consumer = Child(self.checkout, WORKER, python, f"{self.name} consumer")
        self.consumer.ask(
            "setup",
            role="consumer",
            client=self.client,
            store=self.store,
            topic=TOPIC,
            group=group,
            threads=CONSUMER_THREADS,
            servers=where,
            app=self.app,
            key_prefix=LIBRARY_KEY_PREFIX,
            table=CONSUMER_TABLE,
            options={
                "dedup_processing_expire_milli_seconds": LEASE_MS,
                "dedup_record_reserve_minutes": RESERVE_MINUTES,
            },
            cpu=consumer_cpu(),
            handshake_tag=self.tag,
        )
        self.handler = RemoteHandler(self.consumer)  # type: ignore[assignment]
        self.producer = Child(REPO, WORKER, python_of("classic"), f"{self.name} producer")
        self.producer.ask(
            "setup", role="producer", client="classic", servers=where, topic=TOPIC,
            cpu=producer_cpu(),
        )  # fmt: skip

    def sql(self, statement: str, params: Optional[tuple[Any, ...]] = None) -> None:
        """Run an admin statement; once more on a new connection if the server restarted (the
        shared server of a development machine may be restarted by another suite)."""
        for attempt in (1, 2):
            try:
                cur = self.mysql.cursor()
                try:
                    cur.execute(statement, params)
                finally:
                    cur.close()
                return
            except Exception as exc:
                lost = "Lost connection" in str(exc) or "gone away" in str(exc)
                if attempt == 2 or not lost:
                    raise
                self.mysql = self.ctx.servers.mysql_connect()()
                self.mysql.autocommit(True)

    def prepare(self, rep: object) -> None:
        assert self.producer is not None
        self.marker = f"{self.ctx.run_id}-{self.name}-{rep}"
        if self.rate is None:  # the backlog, before the consumer starts
            self.producer.ask("produce", tag=self.tag, marker=self.marker, n=self.n, rate=None)

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        """Timed: the consumer started, (paced: the producer run,) until N were consumed."""
        assert self.consumer is not None and self.producer is not None
        paced = self.rate is not None
        profile, self.profile = self.profile, None
        self.consumer.ask(
            "start", tag=self.tag, marker=self.marker, n=self.n, settle=not paced, profile=profile
        )
        if paced:
            self.producer.ask("produce", tag=self.tag, marker=self.marker, n=self.n, rate=self.rate)
        self.answer = answer = self.consumer.ask("wait", timeout=WAIT_TIMEOUT_S)
        self.expect_no_failures(int(answer["failures"]), "the timed pass")
        self.usage = (answer["cpu_s"], answer["voluntary"], answer["involuntary"])
        return float(answer["seconds"])

    def consume(self, item: Any) -> Any:  # pragma: no cover - measure() is overridden
        raise NotImplementedError

    def details(self) -> dict[str, float]:
        answer = self.answer
        seconds = float(answer["seconds"])
        figures = {
            "cpu_share": float(answer["cpu_s"]) / seconds if seconds > 0 else 0.0,
            "deliveries_per_msg": float(answer["deliveries"]) / self.n,
        }
        if self.rate is not None:
            rate = self.n / seconds if seconds > 0 else 0.0
            p99 = float(answer.get("lag_ms_p99", float("inf")))
            keeps_up = rate >= KEEP_UP_SHARE * self.rate and p99 <= KEEP_UP_P99_MS
            figures.update(
                offered_msgs_per_s=float(self.rate),
                lag_ms_p50=float(answer.get("lag_ms_p50", 0.0)),
                lag_ms_p99=p99,
                lag_ms_max=float(answer.get("lag_ms_max", 0.0)),
                keeps_up=1.0 if keeps_up else 0.0,
            )
        return figures

    def cleanup(self) -> None:
        if self.store == "redis":
            delete_keys(self.redis, library_key_pattern(self.app))
        elif self.store == "mysql":
            self.sql(f"DELETE FROM `{CONSUMER_TABLE}` WHERE application_name = %s", (self.app,))

    def close(self) -> None:
        try:
            self.cleanup()
        finally:
            for child in (self.consumer, self.producer):
                if child is not None:
                    child.close()
            if self.store == "redis":
                self.redis.close()
            elif self.store == "mysql":
                self.mysql.close()


def consumer_cases() -> tuple[type[Case], ...]:
    """Every client x store x regime, in that order (nodedup first within a client)."""
    cases: list[type[Case]] = []
    for regime in ("drain", "paced"):
        for client, prefix in CLIENT_PREFIX.items():
            for store in ("nodedup", "redis", "mysql"):
                paced = regime == "paced"
                stores = frozenset({"broker"} | ({store} - {"nodedup"}))
                cases.append(
                    type(
                        f"{prefix}_{store}_{regime}".title().replace("_", ""),
                        (ConsumerCase,),
                        {
                            "name": f"{prefix}_{store}_{regime}",
                            "client": client,
                            "store": "none" if store == "nodedup" else store,
                            "rate": PACED_RATE[client] if paced else None,
                            "needs": stores,
                            "quick_n": 3_000 if paced else 6_000,
                            "full_n": 6_000 if paced else 20_000,
                            "in_quick": not paced,
                            "__doc__": f"The {client} client, store {store}, {regime}.",
                        },
                    )
                )
    return tuple(cases)


CONSUMER_CASES = consumer_cases()


def baseline_consumer_cases(checkout: Path, selected: set[str]) -> tuple[type[Case], ...]:
    """The selected dedup cases again, with the listener of ``checkout``."""
    return tuple(
        type(
            f"Baseline{case.__name__}",
            (case,),
            {
                "name": PREFIX + case.name,
                "checkout": checkout,
                "of": case,
                "__doc__": f"{case.name} with the listener of {checkout}.",
            },
        )
        for case in CONSUMER_CASES
        if case.name in selected and getattr(case, "store", "none") != "none"
    )
