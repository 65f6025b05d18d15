"""Lease renewal: keeps the CONSUMING claims of handlers that are still running alive.

A claim's lease (``dedup_processing_expire_milli_seconds``) bounds how long a crashed consumer
blocks its message. A handler that legitimately runs longer than the lease would lose its
claim and let a duplicate run beside it; the :class:`LeaseKeeper` prevents that by extending,
every third of a lease, the leases of the claims whose handlers are still running, up to
``max_processing_milli_seconds`` after the claim (RocketMQ's own consume timeout is 15
minutes). A crashed process renews nothing, so its claims still lapse one lease after the
crash. Renewal is compare-and-extend: a claim already taken over is never touched.

Each held claim carries its own lease and give-up time, so one keeper serves a strategy for
its whole life: a setting changed while messages flow applies to the claims made after it.

The renewal thread runs only while there is work: it exits after a renewal interval with
nothing held, when the keeper is closed, and when the keeper is garbage-collected (the thread
holds only a weak reference to it), so dropped listeners leave no thread behind.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.stores.base import Claim, DedupStore

logger = logging.getLogger(__name__)

#: Called after each renewal round: (renewed, lost, seconds the store calls took, whether they
#: succeeded).
RenewalCallback = Callable[[int, int, float, bool], None]

#: A held claim: its lease (ms) and when renewal gives up on it (time.monotonic()).
_Held = Tuple[Claim, int, float]


class LeaseKeeper:
    """Renews the leases of held claims from a daemon thread (started when a claim is held).

    :param store: where the claims live.
    :param on_renewal: told the outcome of each renewal round (for metrics).
    """

    def __init__(self, store: DedupStore, on_renewal: Optional[RenewalCallback] = None) -> None:
        self.store = store
        self.on_renewal = on_renewal
        self._held: Dict[str, _Held] = {}  # by owner token
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._interval = 0.0  # the renewal thread's current wait, seconds
        #: The shortest lease the running thread's interval serves (a third of it); infinite
        #: while no thread runs, so that a hold of any lease starts one (:meth:`_serve`).
        self._served_lease_ms = math.inf
        self._wake = threading.Event()  # a shorter lease arrived, or the keeper closed
        self._stop = threading.Event()
        weakref.finalize(self, _stop_thread, self._stop, self._wake)
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    @property
    def running(self) -> bool:
        """True while the renewal thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def hold(self, claims: Sequence[Claim], lease_ms: int, max_processing_ms: int) -> None:
        """Start renewing these claims, each to ``lease_ms``, until :meth:`drop` or until
        ``max_processing_ms`` from now."""
        give_up = time.monotonic() + max_processing_ms / 1000
        held = self._held
        for claim in claims:
            held[claim.owner] = (claim, lease_ms, give_up)  # a dict store: atomic under the GIL
        if lease_ms < self._served_lease_ms:
            self._serve(lease_ms)

    def hold_one(self, claim: Claim, lease_ms: int, max_processing_ms: int) -> None:
        """:meth:`hold` of one claim (the single-message path, without its loop)."""
        self._held[claim.owner] = (claim, lease_ms, time.monotonic() + max_processing_ms / 1000)
        if lease_ms < self._served_lease_ms:
            self._serve(lease_ms)

    def _serve(self, lease_ms: int) -> None:
        """Have a renewal thread serve a lease of ``lease_ms``: start one, or wake it to wait a
        third of this shorter lease. The claim is already held: a thread that is ending sees it
        (:meth:`_next_wait`), or its end is seen here."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None:
                self._interval, self._served_lease_ms = lease_ms / 3000, lease_ms
                self._thread = threading.Thread(
                    target=_renewal_loop,
                    args=(weakref.ref(self), self._stop, self._wake),
                    name="rocketmq-dedup-lease-keeper",
                    daemon=True,
                )
                self._thread.start()
            elif lease_ms < self._served_lease_ms:
                self._interval, self._served_lease_ms = lease_ms / 3000, lease_ms
                self._wake.set()

    def drop(self, claims: Sequence[Claim]) -> None:
        """Stop renewing these claims (the handler finished, or gave up)."""
        pop = self._held.pop
        for claim in claims:
            pop(claim.owner, None)

    def drop_one(self, claim: Claim) -> None:
        """:meth:`drop` of one claim (the single-message path, without its loop)."""
        self._held.pop(claim.owner, None)

    def close(self) -> None:
        """Stop renewing anything and end the thread (a later :meth:`hold` renews nothing)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            self._held.clear()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def renew_now(self) -> int:
        """Renew every held claim once; return how many were still owned. Run by the thread
        every third of the shortest lease held; public for tests and operators."""
        now = time.monotonic()
        with self._lock:
            expired = [o for o, (_, _, give_up) in list(self._held.items()) if give_up <= now]
            for owner in expired:
                claim, _, _ = self._held.pop(owner)
                logger.warning(
                    "%r has been processing for over max_processing_milli_seconds; no longer "
                    "renewing its lease",
                    claim.element,
                )
            by_lease: Dict[int, List[Claim]] = {}
            for claim, lease_ms, _ in list(self._held.values()):
                by_lease.setdefault(lease_ms, []).append(claim)
        if not by_lease:
            return 0
        begin = time.perf_counter()
        renewed = lost = 0
        try:
            for lease_ms, claims in by_lease.items():
                results = self.store.renew_many(claims, lease_ms)
                gone = [c for c, ok in zip(claims, results, strict=True) if not ok]
                renewed += len(claims) - len(gone)
                # a claim dropped meanwhile was marked or released: not lost
                gone = [c for c in gone if c.owner in self._held]
                if gone:
                    logger.warning("%d claim(s) were taken over before their renewal", len(gone))
                    self.drop(gone)
                lost += len(gone)
        except StoreError as exc:
            held = sum(map(len, by_lease.values()))
            logger.warning("could not renew %d lease(s): %s", held, exc)
            self._report(renewed, lost, begin, False)
            return renewed
        self._report(renewed, lost, begin, True)
        return renewed

    def _report(self, renewed: int, lost: int, begin: float, ok: bool) -> None:
        if self.on_renewal is not None:
            try:
                self.on_renewal(renewed, lost, time.perf_counter() - begin, ok)
            except Exception:
                logger.exception("the renewal report failed; ignored")

    def _next_wait(self) -> Optional[float]:
        """Called by the thread after a renewal: the wait until the next one (a third of the
        shortest lease held), or None when nothing is held (the thread then ends and the
        next :meth:`hold` starts a new one)."""
        with self._lock:
            # hold() adds claims without the lock, then starts a thread if it sees none served:
            # so the thread gives up its place first and looks again, and a claim added
            # meanwhile is either seen here or sees no thread there.
            self._thread, self._served_lease_ms = None, math.inf
            if not self._held:
                return None
            self._thread = threading.current_thread()
            shortest = min(lease for _, lease, _ in list(self._held.values()))
            self._interval, self._served_lease_ms = shortest / 3000, shortest
            return self._interval


def _renewal_loop(
    ref: weakref.ref[LeaseKeeper], stop: threading.Event, wake: threading.Event
) -> None:
    """The renewal thread: holds the keeper only while renewing, so a dropped keeper is freed."""
    keeper = ref()
    if keeper is None:
        return
    wait: Optional[float] = keeper._interval
    del keeper
    while wait is not None:
        woken = wake.wait(wait)
        if stop.is_set():
            return
        keeper = ref()
        if keeper is None:
            return
        if woken:  # a shorter lease: wait again, for its interval
            wake.clear()
            wait = keeper._interval
            del keeper
            continue
        try:
            keeper.renew_now()
        except Exception:  # the keeper must survive anything
            logger.exception("lease renewal failed")
        wait = keeper._next_wait()
        del keeper


def _stop_thread(stop: threading.Event, wake: threading.Event) -> None:
    stop.set()
    wake.set()


def _after_fork(ref: weakref.ref[LeaseKeeper]) -> None:
    """In a forked child no renewal thread runs and no claim of the parent is held."""
    keeper = ref()
    if keeper is not None:
        keeper._lock = threading.Lock()
        keeper._held = {}
        keeper._thread, keeper._served_lease_ms = None, math.inf
        keeper._wake = threading.Event()
