"""What operators ask of a store: the command line's ``check``, ``inspect``, ``release`` and
``stats``, and the DLQ tools' look-ups (:mod:`rocketmq_dedup.cli`). An API apart from the record
contract the strategies call (:class:`~rocketmq_dedup.stores.base.DedupStore`: claim, mark,
release, renew, read): the listener never calls it, a store written for the listener alone
needs none of it, and the server stores (Redis, MySQL, PostgreSQL) and the memory store
implement both. The purge of expired rows is a third face, of the SQL stores only
(:class:`~rocketmq_dedup.stores.purge.PurgeableStore`).

As in :class:`~rocketmq_dedup.stores.base.DedupStore`, the public methods wrap errors once and a
store implements the ``do_*`` hooks.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, TypeVar

from rocketmq_dedup.errors import StoreError, StoreMisconfiguredError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import PROBE_APPLICATION, DedupStore, Record

T = TypeVar("T")


class StoreStats(NamedTuple):
    """Live records of one application, by status, its longest-held claims, and its oldest
    CONSUMED record."""

    counts: Dict[str, int]
    """Records by status (``CONSUMING``, ``CONSUMED``; ``other`` for unreadable values)."""
    oldest_claims: List[Record]
    """CONSUMING records, longest held first (claims made by this library carry their time)."""
    oldest_consumed: Optional[Record] = None
    """The CONSUMED record with the least time left (the oldest, when every record has the
    same retention: its age is the retention less its time left, or its owner token's time);
    None when there is none."""


class Diagnosis(NamedTuple):
    """One check of ``rocketmq-dedup check``."""

    name: str
    ok: bool
    detail: str
    warning: bool = False
    """Passed, but names a setting that puts records at risk (a Redis that evicts keys)."""


class StoreOperations(abc.ABC):
    """The operator API of a store (module docstring). Mixed into a
    :class:`~rocketmq_dedup.stores.base.DedupStore`, whose reads, error wrapping and write
    probe it uses."""

    #: Whether :meth:`prove_writes` probes the store (``DedupStore.proves_writes``).
    proves_writes: bool

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the records live (``DedupStore.describe``)."""

    @abc.abstractmethod
    def read(self, element: DedupElement) -> Optional[Record]:
        """The live record of ``element`` (``DedupStore.read``)."""

    @abc.abstractmethod
    def read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        """The live records of several elements (``DedupStore.read_many``)."""

    @abc.abstractmethod
    def prove_writes(self, application: str = PROBE_APPLICATION) -> None:
        """The write probe (``DedupStore.prove_writes``)."""

    @abc.abstractmethod
    def do_check(self) -> None:
        """One round trip to the server (``DedupStore.do_check``)."""

    @abc.abstractmethod
    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, its errors wrapped once (``DedupStore._call``)."""

    # -- the operator API --------------------------------------------------------------------

    def delete(self, element: DedupElement, force: bool = False) -> Optional[DedupStatus]:
        """Delete the live record of ``element`` if it is CONSUMING (a stuck claim; any owner),
        or whatever it is with ``force``. Returns the status of the record deleted, or None
        when nothing was deleted (no record; or CONSUMED without ``force``)."""
        return self._call(self.do_delete, element, force)

    def stats(self, application: str, limit: int = 10) -> StoreStats:
        """Live records of ``application`` by status, and its ``limit`` longest-held claims."""
        return self._call(self.do_stats, application, limit)

    def diagnose(self, application: str = PROBE_APPLICATION) -> List[Diagnosis]:
        """Checks of the server and the features this store uses (version, scripts, table
        layout, round-trip time) and, when they pass, of its writes
        (:meth:`prove_writes` in ``application``'s key space), for ``rocketmq-dedup check``."""
        checks = self._call(self.do_diagnose)
        # (after a failed check, e.g. a missing table, the probe would only repeat it)
        if self.proves_writes and all(check.ok for check in checks):
            checks.append(self._writes_diagnosis(application))
        return checks

    def _writes_diagnosis(self, application: str) -> Diagnosis:
        try:
            self.prove_writes(application)
        except StoreMisconfiguredError as exc:
            return Diagnosis("writes", False, f"{exc.fix} ({exc.__cause__ or exc})")
        except StoreError as exc:
            return Diagnosis("writes", False, str(exc.__cause__ or exc))
        return Diagnosis("writes", True, "claimed, renewed, read and released probe records")

    # -- I/O hooks -----------------------------------------------------------------------------

    @abc.abstractmethod
    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]: ...

    @abc.abstractmethod
    def do_stats(self, application: str, limit: int) -> StoreStats: ...

    def do_diagnose(self) -> List[Diagnosis]:
        begin = time.perf_counter()
        self.do_check()
        return [Diagnosis("reachable", True, round_trip(time.perf_counter() - begin))]


class OperatedStore(DedupStore, StoreOperations):
    """A record store with the operator API: the Redis, MySQL, PostgreSQL and memory stores
    (what the command line opens)."""


def round_trip(seconds: float) -> str:
    """A round-trip time for a diagnosis line."""
    return f"round trip {seconds * 1000:.2f} ms"


def oldest_claims(records: List[Record], limit: int) -> List[Record]:
    """The CONSUMING records among ``records``, longest held first (then least time left)."""
    claims = [r for r in records if r.status is DedupStatus.CONSUMING]
    claims.sort(key=lambda r: (claimed_at(r.owner or "") or float("inf"), r.expires_in_ms or 0))
    return claims[:limit]


def oldest_consumed(records: List[Record]) -> Optional[Record]:
    """The CONSUMED record among ``records`` with the least time left, or None."""
    consumed = [r for r in records if r.status is DedupStatus.CONSUMED]
    return min(consumed, key=lambda r: r.expires_in_ms or 0, default=None)


def records_stats(records: List[Record], limit: int) -> StoreStats:
    """:class:`StoreStats` of the listed ``records`` of one application (the stores that list
    every record: Redis, memory)."""
    return StoreStats(
        count_statuses(records), oldest_claims(records, limit), oldest_consumed(records)
    )


def count_statuses(records: List[Record]) -> Dict[str, int]:
    """Records by status value (``other`` for unreadable ones)."""
    counts: Dict[str, int] = {}
    for record in records:
        name = record.status.value if record.status is not None else "other"
        counts[name] = counts.get(name, 0) + 1
    return counts
