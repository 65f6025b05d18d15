"""Runs the soak: ``python -m bench.soak [--quick] [--json PATH] [--modes LIST] [--seed N]``.

Needs the project's servers running (``scripts/soak.sh`` starts them): MariaDB and the broker
of ``scripts/services.sh`` / ``scripts/rocketmq.sh``, which this run kills and restarts; Redis
is the soak's own (AOF ``everysec``, port ``SOAK_REDIS_PORT``), started and stopped here. Every
process it starts is stopped by PID when it ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from bench.soak import evidence
from bench.soak import report as soak_report
from bench.soak.plan import Fault, Send, faults, sends

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup")) / "soak"
HOME = STATE / "home"  # the consumers' HOME: rocketmq-client-cpp writes its logs under it
MODES = ("plain-redis", "plain-mysql", "exactly-once")
STORE_KILL = {
    "plain-redis": "redis_kill",
    "plain-mysql": "mysql_kill",
    "exactly-once": "mysql_kill",
}
SOAK_REDIS_PORT = int(os.environ.get("SOAK_REDIS_PORT", "16390"))
CONSUMERS, THREADS = 4, 8
LEASE_MS = 10_000  # a killed consumer's claims lapse after this; redeliveries then run
QUIET_S = 12.0  # the drain ends this long after the last decision, once every key is applied


@dataclass(frozen=True)
class Size:
    keys: int
    send_s: float
    drain_s: float
    idle_s: Optional[float] = None  # also end the drain after this long without any decision

    def drained(self, all_applied: bool, since_decision_s: float, since_begin_s: float) -> bool:
        """Whether the drain is over: every key applied and no decision for QUIET_S, or nothing
        at all decided for ``idle_s`` since the drain began (the broker restart's silence
        before it does not count; the keys still missing are the transport's, the report
        classifies them)."""
        if all_applied and since_decision_s >= QUIET_S:
            return True
        return self.idle_s is not None and min(since_decision_s, since_begin_s) >= self.idle_s


# The full drain outlasts the classic client's stall after a broker restart: in a run with a
# 120 s drain, two consumers' broker connections hung ("GetTransport ... timed_mutex timeout")
# and their queues resumed about 145 s after the restart, only minutes before the deadline.
# The quick run (CI, 5 minutes for three modes) ends a drain after 15 s without a decision
# (counted from the drain's start at the earliest: the broker restart's silence does not
# count): in a CI run with a 60 s drain and no idle end, no mode decided anything in its last
# 40-50 s.
SIZES = {
    "quick": Size(5_000, 30.0, 45.0, idle_s=15.0),
    "full": Size(100_000, 240.0, 180.0),
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


def kill_mariadb() -> None:
    pidfile = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup"))
    pid = int((pidfile / "services" / "mariadb.pid").read_text())
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


# -- consumers -------------------------------------------------------------------------------


class Consumer:
    """One consumer process (restartable in its slot)."""

    def __init__(self, slot: int, settings: Dict[str, Any], client: str) -> None:
        self.slot, self.settings, self.client = slot, settings, client
        self.proc: Optional[subprocess.Popen[str]] = None
        self.pids: List[int] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        venv = ".venv-grpc" if self.client == "grpc" else ".venv-classic"
        home = HOME
        home.mkdir(parents=True, exist_ok=True)
        settings = json.dumps({**self.settings, "client": self.client})
        python = str(REPO / venv / "bin" / "python")
        log_path = STATE / f"consumer-{self.settings['run_id']}-{self.slot}.log"
        with open(log_path, "a") as stderr:
            self.proc = subprocess.Popen(
                [python, "-m", "bench.soak.consumer", settings],
                cwd=REPO, env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
            )  # fmt: skip
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "STARTED" not in line:
            raise RuntimeError(f"consumer {self.slot} did not start (see {STATE})")
        self.pids.append(self.proc.pid)

    def sigkill(self) -> int:
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        return pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- one mode --------------------------------------------------------------------------------


@dataclass
class ModeRun:
    mode: str
    size: Size
    seed: int
    redis: SoakRedis
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    kills: List[evidence.Kill] = field(default_factory=list)
    faults_done: List[Dict[str, Any]] = field(default_factory=list)
    send_retries: int = 0
    sent: int = 0
    unsent: List[str] = field(default_factory=list)
    start: float = 0.0

    @property
    def topic(self) -> str:
        return f"SOAK-{self.mode.upper()}-{self.run_id}"

    @property
    def group(self) -> str:
        return f"soak-{self.mode}-{self.run_id}"

    def evidence_path(self) -> Path:
        return STATE / f"evidence-{self.run_id}.log"

    def run(self) -> Dict[str, Any]:
        script("rocketmq.sh", "both", self.topic, self.group)
        settings = {
            "mode": self.mode, "run_id": self.run_id, "app": f"soak-{self.run_id}",
            "topic": self.topic, "group": self.group, "threads": THREADS,
            "lease_ms": LEASE_MS, "redis_url": self.redis.url,
            "evidence": str(self.evidence_path()),
        }  # fmt: skip
        clients = ["classic"] * CONSUMERS
        if self.mode == "plain-redis":
            clients[-1] = "grpc"  # one 5.x PushConsumer beside the classic ones
        consumers = [Consumer(i, settings, c) for i, c in enumerate(clients)]
        from tests.e2e.clients import Producer

        producer = Producer("classic", (self.topic,))
        try:
            for consumer in consumers:
                consumer.start()
            self.handshake(producer)
            plan = sends(self.run_id, self.size.keys, self.size.send_s, self.seed)
            schedule = faults(self.size.send_s, self.seed)
            self.start = time.time()
            injector = threading.Thread(target=self.inject, args=(schedule, consumers))
            injector.start()
            self.produce(producer, plan)
            injector.join()
            drain_s = self.drain({s.key for s in plan} - set(self.unsent))
        finally:
            for consumer in consumers:
                with consumer.lock:
                    consumer.stop()
            producer.close()
        return self.report(plan, drain_s)

    def handshake(self, producer: Any) -> None:
        """Probes until a consumer decides one: the consumers are subscribed (a new topic's
        queues are then read from their first message)."""
        deadline = time.monotonic() + 90
        path = self.evidence_path()
        while not (path.exists() and " probe-" in path.read_text()):
            if time.monotonic() > deadline:
                raise RuntimeError("no consumer received a probe within 90 s")
            producer.send_keyed(self.topic, b"probe", f"probe-{self.run_id}")
            time.sleep(1.0)

    def produce(self, producer: Any, plan: List[Send]) -> None:
        """Send the plan on time; a send that fails is retried with backoff (counted)."""
        for item in plan:
            delay = self.start + item.at_s - time.time()
            if delay > 0:
                time.sleep(delay)
            backoff, deadline = 0.1, time.monotonic() + 60
            while True:
                try:
                    producer.send_keyed(
                        self.topic, f"{item.key} copy {item.copy}".encode(), item.key
                    )
                    self.sent += 1
                    break
                except Exception as exc:
                    self.send_retries += 1
                    if time.monotonic() > deadline:
                        log(f"giving up on sending {item.key}: {exc}")
                        self.unsent.append(item.key)
                        break
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)

    def inject(self, schedule: List[Fault], consumers: List[Consumer]) -> None:
        """Each fault at its time, in its own thread (a broker restart takes 15-45 s under
        load; the faults after it must still strike while messages flow)."""
        rng = random.Random(self.seed)
        victims = {i: rng.choice(consumers) for i, f in enumerate(schedule) if f.kind == "sigkill"}
        threads = [
            threading.Thread(target=self.strike, args=(fault, victims.get(i)))
            for i, fault in enumerate(schedule)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def strike(self, fault: Fault, victim: Optional[Consumer]) -> None:
        delay = self.start + fault.at_s - time.time()
        if delay > 0:
            time.sleep(delay)
        at = time.time()
        if victim is not None:
            with victim.lock:  # one kill and restart of a slot at a time
                self.kills.append(evidence.Kill("sigkill", at, victim.sigkill()))
                victim.start()
        elif fault.kind == "redis_kill":
            self.redis.kill()
            self.kills.append(evidence.Kill("redis_kill", at))
            time.sleep(1.0)
            self.redis.start()
        elif fault.kind == "mysql_kill":
            kill_mariadb()
            self.kills.append(evidence.Kill("mysql_kill", at))
            time.sleep(1.0)
            script("services.sh", "up")
        else:
            self.kills.append(evidence.Kill("broker_restart", at))
            script("rocketmq.sh", "restart-broker")
        took = time.time() - at
        self.faults_done.append(
            {"kind": fault.kind, "at_s": round(at - self.start, 2), "took_s": round(took, 1)}
        )
        log(f"{self.mode}: {fault.kind} at {at - self.start:.1f}s (recovered in {took:.1f}s)")

    def applied(self) -> List[evidence.Effect]:
        rows = sql("SELECT biz_key, pid, at FROM soak_effects WHERE run_id = %s", (self.run_id,))
        return [evidence.Effect(k, int(p), float(a)) for k, p, a in rows]

    def drain(self, keys: set[str]) -> float:
        """Wait until the size says the drain is over (every sent key applied and no decision
        for QUIET_S: claims of killed consumers lapse, their redeliveries run), or the drain
        deadline passes."""
        begin = time.monotonic()
        deadline = begin + self.size.drain_s
        while time.monotonic() < deadline:
            applied = {e.key for e in self.applied()}
            path = self.evidence_path()
            quiet = time.time() - path.stat().st_mtime if path.exists() else 0.0
            if self.size.drained(keys <= applied, quiet, time.monotonic() - begin):
                break
            time.sleep(1.0)
        return time.monotonic() - begin

    def dlq(self) -> int:
        topics = script("rocketmq.sh", "admin", "topicList")
        name = f"%DLQ%{self.group}"
        if name not in topics:
            return 0
        status = script("rocketmq.sh", "admin", "topicStatus", "-t", name)
        total = 0
        for line in status.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-2].isdigit():  # ... #Min Offset #Max Offset ...
                total += int(parts[-2])
        return total

    def report(self, plan: List[Send], drain_s: float) -> Dict[str, Any]:
        keys = sorted({s.key for s in plan} - set(self.unsent))
        text = self.evidence_path().read_text() if self.evidence_path().exists() else ""
        events = [
            e for e in evidence.parse_events(text.splitlines()) if not e.key.startswith("probe-")
        ]
        effects = [e for e in self.applied() if not e.key.startswith("probe-")]
        verdict = evidence.judge(keys, effects, events, self.kills, STORE_KILL[self.mode])
        doubles, explained = evidence.summary(verdict)
        decisions = [e for e in events if e.kind == "decision"]
        elapsed = max((e.at for e in decisions), default=self.start) - self.start
        return {
            "keys": len(keys), "sent": self.sent, "delivered": len(decisions),
            "applied_keys": verdict.applied_keys, "lost": len(verdict.lost),
            "double_applied": doubles, "double_applied_explained": explained,
            "double_applied_causes": {k: v for k, v in verdict.causes.items() if v},
            "unexplained_keys": verdict.unexplained[:20], "lost_keys": verdict.lost[:20],
            "lost_causes": dict(Counter(verdict.lost_causes.values())),
            "lost_by_dedup": sum(c == evidence.LOST_BY_DEDUP for c in verdict.lost_causes.values()),
            "client_sendback_failures": sendback_failures({e.pid for e in events}),
            "dlq": self.dlq(), "faults": self.faults_done,
            "send_retries": self.send_retries, "unsent": len(self.unsent),
            "drain_s": round(drain_s, 1),
            "msgs_per_s": round(len(decisions) / elapsed, 1) if elapsed > 0 else 0.0,
            "timeline": timeline(decisions, self.start),
        }  # fmt: skip


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


def create_tables() -> None:
    from rocketmq_dedup.stores.mysql import MySQLDedupStore

    sql(
        "CREATE TABLE IF NOT EXISTS soak_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
        " run_id VARCHAR(16) NOT NULL, biz_key VARCHAR(64) NOT NULL, pid INT NOT NULL,"
        " at DOUBLE NOT NULL, KEY (run_id)) ENGINE=InnoDB"
    )
    MySQLDedupStore(mysql_connect()).create_table()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5,000 keys per mode (CI)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chart", type=Path, help="also draw decisions and faults (PNG)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; modes: {', '.join(MODES)}")
    size = SIZES["quick" if args.quick else "full"]
    STATE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(HOME / "logs", ignore_errors=True)  # client logs are counted per pid
    create_tables()
    redis_server = SoakRedis()
    redis_server.start()
    results: Dict[str, Any] = {}
    began = time.monotonic()
    try:
        for mode in modes:
            log(f"{mode}: {size.keys:,} keys over {size.send_s:.0f}s, {CONSUMERS} consumers")
            results[mode] = ModeRun(mode, size, args.seed, redis_server).run()
            r = results[mode]
            log(
                f"{mode}: lost {r['lost']} ({r['lost_by_dedup']} acked by the dedup layer), "
                f"double applied {r['double_applied']} "
                f"({r['double_applied_explained']} explained), dlq {r['dlq']}, "
                f"drain {r['drain_s']}s"
            )
    finally:
        redis_server.stop()
    report = {"modes": results, "env": env(size, args.seed, time.monotonic() - began)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.chart:
        soak_report.chart(report, args.chart)
    print(soak_report.table(report))
    failed = [
        m for m, r in results.items()
        if r["lost_by_dedup"]
        or r["double_applied"] != r["double_applied_explained"]
        or (m == "exactly-once" and r["double_applied"])
    ]  # fmt: skip
    if failed:
        log(
            f"FAILED: {', '.join(failed)} (keys acked by the dedup layer and never applied, or "
            "unexplained double applies; see lost_causes and unexplained_keys in the report)"
        )
        return 1
    log(f"passed in {time.monotonic() - began:.0f}s")
    return 0


def env(size: Size, seed: int, seconds: float) -> Dict[str, Any]:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "git_commit": commit, "keys_per_mode": size.keys, "send_s": size.send_s,
        "consumers": CONSUMERS, "threads": THREADS, "lease_ms": LEASE_MS, "seed": seed,
        "seconds": round(seconds, 1), "cpus": os.cpu_count(),
    }  # fmt: skip
