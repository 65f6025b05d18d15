"""Lease renewal: keeps the CONSUMING claims of handlers that are still running alive.

A claim's lease (``dedup_processing_expire_milli_seconds``) bounds how long a crashed consumer
blocks its message. A handler that legitimately runs longer than the lease would lose its
claim and let a duplicate run beside it; the :class:`LeaseKeeper` prevents that by extending,
every third of a lease, the leases of the claims whose handlers are still running, up to
``max_processing_milli_seconds`` after the claim (RocketMQ's own consume timeout is 15
minutes). A crashed process renews nothing, so its claims still lapse one lease after the
crash. Renewal is compare-and-extend: a claim already taken over is never touched.

The renewal thread runs only while there is work: it exits after a renewal interval with
nothing held, when the keeper is closed, and when the keeper is garbage-collected (the thread
holds only a weak reference to it), so dropped listeners leave no thread behind.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import DedupStore

logger = logging.getLogger(__name__)

#: Called after each renewal round: (renewed, lost, seconds the store call took, whether it
#: succeeded).
RenewalCallback = Callable[[int, int, float, bool], None]


class LeaseKeeper:
    """Renews the leases of held claims from a daemon thread (started when a claim is held).

    :param store: where the claims live.
    :param lease_ms: the lease each renewal grants, in milliseconds.
    :param max_processing_ms: no renewal past this long after the claim, in milliseconds.
    :param on_renewal: told the outcome of each renewal round (for metrics).
    """

    def __init__(
        self,
        store: DedupStore,
        lease_ms: int,
        max_processing_ms: int,
        on_renewal: Optional[RenewalCallback] = None,
    ) -> None:
        self.store = store
        self.on_renewal = on_renewal
        self.lease_ms = lease_ms
        self.max_processing_ms = max_processing_ms
        self._held: Dict[str, Tuple[DedupElement, float]] = {}  # owner -> element, give-up time
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        weakref.finalize(self, self._stop.set)  # wakes the thread of a dropped keeper
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    @property
    def running(self) -> bool:
        """True while the renewal thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def hold(self, elements: List[DedupElement], owners: List[str]) -> None:
        """Start renewing these claims until :meth:`drop`."""
        give_up = time.monotonic() + self.max_processing_ms / 1000
        with self._lock:
            for element, owner in zip(elements, owners, strict=True):
                self._held[owner] = (element, give_up)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=_renewal_loop,
                    args=(weakref.ref(self), self._stop, self.lease_ms / 3000),
                    name="rocketmq-dedup-lease-keeper",
                    daemon=True,
                )
                self._thread.start()

    def drop(self, owners: List[str]) -> None:
        """Stop renewing these claims (the handler finished, or gave up)."""
        with self._lock:
            for owner in owners:
                self._held.pop(owner, None)

    def close(self) -> None:
        """Stop renewing anything and end the thread (a later :meth:`hold` renews nothing)."""
        self._stop.set()
        with self._lock:
            self._held.clear()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def renew_now(self) -> int:
        """Renew every held claim once; return how many were still owned. Run by the thread
        every third of a lease; public for tests and operators."""
        now = time.monotonic()
        with self._lock:
            expired = [o for o, (_, give_up) in self._held.items() if give_up <= now]
            for owner in expired:
                element, _ = self._held.pop(owner)
                logger.warning(
                    "%r has been processing for over %d ms; no longer renewing its lease",
                    element,
                    self.max_processing_ms,
                )
            held = list(self._held.items())
        if not held:
            return 0
        begin = time.perf_counter()
        try:
            renewed = self.store.renew_many(
                [element for _, (element, _) in held], [owner for owner, _ in held], self.lease_ms
            )
        except StoreError as exc:
            logger.warning("could not renew %d lease(s): %s", len(held), exc)
            self._report(0, 0, begin, False)
            return 0
        with self._lock:  # a claim dropped meanwhile was marked or released: not lost
            lost = [
                o for (o, _), ok in zip(held, renewed, strict=True) if not ok and o in self._held
            ]
        if lost:
            logger.warning("%d claim(s) were taken over before their renewal", len(lost))
            self.drop(lost)
        self._report(sum(renewed), len(lost), begin, True)
        return len(held) - len(lost)

    def _report(self, renewed: int, lost: int, begin: float, ok: bool) -> None:
        if self.on_renewal is not None:
            try:
                self.on_renewal(renewed, lost, time.perf_counter() - begin, ok)
            except Exception:
                logger.exception("the renewal report failed; ignored")

    def _idle_exit(self) -> bool:
        """Called by the thread after a renewal: forget the thread and return True when
        nothing is held (the next :meth:`hold` starts a new one)."""
        with self._lock:
            if self._held:
                return False
            self._thread = None
            return True


def _renewal_loop(ref: weakref.ref[LeaseKeeper], stop: threading.Event, interval: float) -> None:
    """The renewal thread: holds the keeper only while renewing, so a dropped keeper is freed."""
    while not stop.wait(interval):
        keeper = ref()
        if keeper is None:
            return
        try:
            keeper.renew_now()
        except Exception:  # the keeper must survive anything
            logger.exception("lease renewal failed")
        if keeper._idle_exit():
            return
        del keeper


def _after_fork(ref: weakref.ref[LeaseKeeper]) -> None:
    """In a forked child no renewal thread runs and no claim of the parent is held."""
    keeper = ref()
    if keeper is not None:
        keeper._lock = threading.Lock()
        keeper._held = {}
        keeper._thread = None
