"""The SQL stores' bounded connection pool (MySQL and PostgreSQL): at most ``size`` pooled
connections, each used by one operation at a time, fork-safe, with no thread of its own.

What it pools is the store's wrapper of a connection (a statement runner) with the few
attributes the pool keeps on it (:class:`Pooled`); opening, preparing and using connections is
the store's business.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Generic, List, Optional, Protocol, TypeVar

from rocketmq_dedup.errors import StorePoolExhaustedError

logger = logging.getLogger(__name__)


class Pooled(Protocol):
    """What the pool keeps on each pooled connection."""

    generation: int
    """The pool's generation when it was opened (a :meth:`BoundedPool.close` ends one)."""
    pid: int
    """The process that opened it (a child never uses its parent's)."""
    idle_since: float
    """``time.monotonic()`` when last given back."""

    def close(self) -> None: ...


R = TypeVar("R", bound=Pooled)
T = TypeVar("T")

_POOLS: weakref.WeakSet[BoundedPool[Any]] = weakref.WeakSet()


class BoundedPool(Generic[R]):
    """At most ``size`` connections (as the store's runners), each used by one operation at a
    time: :meth:`take` one, then :meth:`give` it back, or :meth:`discard` it after an error.

    * Idle runners are reused last-in first-out, so a lone caller keeps using one connection
      and the number open is the number of callers that were ever concurrent, up to ``size``.
    * When all ``size`` are busy a caller waits up to ``timeout`` seconds for one, then gets
      :class:`StorePoolExhaustedError`: not an outage (no server failed, the consumer's threads
      outnumber its connections), so the messages are consumed later, never without dedup.
    * Taking and giving back is a lock and a list pop/append (no object per call).
    * ``fork()``: in the child the pool starts empty (an ``os.register_at_fork`` hook). The
      parent's connections are never used, closed or freed there: closing one (mysqlclient
      also does it when the object is freed, libpq sends a Terminate message) would end the
      session the parent still uses. That is at most ``size`` objects per fork generation.
    """

    def __init__(
        self,
        open_runner: Callable[[], R],
        size: int,
        timeout: float,
        server: str,
        lost: Callable[[BaseException], bool] = lambda exc: False,
        describe: Optional[Callable[[], str]] = None,
    ) -> None:
        self._open_runner = open_runner
        self.size = size
        self.timeout = timeout
        self.server = server  # named in the exhaustion error: "MySQL", "PostgreSQL"
        self._lost = lost
        self._describe = describe or (lambda: server)
        self._inherited: List[R] = []  # from the parent process: never touched
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._idle: List[R] = []
        self._live: List[R] = []  # open in this process, idle or busy
        self._slots = 0  # live runners plus connects in flight
        self._waiting = 0
        self._generation = 0
        self.pid = os.getpid()

    def _after_fork(self) -> None:
        inherited = self._live
        self._reset()
        self._inherited += inherited
        _never_free(inherited)

    @property
    def waiting(self) -> int:
        """Callers waiting for a connection."""
        return self._waiting

    @property
    def open_count(self) -> int:
        """How many connections this process has open (or is opening) from this pool."""
        return self._slots

    def take(self) -> R:
        """An idle runner, or a new one (a new connection) while fewer than ``size`` are open;
        else wait for one to come back."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._slots >= self.size:
                runner = self._wait()
                if runner is not None:
                    return runner
            self._slots += 1
            generation = self._generation
        try:
            runner = self._open_runner()
        except BaseException:
            with self._lock:
                self._slots -= 1
                if self._waiting:
                    self._freed.notify()
            raise
        runner.generation = generation
        with self._lock:
            self._live.append(runner)
        return runner

    def _wait(self) -> Optional[R]:
        """With the lock held: wait until a runner is idle (return it) or a slot is free
        (return None); raise after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        self._waiting += 1
        try:
            while not self._idle and self._slots >= self.size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StorePoolExhaustedError(
                        f"all {self.size} {self.server} connections of the pool stayed busy "
                        f"for {self.timeout:g} s (raise pool_size, or look for slow statements)"
                    )
                self._freed.wait(remaining)
        finally:
            self._waiting -= 1
        return self._idle.pop() if self._idle else None

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(runner, *args)`` on a pooled runner and give it back. A runner that raised
        is discarded; after a lost connection (an error ``lost`` says is one, e.g. the server
        restarted) the idle ones are closed too and ``fn`` runs once more on a new one (the
        stores' statements are idempotent for their owner token, so the retry is safe)."""
        for attempt in (1, 2):
            runner = self.take()
            try:
                result = fn(runner, *args)
            except BaseException as exc:
                self.discard(runner)
                if attempt == 2 or not isinstance(exc, Exception) or not self._lost(exc):
                    raise
                logger.warning("%s: connection failed (%s); reconnecting", self._describe(), exc)
                self.drain()
                continue
            self.give(runner)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def give(self, runner: R) -> None:
        """Return a runner whose operation succeeded."""
        with self._lock:
            if runner.generation == self._generation and runner.pid == self.pid:
                runner.idle_since = time.monotonic()
                self._idle.append(runner)
                if self._waiting:
                    self._freed.notify()
                return
        self.discard(runner)  # opened before close() or before a fork

    def discard(self, runner: R) -> None:
        """Drop a runner that failed (or is stale) and close its connection, unless it was
        inherited from the parent process."""
        with self._lock:
            if runner.pid != self.pid:
                return  # the parent's: stays in _inherited, never closed here
            try:
                self._live.remove(runner)
            except ValueError:  # already dropped by drain() or close()
                return
            self._slots -= 1
            if self._waiting:
                self._freed.notify()
        runner.close()

    def drain(self) -> None:
        """Close the idle connections (after a lost connection: they are most likely lost
        too, e.g. the server restarted). Busy ones are judged by their own operations."""
        with self._lock:
            idle, self._idle = self._idle, []
            for runner in idle:
                self._live.remove(runner)
            self._slots -= len(idle)
            if self._waiting:
                self._freed.notify_all()
        for runner in idle:
            runner.close()

    def close(self) -> None:
        """Close every idle connection now and every busy one when it comes back. The pool
        stays usable: the next :meth:`take` opens a new connection."""
        with self._lock:
            self._generation += 1
        self.drain()


def _never_free(objects: List[Any]) -> None:
    """Keep ``objects`` alive until the process ends, interpreter shutdown included: one
    reference more than anything will ever drop. Freeing a connection inherited across
    ``fork()`` would close it for the parent too (mysqlclient's dealloc sends COM_QUIT,
    mysql-connector-python's socket shuts the TCP connection down, psycopg's sends libpq's
    Terminate), and a list alone is cleared when the child exits normally."""
    if not objects:
        return
    try:
        import ctypes  # only in a forked child that inherited connections
    except ImportError:  # pragma: no cover - a Python built without ctypes
        logger.warning("no ctypes: connections inherited across fork() may close at exit")
        return
    incref = ctypes.pythonapi.Py_IncRef
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    for obj in objects:
        incref(obj)


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
