"""An in-process store: for unit tests, samples and single-process tools. Thread-safe."""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import (
    CLAIMED,
    Claim,
    ClaimResult,
    PerElementStore,
    Record,
    refused_by,
)
from rocketmq_dedup.stores.operations import OperatedStore, StoreStats, records_stats

#: A record: (state, owner, expires at in clock seconds, lapsed claims, reason), kept under its
#: element's fields as a plain tuple. None holds anything the cyclic GC tracks (ints, str, float,
#: None; a tuple of str), so the GC stops walking a record after its first collection: kept as a
#: DedupElement and a DedupStatus, every record stayed tracked, and the collections walking a
#: large store cost 0.9 us per fresh message (memory_fresh, about a sixth of it).
_Entry = Tuple[int, str, float, int, Optional[str]]
_Key = Tuple[str, str, str, str]
#: The state of an entry (its first field): 0 CONSUMING (false: the one unsettled state).
_CONSUMING, _CONSUMED, _FAILED = 0, 1, 2
_STATUS = (DedupStatus.CONSUMING, DedupStatus.CONSUMED, DedupStatus.FAILED)


#: Expired records are swept when the store has grown by this many records since the last
#: sweep and has doubled: the size stays within twice the live records (plus this), at an
#: amortized cost of O(1) per claim.
SWEEP_MIN_GROWTH = 1024


class MemoryDedupStore(PerElementStore, OperatedStore):
    """Keeps records in a dict. Not shared between processes; records vanish on exit. Expired
    records are dropped as new ones arrive, so the size is bounded by the live records.

    :param clock: a monotonic clock in seconds; tests inject a fake one.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Keyed by plain tuples (``element[:]``); read with the element itself (the same hash
        # and equality), and a write to an existing record keeps its plain key.
        self._records: Dict[_Key, _Entry] = {}
        self._lock = threading.Lock()
        self._sweep_at = SWEEP_MIN_GROWTH

    def __len__(self) -> int:
        return len(self._records)

    def purge_expired(self) -> int:
        """Drop expired records; return how many were dropped."""
        now = self._clock()
        with self._lock:
            return self._sweep(now)

    def _sweep(self, now: float) -> int:
        """Drop expired records (holds the lock); the next sweep waits for twice the size."""
        dead = [e for e, entry in self._records.items() if entry[2] <= now]
        for element in dead:
            del self._records[element]
        self._sweep_at = 2 * len(self._records) + SWEEP_MIN_GROWTH
        return len(dead)

    def _live(self, element: DedupElement, now: float) -> Optional[_Entry]:
        """The live entry of ``element``; an expired one stays until it is taken over or swept
        (a lapsed claim's count lives in it)."""
        record = self._records.get(element)
        if record is not None and record[2] <= now:
            return None
        return record

    # The per-message methods take the lock with acquire/release: a ``with`` costs 0.1 us more.

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        element, owner = claim
        now = self._clock()
        records = self._records
        # A live record refuses the claim without the lock (a duplicate's path): one dict read
        # is atomic, and the answer is the one a locked read at that instant would give.
        entry = records.get(element)
        if entry is None or entry[2] <= now:
            lock = self._lock
            lock.acquire()
            try:
                entry = records.get(element)
                if entry is None:  # fresh
                    records[element[:]] = (_CONSUMING, owner, now + lease_ms / 1000, 0, None)
                    if len(records) >= self._sweep_at:
                        self._sweep(now)
                    return CLAIMED
                if entry[2] <= now:  # expired: taken over (a lapsed claim counts)
                    lapsed = entry[3] + 1 if entry[0] == _CONSUMING else 0
                    records[element] = (_CONSUMING, owner, now + lease_ms / 1000, lapsed, None)
                    return ClaimResult(True, None, lapsed) if lapsed else CLAIMED
            finally:
                lock.release()
        return refused_by(_STATUS[entry[0]], entry[1])

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        expires = self._clock() + retention_ms / 1000
        lock = self._lock
        lock.acquire()
        try:
            self._records[claim[0]] = (_CONSUMED, claim[1], expires, 0, None)
        finally:
            lock.release()

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        now = self._clock()
        with self._lock:
            entry = self._live(claim.element, now)
            if entry is None or entry[0] != _CONSUMED:
                entry = (_FAILED, claim.owner, now + retention_ms / 1000, 0, reason)
                self._records[claim.element] = entry

    def do_release(self, claim: Claim) -> bool:
        with self._lock:
            entry = self._live(claim.element, self._clock())
            if entry is not None and entry[0] == _CONSUMING and entry[1] == claim.owner:
                del self._records[claim.element]
                return True
        return False

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        results = []
        now = self._clock()
        with self._lock:
            for element, owner in claims:
                entry = self._live(element, now)
                if entry is None or entry[0] != _CONSUMING or entry[1] != owner:
                    results.append(False)
                    continue
                self._records[element] = (_CONSUMING, owner, now + lease_ms / 1000, entry[3], None)
                results.append(True)
        return results

    def do_read(self, element: DedupElement) -> Optional[Record]:
        now = self._clock()
        with self._lock:
            entry = self._live(element, now)
        return self._record(element, entry, now) if entry is not None else None

    # -- operator API --------------------------------------------------------------------

    @staticmethod
    def _record(element: _Key, entry: _Entry, now: float) -> Record:
        expires_in_ms = max(0, round((entry[2] - now) * 1000))
        element_ = DedupElement._make(element)
        return Record(_STATUS[entry[0]], entry[1], expires_in_ms, element_, entry[4])

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        with self._lock:
            entry = self._live(element, self._clock())
            if entry is None or (entry[0] != _CONSUMING and not force):
                return None
            del self._records[element]
        return _STATUS[entry[0]]

    def do_stats(self, application: str, limit: int) -> StoreStats:
        now = self._clock()
        with self._lock:
            records = [
                self._record(e, r, now)
                for e, r in self._records.items()
                if e[0] == application and r[2] > now
            ]
        return records_stats(records, limit)
