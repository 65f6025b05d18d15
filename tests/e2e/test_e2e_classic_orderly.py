"""The listener in the classic client's orderly consumer (collected in .venv-classic only:
the 5.x client has no orderly push consumer of this kind)."""

from __future__ import annotations

import uuid
from typing import List, Tuple

import pytest

from tests.e2e.clients import Producer
from tests.e2e.harness import ConsumerProcess, Run, settings_for

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("store", ["redis", "mysql"])
def test_orderly_consumer_handles_duplicates_once(
    client: str,
    store: str,
    producer: Producer,
    channel: Tuple[str, str],
    used_groups: List[str],
) -> None:
    """Orderly consumer: 6 keys sent twice each on their own shard, one failing on its first
    attempt (retried locally by the client): one effect per key, every message acked."""
    assert client == "classic"
    used_groups.append(channel[1])
    run = Run(uuid.uuid4().hex[:12], producer, channel[0])
    settings = settings_for(client, store, run.run_id, *channel, orderly=True)
    settings["fail_first"] = ["ord-2"]
    consumer = ConsumerProcess(settings)
    try:
        run.warm_up()
        keys = [f"ord-{i}" for i in range(6)]
        for key in keys:
            run.send(key, sharding_key=key)
            run.send(key, sharding_key=key)
        run.wait_all_acked()
        assert run.effects() == {key: 1 for key in keys}
        failed = [d for d in run.deliveries() if d["biz_key"] == "ord-2" and d["status"] == 1]
        assert len(failed) == 1
    finally:
        consumer.stop()
