"""The README's quick starts (samples/quickstart_*.py), run as a user runs them: each file as a
process against the real broker, Redis, MariaDB and PostgreSQL, configured only through the
environment variables its docstring documents. Each environment runs the samples of its client
(classic: Redis, MySQL, PostgreSQL, and exactly-once on MySQL and on PostgreSQL; 5.x: Push and
Simple), chosen at collection like conftest's client modules."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.e2e.clients import NAMESRV, PROXY, Producer, installed_client
from tests.e2e.harness import REPO, STATE, rocketmq_script
from tests.support import MYSQL, PG_DSN, REDIS_URL, wait_for

pytestmark = pytest.mark.e2e

SAMPLES_BY_CLIENT = {
    "classic": [
        "quickstart_redis",
        "quickstart_mysql",
        "quickstart_postgres",
        "quickstart_exactly_once",
        "quickstart_exactly_once_postgres",
    ],
    "grpc": ["quickstart_grpc_push", "quickstart_grpc_simple"],
}
# with no client installed every sample is collected, and the session's `client` fixture fails
SAMPLES = SAMPLES_BY_CLIENT.get(
    installed_client(), [s for samples in SAMPLES_BY_CLIENT.values() for s in samples]
)
ORDERS = 5

HANDLED = re.compile(r" INFO order (\S+) handled: (.*)$")
DUPLICATE = re.compile(r" INFO order (\S+): duplicate \((\w+)\), skipped$")
# Ctrl-C, and `kill` (what a service manager sends)
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
CASES = [(sample, name) for sample in SAMPLES for name in SIGNALS]


@pytest.fixture(scope="module")
def sample_channels(
    client: str, broker: None, used_groups: List[str]
) -> Dict[Tuple[str, str], Tuple[str, str]]:
    """A fresh topic and consumer group (1 s retry backoff) per case, created in one go; the
    groups are checked for dead letters at the end of the session (test_dead_letters)."""
    run = uuid.uuid4().hex[:8]
    channels = {
        case: (f"QS-{client}-{run}-{i}", f"qs-{client}-{run}-{i}") for i, case in enumerate(CASES)
    }
    topics = " ".join(t for t, _ in channels.values())
    rocketmq_script("both", topics, " ".join(g for _, g in channels.values()))
    used_groups.extend(g for _, g in channels.values())
    return channels


@pytest.fixture(scope="module")
def keyed_producer(
    client: str, sample_channels: Dict[Tuple[str, str], Tuple[str, str]]
) -> Iterator[Producer]:
    producer = Producer(client, tuple(t for t, _ in sample_channels.values()))
    yield producer
    producer.close()


class SampleProcess:
    """samples/<name>.py as a subprocess; its log (stdout and stderr) in the state directory."""

    def __init__(self, name: str, topic: str, group: str) -> None:
        home = STATE / "e2e-home"  # the clients write their logs under $HOME
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = STATE / f"e2e-{name}-{time.time_ns()}.log"
        env = {
            **os.environ,
            "HOME": str(home),
            "PYTHONUNBUFFERED": "1",
            "ROCKETMQ_NAMESRV": NAMESRV,
            "ROCKETMQ_PROXY": PROXY,
            "REDIS_URL": REDIS_URL,
            "MYSQL_HOST": str(MYSQL["host"]),
            "MYSQL_PORT": str(MYSQL["port"]),
            "MYSQL_USER": str(MYSQL["user"]),
            "MYSQL_PASSWORD": str(MYSQL["password"]),
            "MYSQL_DATABASE": str(MYSQL["database"]),
            "POSTGRES_URL": PG_DSN,
            "ORDER_TOPIC": topic,
            "ORDER_GROUP": group,
        }
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(REPO / "samples" / f"{name}.py")],
                cwd=home,  # as a user runs a copied file: nothing of the repository on sys.path
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def lines(self) -> List[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def handled(self) -> Counter[str]:
        return Counter(m.group(1) for m in map(HANDLED.search, self.lines()) if m)

    def duplicates(self, status: str) -> Counter[str]:
        found = (m for m in map(DUPLICATE.search, self.lines()) if m)
        return Counter(m.group(1) for m in found if m.group(2) == status)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the sample exited ({self.proc.returncode}): {self.tail()}")
        return True

    def tail(self) -> str:
        return "\n".join(self.lines()[-40:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.mark.parametrize(("sample", "stop_signal"), CASES)
def test_quickstart_handles_each_order_once_and_stops_cleanly(
    sample: str,
    stop_signal: str,
    client: str,
    sample_channels: Dict[Tuple[str, str], Tuple[str, str]],
    keyed_producer: Producer,
) -> None:
    """5 orders sent twice each, keyed by order id: the sample's handler runs once per order,
    every second copy is skipped as a duplicate of a handled order, and SIGINT (Ctrl-C) or
    SIGTERM stops the process cleanly (exit status 0, no error, no traceback)."""
    topic, group = sample_channels[(sample, stop_signal)]
    run = uuid.uuid4().hex[:8]
    process = SampleProcess(sample, topic, group)
    try:
        warm_up(process, keyed_producer, topic, run)
        orders = [f"order-{run}-{i}" for i in range(ORDERS)]
        for copy in range(2):
            for order in orders:
                keyed_producer.send_keyed(topic, f"{order} copy {copy}".encode(), order)
        wait_for(
            lambda: (
                process.alive()
                and set(orders) <= set(process.handled())
                and set(orders) <= set(process.duplicates("CONSUMED"))
            ),
            timeout=120,
            interval=0.2,
        )
        handled = process.handled()
        assert {order: handled[order] for order in orders} == {order: 1 for order in orders}
        process.proc.send_signal(SIGNALS[stop_signal])
        assert process.proc.wait(60) == 0, process.tail()
        log = process.lines()
        assert log[-1].endswith(" INFO stopped"), process.tail()
        # a transient failure (a WARNING line) is fine; a traceback or an ERROR is not
        assert not [line for line in log if "Traceback" in line or " ERROR " in line], (
            process.tail()
        )
    finally:
        process.kill()


def warm_up(process: SampleProcess, producer: Producer, topic: str, run: str) -> None:
    """Send a warm-up order a second until the sample handles one: its consumer owns its
    queues and pulls."""
    deadline = time.monotonic() + 90
    for n in itertools.count():
        process.alive()
        assert time.monotonic() < deadline, f"the sample handled nothing: {process.tail()}"
        producer.send_keyed(topic, b"warm-up", f"warmup-{run}-{n}")
        try:
            wait_for(lambda: any(k.startswith("warmup-") for k in process.handled()), 1.0, 0.1)
            return
        except AssertionError:
            continue
