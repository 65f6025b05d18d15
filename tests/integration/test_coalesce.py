"""Coalescing of concurrent threads' store requests (the Redis store's thread scaling)."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from typing import Any, Callable, List, Set

import pytest
import redis

from rocketmq_dedup import DedupElement, DedupStatus, StoreError
from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.coalesce import Coalescer, Request
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.support import consume_in_threads, outcome, wait_for

WAKERS: List[Any] = [coalesce.LockWaker]
if hasattr(os, "eventfd"):
    WAKERS.insert(0, coalesce.EventFdWaker)


@pytest.fixture(params=WAKERS, ids=lambda w: w.__name__, autouse=True)
def waker(request: pytest.FixtureRequest) -> Any:
    """Every test runs with each way of waking a waiting thread (the coalescers and stores
    here are made with it)."""
    return request.param


def coalesced_store(client: redis.Redis, waker: Any) -> RedisDedupStore:
    """A Redis store whose coalescer wakes its waiters with ``waker``."""
    return RedisDedupStore(client, waker=waker)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_default_waker_is_an_eventfd_only_on_one_cpu() -> None:
    """A thread confined to one CPU waits on an eventfd (GIL released on wake); a thread free
    to run on several waits on a lock."""
    kinds: List[str] = []
    cpus = sorted(os.sched_getaffinity(0))

    def probe(allowed: Set[int]) -> None:
        os.sched_setaffinity(0, allowed)  # this thread only
        kinds.append(type(coalesce.default_waker()).__name__)

    for allowed in ({cpus[0]}, set(cpus)):
        thread = threading.Thread(target=probe, args=(allowed,))
        thread.start()
        thread.join(10)
    several = "EventFdWaker" if len(cpus) == 1 else "LockWaker"
    assert kinds == ["EventFdWaker", several]


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
    wait_for(lambda: coalescer.queued == n)
    return callers


def test_lone_request_runs_at_once_in_its_own_batch(waker: Any) -> None:
    """A request that arrives alone is executed immediately, by its own thread, alone."""
    batches: List[List[Request]] = []

    def execute(batch: List[Request]) -> None:
        batches.append(batch)
        for r in batch:
            r.result = threading.get_ident()

    coalescer = Coalescer(execute, waker)
    request = coalescer.run(make_request())
    assert request.result == threading.get_ident()
    assert [len(b) for b in batches] == [1]


def test_requests_arriving_during_a_round_trip_share_the_next_one(waker: Any) -> None:
    """While one batch is in flight, later requests queue and then run as one batch."""
    execute = Blocker()
    coalescer = Coalescer(execute, waker)
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

    made: List[Any] = []

    def make_waker() -> Any:  # the first caller to wait is the interrupted one
        made.append(InterruptedWaker() if not made else waker())
        return made[-1]

    execute = Blocker()
    coalescer = Coalescer(execute, make_waker)
    first = start_blocked_round(coalescer, execute)
    outcome: List[Any] = []

    def interrupted_caller() -> None:
        try:
            coalescer.run(make_request())
        except Interrupted:
            outcome.append("interrupted")

    caller = threading.Thread(target=interrupted_caller)
    caller.start()
    if after_wake:  # queued first: it is the one promoted to lead the next round
        wait_for(lambda: coalescer.queued == 1)
    else:
        caller.join(10)
        assert coalescer.queued == 0
    results: List[Any] = []
    behind = threading.Thread(target=lambda: results.append(coalescer.run(make_request()).result))
    behind.start()
    wait_for(lambda: coalescer.queued == (2 if after_wake else 1))
    execute.release.set()
    for t in (first, caller, behind):
        t.join(10)
    assert outcome == ["interrupted"]
    assert not any(w is made[0] for w in coalescer.spare_wakers())  # its waker is never reused
    assert results == ["done"]
    assert execute.batches == [1, 1]  # the withdrawn request was never executed
    assert coalescer.run(make_request()).result == "done"  # and the coalescer is idle again


def test_interrupted_round_trip_fails_every_request_of_the_batch(waker: Any) -> None:
    """If the leader's round trip is interrupted (execute raises a BaseException), the waiters
    of that batch get the error, never a silent success, and the coalescer is idle again."""
    execute = Blocker()
    leader_saw: List[BaseException] = []

    def interrupted(batch: List[Request]) -> None:
        if execute.batches:  # the second round trip is interrupted
            execute.batches.append(len(batch))
            raise Interrupted
        execute(batch)

    coalescer = Coalescer(interrupted, waker)
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
    assert coalescer.idle


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_forked_child_gets_an_idle_coalescer_and_no_parent_waker(waker: Any) -> None:
    """After fork the child never shares the parent's eventfds and never inherits a round in
    flight: its coalescer is idle, has no spare waker, and serves requests."""
    gate, entered = threading.Event(), threading.Event()
    gate.set()

    def execute(batch: List[Request]) -> None:
        entered.set()
        assert gate.wait(10)
        for r in batch:
            r.result = "done"

    coalescer = Coalescer(execute, waker)

    def held_round() -> threading.Thread:
        gate.clear()
        entered.clear()
        leader = threading.Thread(target=coalescer.run, args=(make_request(),))
        leader.start()
        assert entered.wait(10)
        return leader

    leader = held_round()  # a caller queued behind it leaves its waker as a spare
    (queued,) = queue_callers(coalescer, lambda: coalescer.run(make_request()), 1)
    gate.set()
    for t in (leader, queued):
        t.join(10)
    parent_spares = coalescer.spare_wakers()
    assert len(parent_spares) == 1
    leader = held_round()  # a round trip in flight when the process forks
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        gate.set()
        ok = (
            coalescer.idle
            and coalescer.spare_wakers() == ()
            and coalescer.run(make_request()).result == "done"
        )
        os._exit(0 if ok else 1)
    gate.set()
    leader.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert coalescer.spare_wakers() == parent_spares  # the parent keeps its own


# -- deferred requests (the stores' CONSUMED marks) ---------------------------------------------


class Recorder:
    """An ``execute`` that records each batch's request kinds; every request gets "done", or,
    while ``failing``, a ConnectionError."""

    def __init__(self) -> None:
        self.batches: List[List[str]] = []
        self.at: List[float] = []
        self.failing = False

    def __call__(self, batch: List[Request]) -> None:
        self.batches.append([r.kind for r in batch])
        self.at.append(time.monotonic())
        for r in batch:
            if self.failing:
                r.error = ConnectionError("lost")
            else:
                r.result = "done"


def test_deferred_requests_ride_the_next_round_trip_ahead_of_it(waker: Any) -> None:
    """Deferred requests are not sent on their own: the next round trip carries them, first,
    in the order they were deferred; the caller of that round trip gets its own result."""
    execute = Recorder()
    coalescer = Coalescer(execute, waker, defer_ms=60_000)
    coalescer.defer(Request("mark", 1, [b"a"], ["v"]))
    coalescer.defer(Request("mark2", 1, [b"b"], ["v"]))
    assert execute.batches == [] and coalescer.deferred == 2 and not coalescer.idle
    assert coalescer.run(make_request()).result == "done"
    assert execute.batches == [["mark", "mark2", "claim"]]
    assert coalescer.deferred == 0 and coalescer.idle


def test_a_deferred_request_no_round_trip_carries_is_sent_within_defer_ms(waker: Any) -> None:
    """With no other traffic the flusher sends a deferred request once it has waited
    ``defer_ms`` (here 40 ms): not before, and not much after."""
    execute = Recorder()
    coalescer = Coalescer(execute, waker, defer_ms=40)
    deferred_at = time.monotonic()
    coalescer.defer(Request("mark", 1, [b"a"], ["v"]))
    wait_for(lambda: execute.batches, timeout=5)
    waited = execute.at[0] - deferred_at
    assert execute.batches == [["mark"]]
    assert 0.04 <= waited < 0.04 + 0.5  # the bound, and the scheduler's slack
    coalescer.defer(Request("mark", 1, [b"b"], ["v"]))  # the flusher serves the next one too
    wait_for(lambda: len(execute.batches) == 2, timeout=5)


def test_the_flusher_is_not_woken_for_each_request_round_trips_carry(
    waker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While round trips carry the deferred requests (a steady consumer: mark, claim, mark,
    ...), the flusher looks about once per defer_ms, not once per request (before: each
    deferral found it idle and woke it, two more context switches a message)."""
    looks: List[float] = []
    flush_due = Coalescer._flush_due

    def counted(self: Coalescer, *args: Any) -> Any:
        looks.append(time.monotonic())
        return flush_due(self, *args)

    monkeypatch.setattr(Coalescer, "_flush_due", counted)

    def io(batch: List[Request]) -> None:
        time.sleep(0.0005)  # the round trip: the GIL released, the flusher free to run
        for r in batch:
            r.result = "done"

    coalescer = Coalescer(io, waker, defer_ms=50)
    began = time.monotonic()
    for i in range(200):
        coalescer.defer(Request("mark", 1, [b"%d" % i], ["v"]))
        coalescer.run(make_request())
    periods = (time.monotonic() - began) / 0.05
    assert len(looks) <= periods + 3, (len(looks), periods)


def test_flush_sends_the_deferred_now_and_nothing_without_them(waker: Any) -> None:
    """flush() sends the deferred requests in a round trip of their own and returns once it
    is done; with none deferred it sends nothing."""
    execute = Recorder()
    coalescer = Coalescer(execute, waker, defer_ms=60_000)
    coalescer.flush()
    assert execute.batches == []
    deferred = Request("mark", 1, [b"a"], ["v"])
    coalescer.defer(deferred)
    coalescer.flush()
    assert execute.batches == [["mark"]] and deferred.result == "done"
    assert coalescer.idle


def test_flush_waits_for_the_round_trip_carrying_the_deferred(waker: Any) -> None:
    """flush() while a round trip carrying the deferred requests is in flight (the flusher's,
    or a claim's) returns only after it landed: a read after flush() sees every mark (before:
    it returned at once, nothing being left to send, and a read raced the mark)."""
    execute = Blocker()
    coalescer = Coalescer(execute, waker, defer_ms=60_000)
    deferred = Request("mark", 1, [b"a"], ["v"])
    coalescer.defer(deferred)
    first = start_blocked_round(coalescer, execute)  # carries the deferred request
    seen_at_return: List[Any] = []
    flusher = threading.Thread(
        target=lambda: (coalescer.flush(), seen_at_return.append(deferred.result))
    )
    flusher.start()
    flusher.join(0.3)
    execute.release.set()
    for t in (first, flusher):
        t.join(10)
    assert seen_at_return == ["done"]
    assert coalescer.idle


def test_a_failed_deferred_request_is_sent_again_then_reported(
    waker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deferred request whose round trip failed rides the next ones again, up to
    DEFERRED_ATTEMPTS round trips in all once DEFERRED_KEEP_S has passed (0 here); then
    on_deferred_error is told, once, with it."""
    monkeypatch.setattr(coalesce, "DEFERRED_KEEP_S", 0.0)
    execute = Recorder()
    reported: List[Any] = []
    coalescer = Coalescer(
        execute,
        waker,
        defer_ms=60_000,
        on_deferred_error=lambda requests, error: reported.append((requests, error)),
    )
    deferred = Request("mark", 1, [b"a"], ["v"])
    coalescer.defer(deferred)
    execute.failing = True
    for attempt in range(1, coalesce.DEFERRED_ATTEMPTS + 1):
        coalescer.run(make_request())
        assert execute.batches[-1] == ["mark", "claim"]
        assert coalescer.deferred == (0 if attempt == coalesce.DEFERRED_ATTEMPTS else 1)
    assert len(reported) == 1
    assert reported[0][0] == [deferred] and isinstance(reported[0][1], ConnectionError)
    coalescer.run(make_request())
    assert execute.batches[-1] == ["claim"]  # given up: not sent again


def test_a_deferred_request_outlives_a_store_outage_and_the_flusher_backs_off(
    waker: Any,
) -> None:
    """A store restarting fails every round trip for a while: a deferred mark is kept through
    ten failed round trips (within DEFERRED_KEEP_S), lands with the first one after the
    outage, and nothing is reported; meanwhile the flusher waits longer after each failure
    instead of retrying every defer_ms. (Before, a mark was given up after 3 round trips, a
    few milliseconds of an outage: its message stayed CONSUMING and a copy after the lease
    ran again.)"""
    execute = Recorder()
    reported: List[Any] = []
    coalescer = Coalescer(
        execute, waker, defer_ms=10, on_deferred_error=lambda r, e: reported.append(r)
    )
    deferred = Request("mark", 1, [b"a"], ["v"])
    coalescer.defer(deferred)
    execute.failing = True
    waits = []
    for _ in range(10):
        coalescer.run(make_request())
        assert coalescer.deferred == 1
        wait, _ = coalescer._flush_due(threading.Event(), 0)
        waits.append(wait)
    assert waits[0] is not None and waits[-1] is not None
    assert waits[-1] > 0.5 > waits[0]  # 10 ms doubled per failure, at most 1 s
    execute.failing = False
    coalescer.run(make_request())
    assert execute.batches[-1] == ["mark", "claim"] and deferred.result == "done"
    assert reported == [] and coalescer.deferred == 0
    wait, _ = coalescer._flush_due(threading.Event(), 0)
    assert wait is not None and wait <= 0.01  # the backoff ends with the outage


def test_a_deferred_request_that_failed_once_lands_with_the_next_round_trip(waker: Any) -> None:
    """One failed round trip (a lock wait that timed out, a lost connection) loses no
    deferred request: the next round trip writes it, and nothing is reported."""
    execute = Recorder()
    reported: List[Any] = []
    coalescer = Coalescer(
        execute, waker, defer_ms=60_000, on_deferred_error=lambda r, e: reported.append(r)
    )
    deferred = Request("mark", 1, [b"a"], ["v"])
    coalescer.defer(deferred)
    execute.failing = True
    coalescer.run(make_request())
    execute.failing = False
    coalescer.run(make_request())
    assert execute.batches == [["mark", "claim"], ["mark", "claim"]]
    assert deferred.result == "done" and reported == []


def test_the_flusher_thread_ends_with_its_coalescer(waker: Any) -> None:
    """The flusher holds no reference to its coalescer: a coalescer that is dropped is
    collected, and its flusher thread ends."""
    before = set(threading.enumerate())
    execute = Recorder()
    coalescer = Coalescer(execute, waker, defer_ms=20)
    coalescer.defer(Request("mark", 1, [b"a"], ["v"]))
    (flusher,) = [t for t in set(threading.enumerate()) - before if t.name.endswith("flusher")]
    wait_for(lambda: execute.batches, timeout=5)
    ref = weakref.ref(coalescer)
    del coalescer
    gc.collect()
    assert ref() is None
    flusher.join(5)
    assert not flusher.is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_forked_child_never_sends_the_parents_deferred_requests(waker: Any) -> None:
    """Deferred requests belong to the process that deferred them: a forked child starts with
    none (the parent sends its own), and defers and flushes its own."""
    execute = Recorder()
    coalescer = Coalescer(execute, waker, defer_ms=60_000)
    coalescer.defer(Request("mark", 1, [b"a"], ["v"]))
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        ok = coalescer.deferred == 0 and coalescer.idle
        coalescer.defer(Request("child-mark", 1, [b"c"], ["v"]))
        coalescer.flush()
        ok = ok and execute.batches == [["child-mark"]]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert coalescer.deferred == 1
    coalescer.flush()
    assert execute.batches == [["mark"]]


def test_failed_round_trip_raises_store_error(redis_client: redis.Redis) -> None:
    """A round trip that fails (no server) reaches the caller as a StoreError."""
    store = RedisDedupStore(redis.Redis(port=1, retry=None, socket_connect_timeout=0.2))
    with pytest.raises(StoreError):
        store.claim(Claim(DedupElement("a", "t", "", "k"), "o"), 1000)


def test_mixed_batch_after_script_flush(
    redis_client: redis.Redis, app_name: str, waker: Any
) -> None:
    """A combined batch of claims, marks and releases runs in one pipeline and survives the
    server forgetting its scripts (SCRIPT FLUSH): scripts are reloaded and the batch rerun."""
    store = coalesced_store(redis_client, waker)
    a, b, c = (DedupElement(app_name, "t", "", k) for k in "abc")
    store.claim(Claim(b, "ob"), 60_000)
    store.claim(Claim(c, "oc"), 60_000)
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
    assert RedisDedupStore(redis_client, coalesce=False).coalescer is None


def test_concurrent_threads_share_round_trips(
    redis_client: redis.Redis, app_name: str, waker: Any
) -> None:
    """8 threads x 200 fresh messages through one listener: every message handled once, no
    store error, and fewer round trips than messages x 2."""
    import logging

    from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig

    class Ok(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return True

    store = RedisDedupStore(redis_client)
    batches: List[int] = []
    execute = store._execute

    def counting(batch: List[Request]) -> None:
        batches.append(len(batch))
        execute(batch)

    store._coalescer = Coalescer(counting, waker)
    listener = Ok(DedupConfig.enable_dedup_consume_config(app_name, store))
    batches.clear()  # the start-up check's probe records
    errors: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("rocketmq_dedup").addHandler(handler)
    try:
        answers = consume_in_threads(listener, 8, 200)
    finally:
        logging.getLogger("rocketmq_dedup").removeHandler(handler)
    assert [e for e in errors if "failed" in e or "could not" in e] == []
    assert answers == [ConsumeStatus.CONSUME_SUCCESS] * (8 * 200)
    store.close()  # sends the CONSUMED marks still deferred
    assert sum(batches) == 8 * 200 * 2  # one claim and one mark per message
    assert len(batches) < 8 * 200 * 2 * 0.9  # round trips were shared, and not just once
    assert all(
        store.get_status(DedupElement(app_name, "TEST-TOPIC", "TagA", f"{t}-{i}"))
        is DedupStatus.CONSUMED
        for t in range(8)
        for i in range(0, 200, 37)
    )


def test_interrupted_round_trip_drops_the_connection(
    redis_client: redis.Redis, app_name: str, monkeypatch: pytest.MonkeyPatch, waker: Any
) -> None:
    """An interrupt between two replies of a combined round trip drops the store's own
    connection, so the next round trip never reads the stale replies."""
    store = coalesced_store(redis_client, waker)
    a, b, c = (DedupElement(app_name, "t", "", k) for k in "abc")
    assert store.claim(Claim(a, "oa"), 60_000).claimed  # checks out the store's connection
    conn = store._pinned.conn
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
    assert store._pinned.conn is None
    assert conn not in redis_client.connection_pool._in_use_connections  # given back
    assert store.claim(Claim(c, "oc"), 60_000).claimed
    assert outcome(store.claim(Claim(b, "other"), 60_000)) == (False, DedupStatus.CONSUMING)
    assert store.get_status(a) is DedupStatus.CONSUMED


class CountingFactory:
    """A waker factory that counts the wakers it makes."""

    def __init__(self, waker: Any) -> None:
        self.waker = waker
        self.made = 0

    def __call__(self) -> Any:
        self.made += 1
        return self.waker()


def test_fresh_threads_reuse_spare_wakers(waker: Any) -> None:
    """Waiters on threads that live for one call each (as native callbacks do) reuse the
    wakers of earlier waiters: 5 rounds of 3 new waiting threads make 3 wakers, not 15."""
    factory = CountingFactory(waker)
    rounds: List[Blocker] = []
    coalescer = Coalescer(lambda batch: rounds[-1](batch), factory)
    results: List[Any] = []

    def call() -> None:
        results.append(coalescer.run(make_request()).result)

    for _ in range(5):
        rounds.append(Blocker())
        first = start_blocked_round(coalescer, rounds[-1])
        waiters = queue_callers(coalescer, call, 3)
        rounds[-1].release.set()
        for t in [first, *waiters]:
            t.join(10)
            assert not t.is_alive()
    assert results == ["done"] * 15
    assert factory.made == 3
    assert len(coalescer.spare_wakers()) == 3


def test_spare_wakers_are_bounded_and_the_rest_closed(waker: Any) -> None:
    """At most spare_wakers idle wakers are kept; the others are dropped (an eventfd closes)."""
    factory = CountingFactory(waker)
    execute = Blocker()
    coalescer = Coalescer(execute, factory, spare_wakers=2)
    fds_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    first = start_blocked_round(coalescer, execute)
    waiters = queue_callers(coalescer, lambda: coalescer.run(make_request()), 6)
    execute.release.set()
    for t in [first, *waiters]:
        t.join(10)
        assert not t.is_alive()
    assert factory.made == 6
    assert len(coalescer.spare_wakers()) == 2
    if fds_before:
        import gc

        gc.collect()
        opened = len(os.listdir("/proc/self/fd")) - fds_before
        assert opened <= (2 if waker is coalesce.EventFdWaker else 0)


@pytest.mark.parametrize("kind", ["redis", "mysql"])
def test_permanent_failures_are_recorded_beside_coalesced_claims_and_deferred_marks(
    kind: str, app_name: str, waker: Any, request: pytest.FixtureRequest
) -> None:
    """6 threads x 60 messages, every third one's handler raising PermanentFailure, lapsed
    claims counted (max_lapsed_claims): each success is CONSUMED and each failure FAILED with
    its reason once the deferred marks are sent, every copy after is answered without its
    handler; on Redis the FAILED records ride the shared round trips (with the counted kinds)."""
    from rocketmq_dedup import (
        ConsumeStatus,
        DedupConcurrentListener,
        DedupConfig,
        PermanentFailure,
    )
    from rocketmq_dedup.testing import ClassicMessage
    from tests.conftest import make_store

    store: Any = (
        coalesced_store(request.getfixturevalue("redis_client"), waker)
        if kind == "redis"
        else make_store("mysql", request)
    )
    kinds: List[List[str]] = []
    execute = store.coalescer._execute

    def recording(batch: List[Request]) -> None:
        kinds.append([r.kind for r in batch])
        execute(batch)

    store.coalescer._execute = recording
    runs: List[str] = []

    class Orders(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            runs.append(msg.id)
            if int(msg.id.split("-")[1]) % 3 == 0:
                raise PermanentFailure(f"order {msg.id} has no amount")
            return True

    config = DedupConfig.enable_dedup_consume_config(
        app_name, store, max_lapsed_claims=3, permanent_failure="ack"
    )
    listener = Orders(config)
    ids = [f"{t}-{i}" for t in range(6) for i in range(60)]
    answers = consume_in_threads(listener, 6, 60)
    assert answers == [ConsumeStatus.CONSUME_SUCCESS] * len(ids)
    assert sorted(runs) == sorted(ids)
    store.close()  # sends the CONSUMED marks still deferred
    for message_id in ids:
        record: Any = store.read(DedupElement(app_name, "TEST-TOPIC", "TagA", message_id))
        if int(message_id.split("-")[1]) % 3 == 0:
            assert (record.status, record.reason) == (
                DedupStatus.FAILED,
                f"order {message_id} has no amount",
            )
        else:
            assert record.status is DedupStatus.CONSUMED
    again = [listener(ClassicMessage(message_id)) for message_id in ids]
    assert again == [ConsumeStatus.CONSUME_SUCCESS] * len(ids)
    assert len(runs) == len(ids)  # no handler ran for a copy
    if kind == "redis":
        assert any("fail" in batch and len(batch) > 1 for batch in kinds)
    listener.close()
