"""Redis specifics: round trips, readable collision-free keys, client options."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupElement,
    DedupStatus,
)
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.support import REDIS_URL, ClassicMessage


class CountingConnection(redis.Connection):
    """Counts requests sent to the server (a pipeline or script call is one)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counting_client() -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(REDIS_URL, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    client.ping()
    yield client
    client.close()


class Ok(DedupConcurrentListener):
    def do_handle_msg(self, msg: Any) -> bool:
        return True


def round_trips(client: redis.Redis, fn: Any) -> int:
    before = CountingConnection.sent
    fn()
    return CountingConnection.sent - before


def test_round_trips_per_message(counting_client: redis.Redis, app_name: str) -> None:
    """Case 6: a fresh message costs 2 round trips, a duplicate 1, a failure 2."""
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, counting_client))
    listener(ClassicMessage("warm-up"))  # opens the store's connection, loads the scripts
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m1"))) == 2
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m1"))) == 1

    class Failing(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return False

    failing = Failing(DedupConfig.enable_dedup_consume_config(app_name, counting_client))
    failing(ClassicMessage("warm-up-2"))  # opens the store's own connection
    assert round_trips(counting_client, lambda: failing(ClassicMessage("m2"))) == 2


def test_batch_round_trips(counting_client: redis.Redis, app_name: str) -> None:
    """A batch of 32 fresh messages costs 2 round trips; 32 duplicates cost 1."""
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, counting_client))
    listener(ClassicMessage("warm-up"))
    batch = [ClassicMessage(f"b{i}") for i in range(32)]
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 2
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 1


def test_record_keys_are_readable_and_escaped(redis_client: redis.Redis) -> None:
    """Keys read MSGDEDUP:app:topic:tag:key, with ':', '%' and braces escaped."""
    store = RedisDedupStore(redis_client)
    assert store.record_key(DedupElement("app", "T", "TagA", "k1")) == b"MSGDEDUP:app:T:TagA:k1"
    assert store.record_key(DedupElement("app", "T", "", "A:B")) == b"MSGDEDUP:app:T::A%3AB"
    assert store.record_key(DedupElement("a{p}", "T", "", "%")) == b"MSGDEDUP:a%7Bp%7D:T::%25"


def test_decode_responses_client_works(app_name: str) -> None:
    """A client created with decode_responses=True dedups the same way."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, client))
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    store = listener.dedup_config.persist  # type: ignore[union-attr]
    assert store is not None
    assert store.claim(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"), "o", 1000).status
    client.close()


def test_records_carry_ttls(redis_client: redis.Redis, app_name: str) -> None:
    """CONSUMING records expire after the lease, CONSUMED ones after the retention."""
    store = RedisDedupStore(redis_client)
    e = DedupElement(app_name, "T", "", "k")
    store.claim(e, "o", 5000)
    assert 0 < redis_client.pttl(store.record_key(e)) <= 5000
    store.mark_consumed(e, "o", 600_000)
    assert 5000 < redis_client.pttl(store.record_key(e)) <= 600_000
    assert redis_client.get(store.record_key(e)) == b"CONSUMED:o"


@pytest.mark.parametrize("set_nx_get", [True, False], ids=["set-nx-get", "lua-script"])
def test_both_claim_paths_agree(redis_client: redis.Redis, app_name: str, set_nx_get: bool) -> None:
    """SET NX GET (Redis >= 7) and the Lua claim script (older servers) give the same answers,
    and repeating one's own claim (a retried call) still reports it as ours."""
    store = RedisDedupStore(redis_client, coalesce=False)
    store._set_nx_get = set_nx_get
    e = DedupElement(app_name, "T", "", "k")
    assert store.claim(e, "o1", 60_000).claimed
    assert store.claim(e, "o1", 60_000).claimed  # idempotent for the same owner
    assert store.claim(e, "o2", 60_000) == (False, DedupStatus.CONSUMING)
    store.mark_consumed(e, "o1", 60_000)
    assert store.claim(e, "o2", 60_000) == (False, DedupStatus.CONSUMED)
