"""The 5.x SimpleConsumer helper (collected in .venv-grpc only): receive a batch, dedup it,
ack the handled and the already-consumed, leave the failed to become visible again."""

from __future__ import annotations

import time
import uuid
from typing import Any, List, Set, Tuple

import pytest

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.adapters.grpc import SimpleRound, consume_simple
from tests.e2e.clients import PROXY, Producer
from tests.e2e.consumer_app import E2EListener, Recorder
from tests.e2e.harness import Run, settings_for
from tests.support import fresh_python, last_json_line

pytestmark = pytest.mark.e2e


def test_simple_consumer_acks_handled_and_duplicates_once(
    client: str, producer: Producer, channel: Tuple[str, str], used_groups: List[str]
) -> None:
    """6 keys sent twice each, one failing on its first attempt: consume_simple rounds ack
    every message, the failed one after it became visible again; one effect per key."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    assert client == "grpc"
    topic, group = channel
    used_groups.append(group)
    run = Run(uuid.uuid4().hex[:12], producer, topic)
    settings = settings_for(client, "redis", run.run_id, topic, group, fail_first=["simple-3"])
    import redis

    from tests.support import REDIS_URL

    config = DedupConfig.enable_dedup_consume_config(
        settings["app"], redis.Redis.from_url(REDIS_URL)
    )
    listener = E2EListener(config, settings, Recorder(run.run_id))
    consumer = AckRecording(
        SimpleConsumer(
            ClientConfiguration(PROXY, Credentials()),
            group,
            {topic: FilterExpression()},
            await_duration=2,
        )
    )
    consumer.inner.startup()
    rounds: List[SimpleRound] = []
    try:
        deadline = time.monotonic() + 60
        while not rounds or rounds[-1].received == 0:  # warm up: until a receive returns
            assert time.monotonic() < deadline, "the simple consumer received nothing"
            run.producer.send(topic, b"warmup", {"biz_key": f"warmup-{len(rounds)}"})
            rounds.append(consume_simple(consumer, listener, 16, 2))
        keys = [f"simple-{i}" for i in range(6)]
        for key in keys:
            run.send(key)
            run.send(key)
        deadline = time.monotonic() + 90
        while not set(run.sent) <= consumer.acked:
            assert time.monotonic() < deadline, "not every message was acked"
            rounds.append(consume_simple(consumer, listener, 16, 2))
        assert run.effects() == {key: 1 for key in keys}
        assert any(r.left > 0 for r in rounds)  # the failed attempt was left to come back
    finally:
        consumer.inner.shutdown()


def test_the_5x_client_never_imports_the_thread_state_module(client: str) -> None:
    """The installed 5.x client's MessageListener, called through the adapter from a thread
    pool as its push consumer calls it (and every other Python caller, in a fresh process):
    every message consumed, and rocketmq_dedup._threads (the classic client's native-thread
    quirk) never imported."""
    assert client == "grpc"
    seen = last_json_line(fresh_python("-m", "tests.python_callers"))
    assert seen["answers"][-8:] == ["SUCCESS"] * 8  # the 5.x client's ConsumeResult
    assert seen["imported"] is False


class AckRecording:
    """A SimpleConsumer that remembers the ids of the messages it acked."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.acked: Set[str] = set()

    def receive(self, max_message_num: int, invisible_duration: int) -> Any:
        return self.inner.receive(max_message_num, invisible_duration)

    def ack(self, message: Any) -> None:
        self.inner.ack(message)
        self.acked.add(message.message_id)
