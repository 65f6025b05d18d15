"""Coalescing of concurrent threads' store requests (the Redis store's thread scaling)."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
import redis

from rocketmq_dedup import DedupElement, DedupStatus, StoreError
from rocketmq_dedup.stores.coalesce import Coalescer, Request
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.support import wait_for


def make_request(n: int = 1) -> Request:
    return Request("claim", 1000, [b"k%d" % i for i in range(n)], ["v"] * n)


def test_lone_request_runs_at_once_in_its_own_batch() -> None:
    """A request that arrives alone is executed immediately, by its own thread, alone."""
    batches: List[List[Request]] = []

    def execute(batch: List[Request]) -> None:
        batches.append(batch)
        for r in batch:
            r.result = threading.get_ident()

    coalescer = Coalescer(execute)
    request = coalescer.run(make_request())
    assert request.result == threading.get_ident()
    assert [len(b) for b in batches] == [1]


def test_requests_arriving_during_a_round_trip_share_the_next_one() -> None:
    """While one batch is in flight, later requests queue and then run as one batch."""
    in_flight, release = threading.Event(), threading.Event()
    batches: List[int] = []

    def execute(batch: List[Request]) -> None:
        batches.append(len(batch))
        if len(batches) == 1:
            in_flight.set()
            assert release.wait(10)
        for r in batch:
            r.result = "done"

    coalescer = Coalescer(execute)
    first = threading.Thread(target=coalescer.run, args=(make_request(),))
    first.start()
    assert in_flight.wait(10)
    results: List[Any] = []
    waiters = [
        threading.Thread(target=lambda: results.append(coalescer.run(make_request()).result))
        for _ in range(5)
    ]
    for t in waiters:
        t.start()
    wait_for(lambda: len(coalescer._pending) == 5)
    release.set()
    for t in [first, *waiters]:
        t.join(10)
    assert batches == [1, 5]
    assert results == ["done"] * 5


def test_errors_reach_every_request_of_the_batch(redis_client: redis.Redis) -> None:
    """When a combined round trip fails, every caller gets a StoreError."""
    store = RedisDedupStore(redis.Redis(port=1, retry=None, socket_connect_timeout=0.2))
    with pytest.raises(StoreError):
        store.claim(DedupElement("a", "t", "", "k"), "o", 1000)


def test_mixed_batch_after_script_flush(redis_client: redis.Redis, app_name: str) -> None:
    """A combined batch of claims, marks and releases runs in one pipeline and survives the
    server forgetting its scripts (SCRIPT FLUSH): scripts are reloaded and the batch rerun."""
    store = RedisDedupStore(redis_client)
    a, b, c = (DedupElement(app_name, "t", "", k) for k in "abc")
    store.claim(b, "ob", 60_000)
    store.claim(c, "oc", 60_000)
    redis_client.script_flush()
    key = store.record_key
    batch = [
        Request("claim", 60_000, [key(a)], ["CONSUMING:oa"]),
        Request("mark", 60_000, [key(b)], ["CONSUMED:ob"]),
        Request("release", 0, [key(c)], ["CONSUMING:oc"]),
        Request("claim", 60_000, [key(a)], ["CONSUMING:other"]),
    ]
    store._execute(batch)
    assert [r.error for r in batch] == [None] * 4
    assert batch[0].result == [1]
    assert batch[3].result == [b"CONSUMING:oa"]
    assert [store.get_status(e) for e in (a, b, c)] == [
        DedupStatus.CONSUMING,
        DedupStatus.CONSUMED,
        None,
    ]


def test_coalescing_can_be_disabled(redis_client: redis.Redis) -> None:
    """coalesce=False sends every request itself."""
    assert RedisDedupStore(redis_client, coalesce=False)._coalescer is None


def test_concurrent_threads_share_round_trips(redis_client: redis.Redis, app_name: str) -> None:
    """8 threads x 200 fresh messages through one listener: every message handled once, no
    store error, and fewer round trips than messages x 2."""
    import logging

    from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
    from tests.support import ClassicMessage

    class Ok(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return True

    store = RedisDedupStore(redis_client)
    batches: List[int] = []
    execute = store._execute

    def counting(batch: List[Request]) -> None:
        batches.append(len(batch))
        execute(batch)

    store._coalescer = Coalescer(counting)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    errors: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("rocketmq_dedup").addHandler(handler)
    try:
        barrier = threading.Barrier(8)

        def work(t: int) -> None:
            barrier.wait(10)
            for i in range(200):
                assert listener(ClassicMessage(f"{t}-{i}")) is ConsumeStatus.CONSUME_SUCCESS

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        logging.getLogger("rocketmq_dedup").removeHandler(handler)
    assert [e for e in errors if "failed" in e or "could not" in e] == []
    assert sum(batches) == 8 * 200 * 2  # one claim and one mark per message
    assert len(batches) < 8 * 200 * 2  # some round trips were shared
    assert all(
        store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", f"{t}-{i}"))
        is DedupStatus.CONSUMED
        for t in range(8)
        for i in range(0, 200, 37)
    )
