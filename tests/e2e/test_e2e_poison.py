"""A message whose handler kills its consumer, through the real broker with this environment's
client: each consumer process that takes it dies in its handler (SIGKILL from inside); the
message comes back to the next one (a rebalance, then the broker's retries while the dead
consumer's claim still holds), which takes over the lapsed claim. With ``max_lapsed_claims=2``
the third consumer parks it: recorded FAILED ("its handler ended 2 consumers") in Redis, its
handler not run, acked (``permanent_failure="ack"``); the other messages are handled once."""

from __future__ import annotations

import time
import uuid
from typing import Any, List, Tuple

import pytest
import redis

from rocketmq_dedup import DedupElement, DedupStatus, RedisDedupStore
from tests.e2e.clients import Producer
from tests.e2e.harness import ConsumerProcess, Run, settings_for
from tests.support import REDIS_URL, wait_for

pytestmark = pytest.mark.e2e

SUCCESS = 0


def test_a_message_that_kills_its_consumers_is_parked_after_two(
    client: str, producer: Producer, channel: Tuple[str, str], used_groups: List[str]
) -> None:
    """Two consumer processes die in the poison message's handler; the third parks it (FAILED,
    acked without its handler) and lives; every other message is handled once."""
    topic, group = channel
    used_groups.append(group)
    run = Run(uuid.uuid4().hex[:12], producer, topic)
    settings = settings_for(
        client,
        "redis",
        run.run_id,
        topic,
        group,
        threads=1,
        handler_ms=10,
        lease_ms=3000,
        kill_on=["poison"],
        max_lapsed_claims=2,
        permanent_failure="ack",
    )
    consumers: List[ConsumerProcess] = []
    try:
        first = ConsumerProcess(settings)
        consumers.append(first)
        run.warm_up()
        run.send("poison")
        run.send("plain")
        dead = 0
        deadline = time.monotonic() + 240
        while dead < 2 and time.monotonic() < deadline:
            consumer = consumers[-1]
            consumer.proc.wait(max(1.0, deadline - time.monotonic()))  # it dies in the handler
            assert consumer.proc.returncode == -9, consumer.log_path.read_text()[-2000:]
            dead += 1
            consumers.append(ConsumerProcess(settings))  # the next consumer takes it
        assert dead == 2
        survivor = consumers[-1]
        wait_for(
            lambda: [
                d for d in run.deliveries() if d["biz_key"] == "poison" and d["status"] == SUCCESS
            ],
            timeout=120,
            interval=0.5,
        )
        parked = [
            d for d in run.deliveries() if d["biz_key"] == "poison" and d["status"] == SUCCESS
        ]
        assert [(d["handled"], d["pid"]) for d in parked][:1] == [(0, survivor.pid)]
        assert survivor.proc.poll() is None  # alive: the handler did not run
        run.wait_handled(["plain"])
        assert run.effects() == {"plain": 1}
        assert run.effects("start")["poison"] == 2  # the two consumers that died in it
        store = RedisDedupStore(redis.Redis.from_url(REDIS_URL), coalesce=False)
        record: Any = store.read(DedupElement(settings["app"], topic, "TagA", "poison"))
        assert record is not None
        assert (record.status, record.reason) == (
            DedupStatus.FAILED,
            "its handler ended 2 consumers (claims lapsed, never settled)",
        )
    finally:
        for consumer in consumers:
            consumer.stop()
