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
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Type, TypeVar

from rocketmq_dedup.errors import DedupError, StoreError, StoreUnavailableError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import DedupStatus

T = TypeVar("T")


class ClaimResult(NamedTuple):
    """The outcome of a claim."""

    claimed: bool
    """True when this caller now owns a CONSUMING record for the element."""
    status: Optional[DedupStatus]
    """When not claimed: the live record's status (None if the store holds a value it does
    not understand, e.g. written by another program)."""


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
        return [self.do_claim(e, o, lease_ms) for e, o in zip(elements, owners)]

    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        for element, owner in zip(elements, owners):
            self.do_mark_consumed(element, owner, retention_ms)

    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        return sum(self.do_release(e, o) for e, o in zip(elements, owners))


def parse_status(value: Optional[str]) -> Optional[DedupStatus]:
    """Map a stored status text (``CONSUMING``, ``CONSUMED``, optionally ``:owner``) to the enum."""
    if not value:
        return None
    if value.startswith("CONSUMED"):
        return DedupStatus.CONSUMED
    if value.startswith("CONSUMING"):
        return DedupStatus.CONSUMING
    return None
