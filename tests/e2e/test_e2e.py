"""End to end through a real RocketMQ 5.3 broker with the real Python client of this
environment (classic in .venv-classic, 5.x gRPC in .venv-grpc), on Redis and on MariaDB, and the
first case on PostgreSQL too.

Each test gets a fresh topic and consumer group; consumers are separate processes; handler
effects and every delivery are recorded in MariaDB by the consumer (tests/e2e/consumer_app.py).
"""

from __future__ import annotations

import uuid
from typing import List, Tuple

import pytest

from tests.e2e.clients import Producer
from tests.e2e.harness import ConsumerProcess, Run, settings_for

pytestmark = pytest.mark.e2e

SUCCESS, LATER = 0, 1


@pytest.fixture(params=["redis", "mysql"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run(producer: Producer, channel: Tuple[str, str], used_groups: List[str]) -> Run:
    used_groups.append(channel[1])
    return Run(uuid.uuid4().hex[:12], producer, channel[0])


def start(
    client: str, store: str, run: Run, channel: Tuple[str, str], **kw: object
) -> ConsumerProcess:
    topic, group = channel
    return ConsumerProcess(settings_for(client, store, run.run_id, topic, group, **kw))


@pytest.mark.parametrize("store", ["redis", "mysql", "postgres"])
def test_duplicates_have_exactly_one_effect(
    client: str, store: str, run: Run, channel: Tuple[str, str]
) -> None:
    """(a) 12 messages, each sent 2-3 times with one business key (twice back to back, a
    third time after it was handled): 12 effects, and every sent message is acked (on each
    store: the PostgreSQL store's one e2e case)."""
    consumer = start(client, store, run, channel, handler_ms=200)
    try:
        run.warm_up()
        keys = [f"order-{i}" for i in range(12)]
        for key in keys:  # concurrent duplicates
            run.send(key)
            run.send(key)
        run.wait_handled(keys)
        for key in keys[::2]:  # spaced duplicates, after the first copy was handled
            run.send(key)
        run.wait_all_acked()
        assert run.effects() == {key: 1 for key in keys}
        assert len(run.sent) == 30
    finally:
        consumer.stop()


def test_duplicate_during_handler_goes_through_the_retry_topic(
    client: str, store: str, run: Run, channel: Tuple[str, str]
) -> None:
    """(b) a duplicate arriving while the first copy is in its 3 s handler is answered
    RECONSUME_LATER, comes back through the retry topic (attempt > 0) and is then acked as
    consumed without running the handler."""
    consumer = start(client, store, run, channel, handler_ms=3000)
    try:
        run.warm_up()
        first, second = run.send("slow-order"), run.send("slow-order")
        run.wait_all_acked()
        assert run.effects() == {"slow-order": 1}
        by_id = {m: [d for d in run.deliveries() if d["msg_id"] == m] for m in (first, second)}
        retried = [m for m, ds in by_id.items() if ds[0]["status"] == LATER]
        assert len(retried) == 1, by_id
        last = by_id[retried[0]][-1]
        assert (last["status"], last["handled"]) == (SUCCESS, 0)
        assert last["attempt"] > 0
    finally:
        consumer.stop()


@pytest.mark.parametrize("failure", ["fail_first", "raise_first"])
def test_failed_first_attempt_is_retried_and_handled_once(
    client: str, store: str, run: Run, channel: Tuple[str, str], failure: str
) -> None:
    """(c, f) the handler returns False or raises on the first attempt: the message is not
    acked (no ctypes pitfall), the broker redelivers it, and it is handled once."""
    consumer = start(client, store, run, channel, **{failure: ["flaky-order"]})
    try:
        run.warm_up()
        run.send("flaky-order")
        run.wait_all_acked()
        deliveries = run.deliveries()
        assert [(d["status"], d["handled"]) for d in deliveries] == [(LATER, 1), (SUCCESS, 1)]
        assert deliveries[1]["attempt"] > 0
        assert run.effects() == {"flaky-order": 1}
    finally:
        consumer.stop()


def test_consumer_killed_mid_handler_is_recovered_once(
    client: str, store: str, run: Run, channel: Tuple[str, str]
) -> None:
    """(d) SIGKILL in the middle of a handler: after a restart and the lease's expiry the
    message is handled, once."""
    lease = {"lease_ms": 3000}
    victim = start(client, store, run, channel, slow={"crash-order": 120_000}, **lease)
    run.warm_up()
    run.send("crash-order")
    run.wait_for_phase("crash-order", "start")
    victim.kill()
    survivor = start(client, store, run, channel, **lease)
    try:
        run.wait_all_acked(timeout=150)
        assert run.effects() == {"crash-order": 1}
        assert run.effects("start")["crash-order"] == 2  # the killed attempt and the rerun
    finally:
        survivor.stop()


def test_two_consumer_processes_have_exactly_one_effect(
    client: str, store: str, run: Run, channel: Tuple[str, str]
) -> None:
    """(e) two consumer processes in one group, 10 keys sent 3 times each: 10 effects."""
    consumers = [start(client, store, run, channel, handler_ms=150) for _ in range(2)]
    try:
        run.warm_up()
        keys = [f"pair-{i}" for i in range(10)]
        for key in keys:
            run.send(key)
            run.send(key)
        run.wait_handled(keys)
        for key in keys:
            run.send(key)
        run.wait_all_acked()
        assert run.effects() == {key: 1 for key in keys}
    finally:
        for consumer in consumers:
            consumer.stop()
