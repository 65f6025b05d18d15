"""Coalescing of concurrent threads' store requests (the Redis store's thread scaling)."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Set

import pytest
import redis

from rocketmq_dedup import DedupElement, DedupStatus, StoreError
from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.coalesce import Coalescer, Request
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.support import wait_for

WAKERS = [coalesce._LockWaker]
if hasattr(os, "eventfd"):
    WAKERS.insert(0, coalesce._EventFdWaker)


@pytest.fixture(params=WAKERS, ids=lambda w: w.__name__.strip("_"), autouse=True)
def waker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test runs with each way of waking a waiting thread (threads here are new, so
    none holds a waker of the other kind)."""
    monkeypatch.setattr(coalesce, "_new_waker", request.param)
    return request.param


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_default_waker_is_an_eventfd_only_on_one_cpu() -> None:
    """A thread confined to one CPU waits on an eventfd (GIL released on wake); a thread free
    to run on several waits on a lock."""
    kinds: List[str] = []
    cpus = sorted(os.sched_getaffinity(0))

    def probe(allowed: Set[int]) -> None:
        os.sched_setaffinity(0, allowed)  # this thread only
        kinds.append(type(coalesce._default_waker()).__name__)

    for allowed in ({cpus[0]}, set(cpus)):
        thread = threading.Thread(target=probe, args=(allowed,))
        thread.start()
        thread.join(10)
    several = "_EventFdWaker" if len(cpus) == 1 else "_LockWaker"
    assert kinds == ["_EventFdWaker", several]


def make_request(n: int = 1) -> Request:
    return Request("claim", 1000, [b"k%d" % i for i in range(n)], ["v"] * n)


class Blocker:
    """An ``execute`` whose first batch waits until ``release`` is set; every request of
    every batch gets the result "done"."""

    def __init__(self) -> None:
        self.in_flight, self.release = threading.Event(), threading.Event()
        self.batches: List[int] = []

    def __call__(self, batch: List[Request]) -> None:
        self.batches.append(len(batch))
        if len(self.batches) == 1:
            self.in_flight.set()
            assert self.release.wait(10)
        for r in batch:
            r.result = "done"


def start_blocked_round(coalescer: Coalescer, execute: Blocker) -> threading.Thread:
    """A thread leading the first round trip, held in flight until ``execute.release``."""
    first = threading.Thread(target=coalescer.run, args=(make_request(),))
    first.start()
    assert execute.in_flight.wait(10)
    return first


def queue_callers(
    coalescer: Coalescer, target: Callable[[], Any], n: int
) -> List[threading.Thread]:
    """``n`` threads running ``target``, started and queued behind the round in flight."""
    callers = [threading.Thread(target=target) for _ in range(n)]
    for t in callers:
        t.start()
    wait_for(lambda: len(coalescer._pending) == n)
    return callers


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
    execute = Blocker()
    coalescer = Coalescer(execute)
    first = start_blocked_round(coalescer, execute)
    results: List[Any] = []
    waiters = queue_callers(
        coalescer, lambda: results.append(coalescer.run(make_request()).result), 5
    )
    execute.release.set()
    for t in [first, *waiters]:
        t.join(10)
    assert execute.batches == [1, 5]
    assert results == ["done"] * 5


class Interrupted(Exception):
    """Stands in for a KeyboardInterrupt raised while a caller waits."""


@pytest.mark.parametrize("after_wake", [False, True], ids=["while-queued", "when-promoted"])
def test_interrupted_waiter_is_withdrawn_and_never_stalls_the_others(
    waker: Any, after_wake: bool
) -> None:
    """A caller whose wait raises gets the exception, its unsent request is withdrawn, and
    the callers behind it are still served, even if it had just been promoted to lead."""

    class InterruptedWaker(waker):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def wait(self) -> None:
            if after_wake:
                super().wait()
            raise Interrupted

    execute = Blocker()
    coalescer = Coalescer(execute)
    first = start_blocked_round(coalescer, execute)
    outcome: List[Any] = []

    def interrupted_caller() -> None:
        coalesce._local.waker = InterruptedWaker()
        try:
            coalescer.run(make_request())
        except Interrupted:
            outcome.append("interrupted")
        outcome.append(getattr(coalesce._local, "waker", None))

    caller = threading.Thread(target=interrupted_caller)
    caller.start()
    if after_wake:  # queued first: it is the one promoted to lead the next round
        wait_for(lambda: len(coalescer._pending) == 1)
    else:
        caller.join(10)
        assert coalescer._pending == []
    results: List[Any] = []
    behind = threading.Thread(target=lambda: results.append(coalescer.run(make_request()).result))
    behind.start()
    wait_for(lambda: len(coalescer._pending) == (2 if after_wake else 1))
    execute.release.set()
    for t in (first, caller, behind):
        t.join(10)
    assert outcome == ["interrupted", None]  # and that thread drops its waker
    assert results == ["done"]
    assert execute.batches == [1, 1]  # the withdrawn request was never executed
    assert coalescer.run(make_request()).result == "done"  # and the coalescer is idle again


def test_interrupted_round_trip_fails_every_request_of_the_batch() -> None:
    """If the leader's round trip is interrupted (execute raises a BaseException), the waiters
    of that batch get the error, never a silent success, and the coalescer is idle again."""
    execute = Blocker()
    leader_saw: List[BaseException] = []

    def interrupted(batch: List[Request]) -> None:
        if execute.batches:  # the second round trip is interrupted
            execute.batches.append(len(batch))
            raise Interrupted
        execute(batch)

    coalescer = Coalescer(interrupted)
    first = start_blocked_round(coalescer, execute)
    served: List[Request] = []

    def caller() -> None:
        try:
            served.append(coalescer.run(make_request()))
        except Interrupted as exc:
            leader_saw.append(exc)

    callers = queue_callers(coalescer, caller, 3)
    execute.release.set()
    for t in [first, *callers]:
        t.join(10)
        assert not t.is_alive()
    assert execute.batches == [1, 3]
    assert len(leader_saw) == 1  # the thread that led the interrupted round trip
    assert [type(r.error) for r in served] == [Interrupted, Interrupted]
    assert all(r.result is None for r in served)
    assert coalescer._busy is False and coalescer._pending == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_forked_child_gets_an_idle_coalescer_and_its_own_waker() -> None:
    """After fork the child never shares the parent's eventfd and never inherits a round in
    flight: its coalescer is idle and serves requests."""
    coalescer = Coalescer(lambda batch: [setattr(r, "result", "done") for r in batch])
    parent_waker = coalesce._thread_waker()
    coalescer._busy = True  # as if another thread of the parent were mid round trip
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        ok = (
            getattr(coalesce._local, "waker", None) is None
            and coalescer.run(make_request()).result == "done"
            and coalesce._thread_waker() is not parent_waker
        )
        os._exit(0 if ok else 1)
    coalescer._busy = False
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert coalesce._local.waker is parent_waker  # the parent keeps its own


def test_failed_round_trip_raises_store_error(redis_client: redis.Redis) -> None:
    """A round trip that fails (no server) reaches the caller as a StoreError."""
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

        answers: List[Any] = []

        def work(t: int) -> None:
            barrier.wait(10)
            for i in range(200):
                answers.append(listener(ClassicMessage(f"{t}-{i}")))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    finally:
        logging.getLogger("rocketmq_dedup").removeHandler(handler)
    assert [e for e in errors if "failed" in e or "could not" in e] == []
    assert answers == [ConsumeStatus.CONSUME_SUCCESS] * (8 * 200)
    assert sum(batches) == 8 * 200 * 2  # one claim and one mark per message
    assert len(batches) < 8 * 200 * 2 * 0.9  # round trips were shared, and not just once
    assert all(
        store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", f"{t}-{i}"))
        is DedupStatus.CONSUMED
        for t in range(8)
        for i in range(0, 200, 37)
    )


def test_interrupted_round_trip_drops_the_connection(
    redis_client: redis.Redis, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt between two replies of a combined round trip drops the store's own
    connection, so the next round trip never reads the stale replies."""
    store = RedisDedupStore(redis_client)
    a, b, c = (DedupElement(app_name, "t", "", k) for k in "abc")
    assert store.claim(a, "oa", 60_000).claimed  # opens the store's connection
    conn = store._own_connection()
    real_read = conn.read_response
    reads: List[int] = []

    def read_then_interrupt() -> Any:
        reads.append(1)
        if len(reads) == 2:
            raise KeyboardInterrupt
        return real_read()

    monkeypatch.setattr(conn, "read_response", read_then_interrupt)
    key = store.record_key
    batch = [
        Request("claim", 60_000, [key(b)], ["CONSUMING:ob"]),
        Request("mark", 60_000, [key(a)], ["CONSUMED:oa"]),
    ]
    with pytest.raises(KeyboardInterrupt):
        store._execute(batch)
    assert store._conn is None
    assert store.claim(c, "oc", 60_000).claimed
    assert store.claim(b, "other", 60_000) == (False, DedupStatus.CONSUMING)
    assert store.get_status(a) is DedupStatus.CONSUMED
