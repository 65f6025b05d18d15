"""The listener's strategies, for one call: :class:`CallStrategy` (claim, the caller's work,
CONSUMED or release: :class:`~rocketmq_dedup.strategy.plain.ClaimStrategy`'s steps) and
:class:`CallTransactionStrategy` (the exactly-once template of
:class:`~rocketmq_dedup.strategy.exactly_once.TransactionalStrategy`). No decision of their own:
the key, claim, settle and report steps, the payload check, store failures and lease renewal
are the listeners'. What they add is what a call needs that a message does not: the decision
kept on the :class:`CallDelivery` (with the store error that made it) for the caller to read,
the work done between two steps (a ``with`` body) instead of by the strategy, and a bounded wait
for a key in progress, here or in another process.

Their asyncio twins (an ``async with`` block, an ``async def``): :class:`AsyncCallStrategy` (the
asyncio listener's steps) and :class:`AsyncCallTransactionStrategy` (the exactly-once steps for
one call, awaited on the asyncio transaction port, on the same decisions:
:class:`~rocketmq_dedup.strategy.exactly_once.TransactionDecisions`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from rocketmq_dedup.aio.meter import async_meter
from rocketmq_dedup.aio.strategy import AsyncClaimStrategy, outcome_of, shielded
from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import StoreError, TransactionMisuseError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.status import ConsumeStatus, DedupStatus, ExactlyOnceClaim, Outcome
from rocketmq_dedup.stores.aio import AsyncDedupStore
from rocketmq_dedup.stores.base import Claim, Record
from rocketmq_dedup.stores.transaction import AsyncTransaction, AsyncTransactionSource
from rocketmq_dedup.strategy.base import Delivery
from rocketmq_dedup.strategy.exactly_once import (
    TransactionalStrategy,
    TransactionDecisions,
    hold_seconds,
)
from rocketmq_dedup.strategy.plain import ClaimStrategy
from rocketmq_dedup.strategy.rules import LATER, SUCCESS

#: The first pause of the wait for a key in progress (seconds); each next one is twice as
#: long, up to :data:`MAX_POLL_S`: the store is asked again after each.
FIRST_POLL_S = 0.01
MAX_POLL_S = 0.5


class CallDelivery(Delivery):
    """A call on its way through the steps: a :class:`Delivery` that also keeps what the
    caller needs to know: the record that refused it, the store error that decided it, the
    snapshot it was decided with and when its work began."""

    record: Optional[Record] = None
    """The live record of another attempt that refused the claim."""
    store_error: Optional[StoreError] = None
    """The store's error, when the store could not decide."""
    snap: Optional[Snapshot] = None
    begun: float = 0.0


class CallDecisions:
    """What both call strategies keep of a decision (mixed into a strategy)."""

    def _store_failed(self, deliveries: List[Delivery], exc: StoreError, snap: Snapshot) -> None:
        for delivery in deliveries:
            if isinstance(delivery, CallDelivery):
                delivery.store_error = exc
        super()._store_failed(deliveries, exc, snap)  # type: ignore[misc]

    def _duplicate_status(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> Optional[ConsumeStatus]:
        if isinstance(delivery, CallDelivery):
            delivery.record = record
        status: Optional[ConsumeStatus] = super()._duplicate_status(  # type: ignore[misc]
            delivery, record, snap
        )
        return status


def worked(delivery: CallDelivery, ok: bool) -> Tuple[Snapshot, Optional[Claim]]:
    """The work of a call ended (``ok``: succeeded): its time and, when a claim is held, its
    outcome kept on the delivery; the snapshot it was decided with, and the claim to settle."""
    snap = delivery.snap
    assert snap is not None
    delivery.handler_seconds = snap.meter.clock() - delivery.begun
    claim = delivery.claim
    if claim is not None:
        delivery.outcome = Outcome.CONSUMED if ok else Outcome.FAILED
    return snap, claim


def wait_budget(snap: Snapshot, wait_ms: Optional[int]) -> float:
    """The deadline (``time.monotonic()``) of the wait for a key in progress: the call's own
    ``in_progress_wait_milli_seconds``, else the config's."""
    ms = snap.in_progress_wait_ms if wait_ms is None else wait_ms
    return time.monotonic() + ms / 1000


def pause_before_retry(deadline: float, pause: float) -> Optional[float]:
    """Sleep ``pause`` (at most until ``deadline``) and return the next pause; None (no
    sleep) when the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    time.sleep(min(pause, left))
    return min(pause * 2, MAX_POLL_S)


class CallStrategy(CallDecisions, ClaimStrategy):
    """The plain listener's steps for one call, split where the caller's work goes:
    :meth:`begin` (key, claim: held, or decided) and :meth:`end` (settle: CONSUMED or
    release; report)."""

    def begin(self, delivery: CallDelivery, wait_ms: Optional[int] = None) -> None:
        """Key and claim; a key in progress is asked again, with growing pauses, until the
        wait ends. A delivery decided here (``delivery.status`` set) is reported at once; one
        to run (``status`` None) is reported by :meth:`end`."""
        snap = delivery.snap = self.config.snapshot()
        delivery.started = snap.meter.arrival()
        try:
            if self._key(delivery, snap):
                self._claim_one(delivery, snap)
                if delivery.outcome is Outcome.DUPLICATE_IN_PROGRESS:
                    self._wait_for_twin(delivery, snap, wait_budget(snap, wait_ms))
        except BaseException:
            self._abandon(delivery, snap)
            raise
        parked = delivery.claim if delivery.failure is not None else None
        if parked is not None:  # parked (max_lapsed_claims): recorded FAILED, nothing runs
            delivery.claim = None
            self._settle_one(delivery, parked, False, snap)
        if delivery.status is not None:
            snap.meter.report_one(delivery)
        else:
            delivery.begun = snap.meter.clock()

    def _wait_for_twin(self, delivery: CallDelivery, snap: Snapshot, deadline: float) -> None:
        """Claim again until the key is free (its holder failed, or its lease lapsed), recorded
        (a CONSUMED duplicate), or the deadline passes."""
        pause: Optional[float] = FIRST_POLL_S
        while delivery.outcome is Outcome.DUPLICATE_IN_PROGRESS:
            pause = pause_before_retry(deadline, pause)  # type: ignore[arg-type]
            if pause is None:
                return
            delivery.status = delivery.outcome = delivery.record = None
            self._claim_one(delivery, snap)

    def end(self, delivery: CallDelivery, ok: bool) -> None:
        """The work ended (``ok``: it succeeded): settle the claim held (CONSUMED, or
        released so a later call runs again) and report the decision. Never raises a
        StoreError (a failed mark or release is logged, as for a message)."""
        snap, claim = worked(delivery, ok)
        try:
            if claim is not None:
                self._settle_one(delivery, claim, ok, snap)
        finally:
            snap.meter.report_one(delivery)

    def _abandon(self, delivery: CallDelivery, snap: Snapshot) -> None:
        """An interrupt between the claim and the work: the claim is released."""
        claim = delivery.claim
        if claim is not None:
            self._settle_one(delivery, claim, False, snap)


class CallTransactionDecisions(CallDecisions, TransactionDecisions):
    """What both exactly-once call strategies (sync and asyncio) keep of a decision, and the
    snapshot a call is decided with."""

    def __init__(self) -> None:
        """(After the decisions' own ``__init__``.)"""
        #: By the call's wait: (the config's snapshot, the call's made from it).
        self._snaps: Dict[int, Tuple[Snapshot, Snapshot]] = {}
        self._snaps_lock = threading.Lock()

    def _call_snapshot(self, wait_ms: Optional[int]) -> Snapshot:
        """The config's snapshot without local retries (and with the call's wait for a twin
        in this process), made once per settings change."""
        snap = self.config.snapshot()
        wait = snap.in_progress_wait_ms if wait_ms is None else wait_ms
        if not snap.local_retries and wait == snap.in_progress_wait_ms:
            return snap
        with self._snaps_lock:
            made = self._snaps.get(wait)
            if made is None or made[0] is not snap:
                if len(self._snaps) >= 64:
                    self._snaps.clear()
                call_snap = dataclasses.replace(snap, local_retries=0, in_progress_wait_ms=wait)
                made = self._snaps[wait] = (snap, call_snap)
        return made[1]

    def _transaction_failed(self, delivery: Delivery, exc: StoreError) -> None:
        if isinstance(delivery, CallDelivery):
            delivery.store_error = exc
        super()._transaction_failed(delivery, exc)


class CallTransactionStrategy(CallTransactionDecisions, TransactionalStrategy):
    """The exactly-once template for one call: the function runs in the message's place (its
    connection first), and the caller reads the decision from the :class:`CallDelivery`. Local
    retries do not apply to calls (a caller runs the call again if it wants)."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        TransactionalStrategy.__init__(self, config, hooks)
        CallTransactionDecisions.__init__(self)

    def decide(self, delivery: CallDelivery, wait_ms: Optional[int] = None) -> None:
        """The template's steps for ``delivery``; a key in progress (a twin here, or the key's
        lock held elsewhere with ``exactly_once_claim="before_handler"``) is tried again with
        growing pauses until the wait ends."""
        snap = delivery.snap = self._call_snapshot(wait_ms)
        deadline = wait_budget(snap, wait_ms)
        pause: Optional[float] = FIRST_POLL_S
        while True:
            delivery.started = snap.meter.arrival()
            self._consume_deliveries([delivery], snap)
            if delivery.outcome is not Outcome.DUPLICATE_IN_PROGRESS:
                return
            pause = pause_before_retry(deadline, pause)  # type: ignore[arg-type]
            if pause is None:
                return
            delivery.status = delivery.outcome = delivery.record = None


class AsyncCallTransactionStrategy(CallTransactionDecisions):
    """:class:`CallTransactionStrategy` for an ``async def``, on an asyncio store's
    transactions (:class:`~rocketmq_dedup.stores.transaction.AsyncTransactionSource`): the same
    steps and decisions (:class:`~rocketmq_dedup.strategy.exactly_once.TransactionDecisions`),
    each store call and the function awaited on the event loop; the wait for a key in progress
    (a twin here, or another process's lock) sleeps with asyncio.sleep. The transaction is
    closed (rolled back if still open, its connection given back) shielded from cancellation:
    a cancelled call commits nothing, unless its COMMIT was already sent."""

    def __init__(self, config: DedupConfig, hooks: Hooks, transactions: Any) -> None:
        assert config.async_store is not None
        self.store: AsyncDedupStore = config.async_store
        TransactionDecisions.__init__(self, config, hooks, self.store)
        CallTransactionDecisions.__init__(self)
        self.transactions: AsyncTransactionSource = transactions

    async def decide(self, delivery: CallDelivery, wait_ms: Optional[int] = None) -> None:
        """:meth:`CallTransactionStrategy.decide`, awaited."""
        await self.config.check_async_store()
        snap = delivery.snap = self._call_snapshot(wait_ms)
        deadline = wait_budget(snap, wait_ms)
        pause = FIRST_POLL_S
        while True:
            delivery.started = snap.meter.arrival()
            await self._decide_once(delivery, snap)
            left = deadline - time.monotonic()
            if delivery.outcome is not Outcome.DUPLICATE_IN_PROGRESS or left <= 0:
                return
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, MAX_POLL_S)
            delivery.status = delivery.outcome = delivery.record = None

    async def _decide_once(self, delivery: CallDelivery, snap: Snapshot) -> None:
        """The template's steps for one call: key, the in-process registry (and a look-up of a
        likely duplicate), the transaction, leaving the registry, the report."""
        held: List[Delivery] = []
        try:
            if self._key(delivery, snap):
                held = await self._claim(delivery, snap)
            if delivery.status is None:
                delivery.status = await self._transact(delivery, snap)
        finally:
            if held:
                self._finish(held, [], snap)
            snap.meter.report_one(delivery)

    async def _claim(self, delivery: CallDelivery, snap: Snapshot) -> List[Delivery]:
        """:meth:`TransactionalStrategy._claim` for one call: a twin in this process is waited
        for by looking at its outcome (never blocking the loop)."""
        mine, twin = self._in_flight.enter(delivery.element, snap.hold_ms)
        if twin is not None:
            consumed = None
            if snap.in_progress_wait_ms:
                consumed = await outcome_of(twin, snap.in_progress_wait_ms)
            self._twin_answer(delivery, consumed, snap)
            return []
        delivery.attempt = mine
        if self._suspect(delivery):
            meter = async_meter(snap.meter)
            try:
                record = await meter.store_call(StoreOp.LOOKUP, self.store.read, delivery.element)
            except StoreError as exc:
                self._store_failed([delivery], exc, snap)
                return [delivery]
            if record is not None:
                delivery.status = self._refused(delivery, record, snap)
        return [delivery]

    async def _transact(self, delivery: CallDelivery, snap: Snapshot) -> ConsumeStatus:
        """:meth:`TransactionalStrategy._transact` for one call (no sequence key)."""
        try:
            tx = await self.transactions.begin(hold_seconds(snap))
        except StoreError as exc:
            self._transaction_failed(delivery, exc)
            return LATER
        try:
            return await self._in_transaction(delivery, tx, snap)
        except TransactionMisuseError as exc:  # found at the commit
            return self._misused(delivery, str(exc))
        except StoreError as exc:  # a statement of the dedup layer failed
            self._transaction_failed(delivery, exc)
            return await self._after_failure(delivery, snap)
        finally:
            await shielded(tx.close())

    async def _in_transaction(
        self, delivery: CallDelivery, tx: AsyncTransaction, snap: Snapshot
    ) -> ConsumeStatus:
        """:meth:`TransactionalStrategy._in_transaction` for one call: [the key, before the
        function], the function, the record with the COMMIT."""
        element = delivery.element
        if element is not None and snap.exactly_once_claim is ExactlyOnceClaim.BEFORE_HANDLER:
            key = await tx.claim_key(element)
            if not key.taken:
                return self._duplicate(delivery, DedupStatus.CONSUMING, snap)
            if key.record is not None:
                return self._refused(delivery, key.record, snap)
        await tx.before_handler()
        status = await self._handle(delivery, tx, snap)
        if status is not SUCCESS:
            return status
        if element is None:  # no dedup key: the function's writes alone
            await tx.commit()
            return SUCCESS
        owner = self._owner(delivery)
        refused = await async_meter(snap.meter).store_call(
            StoreOp.COMMIT, tx.commit_record, element, owner, snap.retention_ms
        )
        return self._record_committed(delivery, tx, element, refused, False, snap)

    async def _handle(
        self, delivery: CallDelivery, tx: AsyncTransaction, snap: Snapshot
    ) -> ConsumeStatus:
        """The function in the transaction (:class:`~rocketmq_dedup.once.call.AsyncCallRunner`
        keeps what it returned or raised on the call): its answer, or LATER when it raised or
        broke the transaction."""
        begin = time.perf_counter() if snap.metrics is not None else 0.0
        try:
            result = await tx.run_handler(self.hooks.listener.do_handle_msg, delivery.msg)
        finally:
            if snap.metrics is not None:
                delivery.handler_seconds = time.perf_counter() - begin
        misuse = await tx.misuse()
        if misuse is not None:
            return self._misused(delivery, f"do_handle_msg {misuse}")
        return self._handler_status(delivery, result)

    async def _after_failure(self, delivery: CallDelivery, snap: Snapshot) -> ConsumeStatus:
        """:meth:`TransactionalStrategy._after_failure`: the key's record read again."""
        if delivery.element is None:
            return LATER
        try:
            record = await async_meter(snap.meter).store_call(
                StoreOp.LOOKUP, self.store.read, delivery.element
            )
        except StoreError:
            return LATER
        return self._found_after_failure(delivery, record, snap)

    async def aclose(self) -> None:
        """Nothing runs in the background (the transactions are the store's, closed with it)."""


class AsyncCallStrategy(CallDecisions, AsyncClaimStrategy):
    """:class:`CallStrategy` on an asyncio store: the asyncio listener's steps for one call,
    split where the caller's work goes (``async with config.once(key)``, an ``async def``
    under :func:`~rocketmq_dedup.deduplicated`)."""

    async def begin(self, delivery: CallDelivery, wait_ms: Optional[int] = None) -> None:
        """Key and claim (the wait for a key in progress sleeps with asyncio.sleep);
        :meth:`CallStrategy.begin`."""
        await self.config.check_async_store()
        snap = delivery.snap = self.config.snapshot()
        delivery.started = snap.meter.arrival()
        meter = async_meter(snap.meter)
        try:
            if self._key(delivery, snap):
                await self._claim_one(delivery, snap, meter)
                deadline = wait_budget(snap, wait_ms)
                pause = FIRST_POLL_S
                while delivery.outcome is Outcome.DUPLICATE_IN_PROGRESS:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    await asyncio.sleep(min(pause, left))
                    pause = min(pause * 2, MAX_POLL_S)
                    delivery.status = delivery.outcome = delivery.record = None
                    await self._claim_one(delivery, snap, meter)
        except BaseException:
            claim = delivery.claim
            if claim is not None:
                await shielded(self._settle_one(delivery, claim, False, snap))
            raise
        parked = delivery.claim if delivery.failure is not None else None
        if parked is not None:  # parked (max_lapsed_claims): recorded FAILED, nothing runs
            delivery.claim = None
            await shielded(self._settle_one(delivery, parked, False, snap))
        if delivery.status is not None:
            snap.meter.report_one(delivery)
        else:
            delivery.begun = snap.meter.clock()

    async def end(self, delivery: CallDelivery, ok: bool) -> None:
        """:meth:`CallStrategy.end`, the settle step shielded from cancellation."""
        snap, claim = worked(delivery, ok)
        try:
            if claim is not None:
                await shielded(self._settle_one(delivery, claim, ok, snap))
        finally:
            snap.meter.report_one(delivery)


__all__ = [
    "AsyncCallStrategy",
    "AsyncCallTransactionStrategy",
    "CallDelivery",
    "CallStrategy",
    "CallTransactionStrategy",
]
