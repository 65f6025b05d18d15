"""The Redis store on a client whose connection pool is bounded (issue 21, item 1).

The store takes its connection from the client's own pool. It keeps one checked out for its
coalesced round trips and never holds a second one on the hot path (a lost script is loaded
again on that connection), so the smallest pool it accepts is two: one for it, one for the
client's other users (its own PING, GET and operator commands among them). A smaller pool is
refused at construction. A pool that is merely exhausted (every connection in use by the
application) is not an outage: the batch is answered RECONSUME_LATER, never run without dedup.
"""

from __future__ import annotations

import collections
import uuid
from typing import Any, Iterator, List

import pytest
import redis

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig, DedupElement
from rocketmq_dedup.errors import DedupConfigError, StorePoolExhaustedError, StoreUnavailableError
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.redis import RedisDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.support import REDIS_URL

SUCCESS, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER


class Counting(DedupConcurrentListener):
    """Counts how often each message's handler ran."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs: collections.Counter[str] = collections.Counter()

    def do_handle_msg(self, msg: Any) -> bool:
        self.runs[msg.id] += 1
        return True


def blocking_client(max_connections: int, timeout: float = 0.5) -> redis.Redis:
    """A client on a ``BlockingConnectionPool`` (a caller waits ``timeout`` s for a free
    connection, then gets ``ConnectionError("No connection available.")``)."""
    pool = redis.BlockingConnectionPool.from_url(
        REDIS_URL, max_connections=max_connections, timeout=timeout
    )
    return redis.Redis(connection_pool=pool)


def plain_client(max_connections: int) -> redis.Redis:
    """A client on a plain ``ConnectionPool`` with a bound (past it: ``MaxConnectionsError``,
    ``ConnectionError("Too many connections")`` before redis-py 5)."""
    return redis.Redis.from_url(REDIS_URL, max_connections=max_connections)


@pytest.fixture
def clients() -> Iterator[List[redis.Redis]]:
    """Clients a test made; closed after it."""
    made: List[redis.Redis] = []
    yield made
    for client in made:
        client.close()


def checked_out(client: redis.Redis, count: int) -> List[Any]:
    """Take ``count`` connections out of the client's pool, as the application's own
    long calls (a blocking XREAD, a pipeline in progress) hold them."""
    pool = client.connection_pool
    return [pool.get_connection() for _ in range(count)]


def give_back(client: redis.Redis, conns: List[Any]) -> None:
    for conn in conns:
        client.connection_pool.release(conn)


def run_the_issue_sequence(listener: Counting, run: str) -> List[Any]:
    """One message, then a batch of 12 through consume_message, then the same 12 through
    consume_each (the issue's reproduction); returns what each call answered."""
    batch = [ClassicMessage(f"{run}-{i}") for i in range(12)]
    return [
        listener(ClassicMessage(f"{run}-single")),
        listener.consume_message(batch),
        listener.consume_each(batch),
    ]


@pytest.mark.parametrize("make", [blocking_client, plain_client], ids=["blocking", "plain"])
def test_a_pool_smaller_than_the_store_needs_is_refused(
    make: Any, app_name: str, clients: List[redis.Redis]
) -> None:
    """A pool of one connection, which the store's kept connection would take from the
    application for good (and, before this was checked, its script reload found none free:
    an "outage" that ran the batch without dedup), is refused with the size needed. Without
    coalescing the store keeps no connection, and one is enough."""
    client = make(1)
    clients.append(client)
    with pytest.raises(DedupConfigError, match=r"max_connections=1\b.*at least 2"):
        RedisDedupStore(client)
    with pytest.raises(DedupConfigError, match=r"max_connections=1\b.*at least 2"):
        DedupConfig.enable_dedup_consume_config(app_name, client)
    store = RedisDedupStore(client, coalesce=False)
    listener = Counting(DedupConfig.enable_dedup_consume_config(app_name, store))
    run_the_issue_sequence(listener, uuid.uuid4().hex[:8])
    assert set(listener.runs.values()) == {1} and len(listener.runs) == 13


def test_smallest_pool_with_the_application_holding_a_connection_applies_once(
    redis_client: redis.Redis, app_name: str, clients: List[redis.Redis]
) -> None:
    """The issue's sequence on the smallest pool accepted (2), with the application holding
    the other connection throughout and the server's scripts flushed (a fresh or restarted
    Redis): the store reloads its scripts on its own connection, so nothing waits for a
    second one, and every handler runs exactly once (it ran twice when the reload went
    through the client's pool: "No connection available" counted as an outage)."""
    client = blocking_client(2)
    clients.append(client)
    listener = Counting(DedupConfig.enable_dedup_consume_config(app_name, client))
    held = checked_out(client, 1)
    try:
        redis_client.script_flush()
        answers = run_the_issue_sequence(listener, uuid.uuid4().hex[:8])
    finally:
        give_back(client, held)
    assert answers[0] is SUCCESS
    assert answers[1].status is SUCCESS and answers[1].ack_index == 11
    assert answers[2] == [SUCCESS] * 12  # the duplicates, acked without their handlers
    double = {key: n for key, n in listener.runs.items() if n > 1}
    assert double == {}
    assert len(listener.runs) == 13


@pytest.mark.parametrize("make", [blocking_client, plain_client], ids=["blocking", "plain"])
def test_an_exhausted_pool_is_not_an_outage(
    make: Any, app_name: str, clients: List[redis.Redis]
) -> None:
    """Every connection of the pool held by the application: the batch is answered
    RECONSUME_LATER with no handler run (store_failure_policy="consume" runs handlers without
    dedup in a real outage only), and once connections are free again each message runs once
    and its duplicates are acked."""
    client = make(2)
    clients.append(client)
    # no start-up check: its probe would leave the store holding its connection already
    config = DedupConfig.enable_dedup_consume_config(app_name, client, check_store=False)
    listener = Counting(config)
    assert listener.dedup_config is not None
    assert listener.dedup_config.store_failure_policy.value == "consume"
    run = uuid.uuid4().hex[:8]
    batch = [ClassicMessage(f"{run}-{i}") for i in range(12)]
    held = checked_out(client, 2)
    try:
        assert listener(ClassicMessage(f"{run}-single")) is LATER
        assert listener.consume_message(batch).status is LATER
        assert listener.consume_each(batch) == [LATER] * 12
        assert sum(listener.runs.values()) == 0
    finally:
        give_back(client, held)
    answers = run_the_issue_sequence(listener, run)
    assert answers[1].status is SUCCESS and answers[2] == [SUCCESS] * 12
    assert set(listener.runs.values()) == {1} and len(listener.runs) == 13


@pytest.mark.parametrize("make", [blocking_client, plain_client], ids=["blocking", "plain"])
@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "direct"])
def test_exhaustion_is_a_store_error_naming_the_pool(
    make: Any, coalesce: bool, app_name: str, clients: List[redis.Redis]
) -> None:
    """The store raises StorePoolExhaustedError (a StoreError, not StoreUnavailableError),
    naming the pool's size, the original chained; on both send paths."""
    client = make(2)
    clients.append(client)
    store = RedisDedupStore(client, coalesce=coalesce)
    held = checked_out(client, 2)
    try:
        with pytest.raises(StorePoolExhaustedError, match="max_connections=2") as caught:
            store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000)
        assert not isinstance(caught.value, StoreUnavailableError)
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        assert not store.is_outage(caught.value.__cause__)
        with pytest.raises(StorePoolExhaustedError):
            store.check()  # PING through the client: the same answer
    finally:
        give_back(client, held)
    assert store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000).claimed
    store.close()


def test_cluster_pool_exhaustion_is_not_an_outage(app_name: str) -> None:
    """A cluster client's per-node pools (``max_connections``) exhausted: the same
    StorePoolExhaustedError, never an outage."""
    from tests.support import REDIS_CLUSTER_URL

    client = redis.RedisCluster.from_url(REDIS_CLUSTER_URL, max_connections=1)
    try:
        store = RedisDedupStore(client)  # keeps no connection: a pool of one is enough
        element = DedupElement(app_name, "T", "", "k")
        node = client.get_node_from_key(store.record_key(element))
        pool = node.redis_connection.connection_pool
        held = pool.get_connection()
        try:
            with pytest.raises(StorePoolExhaustedError):
                store.claim(Claim(element, "o"), 60_000)
        finally:
            pool.release(held)
        assert store.claim(Claim(element, "o"), 60_000).claimed
    finally:
        client.close()
