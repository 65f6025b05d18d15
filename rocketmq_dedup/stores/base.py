"""The abstract record store: the I/O the dedup strategy needs, and nothing else.

Decisions (what a status means, what to do on failure) live in :mod:`rocketmq_dedup.strategy`;
a concrete store only implements the ``do_*`` hooks. The public methods wrap every error once:
an outage (what :meth:`DedupStore.is_outage` says) becomes
:class:`~rocketmq_dedup.errors.StoreUnavailableError`, anything else (a missing table, a bug)
:class:`~rocketmq_dedup.errors.StoreError`, with the original chained as ``__cause__``.

Contract every store honours (tested in ``tests/test_store_contract.py``):

* ``claim`` is atomic: it either creates a CONSUMING record owned by ``owner`` (or takes over
  an expired one) and reports ``claimed=True``, or reports the live record's status. There is
  no window in which a vanished record lets two claimers both win.
* ``mark_consumed`` always leaves a CONSUMED record that lives ``retention_ms``, whoever owned
  the claim (a success is never lost, and a CONSUMED record is never downgraded).
* ``release`` deletes the record only if it is still a CONSUMING claim owned by ``owner``;
  ``renew_many`` extends a lease under the same condition.
"""

from __future__ import annotations

import abc
import time
from typing import (
    Any,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
)

from rocketmq_dedup.errors import DedupError, StoreError, StoreUnavailableError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.owner import claimed_at
from rocketmq_dedup.status import DedupStatus

T = TypeVar("T")


class ClaimResult(NamedTuple):
    """The outcome of a claim."""

    claimed: bool
    """True when this caller now owns a CONSUMING record for the element."""
    status: Optional[DedupStatus]
    """When not claimed: the live record's status (None if the store holds a value it does
    not understand, e.g. written by another program)."""
    holder: Optional[str] = None
    """When not claimed: the owner token that wrote the live record, if the store reports it
    (the payload check compares fingerprints through it)."""


class RecordInfo(NamedTuple):
    """A live record, as an operator sees it (``rocketmq-dedup inspect``/``stats``)."""

    element: DedupElement
    """Its element; on MySQL the readable columns (the first 255 characters of each field)."""
    status: Optional[DedupStatus]
    """None when the store holds a value this library does not understand."""
    owner: str
    """The owner token of the claim that wrote it."""
    expires_in_ms: Optional[int]
    """Time left before the lease or the retention ends; None when it never expires."""


class StoreStats(NamedTuple):
    """Live records of one application, by status, and its longest-held claims."""

    counts: Dict[str, int]
    """Records by status (``CONSUMING``, ``CONSUMED``; ``other`` for unreadable values)."""
    oldest_claims: List[RecordInfo]
    """CONSUMING records, longest held first (claims made by this library carry their time)."""


class Diagnosis(NamedTuple):
    """One check of ``rocketmq-dedup check``."""

    name: str
    ok: bool
    detail: str


CLAIMED = ClaimResult(True, DedupStatus.CONSUMING)
HELD_BY_OTHER = ClaimResult(False, DedupStatus.CONSUMING)
ALREADY_CONSUMED = ClaimResult(False, DedupStatus.CONSUMED)


class DedupStore(abc.ABC):
    """Base class of the record stores (Redis, MySQL, memory)."""

    #: Exceptions of the underlying driver that mean "the store is unavailable" (an outage).
    outage_errors: Tuple[Type[BaseException], ...] = ()

    # -- public API: wraps driver errors -------------------------------------------------

    def claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        """Atomically claim ``element`` for ``owner`` for ``lease_ms`` milliseconds."""
        return self._call(self.do_claim, element, owner, lease_ms)

    def claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]:
        """Claim several elements at once (one result per element, same order)."""
        if len(elements) == 1:  # stores have cheaper single-element paths
            return [self._call(self.do_claim, elements[0], owners[0], lease_ms)]
        if not elements:
            return []
        return self._call(self.do_claim_many, elements, owners, lease_ms)

    def mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        """Record ``element`` as CONSUMED for ``retention_ms`` milliseconds."""
        self._call(self.do_mark_consumed, element, owner, retention_ms)

    def mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        """Record several elements as CONSUMED at once."""
        if len(elements) == 1:
            self._call(self.do_mark_consumed, elements[0], owners[0], retention_ms)
        elif elements:
            self._call(self.do_mark_consumed_many, elements, owners, retention_ms)

    def release(self, element: DedupElement, owner: str) -> bool:
        """Delete ``owner``'s CONSUMING claim; return False if it is no longer ``owner``'s."""
        return self._call(self.do_release, element, owner)

    def release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        """Release several claims; return how many were still owned and got deleted."""
        if len(elements) == 1:
            return int(self._call(self.do_release, elements[0], owners[0]))
        if not elements:
            return 0
        return self._call(self.do_release_many, elements, owners)

    #: Whether :meth:`renew_many` works (lease renewal is skipped otherwise).
    supports_renewal = True

    def renew_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[bool]:
        """Extend each claim still CONSUMING by its owner to ``lease_ms`` from now; return,
        per claim, whether it was still owned."""
        if not elements:
            return []
        return self._call(self.do_renew_many, elements, owners, lease_ms)

    def get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        """The live record's status, or None when there is none (for operators and tests)."""
        return self._call(self.do_get_status, element)

    def check(self) -> None:
        """One round trip that proves the store is reachable and usable (Redis: PING; MySQL:
        connect and ``SELECT 1``). Raises :class:`StoreError`."""
        self._call(self.do_check)

    # -- operator API (the CLI) ---------------------------------------------------------

    def inspect(self, element: DedupElement) -> Optional[RecordInfo]:
        """The live record of ``element``, or None."""
        return self._call(self.do_inspect, element)

    def delete(self, element: DedupElement, force: bool = False) -> Optional[DedupStatus]:
        """Delete the live record of ``element`` if it is CONSUMING (a stuck claim; any owner),
        or whatever it is with ``force``. Returns the status of the record deleted, or None
        when nothing was deleted (no record; or CONSUMED without ``force``)."""
        return self._call(self.do_delete, element, force)

    def stats(self, application: str, limit: int = 10) -> StoreStats:
        """Live records of ``application`` by status, and its ``limit`` longest-held claims."""
        return self._call(self.do_stats, application, limit)

    def diagnose(self) -> List[Diagnosis]:
        """Checks of the server and the features this store uses (version, scripts, table
        layout, round-trip time), for ``rocketmq-dedup check``."""
        return self._call(self.do_diagnose)

    def describe(self) -> str:
        """Where the records live, for messages (an address; never a password)."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release client resources the store created itself (never the user's client)."""

    def is_outage(self, exc: BaseException) -> bool:
        """True if ``exc`` means the store is unavailable (an outage), not a defect."""
        return isinstance(exc, self.outage_errors)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except DedupError:
            raise
        except Exception as exc:
            kind = StoreUnavailableError if self.is_outage(exc) else StoreError
            raise kind(f"{self.describe()}: {type(exc).__name__}: {exc}") from exc

    # -- I/O hooks -----------------------------------------------------------------------
    # The single-element hooks default to the batch ones; stores override them when one
    # element can be done cheaper.

    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        return self.do_claim_many([element], [owner], lease_ms)[0]

    @abc.abstractmethod
    def do_claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]: ...

    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        self.do_mark_consumed_many([element], [owner], retention_ms)

    @abc.abstractmethod
    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None: ...

    def do_release(self, element: DedupElement, owner: str) -> bool:
        return self.do_release_many([element], [owner]) == 1

    @abc.abstractmethod
    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int: ...

    @abc.abstractmethod
    def do_renew_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[bool]: ...

    @abc.abstractmethod
    def do_get_status(self, element: DedupElement) -> Optional[DedupStatus]: ...

    def do_check(self) -> None:  # noqa: B027 - optional hook
        """Prove the store is reachable; the default has nothing to check."""

    def do_inspect(self, element: DedupElement) -> Optional[RecordInfo]:
        raise NotImplementedError(f"{type(self).__name__} cannot inspect records")

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        raise NotImplementedError(f"{type(self).__name__} cannot delete records")

    def do_stats(self, application: str, limit: int) -> StoreStats:
        raise NotImplementedError(f"{type(self).__name__} cannot list records")

    def do_diagnose(self) -> List[Diagnosis]:
        begin = time.perf_counter()
        self.do_check()
        return [Diagnosis("reachable", True, round_trip(time.perf_counter() - begin))]


class PerElementStore(DedupStore):
    """A store whose batch hooks loop over its single-element hooks (memory, user stores):
    implement ``do_claim``, ``do_mark_consumed`` and ``do_release``."""

    @abc.abstractmethod
    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult: ...

    @abc.abstractmethod
    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None: ...

    @abc.abstractmethod
    def do_release(self, element: DedupElement, owner: str) -> bool: ...

    def do_claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]:
        return [self.do_claim(e, o, lease_ms) for e, o in zip(elements, owners, strict=True)]

    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        for element, owner in zip(elements, owners, strict=True):
            self.do_mark_consumed(element, owner, retention_ms)

    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        return sum(self.do_release(e, o) for e, o in zip(elements, owners, strict=True))


def round_trip(seconds: float) -> str:
    """A round-trip time for a diagnosis line."""
    return f"round trip {seconds * 1000:.2f} ms"


def oldest_claims(records: List[RecordInfo], limit: int) -> List[RecordInfo]:
    """The CONSUMING records among ``records``, longest held first (then least time left)."""
    claims = [r for r in records if r.status is DedupStatus.CONSUMING]
    claims.sort(key=lambda r: (claimed_at(r.owner) or float("inf"), r.expires_in_ms or 0))
    return claims[:limit]


def count_statuses(records: List[RecordInfo]) -> Dict[str, int]:
    """Records by status value (``other`` for unreadable ones)."""
    counts: Dict[str, int] = {}
    for record in records:
        name = record.status.value if record.status is not None else "other"
        counts[name] = counts.get(name, 0) + 1
    return counts


def parse_status(value: Optional[str]) -> Optional[DedupStatus]:
    """Map a stored status text (``CONSUMING``, ``CONSUMED``, optionally ``:owner``) to the enum."""
    if not value:
        return None
    if value.startswith("CONSUMED"):
        return DedupStatus.CONSUMED
    if value.startswith("CONSUMING"):
        return DedupStatus.CONSUMING
    return None
