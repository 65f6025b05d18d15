"""The asyncio consume path: the listener's template (key, claim, run, settle, report) with its
store calls and the handler awaited, on the same decisions
(:class:`~rocketmq_dedup.strategy.base.DedupDecisions`: what a key, a refusing record, a store
failure, a hook that raises mean). Per message::

    key      the listener's rules (dedup_message_key, payload_fingerprint: plain functions)
    claim    awaited; a claim the caller stopped waiting for (cancelled) is released when its
             answer comes, never left CONSUMING
    run      await do_handle_msg(msg); its answer by the listener's rules; local retries wait
             with asyncio.sleep; a twin in its handler in this process is waited for by asking
             the in-process registry again (in_progress_wait_milli_seconds), never blocking;
             a PermanentFailure raised or returned, and a claim taken after
             max_lapsed_claims lapsed ones (parked, not run), as the sync path decides them
    settle   FAILED with its reason (a permanent failure, a parked message), CONSUMED or
             released, shielded from cancellation: a handler that finished is recorded even
             if its task is cancelled meanwhile; a cancelled handler's claim is released (its
             message never acked: the caller sees CancelledError)
    report   the snapshot's meter (its asyncio twin times the awaited store calls)

Lease renewal is the listener's :class:`~rocketmq_dedup.lease.LeaseKeeper`: its thread renews
through a :class:`~rocketmq_dedup.stores.aio.LoopBoundStore` (the renewal runs on the event
loop; the thread waits for it, the loop never waits for the thread).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence, Set

from rocketmq_dedup.aio.meter import AsyncMeter, async_meter
from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import PermanentFailure, StoreError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.inflight import InFlight, in_flight
from rocketmq_dedup.lease import LeaseKeeper, RenewalCallback
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.status import ConsumeStatus, DedupStatus
from rocketmq_dedup.stores.aio import AsyncDedupStore, LoopBoundStore
from rocketmq_dedup.stores.base import CLAIMED, Claim, ClaimResult, Record
from rocketmq_dedup.strategy.base import (
    BatchResult,
    DedupDecisions,
    Delivery,
    pass_through_answer,
)
from rocketmq_dedup.strategy.plain import HANDLED_OUTCOMES, _new_claim
from rocketmq_dedup.strategy.rules import LATER, SUCCESS, HandlerResult, answer

logger = logging.getLogger(__name__)

#: How often a twin waiting for another attempt in this process looks at its outcome.
TWIN_POLL_S = 0.005


async def run_handler(handler: Callable[[Any], Any], msg: Any) -> HandlerResult:
    """Await the user's handler and map its result (:func:`~rocketmq_dedup.strategy.rules.
    answer`). A :class:`PermanentFailure` it raises or returns is given back (the strategy
    records it); another ``Exception`` is logged and means RECONSUME_LATER; anything else (a
    CancelledError) propagates."""
    try:
        result = handler(msg)
        if inspect.isawaitable(result):
            result = await result
    except PermanentFailure as failure:
        return failure
    except Exception:
        logger.exception("do_handle_msg raised; the message will be consumed later")
        return LATER
    if result is True:
        return SUCCESS
    return result if isinstance(result, PermanentFailure) else answer(result)


async def retry_locally(
    attempt: Callable[[], Any], snap: Snapshot, result: HandlerResult
) -> HandlerResult:
    """:func:`rocketmq_dedup.strategy.base.retry_locally`, waiting with asyncio.sleep (a
    permanent failure ends the retries)."""
    backoff = snap.local_retry_backoff_ms / 1000
    for _ in range(snap.local_retries):
        if isinstance(result, PermanentFailure):
            break
        await asyncio.sleep(backoff)
        backoff *= 2
        result = await attempt()
        if result is SUCCESS:
            break
    return result


class AsyncStrategy:
    """How an asyncio listener consumes messages (the sync :class:`Strategy`'s entry points,
    awaited)."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    async def consume(
        self, msgs: Sequence[Any], stop_at_failure: bool = False
    ) -> List[ConsumeStatus]:
        raise NotImplementedError

    async def consume_one(self, msg: Any) -> ConsumeStatus:
        return (await self.consume((msg,)))[0]

    async def consume_batch(self, msgs: Sequence[Any]) -> BatchResult:
        statuses = await self.consume(list(msgs), stop_at_failure=True)
        consumed = next((i for i, s in enumerate(statuses) if s is not SUCCESS), len(statuses))
        return BatchResult(SUCCESS if consumed == len(statuses) else LATER, consumed - 1)

    async def aclose(self) -> None:
        """Stop background work (lease renewal)."""


class AsyncPassThroughStrategy(AsyncStrategy):
    """Dedup disabled: every message goes to the handler (local retries still apply)."""

    def __init__(self, hooks: Hooks, config: Optional[DedupConfig] = None) -> None:
        super().__init__(hooks)
        self.config = config

    async def consume(
        self, msgs: Sequence[Any], stop_at_failure: bool = False
    ) -> List[ConsumeStatus]:
        snap = self.config.snapshot() if self.config is not None else None
        statuses = [LATER] * len(msgs)
        for i, msg in enumerate(msgs):
            result = await run_handler(self.hooks.listener.do_handle_msg, msg)
            if result is not SUCCESS and snap is not None and snap.local_retries:
                again = functools.partial(run_handler, self.hooks.listener.do_handle_msg, msg)
                result = await retry_locally(again, snap, result)
            statuses[i] = status = pass_through_answer(result, snap)
            if stop_at_failure and status is not SUCCESS:
                break
        return statuses


class AsyncClaimStrategy(DedupDecisions, AsyncStrategy):
    """Claim, handler, then CONSUMED or release (module docstring), on an asyncio store."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        DedupDecisions.__init__(self, config, hooks)
        if config.async_store is None:
            raise ValueError(f"{type(self).__name__} needs a config with an asyncio store")
        self.store: AsyncDedupStore = config.async_store
        self._in_flight: InFlight = in_flight(self.store)
        self._keeper: Optional[LeaseKeeper] = None
        self._keeper_lock = threading.Lock()
        self._background: Set[asyncio.Future[Any]] = set()

    # -- one message ---------------------------------------------------------------------

    async def consume_one(self, msg: Any) -> ConsumeStatus:
        snap = self.config.snapshot()
        if snap.in_progress_wait_ms:
            return (await self.consume((msg,)))[0]
        meter = async_meter(snap.meter)
        delivery = Delivery(0, msg, snap.meter.arrival())
        try:
            if self._key(delivery, snap):
                await self._claim_one(delivery, snap, meter)
            status = delivery.status  # decided without the handler (a parked one still held)
            try:
                if status is None:
                    status = LATER
                    status = await self._run(delivery, snap)
            finally:  # whatever happened, the claim is not held past this call
                claim = delivery.claim
                if claim is not None:
                    await shielded(self._settle_one(delivery, claim, status is SUCCESS, snap))
            return status
        finally:
            snap.meter.report_one(delivery)

    async def _claim_one(self, delivery: Delivery, snap: Snapshot, meter: AsyncMeter) -> None:
        claim = _new_claim(delivery)
        try:
            result = await self._claimed(
                meter.claim(delivery, self.store, claim, snap.lease_ms), [claim]
            )
        except StoreError as exc:
            self._store_failed([delivery], exc, snap)
            return
        if not result.claimed:
            delivery.status = self._duplicate_status(delivery, result.record, snap)
            return
        delivery.claim = claim
        if result is not CLAIMED and result.lapsed and self._park(delivery, result.lapsed, snap):
            return  # held, to be recorded FAILED; its handler does not run
        self._hold([claim], snap)

    async def _claimed(self, claiming: Any, claims: List[Claim]) -> Any:
        """Await a claim; if the caller is cancelled meanwhile, the claims it took are
        released once the store answers (a cancelled message is never left CONSUMING)."""
        task = asyncio.ensure_future(claiming)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda done: self._release_abandoned(done, claims))
            raise

    def _release_abandoned(self, done: asyncio.Future[Any], claims: List[Claim]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        result = done.result()
        results: List[ClaimResult] = result if isinstance(result, list) else [result]
        taken = [c for c, r in zip(claims, results, strict=True) if r.claimed]
        if taken:
            task = asyncio.ensure_future(self._release_quietly(taken))
            self._background.add(task)  # kept until done (the loop holds tasks weakly)
            task.add_done_callback(self._background.discard)

    async def _release_quietly(self, claims: List[Claim]) -> None:
        try:
            await self.store.release_many(claims)
        except StoreError as exc:
            self._release_failed(len(claims), exc)

    async def _settle_one(
        self, delivery: Delivery, claim: Claim, consumed: bool, snap: Snapshot
    ) -> None:
        """FAILED if it can never succeed, CONSUMED if its handler succeeded, else the claim
        released. Never raises a StoreError."""
        if self._keeper is not None:
            self._keeper.drop_one(claim)
        if delivery.failure is not None:
            await self._record_failed(delivery, claim, snap)
            return
        meter = async_meter(snap.meter)
        if consumed:
            try:
                await meter.mark_consumed(delivery, self.store, claim, snap.retention_ms)
            except StoreError as exc:
                self._mark_failed(1, exc)
            return
        try:
            released = await meter.release(delivery, self.store, claim)
        except StoreError as exc:
            self._release_failed(1, exc)
            return
        self._released(1, int(released))

    # -- a batch -------------------------------------------------------------------------

    async def consume(
        self, msgs: Sequence[Any], stop_at_failure: bool = False
    ) -> List[ConsumeStatus]:
        snap = self.config.snapshot()
        started = snap.meter.arrival()
        deliveries = [Delivery(i, msg, started) for i, msg in enumerate(msgs)]
        keyed = [d for d in deliveries if self._key(d, snap)]
        held = await self._claim(keyed, snap) if keyed else []
        statuses: List[ConsumeStatus] = []
        try:
            for delivery in deliveries:
                status = delivery.status
                if status is None:
                    status = await self._run(delivery, snap)
                statuses.append(status)
                if stop_at_failure and status is not SUCCESS:
                    break
        finally:
            if held:
                await shielded(self._finish(held, statuses, snap))
            snap.meter.report(deliveries[: len(statuses)])
        if len(statuses) < len(deliveries):
            statuses += [LATER] * (len(deliveries) - len(statuses))
        return statuses

    async def _claim(self, keyed: List[Delivery], snap: Snapshot) -> List[Delivery]:
        claims = [_new_claim(d) for d in keyed]
        meter = async_meter(snap.meter)
        try:
            results = await self._claimed(
                meter.store_call(StoreOp.CLAIM, self.store.claim_many, claims, snap.lease_ms),
                claims,
            )
        except StoreError as exc:
            self._store_failed(keyed, exc, snap)
            return []
        held, running = [], []
        for delivery, claim, result in zip(keyed, claims, results, strict=True):
            if result.claimed:
                delivery.claim = claim
                held.append(delivery)
                if not (result.lapsed and self._park(delivery, result.lapsed, snap)):
                    running.append(delivery)
            else:
                delivery.status = await self._refused(delivery, result.record, snap)
        if running:
            if snap.in_progress_wait_ms:
                for delivery in running:
                    owner = delivery.claim.owner  # type: ignore[union-attr]
                    delivery.attempt, _ = self._in_flight.enter(owner, snap.hold_ms)
            self._hold([d.claim for d in running], snap)  # type: ignore[misc]
        return held

    async def _refused(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> Optional[ConsumeStatus]:
        """A refused claim; a twin in its handler in this process is waited for (polling the
        in-process registry) and the answer taken from its outcome."""
        if (
            snap.in_progress_wait_ms
            and record is not None
            and record.status is DedupStatus.CONSUMING
            and record.owner is not None
        ):
            twin = self._in_flight.get(record.owner)
            if twin is not None and await outcome_of(twin, snap.in_progress_wait_ms):
                record = record._replace(status=DedupStatus.CONSUMED)
        return self._duplicate_status(delivery, record, snap)

    async def _run(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        msg, clock = delivery.msg, snap.meter.clock
        handler = self.hooks.listener.do_handle_msg
        begin = clock()
        result = await run_handler(handler, msg)
        if result is not SUCCESS and snap.local_retries:
            result = await retry_locally(lambda: run_handler(handler, msg), snap, result)
        delivery.handler_seconds = clock() - begin
        if isinstance(result, PermanentFailure):  # (without a claim: nothing to record it in)
            return self._permanent_failure(delivery, result, snap)
        if delivery.claim is not None:
            delivery.outcome = HANDLED_OUTCOMES[result]
        return result

    async def _finish(
        self, held: List[Delivery], statuses: List[ConsumeStatus], snap: Snapshot
    ) -> None:
        if self._keeper is not None:
            self._keeper.drop([d.claim for d in held])  # type: ignore[misc]
        reached = len(statuses)
        for delivery in held:  # rare: one store call each, for its own reason
            if delivery.failure is not None:
                await self._record_failed(delivery, delivery.claim, snap)  # type: ignore[arg-type]
        consumed = [
            d.position < reached and statuses[d.position] is SUCCESS and d.failure is None
            for d in held
        ]
        done = [d.claim for d, ok in zip(held, consumed, strict=True) if ok]
        undone = [
            d.claim for d, ok in zip(held, consumed, strict=True) if not ok and d.failure is None
        ]
        meter = async_meter(snap.meter)
        if done:
            try:
                await meter.store_call(
                    StoreOp.MARK_CONSUMED, self.store.mark_consumed_many, done, snap.retention_ms
                )
            except StoreError as exc:
                self._mark_failed(len(done), exc)
        if undone:
            try:
                released = await meter.store_call(StoreOp.RELEASE, self.store.release_many, undone)
                self._released(len(undone), released)
            except StoreError as exc:
                self._release_failed(len(undone), exc)
        for delivery, ok in zip(held, consumed, strict=True):
            if delivery.attempt is not None:
                owner = delivery.claim.owner  # type: ignore[union-attr]
                self._in_flight.leave(owner, delivery.attempt, ok)

    async def _record_failed(self, delivery: Delivery, claim: Claim, snap: Snapshot) -> None:
        """:meth:`ClaimStrategy._record_failed`, awaited: the FAILED record with its reason;
        a failure is logged, the answer stays."""
        try:
            await async_meter(snap.meter).kept(
                delivery,
                StoreOp.MARK_FAILED,
                self.store.mark_failed,
                claim,
                snap.retention_ms,
                delivery.failure,
            )
        except StoreError as exc:
            self._failed_unrecorded(delivery, exc)

    # -- lease renewal -------------------------------------------------------------------

    def _hold(self, claims: List[Claim], snap: Snapshot) -> None:
        if snap.lease_renewal and self.store.supports_renewal:
            keeper = self._keeper or self._lease_keeper()
            keeper.hold(claims, snap.lease_ms, snap.max_processing_ms)

    def _lease_keeper(self) -> LeaseKeeper:
        """The keeper, made on the loop that runs the messages: its thread renews through
        that loop."""
        with self._keeper_lock:
            if self._keeper is None:
                bound = LoopBoundStore(self.store, asyncio.get_running_loop())
                self._keeper = LeaseKeeper(bound, self._renewal_callback())
            return self._keeper

    def _renewal_callback(self) -> RenewalCallback:
        ref = weakref.ref(self)

        def report(renewed: int, lost: int, seconds: float, ok: bool) -> None:
            strategy = ref()
            if strategy is not None:
                strategy.config.snapshot().meter.leases(renewed, lost, seconds, ok)

        return report

    async def aclose(self) -> None:
        """Stop lease renewal: the keeper's thread ends (joined off the loop: it may be
        waiting for a renewal the loop runs)."""
        with self._keeper_lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await asyncio.to_thread(keeper.close)


async def outcome_of(twin: Any, wait_ms: int) -> Optional[bool]:
    """The outcome of an attempt in this process (True: consumed), waited for up to
    ``wait_ms`` (and never past the attempt's own deadline) by looking again every
    :data:`TWIN_POLL_S`; None while it still runs."""
    loop = asyncio.get_running_loop()
    deadline = min(loop.time() + wait_ms / 1000, loop.time() + max(0.0, twin.deadline - _now()))
    while twin.outcome is None and loop.time() < deadline:
        await asyncio.sleep(min(TWIN_POLL_S, max(0.0, deadline - loop.time())))
    outcome: Optional[bool] = twin.outcome
    return outcome


def _now() -> float:
    return time.monotonic()


async def shielded(work: Any) -> None:
    """Run ``work`` to its end even if the caller is cancelled meanwhile (the settle step:
    a record, once the handler finished, or the release of a claim); the caller still sees
    its CancelledError."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait([task])
        raise


__all__ = [
    "AsyncClaimStrategy",
    "AsyncPassThroughStrategy",
    "AsyncStrategy",
    "outcome_of",
    "retry_locally",
    "run_handler",
]
