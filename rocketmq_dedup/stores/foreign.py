"""Adapts a user's duck-typed store object (``claim``/``mark_consumed``/``release``)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import Claim, ClaimResult, PerElementStore, Record

_REQUIRED = ("claim", "mark_consumed", "release")


def looks_like_store(obj: object) -> bool:
    """True if ``obj`` has the store interface's required methods."""
    return all(callable(getattr(obj, name, None)) for name in _REQUIRED)


class ForeignStore(PerElementStore):
    """Forwards to an object with ``claim(element, owner, lease_ms)``,
    ``mark_consumed(element, owner, retention_ms)``, ``release(element, owner) -> bool`` and,
    optionally, ``renew(element, owner, lease_ms) -> bool``, ``mark_failed(element, owner,
    retention_ms, reason)`` (FAILED records: without it a permanent failure is answered but not
    recorded), ``read(element) -> Optional[Record]`` (else ``get_status(element)``) and
    ``check()``. ``claim`` answers a :class:`ClaimResult`, or a tuple ``(claimed, status)`` or
    ``(claimed, status, owner)`` (``status``: the refusing record's :class:`DedupStatus`, None
    when unreadable). An outage is what it raises as ``ConnectionError``, ``TimeoutError`` (any
    ``OSError``) or :class:`~rocketmq_dedup.errors.StoreUnavailableError`; anything else it
    raises is a defect (the message is retried later, never consumed without dedup)."""

    outage_errors = (OSError,)

    def __init__(self, target: Any) -> None:
        self.target = target
        self.supports_renewal = callable(getattr(target, "renew", None))

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return [bool(self.target.renew(e, o, lease_ms)) for e, o in claims]

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return claim_result(self.target.claim(claim.element, claim.owner, lease_ms))

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self.target.mark_consumed(claim.element, claim.owner, retention_ms)

    def do_release(self, claim: Claim) -> bool:
        return bool(self.target.release(claim.element, claim.owner))

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        mark_failed = getattr(self.target, "mark_failed", None)
        if not callable(mark_failed):
            raise NotImplementedError(f"{self.describe()} has no mark_failed: FAILED not recorded")
        mark_failed(claim.element, claim.owner, retention_ms, reason)

    def do_read(self, element: DedupElement) -> Optional[Record]:
        reader = getattr(self.target, "read", None)
        if callable(reader):
            record: Optional[Record] = reader(element)
            return record
        getter = getattr(self.target, "get_status", None)
        status = getter(element) if callable(getter) else None
        return Record(_status(status), element=element) if status is not None else None

    def do_check(self) -> None:
        check = getattr(self.target, "check", None)
        if callable(check):
            check()

    def describe(self) -> str:
        return f"{type(self.target).__module__}.{type(self.target).__qualname__}"


def claim_result(answer: Any) -> ClaimResult:
    """A user store's claim answer as a :class:`ClaimResult`."""
    if isinstance(answer, ClaimResult):
        return answer
    fields = tuple(answer)
    if bool(fields[0]):
        return ClaimResult(True)
    status = fields[1] if len(fields) > 1 else None
    owner = fields[2] if len(fields) > 2 else None
    return ClaimResult(False, Record(_status(status), owner))


def _status(value: Any) -> Optional[DedupStatus]:
    """A user store's status as the enum; None (unreadable) for anything else."""
    try:
        return DedupStatus(value) if value is not None else None
    except ValueError:
        return None
