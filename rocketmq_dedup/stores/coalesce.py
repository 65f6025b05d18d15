"""Flat combining of concurrent store requests into shared round trips.

The clients run handlers on thread pools, and with redis-py a round trip per thread does not
scale past one core: the GIL and the per-command client cost dominate. A :class:`Coalescer`
lets the first thread that arrives run its request at once (a message that arrives alone is
never delayed); requests that arrive while that round trip is in flight queue up and are run
together, in one round trip, by one of their threads. Every caller still returns only after
its own request was executed, so no guarantee is weakened.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence


class Request:
    """One caller's store request and, once run, its result or error."""

    __slots__ = ("_wake", "error", "keys", "kind", "lead", "millis", "result", "values")

    def __init__(self, kind: str, millis: int, keys: Sequence[bytes], values: Sequence[str]):
        self.kind = kind
        self.millis = millis
        self.keys = keys
        self.values = values
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.lead = False
        self._wake: Optional[Any] = None  # a held lock, made only if the caller must wait

    def prepare_wait(self) -> None:
        self._wake = threading.Lock()
        self._wake.acquire()

    def wake(self) -> None:
        assert self._wake is not None
        self._wake.release()

    def wait(self) -> None:
        assert self._wake is not None
        self._wake.acquire()


class Coalescer:
    """Runs :class:`Request` objects through ``execute`` in combined batches.

    ``execute(batch)`` must set ``result`` or ``error`` on every request and never raise.
    """

    def __init__(self, execute: Callable[[List[Request]], None]) -> None:
        self._execute = execute
        self._lock = threading.Lock()
        self._pending: List[Request] = []
        self._busy = False

    def run(self, request: Request) -> Request:
        """Execute ``request`` (alone or with others) and return it, result or error set."""
        with self._lock:
            lead = not self._busy
            if not lead:
                request.prepare_wait()
            self._pending.append(request)
            self._busy = True
        if not lead:
            request.wait()  # served by another thread's round trip, or promoted to lead
            if not request.lead:
                return request
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            self._execute(batch)
        finally:
            with self._lock:
                if self._pending:  # hand the next round to one of the waiting threads
                    successor = self._pending[0]
                    successor.lead = True
                    successor.wake()
                else:
                    self._busy = False
            for other in batch:
                if other is not request:
                    other.wake()
        return request
