"""Flat combining of concurrent store requests into shared round trips, and CONSUMED marks
that ride later round trips. Used by the Redis and MySQL stores.

The clients run handlers on thread pools, and a round trip per thread does not scale past one
core: the GIL, the per-command client cost and the wake-ups dominate. A :class:`Coalescer`
lets the first thread that arrives run its request at once (a message that arrives alone is
never delayed); requests that arrive while that round trip is in flight queue up and are run
together, in one round trip, by one of their threads. Every caller of :meth:`Coalescer.run`
returns only after its own request was executed.

**Deferred requests** (:meth:`Coalescer.defer`: the stores' CONSUMED marks) are not waited
for: each rides the next round trip, ahead of the requests in it, or, when no round trip
comes, is sent by the coalescer's flusher thread at most ``defer_ms`` after it was deferred.
:meth:`Coalescer.flush` (the stores' ``close()``, and at interpreter exit) sends them at once.
A failure is reported to ``on_deferred_error`` (the stores log it). Why a CONSUMED mark may
wait (the handler has run; the claim is still held), and what it changes for a crash: see the
stores' docs and README ("CONSUMED marks").

Waking a waiting thread is the coalescer's main cost, and how to wake one depends on where the
threads run (measured on a 2-vCPU VM, BENCHMARKS.md). A thread confined to one CPU (a pinned
consumer process) waits on an eventfd of its own: writing to it releases the GIL, so the woken
thread takes the GIL and runs at once; with a ``threading.Lock`` instead, the woken thread
preempts its waker, finds the GIL held, and sleeps again (about 2.7 more context switches and
7 us more CPU per message with 8 threads). Threads free to use several CPUs wait on a lock:
there, a woken thread that takes the GIL on another CPU while its waker still needs it made
end-to-end consumers slower (0.40-0.59 of the no-dedup throughput against 0.55-0.73).

Wakers are not per thread: the classic RocketMQ client calls back from native C++ threads
through ctypes, with a fresh Python thread state per callback, so a ``threading.local`` waker
would be made (an eventfd: two syscalls, 2.5 us) and closed again on every callback that waits.
Each coalescer keeps a small free-list of wakers instead: a waiting caller takes one and puts it
back once woken (as cheap as a thread-local lookup, 0.04 us); at most ``spare_wakers`` are kept,
the others are dropped and an eventfd closes with its waker.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import DedupConfigError

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)


class Waker(Protocol):
    """Blocks one waiting caller until a single :meth:`wake`; reusable once woken."""

    def wake(self) -> None: ...

    def wait(self) -> None: ...


class EventFdWaker:
    """A thread's reusable wake-up channel: an eventfd (Linux), closed when unreferenced."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.eventfd(0)  # close-on-exec by default

    def wake(self) -> None:
        os.eventfd_write(self.fd, 1)  # releases the GIL: the woken thread may run at once

    def wait(self) -> None:
        os.eventfd_read(self.fd)  # blocks, GIL released, until woken; resets the counter

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        _close(self.fd)


class LockWaker:
    """The portable wake-up channel: a lock that is held except between wake and wait."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()

    def wake(self) -> None:
        self.lock.release()

    def wait(self) -> None:
        self.lock.acquire()


def default_waker() -> Waker:
    """An eventfd waker if the calling thread may only run on one CPU (Linux), else a lock.

    The choice is made by the first thread that has to wait for a new waker; the threads of a
    consumer process normally share one affinity."""
    if hasattr(os, "eventfd") and len(os.sched_getaffinity(0)) == 1:
        return EventFdWaker()
    return LockWaker()


#: Every live coalescer, for the one at-fork hook (weak: a dropped store is never kept alive,
#: and no hook is registered per coalescer).
_coalescers: weakref.WeakSet[Coalescer] = weakref.WeakSet()


def _reset_all() -> None:
    """In a forked child: every coalescer idle, and no eventfd shared with the parent."""
    for coalescer in list(_coalescers):
        coalescer._reset()


def _flush_all() -> None:
    """At interpreter exit: the deferred requests of every live coalescer sent (the flusher
    threads are daemons and stop with the interpreter)."""
    for coalescer in list(_coalescers):
        coalescer.flush()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all)
atexit.register(_flush_all)


class Request:
    """One caller's store request and, once run, its result or error. ``keys`` and ``values``
    are the store's (Redis: record keys and values; MySQL: claims); a request without keys is
    a flush (it only carries the deferred requests) and gets an empty result."""

    __slots__ = (
        "attempts",
        "deferred_at",
        "error",
        "keys",
        "kind",
        "lead",
        "millis",
        "result",
        "values",
        "waker",
    )

    def __init__(self, kind: str, millis: int, keys: Sequence[Any], values: Sequence[Any]):
        self.attempts = 0  # round trips that carried it (a deferred one is sent again)
        self.deferred_at = 0.0  # time.monotonic() when it was deferred
        self.kind = kind
        self.millis = millis
        self.keys = keys
        self.values = values
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.lead = False
        self.waker: Optional[Waker] = None  # set only if the caller must wait


#: The kind of the request :meth:`Coalescer.flush` runs: no keys, nothing of its own to send.
FLUSH = "flush"

#: How long a deferred request may wait for a round trip to carry it, by default (ms).
DEFAULT_DEFER_MS = 10
#: A deferred request whose round trip failed (a lost connection, a server restarting, a lock
#: wait that timed out) is deferred again: at least this many round trips in all, and for as
#: long as :data:`DEFERRED_KEEP_S` after it was first deferred (a store restart or a failover
#: takes seconds: a mark given up within milliseconds would leave its message CONSUMING, and a
#: copy after its lease would run again), tried again no sooner than a backoff from
#: ``defer_ms``, doubled per failure up to :data:`DEFERRED_RETRY_MAX_S`. Then it is reported.
DEFERRED_ATTEMPTS = 3
DEFERRED_KEEP_S = 30.0
DEFERRED_RETRY_MAX_S = 1.0


def settle_deferred(
    failed: List[Request], defer_s: float
) -> Tuple[List[Request], List[Request], float]:
    """What becomes of deferred requests whose round trip failed (the sync and the asyncio
    coalescers' rule): ``(again, given_up, retry_at)``. ``again``: cleared, to be deferred
    again, while they had fewer than :data:`DEFERRED_ATTEMPTS` round trips or are younger than
    :data:`DEFERRED_KEEP_S`; ``given_up``: the others, error kept, to be reported;
    ``retry_at``: when a flush may send them again (``time.monotonic()``; 0.0 when nothing
    failed), a backoff from ``defer_s`` doubled per round trip the oldest of them failed in,
    at most :data:`DEFERRED_RETRY_MAX_S`."""
    if not failed:  # the round trip carried them: no backoff
        return [], [], 0.0
    again, given_up = [], []
    now = time.monotonic()
    for request in failed:
        request.attempts += 1
        if request.attempts < DEFERRED_ATTEMPTS or now - request.deferred_at < DEFERRED_KEEP_S:
            request.error = request.result = None
            again.append(request)
        else:
            given_up.append(request)
    backoff = defer_s * 2 ** min(max(r.attempts for r in failed), 16)
    return again, given_up, now + min(backoff, DEFERRED_RETRY_MAX_S)


class Coalescer:
    """Runs :class:`Request` objects through ``execute`` in combined batches.

    ``execute(batch)`` must set ``result`` or ``error`` on every request and never raise; the
    deferred requests come first in a batch, in the order they were deferred. ``waker`` makes
    the wake-up channel of a waiting caller (:func:`default_waker`); at most ``spare_wakers``
    idle ones are kept for reuse. ``defer_ms``: the longest a deferred request waits before the
    flusher thread sends it. ``on_deferred_error(requests, error)`` is told about deferred
    requests that failed (it must not raise).
    """

    def __init__(
        self,
        execute: Callable[[List[Request]], None],
        waker: Callable[[], Waker] = default_waker,
        spare_wakers: int = 64,
        defer_ms: int = DEFAULT_DEFER_MS,
        on_deferred_error: Optional[Callable[[List[Request], BaseException], None]] = None,
    ) -> None:
        self._execute = execute
        self._new_waker = waker
        self._max_spare = spare_wakers
        self._defer_s = defer_ms / 1000
        self._on_deferred_error = on_deferred_error
        self._reset()
        _coalescers.add(self)

    def _reset(self) -> None:
        """Idle and empty. Also run in a forked child: only the forking thread lives on there,
        so a round in flight in the parent is never finished in the child, the spare eventfds
        are the parent's, and so are the deferred requests (the parent sends them)."""
        self._lock = threading.Lock()
        self._pending: List[Request] = []
        self._busy = False
        self._spare: List[Waker] = []
        self._deferred: List[Request] = []
        self._deferred_since = 0.0  # time.monotonic() when the oldest deferred one came
        self._retry_at = 0.0  # after a failed round trip: not sent again by the flusher before
        self._deferrals = 0  # requests deferred so far (the flusher watches it move)
        self._flusher_idle = True  # the flusher thread waits on _flusher_wake (or none runs)
        self._flusher_wake: Optional[threading.Event] = None

    # -- state, for operators and tests ----------------------------------------------

    @property
    def queued(self) -> int:
        """Requests waiting for the next round trip."""
        return len(self._pending)

    @property
    def deferred(self) -> int:
        """Deferred requests not sent yet."""
        return len(self._deferred)

    @property
    def idle(self) -> bool:
        """True when no round trip is in flight and nothing is queued or deferred."""
        return not self._busy and not self._pending and not self._deferred

    def spare_wakers(self) -> Tuple[Waker, ...]:
        """The idle wakers kept for reuse."""
        return tuple(self._spare)

    def run(self, request: Request) -> Request:
        """Execute ``request`` (alone or with others) and return it, result or error set.

        If the caller's wait is interrupted (an exception such as ``KeyboardInterrupt``), the
        exception propagates; the request is withdrawn if it has not been sent yet. Python
        delivers signals to the main thread only; the clients run callbacks on their own
        threads, which are never interrupted that way."""
        waker = None
        with self._lock:
            if self._busy:
                spare = self._spare
                waker = request.waker = spare.pop() if spare else self._new_waker()
            self._pending.append(request)
            self._busy = True
        if waker is not None:
            try:
                waker.wait()
            except BaseException:
                self._abandon(request)
                raise
            # Woken exactly once (served, or made lead): the waker is idle again.
            if len(self._spare) < self._max_spare:
                self._spare.append(waker)
            if not request.lead:  # served by another thread's round trip
                return request
        with self._lock:  # leading: take every request queued so far, the deferred first
            batch, self._pending = self._pending, []
            deferred, self._deferred = self._deferred, []
            if deferred:
                batch = deferred + batch
        try:
            self._send(batch, deferred)
        finally:
            with self._lock:
                self._hand_over()
            for other in batch:
                if other.waker is not None and other is not request:
                    other.waker.wake()
        return request

    def _send(self, batch: List[Request], deferred: List[Request]) -> None:
        """Execute ``batch`` (flush requests left out); tell about failed deferred ones."""
        work = batch if all(r.keys for r in batch) else [r for r in batch if r.keys]
        for request in batch:
            if not request.keys:
                request.result = []
        try:
            if work:
                self._execute(work)
        except BaseException as exc:  # execute never raises, short of a KeyboardInterrupt:
            for other in work:  # then no caller may mistake an unsent request for a done one
                if other.result is None and other.error is None:
                    other.error = exc
            raise
        finally:
            if deferred:
                self._retry_or_report([r for r in deferred if r.error is not None])

    def _retry_or_report(self, failed: List[Request]) -> None:
        """Defer failed deferred requests again (they ride a later round trip, the flusher's
        backing off), or, once they had :data:`DEFERRED_ATTEMPTS` round trips and
        :data:`DEFERRED_KEEP_S` passed, tell ``on_deferred_error``."""
        again, given_up, self._retry_at = settle_deferred(failed, self._defer_s)
        if again:
            self._enqueue(again, first=True)
        if given_up and self._on_deferred_error is not None:
            self._on_deferred_error(given_up, given_up[0].error)  # type: ignore[arg-type]

    def defer(self, request: Request) -> None:
        """Queue ``request`` without waiting for it: it rides the next round trip, or the
        flusher sends it within ``defer_ms``."""
        request.deferred_at = time.monotonic()
        self._enqueue([request])

    def _enqueue(self, requests: List[Request], first: bool = False) -> None:
        """Add deferred requests (``first``: ahead of the others); the flusher, if idle, is
        woken to send them once they are due."""
        wake = None
        with self._lock:
            self._deferrals += 1
            if not self._deferred:
                self._deferred_since = time.monotonic()
                if self._flusher_idle:
                    self._flusher_idle = False
                    wake = self._flusher_wake
                    if wake is None:
                        wake = self._flusher_wake = self._start_flusher()
            if first:
                self._deferred[:0] = requests
            else:
                self._deferred += requests
        if wake is not None:
            wake.set()

    def flush(self) -> None:
        """Send the deferred requests now, and wait for the round trip that carries them (the
        one in flight may: a read after a flush sees every mark); nothing when there are none
        and no round trip is in flight."""
        if self._deferred or self._busy:
            self.run(Request(FLUSH, 0, (), ()))

    def _flush_due(self, wake: threading.Event, seen: int) -> Tuple[Optional[float], int]:
        """The flusher's question, and how many requests were deferred so far: seconds until
        the oldest deferred request is due (<= 0: now); with none waiting, one more
        ``defer_ms`` if requests were deferred since the flusher's last look (``seen``: round
        trips are carrying them, and it stays awake rather than be woken for each), else None
        (it waits for ``wake``)."""
        with self._lock:
            if self._deferred:
                due = max(self._deferred_since + self._defer_s, self._retry_at)
                return due - time.monotonic(), self._deferrals
            if self._deferrals != seen:
                return self._defer_s, self._deferrals
            self._flusher_idle = True
            wake.clear()
            return None, seen

    def _start_flusher(self) -> threading.Event:
        """The flusher thread (a daemon; it holds only a weak reference, and ends when the
        coalescer is dropped)."""
        wake = threading.Event()
        ref = weakref.ref(self)
        weakref.finalize(self, wake.set)
        thread = threading.Thread(
            target=_run_flusher, args=(ref, wake), name="rocketmq-dedup-flusher", daemon=True
        )
        thread.start()
        return wake

    def _hand_over(self) -> None:
        """Make the first queued request lead the next round, or go idle. Holds the lock."""
        if self._pending:
            successor = self._pending[0]
            successor.lead = True
            successor.waker.wake()  # type: ignore[union-attr]
        else:
            self._busy = False

    def _abandon(self, request: Request) -> None:
        """Withdraw a request whose caller stopped waiting; pass on its lead if it had one. Its
        waker is dropped, never reused: a wake-up may still arrive for it."""
        with self._lock:
            if any(r is request for r in self._pending):
                self._pending = [r for r in self._pending if r is not request]
                if request.lead:
                    self._hand_over()


#: The longest ``defer_ms`` a store accepts.
MAX_DEFER_MS = 1000
#: A store defers a CONSUMED mark only while every lease it claimed with is at least this many
#: times ``defer_ms`` (the default 10 ms: leases of 1 s and more): a deferred mark then lands
#: long before the claim it replaces could lapse.
LEASE_PER_DEFER = 100


def by_kind(batch: Sequence[Request]) -> Dict[Tuple[str, int], List[Request]]:
    """A batch's requests grouped by (kind, millis), in order of first appearance (so the
    deferred requests, which come first, are sent first)."""
    groups: Dict[Tuple[str, int], List[Request]] = {}
    for request in batch:
        groups.setdefault((request.kind, request.millis), []).append(request)
    return groups


def deliver(members: Sequence[Request], results: Sequence[Any]) -> None:
    """Give each request its slice of ``results`` (one per key, the members' keys in order)."""
    offset = 0
    for request in members:
        n = len(request.keys)
        request.result = results[offset : offset + n]
        offset += n


def check_defer_ms(value: Any) -> int:
    """``defer_marks_ms`` as given, if it is an int from 0 to :data:`MAX_DEFER_MS`."""
    if type(value) is not int or not 0 <= value <= MAX_DEFER_MS:
        raise DedupConfigError(
            f"defer_marks_ms must be an int from 0 to {MAX_DEFER_MS}; got {value!r}"
        )
    return value


class DeferredMarks:
    """The rule of the coalescing stores (Redis, asyncio Redis, MySQL) for when a CONSUMED
    mark may ride a later round trip: coalescing on, ``defer_marks_ms`` > 0, and every lease
    the store claimed with so far at least :data:`LEASE_PER_DEFER` times ``defer_marks_ms``
    (the claim hooks call :meth:`_note_lease`)."""

    defer_marks_ms: int
    _shortest_lease_ms = float("inf")  # of every claim so far

    def _init_deferred_marks(self, defer_marks_ms: Any, coalesce: bool) -> None:
        """Check and keep ``defer_marks_ms`` (a :class:`DedupConfigError` if out of range)."""
        self.defer_marks_ms = check_defer_ms(defer_marks_ms)
        #: The shortest lease that lets a mark wait; None: marks are never deferred.
        self._lease_to_defer_ms = (
            self.defer_marks_ms * LEASE_PER_DEFER if coalesce and self.defer_marks_ms else None
        )

    def _note_lease(self, lease_ms: int) -> None:
        """Remember a claim's lease (the shortest one decides :attr:`marks_deferred`)."""
        if lease_ms < self._shortest_lease_ms:
            self._shortest_lease_ms = lease_ms

    @property
    def marks_deferred(self) -> bool:
        """Whether a CONSUMED mark made now rides a later round trip: the listener answers
        before it lands."""
        needed = self._lease_to_defer_ms
        return needed is not None and needed <= self._shortest_lease_ms


def marks_failed_reporter(
    describe: Callable[[], str],
) -> Callable[[List[Request], BaseException], None]:
    """The stores' ``on_deferred_error``: deferred CONSUMED marks that failed are logged (an
    ERROR, rate-limited). Their messages were acked when their handlers succeeded; each claim
    lapses at the end of its lease, and a copy delivered after that runs again."""

    def report(requests: List[Request], error: BaseException) -> None:
        _log.log(
            logging.ERROR,
            "%s: could not mark %d handled message(s) CONSUMED (%s: %s); they were acked: a "
            "copy delivered before their claims lapse is consumed later, one after runs again",
            describe(),
            sum(len(r.keys) for r in requests),
            type(error).__name__,
            error,
        )

    return report


def _run_flusher(ref: weakref.ReferenceType[Coalescer], wake: threading.Event) -> None:
    """Send a coalescer's deferred requests when the oldest has waited ``defer_ms`` and no
    round trip has carried it; while requests keep being deferred, look every ``defer_ms``;
    after a ``defer_ms`` with none, wait for ``wake``."""
    seen = -1
    while True:
        wake.wait()
        coalescer = ref()
        if coalescer is None:
            return
        due: Optional[float] = None
        try:
            due, seen = coalescer._flush_due(wake, seen)
            if due is not None and due <= 0:
                coalescer.flush()
        except Exception:  # a failed flush is reported through on_deferred_error
            logger.debug("flushing deferred requests failed", exc_info=True)
        del coalescer  # never kept alive by this thread while it sleeps
        if due is not None and due > 0:
            time.sleep(due)
