"""Runs the soak: ``python -m bench.soak [--quick] [--json PATH] [--modes LIST] [--seed N]
[--options K=V,...] [--variant NAME=K=V,...] [--consumers KINDS]``.

Needs the project's servers running (``scripts/soak.sh`` starts them): MariaDB and the broker
of ``scripts/services.sh`` / ``scripts/rocketmq.sh``, which this run kills and restarts; Redis
is the soak's own (AOF ``everysec``, port ``SOAK_REDIS_PORT``), started and stopped here, and so
is PostgreSQL when the ``exactly-once-postgres`` mode runs (a cluster of its own under the
state root, on a free port: never the project's). Every process it starts is stopped by PID
when it ends, fails or is interrupted.

The quick run (CI) runs its modes at once, under one schedule of faults (one broker restart for
all of them); the full run (the record) runs them one after another, each alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from bench.soak import accounting, evidence
from bench.soak import report as soak_report
from bench.soak.plan import (
    DEFAULT_CONSUMERS,
    KINDS,
    STORE_KILLS,
    Fault,
    Send,
    faults,
    kind_of,
    sends,
)

REPO = Path(__file__).resolve().parents[2]
STATE_ROOT = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup"))
STATE = STATE_ROOT / "soak"
HOME = STATE / "home"  # the consumers' HOME: rocketmq-client-cpp writes its logs under it
CONTROL = "no-dedup"
MODES = ("plain-redis", "plain-mysql", "exactly-once", "exactly-once-postgres", CONTROL)
#: The modes a run does by default (``--modes``): all but those that need a server more.
DEFAULT_MODES = ("plain-redis", "plain-mysql", "exactly-once", CONTROL)
STORE_KILL = {
    "plain-redis": "redis_kill",
    "plain-mysql": "mysql_kill",
    "exactly-once": "mysql_kill",
    "exactly-once-postgres": "postgres_kill",
    CONTROL: "none",
}
#: The modes whose store (and effects) are the soak's PostgreSQL.
POSTGRES_MODES = ("exactly-once-postgres",)
SOAK_REDIS_PORT = int(os.environ.get("SOAK_REDIS_PORT", "16390"))
THREADS = 8
LEASE_MS = 10_000  # a killed consumer's claims lapse after this; redeliveries then run
QUIET_S = 12.0  # the drain ends this long after the last decision, once every key is applied
LATE_S = 60.0  # a key applied later than this after its send is "delayed" (lease + restart)
STOP_GRACE_S = 5.0  # consumers get this long to stop after SIGTERM at the end
MAX_DETAILED = 200  # double-applied keys whose appliers the report lists (unexplained first)
SEND_DEADLINE_S = 180.0  # a send is retried this long (a broker restart took up to 88 s)
#: Options the soak sets itself (its evidence is the metrics object; consumers restarted in an
#: outage must start): refused in --options and --variant.
RESERVED_OPTIONS = ("metrics", "check_store")


@dataclass(frozen=True)
class Size:
    keys: int
    send_s: float
    drain_s: Optional[float] = None  # stop draining this long after the drain began
    idle_s: Optional[float] = None  # also stop after this long without any decision
    loss_deadline_s: Optional[float] = None  # missing this long after the last fault: lost
    poll_s: Optional[float] = None  # poll the DLQ and the group's lag this often while draining
    together: bool = False  # run the modes at once, under one schedule of faults

    def drain_end(
        self, all_in: bool, since_decision_s: float, since_begin_s: float, since_fault_s: float
    ) -> Optional[str]:
        """Why the drain is over (:data:`accounting.ENDS`), or None.

        ``all_applied``: every key applied (or dead-lettered) and no decision for QUIET_S
        (killed consumers' claims lapse, their redeliveries run). ``deadline``: the loss
        deadline passed (``since_fault_s``: since the last fault recovered); what is missing
        then is lost. ``stopped``/``idle``: the drain's own time ran out, or nothing was
        decided for ``idle_s`` since the drain began (the broker restart's silence before it
        does not count); what is missing then is outstanding, not lost.
        """
        if all_in and since_decision_s >= QUIET_S:
            return "all_applied"
        if self.loss_deadline_s is not None and since_fault_s >= self.loss_deadline_s:
            return "deadline"
        if self.drain_s is not None and since_begin_s >= self.drain_s:
            return "stopped"
        if self.idle_s is not None and min(since_decision_s, since_begin_s) >= self.idle_s:
            return "idle"
        return None


# The full run is the record: each mode alone, draining until 5 minutes after the last fault
# (in a run with a 120 s drain, two classic consumers' broker connections hung after the broker
# restart, "GetTransport ... timed_mutex timeout", and their queues resumed ~145 s later).
# The quick run is CI's gate (5 minutes in all): its modes run at once, so the broker restarts
# once for all of them (one restart took 18-88 s), over 60 s of sends (four modes' 5,000 keys
# over 30 s overloaded the 2 cores), and its drain stops after 45 s, or 15 s without a decision
# (counted from the drain's start at the earliest); it calls what is still missing outstanding.
SIZES = {
    "quick": Size(5_000, 60.0, drain_s=45.0, idle_s=15.0, together=True),
    "full": Size(100_000, 240.0, loss_deadline_s=300.0, poll_s=30.0),
}


def log(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def mysql_connect() -> Callable[[], Any]:
    from tests.support import mysql_connect as connect

    return connect()


def sql(query: str, params: Sequence[Any] = ()) -> List[Any]:
    """One statement on a new autocommit connection (retried while MariaDB restarts)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = mysql_connect()()
            try:
                conn.autocommit(True)
                cur = conn.cursor()
                cur.execute(query, tuple(params))
                return list(cur.fetchall() or [])
            finally:
                conn.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# -- servers ---------------------------------------------------------------------------------


class SoakRedis:
    """The soak's Redis: AOF ``everysec``, as a production Redis runs; killed with -9 and
    restarted on the same directory (it reloads the AOF)."""

    def __init__(self) -> None:
        self.dir = STATE / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.iterdir():
            if stale.is_file():
                stale.unlink()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.url = f"redis://127.0.0.1:{SOAK_REDIS_PORT}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(SOAK_REDIS_PORT), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "everysec",
             "--save", "", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.RedisError as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the soak's Redis did not start ({self.dir})") from exc
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class SoakPostgres:
    """The soak's PostgreSQL: a cluster of its own (tests.support.PrivatePostgres: initdb under
    the state root, a free port), killed with -9 and restarted on the same data directory (it
    recovers from its WAL); destroyed at the end."""

    def __init__(self) -> None:
        from tests.support import PrivatePostgres

        self.server = PrivatePostgres("soak")
        self.dsn = self.server.dsn

    def start(self) -> None:
        self.server.create()

    def kill(self) -> None:
        self.server.kill()
        self.server.start()

    def stop(self) -> None:
        self.server.destroy()


def kill_mariadb() -> None:
    pid = int((STATE_ROOT / "services" / "mariadb.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def script(*args: str) -> str:
    result = subprocess.run(
        [str(REPO / "scripts" / args[0]), *args[1:]],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (every thread), from /proc; 0.0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- consumers -------------------------------------------------------------------------------


class Consumer:
    """One consumer process of a kind (restartable in its slot)."""

    def __init__(self, slot: int, settings: Dict[str, Any], kind: str) -> None:
        self.slot, self.settings, self.kind = slot, settings, kind
        self.proc: Optional[subprocess.Popen[str]] = None
        self.cpu_s: Dict[int, float] = {}  # pid -> CPU seconds when it was stopped or killed
        self.lock = threading.Lock()

    def launch(self) -> None:
        venv = ".venv-grpc" if self.kind == "grpc" else ".venv-classic"
        HOME.mkdir(parents=True, exist_ok=True)
        settings = json.dumps({**self.settings, "kind": self.kind})
        python = str(REPO / venv / "bin" / "python")
        log_path = STATE / f"consumer-{self.settings['run_id']}-{self.slot}.log"
        with open(log_path, "a") as stderr:
            self.proc = subprocess.Popen(
                [python, "-m", "bench.soak.consumer", settings],
                cwd=REPO, env={**os.environ, "HOME": str(HOME), "PYTHONPATH": str(REPO)},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
            )  # fmt: skip

    def started(self) -> None:
        assert self.proc is not None
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "STARTED" not in line:
            raise RuntimeError(f"consumer {self.slot} ({self.kind}) did not start (see {STATE})")
        self.cpu_s[self.proc.pid] = 0.0

    def start(self) -> None:
        self.launch()
        self.started()

    def sigkill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.cpu_s[pid] = cpu_seconds(pid)
        self.proc.kill()
        self.proc.wait()
        return pid

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.cpu_s[self.proc.pid] = cpu_seconds(self.proc.pid)
            self.proc.terminate()

    def wait(self) -> None:
        """Until it exited; killed after STOP_GRACE_S (the run is over: nothing it still
        does is counted, and a classic client's shutdown can hang after a broker restart)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parallel(calls: Sequence[Callable[[], Any]]) -> List[Any]:
    """Run the calls in threads; their results in order (the first error is raised)."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


# -- one mode --------------------------------------------------------------------------------


@dataclass
class ModeRun:
    spec: str  # the mode, or MODE:VARIANT
    options: Dict[str, Any]
    size: Size
    seed: int
    kinds: Sequence[str]
    redis: SoakRedis
    postgres: Optional[SoakPostgres]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    kills: List[evidence.Kill] = field(default_factory=list)
    faults_done: List[Dict[str, Any]] = field(default_factory=list)
    send_retries: int = 0
    sent: int = 0
    unsent: List[str] = field(default_factory=list)
    first_sent: Dict[str, float] = field(default_factory=dict)
    start: float = 0.0
    consumers: List[Consumer] = field(default_factory=list)
    plan: List[Send] = field(default_factory=list)
    drain_end: str = ""
    drain_s: float = 0.0
    dead_lettered: set[str] = field(default_factory=set)
    dlq_messages: int = 0
    polls: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return self.spec.partition(":")[0]

    @property
    def channels(self) -> List[str]:
        """The consumer kinds of the mix: each consumes its own topic and group."""
        return sorted(set(self.kinds))

    def topic(self, kind: str) -> str:
        return f"SOAK-{self.mode.upper()}-{self.run_id}-{kind.upper()}"

    def group(self, kind: str) -> str:
        return f"soak-{self.mode}-{self.run_id}-{kind}"

    @property
    def keys(self) -> set[str]:
        return {s.key for s in self.plan} - set(self.unsent)

    def evidence_path(self) -> Path:
        return STATE / f"evidence-{self.run_id}.log"

    def make_consumers(self) -> None:
        settings = {
            "mode": self.mode, "run_id": self.run_id, "app": f"soak-{self.run_id}",
            "threads": THREADS, "lease_ms": LEASE_MS, "redis_url": self.redis.url,
            "pg_dsn": self.postgres.dsn if self.postgres is not None else None,
            "evidence": str(self.evidence_path()), "options": self.options,
        }  # fmt: skip
        self.consumers = [
            Consumer(i, {**settings, "topic": self.topic(kind), "group": self.group(kind)}, kind)
            for i, kind in enumerate(self.kinds)
        ]
        self.plan = sends(self.run_id, self.size.keys, self.size.send_s, self.seed)

    def probe_key(self, kind: str) -> str:
        return f"probe-{self.run_id}-{kind}"

    def unprobed(self) -> List[str]:
        """The kinds of which no consumer has decided a probe yet."""
        path = self.evidence_path()
        text = path.read_text() if path.exists() else ""
        return [k for k in self.channels if f" {self.probe_key(k)} " not in text]

    def produce(self, producer: Any) -> None:
        """Send the plan on time; a send that fails is retried with backoff (counted)."""
        for item in self.plan:
            delay = self.start + item.at_s - time.time()
            if delay > 0:
                time.sleep(delay)
            backoff, deadline = 0.1, time.monotonic() + SEND_DEADLINE_S
            while True:
                try:
                    topic = self.topic(kind_of(item.key, self.kinds))
                    producer.send_keyed(topic, f"{item.key} copy {item.copy}".encode(), item.key)
                    self.sent += 1
                    self.first_sent.setdefault(item.key, time.time())
                    break
                except Exception as exc:
                    self.send_retries += 1
                    if time.monotonic() > deadline:
                        log(f"giving up on sending {item.key}: {exc}")
                        self.unsent.append(item.key)
                        break
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)

    def applied(self) -> List[evidence.Effect]:
        query = "SELECT biz_key, pid, at FROM soak_effects WHERE run_id = %s"
        if self.mode in POSTGRES_MODES:
            assert self.postgres is not None
            rows = pg_sql(self.postgres.dsn, query, (self.run_id,))
        else:
            rows = sql(query, (self.run_id,))
        return [evidence.Effect(k, int(p), float(a)) for k, p, a in rows]

    def quiet_s(self) -> float:
        path = self.evidence_path()
        return time.time() - path.stat().st_mtime if path.exists() else 0.0

    def dlq_keys(self, topics: Optional[str] = None) -> List[str]:
        """The keys of the messages in the groups' DLQs (one per copy); ``topics``: the
        broker's topic list, if at hand."""
        topics = topics or script("rocketmq.sh", "admin", "topicList")
        keys: List[str] = []
        for kind in self.channels:
            name = f"%DLQ%{self.group(kind)}"
            if name in topics:
                text = script("rocketmq.sh", "admin", "printMsg", "-t", name, "-d", "false")
                keys += re.findall(r"KEYS=([^,}\s]+)", text)
        return keys

    def lag(self) -> Dict[str, Optional[int]]:
        """Per kind, its group's messages not yet consumed (topic and retry topic), while its
        consumers run; None if the broker does not say."""
        out: Dict[str, Optional[int]] = {}
        for kind in self.channels:
            try:
                text = script("rocketmq.sh", "admin", "consumerProgress", "-g", self.group(kind))
            except RuntimeError:
                out[kind] = None
                continue
            found = re.search(r"Diff Total:\s*(\d+)", text)
            out[kind] = int(found.group(1)) if found else None
        return out

    def missing(self) -> set[str]:
        return self.keys - {e.key for e in self.applied()} - self.dead_lettered

    def poll(self, topics: Optional[str] = None, lag: bool = True) -> None:
        """The DLQ's keys, and (``lag``) the groups' lag while keys are missing, into
        ``polls``."""
        missing = self.missing()
        keys = self.dlq_keys(topics)
        self.dead_lettered, self.dlq_messages = set(keys), len(keys)
        self.polls.append(
            {"at_s": round(time.time() - self.start, 1), "missing": len(missing),
             "dlq": len(keys), "lag": self.lag() if lag and missing - self.dead_lettered else {}}
        )  # fmt: skip

    def pid_kinds(self) -> Dict[int, str]:
        return {pid: c.kind for c in self.consumers for pid in c.cpu_s}

    def report(self, phases: Dict[str, float]) -> Dict[str, Any]:
        keys = sorted(self.keys)
        text = self.evidence_path().read_text() if self.evidence_path().exists() else ""
        events = [
            e for e in evidence.parse_events(text.splitlines()) if not e.key.startswith("probe-")
        ]
        effects = [e for e in self.applied() if not e.key.startswith("probe-")]
        verdict = evidence.judge(
            keys, effects, events, self.kills, STORE_KILL[self.mode],
            dead_lettered=self.dead_lettered, dedup=self.mode != CONTROL,
            lease_s=LEASE_MS / 1000,
        )  # fmt: skip
        doubles, explained = evidence.summary(verdict)
        decisions = [e for e in events if e.kind == "decision"]
        kinds = self.pid_kinds()
        key_kinds = {key: kind_of(key, self.kinds) for key in keys}
        applied_at = accounting.first_applied(effects)
        delays = accounting.delays(self.first_sent, applied_at)
        settled = accounting.settle(verdict.lost_causes, self.drain_end)
        cpu = {pid: s for c in self.consumers for pid, s in c.cpu_s.items()}
        return {
            "mode": self.mode, "options": self.options,
            "consumers": dict(Counter(self.kinds)),
            "keys": len(keys), "sent": self.sent, "delivered": len(decisions),
            "applied_keys": verdict.applied_keys,
            "missing": len(verdict.lost), **settled,
            "deadline": self.deadline(),
            "missing_causes": dict(Counter(verdict.lost_causes.values())),
            "missing_by_kind": accounting.missing_by_kind(verdict.lost_causes, key_kinds),
            "missing_keys": verdict.lost,
            "keys_by_kind": dict(Counter(key_kinds.values())),
            "answers_by_kind": accounting.answers_by_kind(events, kinds),
            "delay": accounting.delay_summary(delays, LATE_S),
            "double_applied": doubles, "double_applied_explained": explained,
            "double_applied_causes": {k: v for k, v in verdict.causes.items() if v},
            "unexplained_keys": verdict.unexplained[:20],
            "double_applied_appliers": {
                key: verdict.appliers[key]
                for key in sorted(verdict.appliers, key=lambda k: verdict.doubles[k] is not None)
                [:MAX_DETAILED]
            },
            "stalls": accounting.stall_summary(events, kinds, self.start),
            "client_sendback_failures": sendback_failures(kinds),
            "dlq": self.dlq_messages, "polls": self.polls,
            "faults": self.faults_done,
            "kills": [dataclasses.asdict(k) for k in self.kills],
            "send_retries": self.send_retries, "unsent": len(self.unsent),
            "drain_s": round(self.drain_s, 1), "drain_end": self.drain_end,
            **accounting.throughput(
                decisions, self.start, accounting.busy_end(applied_at, len(keys), self.start)
            ),
            "cpu_ms_per_msg": accounting.cpu_per_message(cpu, decisions, kinds),
            "timeline": timeline(decisions, self.start),
            "phases": phases,
        }  # fmt: skip

    def deadline(self) -> Dict[str, Any]:
        """The report's statement of when a missing key counts as lost."""
        last = max((f["at_s"] + f["took_s"] for f in self.faults_done), default=0.0)
        if self.size.loss_deadline_s is None:
            rule = "none: this run stops draining early, its missing keys are outstanding"
            return {"rule": rule, "reached": self.drain_end in accounting.FINAL_ENDS}
        return {
            "rule": f"{self.size.loss_deadline_s:.0f} s after the last fault recovered",
            "at_s": round(last + self.size.loss_deadline_s, 1),
            "reached": self.drain_end in accounting.FINAL_ENDS,
        }


# -- a batch of modes run at once ------------------------------------------------------------


class Batch:
    """Modes run at once: their topics and consumers side by side, one producer each, one
    schedule of faults (a SIGKILL kills the same slot in every mode; the servers restart once
    for all), one drain. ``phases`` times each step."""

    def __init__(self, runs: List[ModeRun], size: Size, seed: int) -> None:
        self.runs, self.size, self.seed = runs, size, seed
        self.phases: Dict[str, float] = {}
        self._mark = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - self._mark, 1)
        self._mark = now

    def run(self) -> None:
        from tests.e2e.clients import Producer

        script(
            "rocketmq.sh", "both",
            " ".join(r.topic(k) for r in self.runs for k in r.channels),
            " ".join(r.group(k) for r in self.runs for k in r.channels),
        )  # fmt: skip
        self.lap("create")
        consumers = [c for r in self.runs for c in r.consumers]
        producers: List[Any] = []
        try:
            for consumer in consumers:
                consumer.launch()
            for consumer in consumers:
                consumer.started()
            producers = [
                Producer("classic", tuple(r.topic(k) for k in r.channels)) for r in self.runs
            ]
            self.lap("start")
            self.handshake(producers)
            self.lap("handshake")
            start = time.time()
            for r in self.runs:
                r.start = start
            threads = [
                threading.Thread(target=r.produce, args=(p,))
                for r, p in zip(self.runs, producers, strict=True)
            ]
            threads.append(threading.Thread(target=self.inject, args=(start,)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.lap("send")
            self.drain()
            self.lap("drain")
            topics = script("rocketmq.sh", "admin", "topicList")  # while consumers run:
            lag = self.size.poll_s is not None  # the quick run skips the lag (a JVM per group)
            parallel([functools.partial(r.poll, topics, lag) for r in self.runs])
            self.lap("poll")
        finally:
            for consumer in consumers:
                with consumer.lock:
                    consumer.terminate()
            parallel([c.wait for c in consumers])
            for producer in producers:
                producer.close()
            self.lap("stop")

    def handshake(self, producers: List[Any]) -> None:
        """Probes until a consumer of every mode and kind decides one: the consumers are
        subscribed (a new topic's queues are then read from their first message)."""
        deadline = time.monotonic() + 90
        while waiting := [(r, p, k) for r, p in zip(self.runs, producers, strict=True)
                          for k in r.unprobed()]:  # fmt: skip
            if time.monotonic() > deadline:
                names = ", ".join(f"{r.spec} ({k})" for r, _, k in waiting)
                raise RuntimeError(f"no consumer of {names} received a probe within 90 s")
            for r, p, k in waiting:
                p.send_keyed(r.topic(k), b"probe", r.probe_key(k))
            time.sleep(1.0)

    def store_kills(self) -> List[str]:
        """The store kills of the schedule: Redis's and MariaDB's always (every run's schedule
        stays what it was), PostgreSQL's when one of its modes runs."""
        kills = list(STORE_KILLS)
        if any(r.mode in POSTGRES_MODES for r in self.runs):
            kills.append("postgres_kill")
        return kills

    def inject(self, start: float) -> None:
        """Each fault at its time, in its own thread (a broker restart takes 15-45 s under
        load; the faults after it must still strike while messages flow)."""
        schedule = faults(self.size.send_s, self.seed, stores=self.store_kills())
        rng = random.Random(self.seed)
        slots = {i: rng.randrange(len(self.runs[0].kinds)) for i, f in enumerate(schedule)
                 if f.kind == "sigkill"}  # fmt: skip
        threads = [
            threading.Thread(target=self.strike, args=(start, fault, slots.get(i)))
            for i, fault in enumerate(schedule)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def strike(self, start: float, fault: Fault, slot: Optional[int]) -> None:
        delay = start + fault.at_s - time.time()
        if delay > 0:
            time.sleep(delay)
        at = time.time()
        if slot is not None:
            victims = [r.consumers[slot] for r in self.runs]
            for victim in victims:
                victim.lock.acquire()  # one kill and restart of a slot at a time
            try:
                for r, victim in zip(self.runs, victims, strict=True):
                    pid = victim.sigkill()  # the time it was dead by: anything it wrote is
                    r.kills.append(evidence.Kill("sigkill", time.time(), pid))  # before
                for victim in victims:
                    victim.launch()
                for victim in victims:
                    victim.started()
            finally:
                for victim in victims:
                    victim.lock.release()
        elif fault.kind == "redis_kill":
            self.runs[0].redis.kill()
            time.sleep(1.0)
            self.runs[0].redis.start()
        elif fault.kind == "mysql_kill":
            kill_mariadb()
            time.sleep(1.0)
            script("services.sh", "up", "mysql")
        elif fault.kind == "postgres_kill":
            postgres = self.runs[0].postgres
            assert postgres is not None
            postgres.kill()
        else:
            script("rocketmq.sh", "restart-broker")
        took = time.time() - at
        for r in self.runs:
            if slot is None:
                r.kills.append(evidence.Kill(fault.kind, at))
            r.faults_done.append(
                {"kind": fault.kind, "at_s": round(at - start, 2), "took_s": round(took, 1)}
            )
        names = ", ".join(r.spec for r in self.runs)
        log(f"{names}: {fault.kind} at {at - start:.1f}s (recovered in {took:.1f}s)")

    def drain(self) -> None:
        """Until every mode's drain is over (:meth:`Size.drain_end`); with ``poll_s``, the DLQ
        and the groups' lag are polled meanwhile (dead-lettered keys are not waited for)."""
        size = self.size
        begin = time.monotonic()
        last_fault = max(
            (r.start + f["at_s"] + f["took_s"] for r in self.runs for f in r.faults_done),
            default=time.time(),
        )
        next_poll = begin + (size.poll_s or 0.0)
        pending = list(self.runs)
        while pending:
            if size.poll_s is not None and time.monotonic() >= next_poll:
                polled = [r for r in pending if r.missing()]
                if polled:  # one topic list, the modes' DLQs and lags side by side
                    topics = script("rocketmq.sh", "admin", "topicList")
                    parallel([functools.partial(r.poll, topics) for r in polled])
                next_poll = time.monotonic() + size.poll_s
            now = time.monotonic()
            for r in list(pending):
                end = size.drain_end(
                    not r.missing(), r.quiet_s(), now - begin, time.time() - last_fault
                )
                if end is not None:
                    r.drain_end, r.drain_s = end, time.monotonic() - begin
                    pending.remove(r)
            if pending:
                time.sleep(1.0)


def sendback_failures(pids: Iterable[int]) -> int:
    """``sendMessageBack`` errors in these consumers' rocketmq-client-cpp logs: each is a
    RECONSUME_LATER message the client dropped (it advances the offset past it)."""
    count = 0
    for pid in pids:
        for path in (HOME / "logs" / "rocketmq-cpp").glob(f"{pid}_rocketmq-cpp.log*"):
            with path.open(errors="replace") as lines:
                count += sum("(error)" in line and "[sendMessageBack:" in line for line in lines)
    return count


def timeline(decisions: Sequence[evidence.Event], start: float, step: float = 5.0) -> List[int]:
    """Decisions per ``step`` seconds from the start of sending."""
    counts: Dict[int, int] = {}
    for e in decisions:
        slot = int(max(e.at - start, 0.0) // step)
        counts[slot] = counts.get(slot, 0) + 1
    return [counts.get(i, 0) for i in range(max(counts, default=-1) + 1)]


def create_tables(postgres: Optional[SoakPostgres]) -> None:
    from rocketmq_dedup.stores.mysql import MySQLDedupStore

    sql(
        "CREATE TABLE IF NOT EXISTS soak_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
        " run_id VARCHAR(16) NOT NULL, biz_key VARCHAR(64) NOT NULL, pid INT NOT NULL,"
        " at DOUBLE NOT NULL, KEY (run_id)) ENGINE=InnoDB"
    )
    MySQLDedupStore(mysql_connect()).create_table()
    if postgres is not None:
        from rocketmq_dedup.stores.postgres import PostgresDedupStore
        from tests.support import pg_connect

        pg_sql(
            postgres.dsn,
            "CREATE TABLE IF NOT EXISTS soak_effects (id bigserial PRIMARY KEY,"
            " run_id varchar(16) NOT NULL, biz_key varchar(64) NOT NULL, pid int NOT NULL,"
            " at double precision NOT NULL)",
        )
        pg_sql(postgres.dsn, "CREATE INDEX IF NOT EXISTS soak_effects_run ON soak_effects (run_id)")
        store = PostgresDedupStore(pg_connect(postgres.dsn))
        store.create_table()
        store.close()


def pg_sql(dsn: str, query: str, params: Sequence[Any] = ()) -> List[Any]:
    """One statement on the soak's PostgreSQL (retried while it restarts)."""
    from tests.support import pg_query

    deadline = time.monotonic() + 60
    while True:
        try:
            return pg_query(query, *params, dsn=dsn)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# -- the command line ------------------------------------------------------------------------


def parse_options(text: str) -> Dict[str, Any]:
    """``K=V,K=V`` -> {K: V}; a value is JSON if it parses (200, 0.5, true, null), else a
    string (reconsume_later)."""
    options: Dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"expected NAME=VALUE, got {item!r}")
        try:
            options[name.strip()] = json.loads(value)
        except ValueError:
            options[name.strip()] = value.strip()
    return options


def check_options(options: Dict[str, Any]) -> None:
    """Raise ValueError unless ``DedupConfig`` takes these options (checked on a memory store
    before anything starts; the store's own options are checked by name)."""
    from rocketmq_dedup import DedupConfig, MemoryDedupStore
    from rocketmq_dedup.errors import DedupConfigError
    from rocketmq_dedup.stores import STORE_OPTIONS

    reserved = sorted(set(options) & set(RESERVED_OPTIONS))
    if reserved:
        raise ValueError(f"the soak sets {', '.join(reserved)} itself")
    settings = {k: v for k, v in options.items() if k not in STORE_OPTIONS}
    try:
        DedupConfig.enable_dedup_consume_config(
            "soak-options", MemoryDedupStore(), check_store=False, **settings
        )
    except (DedupConfigError, TypeError, ValueError) as exc:
        raise ValueError(f"DedupConfig refuses {options}: {exc}") from exc


def mode_options(
    specs: Sequence[str], common: Dict[str, Any], variants: Dict[str, Dict[str, Any]]
) -> Dict[str, Dict[str, Any]]:
    """spec -> its DedupConfig options: ``--options`` for every dedup mode, then the
    variant's (``MODE:VARIANT``). The control takes none (it has no DedupConfig)."""
    out: Dict[str, Dict[str, Any]] = {}
    for spec in specs:
        mode, _, variant = spec.partition(":")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        if variant and variant not in variants:
            raise ValueError(f"{spec}: no --variant {variant}=...")
        if mode == CONTROL:
            if variant:
                raise ValueError(f"{spec}: the control has no DedupConfig to vary")
            out[spec] = {}
            continue
        out[spec] = {**common, **variants.get(variant, {})}
    if len(set(out)) != len(specs):
        raise ValueError(f"a mode is listed twice: {', '.join(specs)}")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true",
                        help="5,000 keys per mode, the modes at once (CI)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--modes", default=",".join(DEFAULT_MODES),
        help=f"comma-separated MODE or MODE:VARIANT; modes: {', '.join(MODES)} (the control; "
        f"default: {','.join(DEFAULT_MODES)})",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--deadline", type=float, metavar="S",
        help="drain until every key is applied or S seconds after the last fault, as the full "
        "run does (300): what is missing then is lost (with --quick: a quick run that tells "
        "delayed from lost)",
    )  # fmt: skip
    parser.add_argument("--chart", type=Path, help="also draw decisions and faults (PNG)")
    parser.add_argument(
        "--options", default="", metavar="K=V,...",
        help="extra DedupConfig options of every dedup mode, e.g. in_progress_wait_ms=200 "
        "(values are JSON if they parse, else strings)",
    )  # fmt: skip
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=K=V,...",
        help="options of the modes listed as MODE:NAME (repeatable), e.g. "
        "--variant wait=in_progress_wait_ms=200 --modes plain-redis,plain-redis:wait",
    )  # fmt: skip
    parser.add_argument(
        "--consumers", default=",".join(DEFAULT_CONSUMERS), metavar="KINDS",
        help=f"every mode's consumer processes, one kind each: {', '.join(KINDS)} "
        f"(default {','.join(DEFAULT_CONSUMERS)})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    specs = [m.strip() for m in args.modes.split(",") if m.strip()]
    kinds = [k.strip() for k in args.consumers.split(",") if k.strip()]
    try:
        if not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"--consumers: kinds are {', '.join(KINDS)}; got {args.consumers}")
        common = parse_options(args.options)
        variants: Dict[str, Dict[str, Any]] = {}
        for text in args.variant:
            name, eq, rest = text.partition("=")
            if not eq or not name:
                raise ValueError(f"--variant NAME=K=V,...: got {text!r}")
            variants[name] = parse_options(rest)
        options = mode_options(specs, common, variants)
        for chosen in options.values():
            if chosen:
                check_options(chosen)
    except ValueError as exc:
        parser.error(str(exc))
    size = SIZES["quick" if args.quick else "full"]
    if args.deadline is not None:
        if args.deadline <= 0:
            parser.error("--deadline must be positive")
        size = dataclasses.replace(
            size, drain_s=None, idle_s=None, loss_deadline_s=args.deadline, poll_s=30.0
        )
    STATE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(HOME / "logs", ignore_errors=True)  # client logs are counted per pid
    postgres: Optional[SoakPostgres] = None
    if any(spec.partition(":")[0] in POSTGRES_MODES for spec in specs):
        postgres = SoakPostgres()
        postgres.start()
    redis_server = SoakRedis()
    try:
        create_tables(postgres)
        redis_server.start()
    except BaseException:
        if postgres is not None:
            postgres.stop()
        raise
    runs = [ModeRun(s, options[s], size, args.seed, kinds, redis_server, postgres) for s in specs]
    for r in runs:
        r.make_consumers()
    batches = [runs] if size.together else [[r] for r in runs]
    results: Dict[str, Any] = {}
    phases: List[Dict[str, float]] = []
    began = time.monotonic()
    try:
        for batch_runs in batches:
            names = ", ".join(r.spec for r in batch_runs)
            log(f"{names}: {size.keys:,} keys each over {size.send_s:.0f}s, consumers {kinds}")
            batch = Batch(batch_runs, size, args.seed)
            batch.run()
            reports = parallel([functools.partial(r.report, batch.phases) for r in batch_runs])
            batch.lap("report")
            phases.append(batch.phases)
            for r, result in zip(batch_runs, reports, strict=True):
                results[r.spec] = result
                log(
                    f"{r.spec}: lost {result['lost']}, outstanding {result['outstanding']} "
                    f"({result['acked_not_applied']} acked by the dedup layer), double applied "
                    f"{result['double_applied']} ({result['double_applied_explained']} "
                    f"explained), delayed {result['delay']['delayed']}, nacks "
                    f"{sum(a['later'] for a in result['answers_by_kind'].values())}, "
                    f"drain {result['drain_s']}s ({result['drain_end']})"
                )
            log(f"{names}: phases {batch.phases}")
    finally:
        redis_server.stop()
        if postgres is not None:
            postgres.stop()
    report = {
        "modes": results,
        "control": accounting.compare(results, CONTROL),
        "env": env(size, args.seed, time.monotonic() - began, kinds, phases, common, variants),
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.chart:
        soak_report.chart(report, args.chart)
    print(soak_report.table(report))
    failed = [
        m for m, r in results.items()
        if r["acked_not_applied"]
        or r["double_applied"] != r["double_applied_explained"]
        or (r["mode"].startswith("exactly-once") and r["double_applied"])
    ]  # fmt: skip
    if failed:
        log(
            f"FAILED: {', '.join(failed)} (keys acked by the dedup layer and never applied, or "
            "unexplained double applies; see missing_causes and unexplained_keys in the report)"
        )
        return 1
    log(f"passed in {time.monotonic() - began:.0f}s")
    return 0


def env(
    size: Size,
    seed: int,
    seconds: float,
    kinds: Sequence[str],
    phases: List[Dict[str, float]],
    options: Dict[str, Any],
    variants: Dict[str, Dict[str, Any]],
) -> Dict[str, Any]:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "git_commit": commit, "keys_per_mode": size.keys, "send_s": size.send_s,
        "together": size.together, "consumers": list(kinds), "threads": THREADS,
        "lease_ms": LEASE_MS, "late_s": LATE_S, "loss_deadline_s": size.loss_deadline_s,
        "drain_s": size.drain_s, "idle_s": size.idle_s, "seed": seed,
        "options": options, "variants": variants,
        "seconds": round(seconds, 1), "phases": phases, "cpus": os.cpu_count(),
    }  # fmt: skip
