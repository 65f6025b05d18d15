"""The operator kit (rocketmq_dedup/ops/) against real data: a real Prometheus
(scripts/services.sh, Debian's package) scrapes samples/redis_consumer.py consuming through the
real broker, with its records in a Redis server this test starts and later kills. The traffic
produces, honestly, every event the rules watch: a storm of copies of two orders (duplicates in
progress, then of a consumed order, at more than a delivery every 10 s), a key reused with
another body (a payload mismatch), a claim an operator releases with `rocketmq-dedup release`
under its running handler (a lease lost), handlers slower than the rule's 10 s, two poisoned
orders whose handler fails on every redelivery (heading to the DLQ), a store that refuses writes
(made a replica: messages sent back to the broker, outcome store_misconfigured), and a store
outage (store errors, messages run without dedup). Then every rule's expression and every
dashboard panel's query, evaluated by Prometheus over its HTTP API, returns data for this run's
application, and every alert is pending or firing. The classic client only (the sample consumer
uses it).

The panels' time series are written to $STATE/operations-<run>.json;
``python -m tests.e2e.render_dashboard DUMP PNG`` draws them (docs/operations-dashboard.png)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import redis

from tests.e2e.clients import Producer
from tests.e2e.harness import REPO, STATE, rocketmq_script
from tests.support import wait_for

pytestmark = pytest.mark.e2e

PROMETHEUS = os.environ.get("DEDUP_PROMETHEUS_URL", "http://127.0.0.1:19090")
PROMETHEUS_DIR = Path(os.environ.get("DEDUP_PROMETHEUS_DIR", STATE / "services" / "prometheus"))
RULES = REPO / "rocketmq_dedup" / "ops" / "prometheus" / "rocketmq-dedup.rules.yml"
DASHBOARD = REPO / "rocketmq_dedup" / "ops" / "grafana" / "rocketmq-dedup-dashboard.json"
HANDLE_SECONDS = 11  # above RocketmqDedupHandlerSlow's 10 s
LEASE_MS = 3000  # renewed every second while a handler runs
STORM = 8  # copies of each storm order, sent at once
POISON = "poison"  # the body whose handler fails on every delivery (--fail-body)
TAG = "TagA"  # what Producer.send_keyed sets
LEGEND_LABEL = re.compile(r"\{\{(\w+)\}\}")  # Grafana's {{label}} in a legend


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def api(path: str, method: str = "GET", **params: str) -> Any:
    """Prometheus's HTTP API: the ``data`` of a successful answer."""
    url = f"{PROMETHEUS}{path}"
    data = urllib.parse.urlencode(params).encode() if params else None
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    if path.startswith("/-/"):
        return body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]


def query(expr: str, app: str) -> List[Dict[str, Any]]:
    """The instant vector ``expr`` evaluates to now, this run's application only."""
    result: List[Dict[str, Any]] = api("/api/v1/query", "POST", query=expr)["result"]
    return [r for r in result if r["metric"].get("app") in (app, None)]


def value(expr: str, app: str) -> float:
    """The sum of ``expr``'s values for this run's application (0 with no data)."""
    return sum(float(r["value"][1]) for r in query(expr, app))


def dashboard_queries(
    app: str, interval: str
) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any], str]]:
    """(panel, target, expression) with Grafana's variables filled in."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", interval).replace("$app", app)
            yield panel, target, expr


@pytest.fixture(scope="module")
def prometheus() -> None:
    try:
        api("/-/ready")
    except OSError as exc:
        pytest.fail(f"Prometheus is not running at {PROMETHEUS}: scripts/services.sh up ({exc})")


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[Tuple[str, subprocess.Popen[bytes]]]:
    """A Redis server of this test's own (127.0.0.1, a free port), killed by the test."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until_up(port)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.kill()
        proc.wait(10)


def wait_until_up(port: int) -> None:
    """Wait until the Redis server on ``port`` answers."""

    def ping() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_connect_timeout=0.5).ping())
        except redis.ConnectionError:
            return False

    wait_for(ping, timeout=20, interval=0.1)


class Consumer:
    """samples/redis_consumer.py as a process; its log in the state directory."""

    def __init__(self, args: List[str]) -> None:
        home = STATE / "e2e-home"  # the classic client writes its logs under $HOME
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = STATE / f"e2e-operations-{time.time_ns()}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "samples.redis_consumer", *args],
                cwd=REPO,
                env={**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def handling(self, body: str) -> bool:
        """Whether a handler has started on a message with ``body`` (the sample logs it)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the consumer exited: {self.tail()}")
        text = self.log_path.read_text(errors="replace")
        return f"pretending to consume for a long time: {body}\n" in text

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.mark.timeout(600)
def test_every_rule_and_panel_returns_data_for_a_real_consumer(
    client: str,
    broker: None,
    prometheus: None,
    store_server: Tuple[str, subprocess.Popen[bytes]],
) -> None:
    assert client == "classic"
    run = uuid.uuid4().hex[:8]
    app, topic, group = f"ops-{run}", f"OPS-{run}", f"ops-{run}"
    redis_url, redis_proc = store_server
    rocketmq_script("both", topic, group)
    metrics_port = free_port()
    consumer = Consumer(
        ["--redis", redis_url, "--group", group, "--topic", topic, "--app", app,
         "--metrics-port", str(metrics_port), "--handle-seconds", str(HANDLE_SECONDS),
         "--lease-ms", str(LEASE_MS), "--threads", "8", "--fail-body", POISON]
    )  # fmt: skip
    target = PROMETHEUS_DIR / "targets" / f"operations-{run}.json"
    rules = PROMETHEUS_DIR / "rules" / RULES.name
    producer = Producer(client, (topic,))
    started = time.time()
    try:
        # Prometheus scrapes the consumer and loads the kit's rules as they are in this checkout
        target.write_text(json.dumps([{"targets": [f"127.0.0.1:{metrics_port}"]}]))
        shutil.copy(RULES, rules)
        api("/-/reload", "POST")
        wait_for(lambda: value(f'up{{instance="127.0.0.1:{metrics_port}"}}', app) == 1, 30)

        warm_up(consumer, producer, topic, run)
        produce_the_events(consumer, producer, topic, app, run, redis_url, redis_proc)

        # every rule Prometheus loaded from the kit is healthy, and the consumers' group's
        # expressions have data (the outbox's group, rocketmq-dedup-outbox, is for relays:
        # its unit tests are promtool's)
        names = re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.MULTILINE)
        groups = {
            g["name"]: g["rules"] for g in api("/api/v1/rules")["groups"] if g["file"] == str(rules)
        }
        assert [r["name"] for rules_ in groups.values() for r in rules_] == names
        assert all(r["health"] == "ok" for rules_ in groups.values() for r in rules_)
        group_rules = groups["rocketmq-dedup"]
        names = [r["name"] for r in group_rules]
        for rule in group_rules:
            assert rule["health"] == "ok", rule
            assert query(rule["query"], app), f"{rule['name']}: no data for {rule['query']}"

        # ... and Prometheus's own evaluation has every alert pending or firing for this app
        def alerting() -> set[str]:
            alerts = api("/api/v1/alerts")["alerts"]
            return {a["labels"]["alertname"] for a in alerts if a["labels"].get("app") == app}

        wait_for(lambda: alerting() >= set(names), timeout=30, interval=0.5)

        # every dashboard panel's query has data for this app
        for panel, target_, expr in dashboard_queries(app, "5m"):
            assert query(expr, app), f"panel {panel['title']!r} ({target_['refId']}): {expr}"
        dump_panels(app, run, started)
    finally:
        target.unlink(missing_ok=True)
        rules.unlink(missing_ok=True)
        api("/-/reload", "POST")
        producer.close()
        consumer.stop()


def warm_up(consumer: Consumer, producer: Producer, topic: str, run: str) -> None:
    """Send a keyed warm-up message a second until a handler starts on one: the consumer owns
    its queues and pulls."""
    deadline = time.monotonic() + 90
    for n in itertools.count():
        assert time.monotonic() < deadline, f"the consumer handled nothing: {consumer.tail()}"
        producer.send_keyed(topic, b"warm-up", f"warmup-{run}-{n}")
        try:
            wait_for(lambda: consumer.handling("warm-up"), timeout=1.0, interval=0.1)
            return
        except AssertionError:
            continue


def produce_the_events(
    consumer: Consumer,
    producer: Producer,
    topic: str,
    app: str,
    run: str,
    redis_url: str,
    redis_proc: subprocess.Popen[bytes],
) -> None:
    """The traffic; each step waits until Prometheus has scraped what it caused."""

    def outcome(name: str) -> float:
        return value(f'sum(rocketmq_dedup_messages_total{{app="{app}", outcome="{name}"}})', app)

    # the counters are exported at 0 from the first decision (the warm-up's): once Prometheus
    # has scraped them, the events below are increases it sees, not a series that starts
    # above 0 (waited for after the storm, the storm's first copies could land in the first
    # sample: under load the storm's share of the 5-minute rate then fell under the rule's
    # 0.25, and its expression had no data)
    wait_for(lambda: bool(query(f'rocketmq_dedup_messages_total{{app="{app}"}}', app)), 30)
    storm = [f"order-{run}-1", f"order-{run}-2"]
    for key in storm:  # STORM copies at once: one handled, the rest answered in progress
        for _ in range(STORM):
            producer.send_keyed(topic, key.encode(), key)
    lease_key = f"order-{run}-3"
    producer.send_keyed(topic, lease_key.encode(), lease_key)
    wait_for(lambda: all(consumer.handling(key) for key in [*storm, lease_key]), timeout=60)
    for n in (1, 2):  # failing on every redelivery: heading to the DLQ
        producer.send_keyed(topic, POISON.encode(), f"poison-{run}-{n}")
    # a producer reusing an order's key for another body while the first copy is handled
    producer.send_keyed(topic, b"another body", storm[0])
    # an operator releases the running claim: the next renewal round finds it gone
    release = subprocess.run(
        [sys.executable, "-m", "rocketmq_dedup", "release", "--redis", redis_url, "--app", app,
         "--topic", topic, "--tag", TAG, lease_key],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert release.returncode == 0, release.stdout + release.stderr
    wait_for(lambda: value(f'sum(rocketmq_dedup_leases_lost_total{{app="{app}"}})', app) >= 1, 30)
    wait_for(lambda: outcome("payload_mismatch") >= 1, timeout=30)
    wait_for(lambda: outcome("duplicate_in_progress") >= 2 * (STORM - 1), timeout=30)
    # the storm settles: every copy acked as a duplicate once its order was handled
    wait_for(lambda: outcome("duplicate_consumed") >= 2 * (STORM - 1), timeout=90)
    wait_for(lambda: outcome("failed") >= 4, timeout=90)  # each poisoned order, redelivered

    # the store refuses writes (made a replica of a master that never answers): the next order
    # is sent back to the broker, never run without dedup; then it takes writes again
    admin = redis.Redis.from_url(redis_url)
    admin.replicaof("127.0.0.1", str(free_port()))
    refused_key = f"order-{run}-5"
    producer.send_keyed(topic, refused_key.encode(), refused_key)
    wait_for(lambda: outcome("store_misconfigured") >= 1, timeout=60)
    admin.replicaof("NO", "ONE")
    admin.close()

    # the store goes down: the next order runs without dedup (policy "consume")
    redis_proc.kill()
    redis_proc.wait(10)
    outage_key = f"order-{run}-4"
    producer.send_keyed(topic, outage_key.encode(), outage_key)
    wait_for(lambda: outcome("store_error_consumed") >= 1, timeout=60)
    errors = f'sum(rocketmq_dedup_store_errors_total{{app="{app}", op="claim"}})'
    assert value(errors, app) >= 1


def legend_of(template: str, labels: Dict[str, str]) -> str:
    """A series' legend, as Grafana fills ``{{label}}`` in."""
    return LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), template)


def dump_panels(app: str, run: str, started: float) -> None:
    """Each panel's series over the run, as Prometheus computes them (for the PNG)."""
    end = time.time()
    panels: Dict[str, Dict[str, Any]] = {}
    for panel, target, expr in dashboard_queries(app, "15s"):
        data = api(
            "/api/v1/query_range", "POST", query=expr, start=str(started), end=str(end), step="1"
        )
        entry = panels.setdefault(
            panel["title"], {"unit": panel["fieldConfig"]["defaults"]["unit"], "series": []}
        )
        for series in data["result"]:
            legend = legend_of(target["legendFormat"], series["metric"])
            points = [[float(t) - started, float(v)] for t, v in series["values"]]
            entry["series"].append({"legend": legend, "points": points})
    out = STATE / f"operations-{run}.json"
    out.write_text(json.dumps({"app": app, "panels": panels}, indent=1))
    print(f"dashboard data: {out}")
