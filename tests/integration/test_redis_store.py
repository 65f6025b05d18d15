"""Redis specifics: round trips, readable collision-free keys, client options."""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid
import weakref
from typing import Any, Iterator, List

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupConfigError,
    DedupElement,
    DedupStatus,
)
from rocketmq_dedup.errors import StoreError, StoreUnavailableError
from rocketmq_dedup.message import to_text
from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.coalesce import Request
from rocketmq_dedup.stores.redis import RedisDedupStore, transport
from rocketmq_dedup.testing import ClassicMessage
from tests.support import REDIS_URL, claims, mysql_connect, outcome, wait_for


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


class Recording(DedupConcurrentListener):
    """Succeeds, remembering the id of every message it handled."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.handled: List[str] = []

    def do_handle_msg(self, msg: Any) -> bool:
        self.handled.append(msg.id)
        return True


def round_trips(client: redis.Redis, fn: Any) -> int:
    before = CountingConnection.sent
    fn()
    return CountingConnection.sent - before


def test_round_trips_per_message(counting_client: redis.Redis, app_name: str) -> None:
    """Case 6, marks written at once (defer_marks_ms=0): a fresh message costs 2 round trips,
    a duplicate 1, a failure 2."""
    store = RedisDedupStore(counting_client, defer_marks_ms=0)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    listener(ClassicMessage("warm-up"))  # opens the store's connection, loads the scripts
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m1"))) == 2
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m1"))) == 1

    class Failing(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return False

    store = RedisDedupStore(counting_client, defer_marks_ms=0)
    failing = Failing(DedupConfig.enable_dedup_consume_config(app_name, store))
    failing(ClassicMessage("warm-up-2"))  # opens the store's own connection
    assert round_trips(counting_client, lambda: failing(ClassicMessage("m2"))) == 2


def test_deferred_mark_rides_the_next_round_trip(
    counting_client: redis.Redis, app_name: str
) -> None:
    """With deferred marks (the default) a fresh message costs one round trip of its own: its
    CONSUMED mark goes with the next message's claim, ahead of it (so a copy claimed in that
    round trip is a duplicate of a CONSUMED record), or with close()."""
    store = RedisDedupStore(counting_client, defer_marks_ms=500)
    listener = Recording(DedupConfig.enable_dedup_consume_config(app_name, store))
    listener(ClassicMessage("warm-up"))  # opens the store's connection
    assert store.coalescer is not None
    store.coalescer.flush()
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m1"))) == 1
    assert store.coalescer.deferred == 1
    copy = ClassicMessage("m1")
    assert round_trips(counting_client, lambda: listener(copy)) == 1
    assert listener.handled == ["warm-up", "m1"]  # the copy was a duplicate, acked
    assert store.coalescer.deferred == 0
    assert round_trips(counting_client, lambda: listener(ClassicMessage("m2"))) == 1
    assert round_trips(counting_client, store.close) == 1
    assert store.coalescer.deferred == 0


def test_deferred_mark_is_sent_within_its_bound(
    counting_client: redis.Redis, app_name: str
) -> None:
    """A deferred mark that no round trip carries is sent by the flusher within
    defer_marks_ms (here 50 ms), not later: the record reads CONSUMED straight from Redis."""
    store = RedisDedupStore(counting_client, defer_marks_ms=50)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    key = store.record_key(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"))
    began = time.monotonic()
    listener(ClassicMessage("m1"))
    wait_for(lambda: (counting_client.get(key) or b"").startswith(b"CONSUMED:"), timeout=2)
    assert time.monotonic() - began < 0.05 + 0.5  # the bound, and the scheduler's slack


def test_a_copy_elsewhere_is_consumed_later_until_the_deferred_mark_lands(
    redis_client: redis.Redis, app_name: str
) -> None:
    """The safety of a deferred mark: until it lands, the record is still the handled copy's
    live CONSUMING claim, so a copy delivered to another consumer is answered RECONSUME_LATER
    (its handler not run, nothing acked for it); once the mark lands, a copy is a duplicate of
    a CONSUMED record and is acked without its handler."""
    first = Recording(
        DedupConfig.enable_dedup_consume_config(
            app_name, RedisDedupStore(redis_client, defer_marks_ms=500)
        )
    )
    other = Recording(DedupConfig.enable_dedup_consume_config(app_name, redis_client))
    assert first(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert other(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
    first.close()  # sends the deferred mark
    assert other(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    assert first.handled == ["m1"] and other.handled == []


def test_marks_are_written_at_once_while_a_lease_is_under_100_times_the_deferral(
    redis_client: redis.Redis, app_name: str
) -> None:
    """A mark is deferred only while every lease the store claimed with is at least 100 times
    defer_marks_ms: with a 1 s lease and 50 ms, each mark is written before the listener
    returns."""
    store = RedisDedupStore(redis_client, defer_marks_ms=50)
    listener = Ok(
        DedupConfig.enable_dedup_consume_config(
            app_name, store, dedup_processing_expire_milli_seconds=1000
        )
    )
    listener(ClassicMessage("m1"))
    key = store.record_key(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"))
    assert (redis_client.get(key) or b"").startswith(b"CONSUMED:")
    assert store.coalescer is not None and store.coalescer.deferred == 0


def test_a_deferred_mark_that_cannot_be_written_is_logged(
    redis_client: redis.Redis,
    app_name: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deferred mark whose round trips keep failing (Redis gone) is given up after
    DEFERRED_ATTEMPTS round trips once DEFERRED_KEEP_S has passed (0 here) and logged as an
    ERROR naming the store; the message was acked."""
    monkeypatch.setattr(coalesce, "DEFERRED_KEEP_S", 0.0)
    store = RedisDedupStore(redis_client, defer_marks_ms=500)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS

    def gone(commands: Any) -> Any:
        raise redis.ConnectionError("Redis gone")

    store._send = gone  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        for _ in range(3):
            store.close()
    assert store.coalescer is not None and store.coalescer.deferred == 0
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(messages) == 1
    assert "could not mark 1 handled message(s) CONSUMED" in messages[0]
    assert store.describe() in messages[0]


def test_batch_round_trips(counting_client: redis.Redis, app_name: str) -> None:
    """Marks written at once: a batch of 32 fresh messages costs 2 round trips; 32 duplicates
    cost 1. Deferred (the default): the fresh batch costs 1, its marks ride the next one."""
    store = RedisDedupStore(counting_client, defer_marks_ms=0)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    listener(ClassicMessage("warm-up"))
    batch = [ClassicMessage(f"b{i}") for i in range(32)]
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 2
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 1
    store = RedisDedupStore(counting_client, defer_marks_ms=500)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    listener(ClassicMessage("warm-up"))
    batch = [ClassicMessage(f"c{i}") for i in range(32)]
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 1
    assert round_trips(counting_client, lambda: listener.consume_message(batch)) == 1
    assert listener.consume_message(batch).consumed == 32  # every copy a CONSUMED duplicate


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
    assert store.claim(Claim(DedupElement(app_name, "TEST-TOPIC", "TagA", "m1"), "o"), 1000).status
    client.close()


def test_records_carry_ttls(redis_client: redis.Redis, app_name: str) -> None:
    """CONSUMING records expire after the lease, CONSUMED ones after the retention."""
    store = RedisDedupStore(redis_client)
    e = DedupElement(app_name, "T", "", "k")
    store.claim(Claim(e, "o"), 5000)
    assert 0 < redis_client.pttl(store.record_key(e)) <= 5000
    store.mark_consumed(Claim(e, "o"), 600_000)
    store.close()  # sends the deferred mark
    assert 5000 < redis_client.pttl(store.record_key(e)) <= 600_000
    assert redis_client.get(store.record_key(e)) == b"CONSUMED:o"


@pytest.mark.parametrize("set_nx_get", [True, False], ids=["set-nx-get", "lua-script"])
def test_both_claim_paths_agree(redis_client: redis.Redis, app_name: str, set_nx_get: bool) -> None:
    """SET NX GET (Redis >= 7) and the Lua claim script (older servers) give the same answers,
    and repeating one's own claim (a retried call) still reports it as ours."""
    store = RedisDedupStore(redis_client, coalesce=False)
    store._set_nx_get = set_nx_get
    e = DedupElement(app_name, "T", "", "k")
    assert store.claim(Claim(e, "o1"), 60_000).claimed
    assert store.claim(Claim(e, "o1"), 60_000).claimed  # idempotent for the same owner
    assert outcome(store.claim(Claim(e, "o2"), 60_000)) == (False, DedupStatus.CONSUMING)
    store.mark_consumed(Claim(e, "o1"), 60_000)
    assert outcome(store.claim(Claim(e, "o2"), 60_000)) == (False, DedupStatus.CONSUMED)


# -- errors: wrapped once; an outage is not a defect ------------------------------------------


def closed_port_client() -> redis.Redis:
    """A client of a port nothing listens on (1), failing fast."""
    return redis.Redis(
        host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.2
    )


@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "direct"])
def test_unreachable_server_is_an_outage(coalesce: bool) -> None:
    """A refused connection raises StoreUnavailableError, wrapped once, naming the address."""
    store = RedisDedupStore(closed_port_client(), coalesce=coalesce)
    with pytest.raises(StoreUnavailableError) as caught:
        store.claim(Claim(DedupElement("a", "t", "", "k"), "o"), 1000)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    assert str(caught.value).startswith("Redis 127.0.0.1:1/0: ConnectionError")


def test_bug_inside_the_store_is_not_an_outage(
    redis_client: redis.Redis, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TypeError raised inside the store is a plain StoreError (not an outage), wrapped once,
    and the store works again once the defect is gone."""
    store = RedisDedupStore(redis_client)
    e = DedupElement(app_name, "t", "", "k")

    def broken(commands: Any) -> bytes:
        raise TypeError("packer bug")

    monkeypatch.setattr(transport, "pack_commands", broken)
    with pytest.raises(StoreError) as caught:
        store.claim(Claim(e, "o"), 60_000)
    assert not isinstance(caught.value, StoreUnavailableError)
    assert type(caught.value.__cause__) is TypeError
    assert str(caught.value) == "Redis 127.0.0.1:16379/0: TypeError: packer bug"
    monkeypatch.undo()
    assert store.claim(Claim(e, "o"), 60_000).claimed


def test_every_request_of_a_failed_round_gets_the_original_error(
    redis_client: redis.Redis, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed combined round trip hands its error, unwrapped, to every request in it."""
    store = RedisDedupStore(redis_client)
    error = TypeError("packer bug")

    def broken(commands: Any) -> bytes:
        raise error

    monkeypatch.setattr(transport, "pack_commands", broken)
    key = store.record_key(DedupElement(app_name, "t", "", "k"))
    batch = [Request("claim", 1000, [key], ["CONSUMING:a"]), Request("mark", 1000, [key], ["x"])]
    store._execute(batch)
    assert [r.error for r in batch] == [error, error]


def test_error_reply_is_an_outage(redis_client: redis.Redis, app_name: str) -> None:
    """A server error reply (here WRONGTYPE) is an outage: the server could not write."""
    store = RedisDedupStore(redis_client)
    e = DedupElement(app_name, "t", "", "a-list")
    redis_client.rpush(store.record_key(e), "not a record")
    with pytest.raises(StoreUnavailableError) as caught:
        store.claim(Claim(e, "o"), 60_000)
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_outage_classification(redis_client: redis.Redis) -> None:
    """Connection, timeout, error replies and socket errors are outages; DataError and
    programming errors are not."""
    store = RedisDedupStore(redis_client)
    outages: List[Exception] = [redis.ConnectionError(), redis.TimeoutError()]
    outages += [redis.ResponseError("OOM")]
    outages += [redis.exceptions.NoScriptError(), OSError(104, "reset")]
    defects = [redis.DataError("bad arg"), TypeError(), UnicodeEncodeError("utf-8", "", 0, 1, "")]
    assert [store.is_outage(e) for e in outages] == [True] * 5
    assert [store.is_outage(e) for e in defects] == [False] * 3


# -- keys with any code point ---------------------------------------------------------------

ODD_KEYS = {
    "lone-high-surrogate": "order-\ud83d",
    "lone-low-surrogate": "\udcff",
    "bytes-derived": to_text(b"order-\xff\xfe\x80"),
    "emoji": "order-\U0001f600",
    "cjk": "\u8a02\u55ae-\u4e2d\u6587",
}


@pytest.fixture(params=["coalesced", "direct", "cluster"])
def any_store(request: pytest.FixtureRequest) -> RedisDedupStore:
    """The three ways the Redis store sends commands."""
    if request.param == "cluster":
        return RedisDedupStore(request.getfixturevalue("redis_cluster_client"))
    client = request.getfixturevalue("redis_client")
    return RedisDedupStore(client, coalesce=request.param == "coalesced")


@pytest.mark.parametrize("key", list(ODD_KEYS.values()), ids=list(ODD_KEYS))
def test_keys_with_any_code_point(any_store: RedisDedupStore, app_name: str, key: str) -> None:
    """Claim, status, mark and release work on keys with lone surrogates, bytes-derived text,
    emoji and CJK."""
    e = DedupElement(app_name, "T", "", key)
    assert any_store.claim(Claim(e, "o1"), 60_000).claimed
    assert any_store.get_status(e) is DedupStatus.CONSUMING
    assert outcome(any_store.claim(Claim(e, "o2"), 60_000)) == (False, DedupStatus.CONSUMING)
    assert any_store.renew_many(claims([e], ["o1"]), 60_000) == [True]
    assert any_store.release(Claim(e, "o1")) is True
    assert any_store.get_status(e) is None
    assert any_store.claim(Claim(e, "o1"), 60_000).claimed
    any_store.mark_consumed(Claim(e, "o1"), 60_000)
    assert any_store.get_status(e) is DedupStatus.CONSUMED


def test_str_key_and_bytes_derived_key_share_a_record(
    redis_client: redis.Redis, app_name: str
) -> None:
    """A key given as text and the same key decoded from the message's bytes are one record,
    stored under the key's UTF-8 bytes."""
    store = RedisDedupStore(redis_client)
    for text, raw in [("\u8a02\u55ae-1", "\u8a02\u55ae-1".encode()), ("k-\udcff", b"k-\xff")]:
        as_text = DedupElement(app_name, "T", "", text)
        from_bytes = DedupElement(app_name, "T", "", to_text(raw))
        assert store.claim(Claim(as_text, "o1"), 60_000).claimed
        assert outcome(store.claim(Claim(from_bytes, "o2"), 60_000)) == (
            False,
            DedupStatus.CONSUMING,
        )
        assert redis_client.get(f"MSGDEDUP:{app_name}:T::".encode() + raw) == b"CONSUMING:o1"


# -- check and describe ---------------------------------------------------------------------


def test_check_pings_the_server(redis_client: redis.Redis) -> None:
    """check() passes against a live server and raises StoreUnavailableError without one."""
    RedisDedupStore(redis_client).check()
    with pytest.raises(StoreUnavailableError):
        RedisDedupStore(closed_port_client()).check()


def test_check_pings_the_cluster(redis_cluster_client: Any) -> None:
    """check() on a cluster pings it; describe() names its nodes."""
    store = RedisDedupStore(redis_cluster_client)
    store.check()
    assert store.describe().startswith("Redis Cluster 127.0.0.1:1700")


def test_describe_names_the_address_never_the_password() -> None:
    """describe() gives host:port/db or the unix socket path, without credentials."""
    tcp = redis.Redis(host="127.0.0.1", port=16379, db=3, username="u", password="s3cret")
    assert RedisDedupStore(tcp).describe() == "Redis 127.0.0.1:16379/3"
    unix = redis.Redis(unix_socket_path="/run/redis.sock", password="s3cret")
    assert RedisDedupStore(unix).describe() == "Redis unix:/run/redis.sock/0"
    url = redis.Redis.from_url("redis://:s3cret@127.0.0.1:16379/2")
    assert "s3cret" not in RedisDedupStore(url).describe()


# -- lifecycle --------------------------------------------------------------------------------


def named_connections(redis_client: redis.Redis, name: str) -> int:
    """Connections the server has open for clients named ``name``."""
    return sum(1 for c in redis_client.client_list() if c.get("name") == name)


def test_dropped_stores_leave_no_connection_and_no_thread(
    redis_client: redis.Redis, app_name: str
) -> None:
    """60 stores created, used and dropped without close(): no connection left open, none
    left checked out of the pool, no thread, no store kept alive."""
    name = f"lifecycle-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL, client_name=name)
    threads = set(threading.enumerate())  # earlier tests' threads may end meanwhile
    refs: List[Any] = []
    for i in range(60):
        store = RedisDedupStore(client)
        assert store.claim(Claim(DedupElement(app_name, "T", "", str(i)), "o"), 60_000).claimed
        refs.append(weakref.ref(store))
        del store
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert named_connections(redis_client, name) == 0
    assert set(threading.enumerate()) - threads == set()
    RedisDedupStore(client).close()  # gives the dropped stores' connections back to the pool
    assert len(client.connection_pool._in_use_connections) == 0
    client.close()


def test_closed_store_gives_its_connection_back(redis_client: redis.Redis, app_name: str) -> None:
    """close() returns the store's connection to the client's pool, disconnected; the store
    takes one again when used after close()."""
    name = f"close-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL, client_name=name)
    store = RedisDedupStore(client)
    assert store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000).claimed
    assert named_connections(redis_client, name) == 1
    store.close()
    assert named_connections(redis_client, name) == 0
    assert len(client.connection_pool._in_use_connections) == 0
    assert store.claim(Claim(DedupElement(app_name, "T", "", "k2"), "o"), 60_000).claimed
    store.close()
    client.close()


def test_key_head_cache_is_bounded_in_bytes(redis_client: redis.Redis) -> None:
    """Long key heads are never cached, and the cache holds a bounded number of heads."""
    store = RedisDedupStore(redis_client)
    long_topic = "T" * 4096
    key = store.record_key(DedupElement("app", long_topic, "", "k"))
    assert key == b"MSGDEDUP:app:" + long_topic.encode() + b"::k"
    assert store._keys._heads == {}
    for i in range(2000):
        store.record_key(DedupElement("app", f"topic-{i}", "", "k"))
    assert 0 < len(store._keys._heads) <= 256
    assert sum(map(len, store._keys._heads.values())) <= 256 * 1024


# -- operator operations (the CLI) ----------------------------------------------------------


def test_inspect_delete_and_stats(any_store: RedisDedupStore, app_name: str) -> None:
    """inspect shows a record with its owner and time left; delete removes a claim but keeps
    a CONSUMED record unless forced; stats counts the application's records by status."""
    app = app_name + "*[x]:{y}"  # glob and escaped characters stay literal
    stuck, done = DedupElement(app, "T", "TagA", "k:1"), DedupElement(app, "T", "TagA", "k2")
    other = DedupElement(app_name + "x", "T", "TagA", "k3")  # another application
    assert any_store.claim(Claim(stuck, "owner-1"), 60_000).claimed
    any_store.mark_consumed(Claim(done, "owner-2"), 600_000)
    any_store.mark_consumed(Claim(other, "owner-3"), 600_000)
    info = any_store.read(stuck)
    assert info is not None
    assert (info.element, info.status, info.owner) == (stuck, DedupStatus.CONSUMING, "owner-1")
    assert info.expires_in_ms is not None and 0 < info.expires_in_ms <= 60_000
    stats = any_store.stats(app)
    assert stats.counts == {"CONSUMING": 1, "CONSUMED": 1}
    assert [r.element for r in stats.oldest_claims] == [stuck]
    assert any_store.delete(done) is None
    assert any_store.get_status(done) is DedupStatus.CONSUMED
    assert any_store.delete(stuck) is DedupStatus.CONSUMING
    assert any_store.delete(done, force=True) is DedupStatus.CONSUMED
    assert any_store.read(stuck) is None and any_store.read(done) is None
    assert any_store.stats(app).counts == {}


@pytest.mark.parametrize("bad", [-1, 1001, 2.5, True, "10"])
def test_defer_marks_ms_is_a_store_option_checked_at_construction(
    redis_client: redis.Redis, app_name: str, bad: Any
) -> None:
    """defer_marks_ms goes from DedupConfig to either store (0 turns deferral off); anything
    but an int from 0 to 1000 is a DedupConfigError."""
    config = DedupConfig.enable_dedup_consume_config(app_name, redis_client, defer_marks_ms=0)
    assert isinstance(config.persist, RedisDedupStore) and config.persist.defer_marks_ms == 0
    with pytest.raises(DedupConfigError, match="defer_marks_ms"):
        DedupConfig.enable_dedup_consume_config(app_name, redis_client, defer_marks_ms=bad)
    with pytest.raises(DedupConfigError, match="defer_marks_ms"):
        DedupConfig.enable_dedup_consume_config(app_name, mysql_connect(), defer_marks_ms=bad)
