"""E2E plumbing: consumer processes, the recording tables, polling helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

from tests.e2e.clients import Producer
from tests.e2e.consumer_app import BIZ_KEY, SCHEMA
from tests.support import sql, wait_for

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("ROCKETMQ_DEDUP_STATE_ROOT", "/tmp/rocketmq-dedup"))


def create_tables() -> None:
    for statement in SCHEMA:
        sql(statement)


class ConsumerProcess:
    """A consumer_app subprocess (or another app module of these tests)."""

    def __init__(self, settings: Dict[str, Any], module: str = "tests.e2e.consumer_app") -> None:
        home = STATE / "e2e-home"  # the clients write their logs under $HOME
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = STATE / f"e2e-consumer-{settings['run_id']}-{time.time_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(settings)],
            cwd=REPO,
            env={**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until STARTED or the process dies
        if line.strip() != "STARTED":
            self.kill()
            raise AssertionError(f"consumer did not start: {self.log_path.read_text()[-2000:]}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown, no ack, no cleanup."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class Run:
    """One test's messages and what the consumers recorded about them."""

    def __init__(self, run_id: str, producer: Producer, topic: str) -> None:
        self.run_id = run_id
        self.producer = producer
        self.topic = topic
        self.sent: List[str] = []

    def send(self, key: str, body: bytes = b"payload", sharding_key: Optional[str] = None) -> str:
        props = {BIZ_KEY: key, "run_id": self.run_id}
        msg_id = self.producer.send(self.topic, body, props, sharding_key=sharding_key)
        self.sent.append(msg_id)
        return msg_id

    def effects(self, phase: str = "done") -> Counter[str]:
        rows = sql(
            "SELECT biz_key FROM e2e_effects WHERE run_id = %s AND phase = %s",
            self.run_id,
            phase,
        )
        return Counter(r[0] for r in rows if not r[0].startswith("warmup-"))

    def deliveries(self) -> List[Dict[str, Any]]:
        rows = sql(
            "SELECT biz_key, msg_id, attempt, status, handled, pid FROM e2e_deliveries "
            "WHERE run_id = %s ORDER BY id",
            self.run_id,
        )
        keys = ("biz_key", "msg_id", "attempt", "status", "handled", "pid")
        return [dict(zip(keys, r, strict=False)) for r in rows if not r[0].startswith("warmup-")]

    def acked_ids(self) -> set[str]:
        return {d["msg_id"] for d in self.deliveries() if d["status"] == 0}

    def wait_all_acked(self, timeout: float = 90) -> None:
        """Every message sent so far got a CONSUME_SUCCESS answer; on a timeout the error says
        which were not, what their deliveries were and what the consumers logged."""
        try:
            wait_for(lambda: set(self.sent) <= self.acked_ids(), timeout=timeout, interval=0.2)
        except AssertionError as exc:
            raise AssertionError(self.unacked_report(timeout)) from exc

    def unacked_report(self, timeout: float) -> str:
        """The messages sent but never answered CONSUME_SUCCESS, their deliveries, and the tail
        of every consumer log of this run."""
        deliveries = self.deliveries()
        missing = set(self.sent) - {d["msg_id"] for d in deliveries if d["status"] == 0}
        lines = [f"{len(missing)} of {len(self.sent)} messages not acked within {timeout}s"]
        lines += [
            f"  {msg_id}: {[d for d in deliveries if d['msg_id'] == msg_id]}"
            for msg_id in sorted(missing)
        ]
        for log in sorted(STATE.glob(f"e2e-consumer-{self.run_id}-*.log")):
            lines.append(f"--- {log.name} (last 3000 characters)")
            lines.append(log.read_text(errors="replace")[-3000:])
        return "\n".join(lines)

    def wait_delivered(self, msg_id: str, timeout: float = 30) -> None:
        """A consumer answered ``msg_id`` (any answer)."""
        found = "SELECT 1 FROM e2e_deliveries WHERE run_id = %s AND msg_id = %s LIMIT 1"
        wait_for(lambda: sql(found, self.run_id, msg_id), timeout=timeout, interval=0.02)

    def wait_handled(self, keys: List[str], timeout: float = 90) -> None:
        wait_for(lambda: set(keys) <= set(self.effects()), timeout=timeout, interval=0.2)

    def wait_for_phase(self, key: str, phase: str, timeout: float = 60) -> None:
        wait_for(lambda: self.effects(phase)[key] > 0, timeout=timeout, interval=0.1)

    def warm_up(self, timeout: float = 60) -> None:
        """Send warm-up messages until a consumer handles one (queues assigned, pulling)."""
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            self.producer.send(
                self.topic, b"warmup", {BIZ_KEY: f"warmup-{n}", "run_id": self.run_id}
            )
            n += 1
            poll_end = time.monotonic() + 1.0
            while time.monotonic() < poll_end:
                if sql("SELECT 1 FROM e2e_deliveries WHERE run_id = %s LIMIT 1", self.run_id):
                    return
                time.sleep(0.1)
        raise AssertionError("no consumer received a warm-up message")


def settings_for(
    client: str, store: str, run_id: str, topic: str, group: str, **overrides: Any
) -> Dict[str, Any]:
    settings: Dict[str, Any] = {
        "client": client,
        "store": store,
        "app": f"e2e-{run_id}",
        "group": group,
        "topic": topic,
        "run_id": run_id,
        "handler_ms": 100,
        "threads": 4,
        "table": "t_rocketmq_dedup_e2e",
    }
    settings.update(overrides)
    return settings


def rocketmq_script(
    *args: str, capture: bool = False, env: Optional[Dict[str, str]] = None
) -> Optional[str]:
    """scripts/rocketmq.sh with ``args`` (``env``: more variables, e.g. the retries of the
    groups it creates, ``ROCKETMQ_DEDUP_RETRY_MAX``)."""
    result = subprocess.run(
        [str(REPO / "scripts/rocketmq.sh"), *args],
        check=True,
        capture_output=capture,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    return result.stdout if capture else None
