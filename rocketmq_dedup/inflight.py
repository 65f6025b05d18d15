"""The attempts this process is running right now, so that a twin in the same process (a
duplicate delivered while its first copy is in its handler here) need not go through the broker:
it is answered at once, or waits a bounded time for the first copy's outcome.

One :class:`InFlight` per record store (:func:`in_flight`), shared by every listener of that
store in the process. An attempt holds its key for at most its ``hold`` (the lease, or the
longest processing time with lease renewal): a twin arriving after that is not held back by it,
as a duplicate in another process would not be by a lapsed lease.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Dict, Hashable, Optional

_REGISTRIES: weakref.WeakKeyDictionary[Any, InFlight] = weakref.WeakKeyDictionary()
_REGISTRIES_LOCK = threading.Lock()


class Attempt:
    """One attempt at a message, from its start to its outcome."""

    __slots__ = ("deadline", "outcome", "waiters")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # time.monotonic() after which it no longer holds its key
        self.outcome: Optional[bool] = None  # True: consumed (committed); False: not
        self.waiters = 0


class InFlight:
    """Attempts by key (an element, or an owner token); thread-safe."""

    def __init__(self) -> None:
        self._attempts: Dict[Hashable, Attempt] = {}
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)

    def __len__(self) -> int:
        return len(self._attempts)

    def enter(self, key: Hashable, hold_ms: int) -> tuple[Optional[Attempt], Optional[Attempt]]:
        """Start an attempt at ``key``, unless another one holds it: returns ``(mine, None)``,
        or ``(None, twin)`` with the attempt still holding the key."""
        now = time.monotonic()
        with self._lock:
            twin = self._attempts.get(key)
            if twin is not None and twin.deadline > now:
                return None, twin
            mine = self._attempts[key] = Attempt(now + hold_ms / 1000)
        return mine, None

    def get(self, key: Hashable) -> Optional[Attempt]:
        """The attempt holding ``key``, if any."""
        return self._attempts.get(key)

    def leave(self, key: Hashable, attempt: Attempt, consumed: bool) -> None:
        """End ``attempt`` with its outcome; its waiting twins are woken."""
        with self._lock:
            attempt.outcome = consumed
            if self._attempts.get(key) is attempt:
                del self._attempts[key]
            if attempt.waiters:
                self._ended.notify_all()

    def wait(self, attempt: Attempt, timeout_ms: int) -> Optional[bool]:
        """Wait up to ``timeout_ms`` (and never past the attempt's deadline) for its outcome:
        True consumed, False not, None still running."""
        deadline = min(time.monotonic() + timeout_ms / 1000, attempt.deadline)
        with self._lock:
            attempt.waiters += 1
            try:
                while attempt.outcome is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ended.wait(left)
            finally:
                attempt.waiters -= 1
            return attempt.outcome


def in_flight(store: Any) -> InFlight:
    """The registry of ``store`` in this process (made on first use)."""
    registry = _REGISTRIES.get(store)
    if registry is None:
        with _REGISTRIES_LOCK:
            registry = _REGISTRIES.get(store)
            if registry is None:
                registry = _REGISTRIES[store] = InFlight()
    return registry


def _after_fork_in_child() -> None:
    """A forked child runs none of its parent's attempts: every registry starts empty."""
    global _REGISTRIES_LOCK
    _REGISTRIES_LOCK = threading.Lock()
    for registry in list(_REGISTRIES.values()):
        registry.__init__()  # type: ignore[misc]


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
