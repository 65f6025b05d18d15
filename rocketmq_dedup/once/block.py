"""``with config.once(key) as run: if run: ...``: a block of work done once per key, on the
listener's stores, leases, owner tokens, payload check and metrics (:class:`Once`).

The decisions are the listener's, for a block instead of a handler::

    fresh key                -> run is truthy: the body does the work; leaving the block
                                normally marks the key CONSUMED, an exception releases it (a
                                later block runs again) and propagates; the lease is renewed
                                while the body runs
    CONSUMED key             -> run is falsy (run.status is DedupStatus.CONSUMED): skip the work
    key in progress          -> asked again, with growing pauses, for up to
                                in_progress_wait_milli_seconds (the block's, else the config's);
                                then DuplicateInProgressError from the with statement
    key None / ""            -> run is truthy, without dedup (run.dedup is False)
    key refused              -> DedupKeyError when the block is made
    another payload          -> payload_mismatch="warn": the duplicate it claims to be;
                                "reject": PayloadMismatchError
    store unavailable        -> store_failure_policy: "consume" runs without dedup (truthy,
                                run.dedup False); "reconsume_later": the StoreUnavailableError
    store refused or failed  -> the StoreError (never a run without dedup)
    dedup disabled           -> truthy, without dedup

A with statement cannot skip its body, so the body must test ``run`` before the work. A body
that ran for a duplicate without testing it is a :class:`~rocketmq_dedup.errors.DedupUsageError`
when the block ends (the work was done twice: loud rather than silent), and a fresh key's body
that never tested it is logged as a WARNING (the same code would redo the work on a duplicate).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, Optional, Type

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import (
    DedupUsageError,
    DuplicateError,
    DuplicateInProgressError,
    PayloadMismatchError,
    StoreError,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.once.call import DEFAULT_ONCE_TOPIC, Call
from rocketmq_dedup.once.registry import async_strategy, plain_strategy
from rocketmq_dedup.once.strategy import CallDelivery
from rocketmq_dedup.status import DedupStatus, Outcome, PayloadMismatch

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)


class Once:
    """One block of work done once per key (module docstring). Made by
    :meth:`DedupConfig.once <rocketmq_dedup.DedupConfig.once>`; entered once.

    ``bool(run)`` (or :attr:`fresh`): True when this block must do the work. :attr:`status`:
    the record that made it a duplicate (``DedupStatus.CONSUMED``), else None. :attr:`dedup`:
    whether the work is deduplicated (False: no key, dedup disabled, or a store outage under
    ``store_failure_policy="consume"``). :attr:`element`: the record's element (None without
    a key)."""

    __slots__ = (
        "_call",
        "_config",
        "_consulted",
        "_delivery",
        "_entered",
        "_fresh",
        "_strategy",
        "_wait_ms",
    )

    def __init__(
        self,
        config: Any,
        key: Any,
        *,
        topic: str = DEFAULT_ONCE_TOPIC,
        tag: str = "",
        payload: Any = None,
        in_progress_wait_milli_seconds: Optional[float] = None,
    ) -> None:
        self._config = config
        self._call = Call(key, topic, tag, payload)
        self._wait_ms = wait_ms_of(in_progress_wait_milli_seconds)
        self._delivery: Optional[CallDelivery] = None
        self._strategy: Any = None  # the call strategy that took the block (once entered)
        self._entered = self._consulted = self._fresh = False

    # -- the decision --------------------------------------------------------------------

    @property
    def fresh(self) -> bool:
        """True when this block does the work (a fresh key, or no dedup); False for a
        duplicate of a CONSUMED key."""
        self._consulted = True
        return self._fresh

    def __bool__(self) -> bool:
        return self.fresh

    @property
    def status(self) -> Optional[DedupStatus]:
        """``DedupStatus.CONSUMED`` for a duplicate; None when this block does the work."""
        self._consulted = True
        record = self._delivery.record if self._delivery is not None else None
        return None if self._fresh or record is None else record.status

    @property
    def dedup(self) -> bool:
        """Whether the work is deduplicated: a claim is held for it, or it is a duplicate."""
        delivery = self._delivery
        return delivery is not None and (delivery.claim is not None or not self._fresh)

    @property
    def element(self) -> Optional[DedupElement]:
        """The element of the block's record (application, topic, tag, key)."""
        return self._delivery.element if self._delivery is not None else None

    # -- the block -----------------------------------------------------------------------

    def __enter__(self) -> Once:
        delivery = self._enter(plain_strategy)
        if delivery is not None:
            self._strategy.begin(delivery, self._wait_ms)
            self._decided(delivery)
        return self

    def _enter(self, strategy_of: Any) -> Optional[CallDelivery]:
        """Enter once; the delivery to begin (None with dedup disabled: fresh, no store)."""
        if self._entered:
            raise DedupUsageError("a Once block is entered once: make a new one per block")
        self._entered = True
        self._strategy = strategy_of(self._config)
        if self._strategy is None:  # dedup disabled
            self._fresh = True
            return None
        delivery = self._delivery = CallDelivery(0, self._call)
        return delivery

    def _decided(self, delivery: CallDelivery) -> None:
        """Fresh (to run) or a CONSUMED duplicate; else the error of :func:`raise_for`."""
        self._fresh = delivery.status is None or raise_for(delivery)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        delivery = self._delivery
        if delivery is None:
            return
        if self._fresh and delivery.status is None:
            self._strategy.end(delivery, exc_type is None)
        self._check_consulted(exc_type)

    def _check_consulted(self, exc_type: Optional[Type[BaseException]]) -> None:
        """A body that never tested ``run``: a WARNING (fresh) or :class:`DedupUsageError` (a
        duplicate whose work was done again); never over the body's own exception."""
        if self._delivery is None or self._consulted or exc_type is not None:
            return
        if self._fresh:
            _log.log(
                logging.WARNING,
                "the body of `with config.once(%r)` never tested its `run` value: on a "
                "duplicate it would do its work again; write `if run:` before the work",
                self._call.key,
            )
        else:
            raise DedupUsageError(
                f"the body of `with config.once({self._call.key!r}) as run:` ran for a duplicate "
                "(the key is CONSUMED) without testing `run`, so its work was done again: "
                "write `if run:` before the work"
            )

    # -- the block, awaited (an asyncio store) ---------------------------------------------

    async def __aenter__(self) -> Once:
        delivery = self._enter(async_strategy)
        if delivery is not None:
            await self._strategy.begin(delivery, self._wait_ms)
            self._decided(delivery)
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        delivery = self._delivery
        if delivery is not None and self._fresh and delivery.status is None:
            await self._strategy.end(delivery, exc_type is None)
        self._check_consulted(exc_type)

    def __repr__(self) -> str:
        decided = "not entered" if not self._entered else ("fresh" if self._fresh else "duplicate")
        return f"Once({self._call!r}, {decided})"


def wait_ms_of(value: Optional[float]) -> Optional[int]:
    """A call's ``in_progress_wait_milli_seconds`` checked as the config checks its own (None:
    the config's)."""
    if value is None:
        return None
    from rocketmq_dedup.config import DedupConfig

    checked: int = DedupConfig.in_progress_wait_milli_seconds.check(
        "in_progress_wait_milli_seconds", value
    )
    return checked


def raise_for(delivery: CallDelivery) -> bool:
    """A call decided without running: False for a duplicate of a CONSUMED key (True for one
    decided to run without dedup); else the error that tells the caller why nothing ran."""
    outcome, record, snap = delivery.outcome, delivery.record, delivery.snap
    if outcome is Outcome.STORE_ERROR_CONSUMED:
        return True
    if outcome is Outcome.PAYLOAD_MISMATCH:
        if snap is not None and snap.payload_mismatch is PayloadMismatch.REJECT:
            raise PayloadMismatchError(
                f"{delivery.element!r} has a record of a call with another payload "
                "(payload_mismatch='reject')",
                delivery.element,
                record,
            )
        consumed = record is not None and record.status is DedupStatus.CONSUMED
        outcome = Outcome.DUPLICATE_CONSUMED if consumed else Outcome.DUPLICATE_IN_PROGRESS
    if outcome is Outcome.DUPLICATE_CONSUMED:
        return False
    if outcome is Outcome.DUPLICATE_IN_PROGRESS:
        left = ""
        if record is not None and record.expires_in_ms:
            left = f", {record.expires_in_ms} ms left on its lease"
        raise DuplicateInProgressError(
            f"{delivery.element!r} is in progress in another call (CONSUMING{left})",
            delivery.element,
            record,
        )
    if outcome in (Outcome.DUPLICATE_FAILED, Outcome.POISON_PARKED):
        failed = record.reason if record is not None and record.reason else delivery.failure
        raise DuplicateError(
            f"{delivery.element!r} is FAILED ({failed or 'no reason recorded'}): it can never "
            "succeed (a PermanentFailure, or parked by max_lapsed_claims); nothing ran",
            delivery.element,
            record,
        )
    if delivery.store_error is not None:
        raise delivery.store_error
    raise StoreError(
        f"{delivery.element!r}: its record could not be read by this library ({outcome}); "
        "nothing ran"
    )
