"""Flat combining of concurrent store requests into shared round trips.

The clients run handlers on thread pools, and with redis-py a round trip per thread does not
scale past one core: the GIL and the per-command client cost dominate. A :class:`Coalescer`
lets the first thread that arrives run its request at once (a message that arrives alone is
never delayed); requests that arrive while that round trip is in flight queue up and are run
together, in one round trip, by one of their threads. Every caller still returns only after
its own request was executed, so no guarantee is weakened.

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

import os
import threading
import weakref
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple


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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all)


class Request:
    """One caller's store request and, once run, its result or error."""

    __slots__ = ("error", "keys", "kind", "lead", "millis", "result", "values", "waker")

    def __init__(self, kind: str, millis: int, keys: Sequence[bytes], values: Sequence[str]):
        self.kind = kind
        self.millis = millis
        self.keys = keys
        self.values = values
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.lead = False
        self.waker: Optional[Waker] = None  # set only if the caller must wait


class Coalescer:
    """Runs :class:`Request` objects through ``execute`` in combined batches.

    ``execute(batch)`` must set ``result`` or ``error`` on every request and never raise.
    ``waker`` makes the wake-up channel of a waiting caller (:func:`default_waker`); at most
    ``spare_wakers`` idle ones are kept for reuse.
    """

    def __init__(
        self,
        execute: Callable[[List[Request]], None],
        waker: Callable[[], Waker] = default_waker,
        spare_wakers: int = 64,
    ) -> None:
        self._execute = execute
        self._new_waker = waker
        self._max_spare = spare_wakers
        self._reset()
        _coalescers.add(self)

    def _reset(self) -> None:
        """Idle and empty. Also run in a forked child: only the forking thread lives on there,
        so a round in flight in the parent is never finished in the child, and the spare
        eventfds are the parent's."""
        self._lock = threading.Lock()
        self._pending: List[Request] = []
        self._busy = False
        self._spare: List[Waker] = []

    # -- state, for operators and tests ----------------------------------------------

    @property
    def queued(self) -> int:
        """Requests waiting for the next round trip."""
        return len(self._pending)

    @property
    def idle(self) -> bool:
        """True when no round trip is in flight and nothing is queued."""
        return not self._busy and not self._pending

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
        with self._lock:  # leading: take every request queued so far
            batch, self._pending = self._pending, []
        try:
            self._execute(batch)
        except BaseException as exc:  # execute never raises, short of a KeyboardInterrupt:
            for other in batch:  # then no caller may mistake an unsent request for a done one
                if other.result is None and other.error is None:
                    other.error = exc
            raise
        finally:
            with self._lock:
                self._hand_over()
            for other in batch:
                if other is not request:
                    other.waker.wake()  # type: ignore[union-attr]
        return request

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
