"""``rocketmq-dedup dlq`` through the real broker (issue 36.4): dead letters of a group that
retries once (a reused key rejected for its other payload, a failing handler), listed and shown
with their dedup records in Redis, and resent to their topic with the same message id, keys,
tag and properties: a dry run changes nothing, ``--release`` runs the handler again, and a
resend whose record is kept is acked as the duplicate it is. The resent copies are consumed by
this environment's client (classic or 5.x); the dead letters are made by a 5.x consumer (the
classic one cannot make them on RocketMQ 5.3: test_e2e_classic_dlq.py)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import redis

from rocketmq_dedup import DedupElement, DedupStatus, RedisDedupStore
from rocketmq_dedup.cli import main
from tests.e2e.clients import Producer, start_push_consumer
from tests.e2e.dlq_maker import OrderListener, listener, make_dead_letters
from tests.e2e.harness import REPO, rocketmq_script
from tests.support import REDIS_URL, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def dlq_channel(broker: None, session_id: str) -> Tuple[str, str]:
    """A fresh topic and a group that retries once (retryMaxTimes=1, 1 s backoff), made at run
    time; not in used_groups: its dead letters are wanted."""
    topic, group = f"E2E-DLQ-{session_id}", f"e2e-dlq-{session_id}"
    rocketmq_script("both", topic, group, env={"ROCKETMQ_DEDUP_RETRY_MAX": "1"})
    return topic, group


def dead_letters(client: str, topic: str, group: str, app: str) -> Dict[str, str]:
    """The dead letters, made by a 5.x consumer: in this process, or in the 5.x environment."""
    if client == "grpc":
        return make_dead_letters(topic, group, app)
    python = REPO / ".venv-grpc" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"the 5.x environment {python} is missing: scripts/test.sh creates it")
    made = subprocess.run(
        [str(python), "-m", "tests.e2e.dlq_maker", json.dumps([topic, group, app])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    ids: Dict[str, str] = json.loads(made.stdout.strip().splitlines()[-1])
    return ids


def dlq(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``rocketmq-dedup dlq ARGS`` in this process: its output; exit status 0."""
    capsys.readouterr()
    status = main(["dlq", *args])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    return out


def line_of(text: str, needle: str) -> str:
    [line] = [line for line in text.splitlines() if needle in line]
    return line


@pytest.fixture
def consumer(client: str, dlq_channel: Tuple[str, str], app: str) -> Iterator[OrderListener]:
    """This environment's client consuming the topic in the group, warmed up (a message of
    its own handled: the queues are assigned and pulled)."""
    topic, group = dlq_channel
    orders = listener(app)
    orders.failing = False
    stop = start_push_consumer(client, group, topic, orders)
    producer = Producer(client, (topic,))
    try:
        deadline, n = time.monotonic() + 90, 0
        while not orders.handled:
            assert time.monotonic() < deadline, "the consumer never received a warm-up message"
            producer.send_keyed(topic, b"warm-up", f"warmup-{n}")
            n += 1
            pause = time.monotonic() + 2
            while not orders.handled and time.monotonic() < pause:
                time.sleep(0.1)
        yield orders
    finally:
        producer.close()
        stop()
        orders.close()


@pytest.fixture
def app() -> str:
    return f"e2e-dlq-{uuid.uuid4().hex[:10]}"


def test_dead_letters_are_listed_with_records_and_resent(
    client: str,
    dlq_channel: Tuple[str, str],
    app: str,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """list and show: each dead letter with its topic, tag, key and record (CONSUMED for the
    rejected copy of order-1, none for the failed order-3); resend: a dry run changes
    nothing, a resend reaches the handler with the same id and keys, --release runs a
    CONSUMED key's handler again, and without it the copy is acked as a duplicate."""
    topic, group = dlq_channel
    ids = dead_letters(client, topic, group, app)
    base = ["--group", group, "--redis", REDIS_URL, "--app", app, "--key", "first-key"]

    listed = dlq(capsys, "list", *base)
    assert "2 dead letter(s)" in listed and ids["first"] not in listed
    reused = line_of(listed, ids["reused"]).split()  # stored (2 cells), id, topic, tag, key ...
    assert reused[3:6] + reused[-1:] == [topic, "TagD", "order-1", "CONSUMED"]
    failing = line_of(listed, ids["failing"]).split()
    assert failing[3:6] + failing[-1:] == [topic, "TagD", "order-3", "none"]
    by_id = dlq(capsys, "list", "--group", group, "--redis", REDIS_URL, "--app", app)
    assert line_of(by_id, ids["reused"]).split()[-1] == "none"  # keyed by message id: no record

    shown = dlq(capsys, "show", *base, ids["reused"])
    assert "body           8 bytes: b'12 books'" in shown
    assert "dedup key      order-1 (the first key)" in shown
    assert line_of(shown, "status").split()[-1] == "CONSUMED"

    orders: OrderListener = request.getfixturevalue("consumer")
    store = RedisDedupStore(redis.Redis.from_url(REDIS_URL))
    element = DedupElement(app, topic, "TagD", "order-1")
    before = store.read(element)
    dry = dlq(capsys, "resend", *base, ids["reused"], "--release", "--dry-run")
    assert "CONSUMED: would be released" in dry and "nothing sent" in dry
    unchanged = store.read(element)
    assert before is not None and unchanged is not None
    assert (unchanged.status, unchanged.owner) == (DedupStatus.CONSUMED, before.owner)

    sent = dlq(capsys, "resend", *base, ids["failing"])
    assert "none: the handler runs for the resent copy" in sent
    wait_for(lambda: ("order-3", ids["failing"], b"fail") in orders.handled, timeout=60)

    released = dlq(capsys, "resend", *base, ids["reused"], "--release")
    assert "CONSUMED: released" in released and f"sent to {topic}" in released
    wait_for(lambda: ("order-1", ids["reused"], b"12 books") in orders.handled, timeout=60)

    def consumed() -> Any:  # the consumer's mark rides its store's next round trip (deferred)
        record = store.read(element)
        return record if record is not None and record.status is DedupStatus.CONSUMED else None

    after = wait_for(consumed, timeout=10)
    assert after.owner != before.owner

    kept = dlq(capsys, "resend", *base, ids["reused"])
    assert "CONSUMED, kept: the resent copy is acked as a duplicate" in kept
    wait_for(lambda: (ids["reused"], DedupStatus.CONSUMED) in orders.duplicates, timeout=60)
    handled_keys: List[Any] = [key for key, _, _ in orders.handled if key.startswith("order")]
    assert sorted(handled_keys) == ["order-1", "order-3"]
