"""Lease renewal: keeps the CONSUMING claims of handlers that are still running alive.

A claim's lease (``dedup_processing_expire_milli_seconds``) bounds how long a crashed consumer
blocks its message. A handler that legitimately runs longer than the lease would lose its
claim and let a duplicate run beside it; the :class:`LeaseKeeper` prevents that by extending,
every third of a lease, the leases of the claims whose handlers are still running, up to
``max_processing_milli_seconds`` after the claim (RocketMQ's own consume timeout is 15
minutes). A crashed process renews nothing, so its claims still lapse one lease after the
crash. Renewal is compare-and-extend: a claim already taken over is never touched.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import DedupStore

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews the leases of held claims from one daemon thread (started on first use).

    :param store: where the claims live.
    :param lease_ms: the lease each renewal grants, in milliseconds.
    :param max_processing_ms: no renewal past this long after the claim, in milliseconds.
    """

    def __init__(self, store: DedupStore, lease_ms: int, max_processing_ms: int) -> None:
        self.store = store
        self.lease_ms = lease_ms
        self.max_processing_ms = max_processing_ms
        self._held: Dict[str, Tuple[DedupElement, float]] = {}  # owner -> element, give-up time
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def hold(self, elements: List[DedupElement], owners: List[str]) -> None:
        """Start renewing these claims until :meth:`drop`."""
        give_up = time.monotonic() + self.max_processing_ms / 1000
        with self._lock:
            for element, owner in zip(elements, owners):
                self._held[owner] = (element, give_up)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rocketmq-dedup-lease-keeper", daemon=True
                )
                self._thread.start()

    def drop(self, owners: List[str]) -> None:
        """Stop renewing these claims (the handler finished)."""
        with self._lock:
            for owner in owners:
                self._held.pop(owner, None)

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
        try:
            renewed = self.store.renew_many(
                [element for _, (element, _) in held], [owner for owner, _ in held], self.lease_ms
            )
        except StoreError as exc:
            logger.warning("could not renew %d lease(s): %s", len(held), exc)
            return 0
        with self._lock:  # a claim dropped meanwhile was marked or released: not lost
            lost = [o for (o, _), ok in zip(held, renewed) if not ok and o in self._held]
        if lost:
            logger.warning("%d claim(s) were taken over before their renewal", len(lost))
            self.drop(lost)
        return len(held) - len(lost)

    def _run(self) -> None:
        interval = self.lease_ms / 3000
        while True:
            time.sleep(interval)
            try:
                self.renew_now()
            except Exception:  # the keeper must survive anything
                logger.exception("lease renewal failed")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._held = {}
        self._thread = None
