"""The asyncio listener end to end through the real broker, with the real client of this
environment: the classic push client through PushBridge (.venv-classic), the 5.x PushConsumer
through message_listener and the 5.x SimpleConsumer through consume_simple (.venv-grpc), on
redis.asyncio. Consumers are processes of tests/e2e/aio_consumer_app.py."""

from __future__ import annotations

import uuid
from typing import List, Tuple

import pytest

from tests.e2e.clients import Producer, installed_client
from tests.e2e.harness import ConsumerProcess, Run, settings_for

pytestmark = pytest.mark.e2e

APP = "tests.e2e.aio_consumer_app"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The drivers of this environment's client: the classic client has a push consumer only,
    the 5.x client a push and a simple one."""
    if "driver" in metafunc.fixturenames:
        client = installed_client()
        metafunc.parametrize("driver", ["push"] if client == "classic" else ["push", "simple"])


def test_the_asyncio_listener_applies_each_key_once_through_the_broker(
    client: str,
    driver: str,
    producer: Producer,
    channel: Tuple[str, str],
    used_groups: List[str],
) -> None:
    """12 keys sent twice at once, 4 of them a third time once handled, one failing its first
    attempt: every message acked, one effect per key, the failed one after its retry."""
    topic, group = channel
    used_groups.append(group)
    run = Run(uuid.uuid4().hex[:12], producer, topic)
    settings = settings_for(
        client, "redis", run.run_id, topic, group, driver=driver, fail_first=["order-3"]
    )
    consumer = ConsumerProcess(settings, module=APP)
    try:
        run.warm_up()
        keys = [f"order-{i}" for i in range(12)]
        for key in keys:
            run.send(key)
            run.send(key)
        run.wait_handled(keys, timeout=120)
        for key in keys[::3]:
            run.send(key)
        run.wait_all_acked(timeout=120)
        assert run.effects() == {key: 1 for key in keys}
        failed = [d for d in run.deliveries() if d["biz_key"] == "order-3" and d["status"] == 1]
        assert failed, "order-3's first attempt was not answered RECONSUME_LATER"
    finally:
        consumer.stop()
