"""The Redis store behind Redis Sentinel (scripts/services.sh up sentinel): its records go to
the master Sentinel names, and it reconnects after the master restarts."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator, Tuple

import pytest
import redis
from redis.sentinel import Sentinel

from rocketmq_dedup import DedupElement, DedupStatus, StoreError
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.support import wait_for

SENTINEL = os.environ.get("DEDUP_REDIS_SENTINEL", "127.0.0.1:26379")
SERVICE = os.environ.get("DEDUP_REDIS_SENTINEL_MASTER", "mymaster")
MASTER_PORT = 16380  # scripts/services.sh: the master the sentinel monitors
SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


def sentinel_address() -> Tuple[str, int]:
    host, port = SENTINEL.rsplit(":", 1)
    return host, int(port)


@pytest.fixture(scope="module")
def sentinel() -> Sentinel:
    """The test Sentinel; a missing one fails the tests (never skips them)."""
    sentinel = Sentinel([sentinel_address()], socket_timeout=2, socket_connect_timeout=2)
    try:
        master = sentinel.discover_master(SERVICE)
    except redis.RedisError as exc:
        pytest.fail(
            f"Sentinel not reachable at {SENTINEL}: scripts/services.sh up sentinel ({exc})"
        )
    assert master == ("127.0.0.1", MASTER_PORT), master
    return sentinel


@pytest.fixture
def master_direct(sentinel: Sentinel) -> Iterator[redis.Redis]:
    """A plain client of the master's own port, to read what the store wrote."""
    client = redis.Redis(host="127.0.0.1", port=MASTER_PORT)
    yield client
    client.close()


def element() -> DedupElement:
    return DedupElement(f"app-{uuid.uuid4().hex[:12]}", "T", "", "k")


def test_records_go_to_the_master_sentinel_names(
    sentinel: Sentinel, master_direct: redis.Redis
) -> None:
    """A store on Sentinel(...).master_for() writes its records to the master on 16380."""
    store = RedisDedupStore(sentinel.master_for(SERVICE, socket_timeout=2))
    e = element()
    assert store.claim(Claim(e, "o1"), 60_000).claimed
    assert master_direct.get(store.record_key(e)) == b"CONSUMING:o1"
    store.mark_consumed(Claim(e, "o1"), 60_000)  # deferred: the flusher sends it soon
    wait_for(lambda: master_direct.get(store.record_key(e)) == b"CONSUMED:o1", timeout=2)
    assert store.get_status(e) is DedupStatus.CONSUMED
    store.check()
    assert store.describe() == f"Redis Sentinel master {SERVICE}"
    store.close()


def test_store_reconnects_after_the_master_restarts(
    sentinel: Sentinel, master_direct: redis.Redis
) -> None:
    """After the master is killed and started again on the same address (no failover), the
    store's next round trips reconnect through Sentinel and its records land on the master."""
    store = RedisDedupStore(sentinel.master_for(SERVICE, socket_timeout=2))
    before = element()
    assert store.claim(Claim(before, "o"), 60_000).claimed
    result = subprocess.run(
        [str(SERVICES), "restart-sentinel-master"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    after = element()

    def claimed() -> bool:
        try:
            return store.claim(Claim(after, "o"), 60_000).claimed
        except StoreError:  # the master may still be starting
            return False

    wait_for(claimed, timeout=20, interval=0.1)
    assert master_direct.get(store.record_key(after)) == b"CONSUMING:o"
    assert master_direct.get(store.record_key(before)) is None  # a new, empty server
    store.close()
