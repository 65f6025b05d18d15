"""Adapts a user's duck-typed store object (``claim``/``mark_consumed``/``release``)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import ClaimResult, PerElementStore

_REQUIRED = ("claim", "mark_consumed", "release")


def looks_like_store(obj: object) -> bool:
    """True if ``obj`` has the store interface's required methods."""
    return all(callable(getattr(obj, name, None)) for name in _REQUIRED)


class ForeignStore(PerElementStore):
    """Forwards to an object with ``claim(element, owner, lease_ms) -> ClaimResult``,
    ``mark_consumed(element, owner, retention_ms)``, ``release(element, owner) -> bool`` and,
    optionally, ``renew(element, owner, lease_ms) -> bool``, ``get_status(element)`` and
    ``check()``. An outage is what it raises as ``ConnectionError``, ``TimeoutError`` (any
    ``OSError``) or :class:`~rocketmq_dedup.errors.StoreUnavailableError`; anything else it
    raises is a defect (the message is retried later, never consumed without dedup)."""

    outage_errors = (OSError,)

    def __init__(self, target: Any) -> None:
        self.target = target
        self.supports_renewal = callable(getattr(target, "renew", None))

    def do_renew_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[bool]:
        return [
            bool(self.target.renew(e, o, lease_ms)) for e, o in zip(elements, owners, strict=True)
        ]

    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        result = tuple(self.target.claim(element, owner, lease_ms))
        holder = result[2] if len(result) > 2 else None  # a ClaimResult, or (claimed, status)
        return ClaimResult(bool(result[0]), result[1], holder)

    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        self.target.mark_consumed(element, owner, retention_ms)

    def do_release(self, element: DedupElement, owner: str) -> bool:
        return bool(self.target.release(element, owner))

    def do_get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        getter = getattr(self.target, "get_status", None)
        return getter(element) if callable(getter) else None

    def do_check(self) -> None:
        check = getattr(self.target, "check", None)
        if callable(check):
            check()

    def describe(self) -> str:
        return f"{type(self.target).__module__}.{type(self.target).__qualname__}"
