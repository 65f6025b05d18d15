"""What the asyncio consume path tells a metrics object: the snapshot's
:class:`~rocketmq_dedup.metrics.meter.Meter` with awaited store calls, chosen once per meter (as
the sync path's: without metrics the store's own calls, no clock read, no branch per message).
Reports (:meth:`Meter.report_one`, :meth:`Meter.report`) are the meter's own: they do no I/O."""

from __future__ import annotations

import time
import weakref
from typing import Any, Awaitable, Callable, TypeVar

from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.metrics.meter import UNMETERED, Meter, Metered, Reported
from rocketmq_dedup.stores.aio import AsyncDedupStore
from rocketmq_dedup.stores.base import Claim, ClaimResult

T = TypeVar("T")


class AsyncMeter:
    """No metrics: the store's calls, awaited, and nothing timed."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    async def claim(
        self, message: Reported, store: AsyncDedupStore, claim: Claim, lease_ms: int
    ) -> ClaimResult:
        return await store.claim(claim, lease_ms)

    async def mark_consumed(
        self, message: Reported, store: AsyncDedupStore, claim: Claim, retention_ms: int
    ) -> None:
        await store.mark_consumed(claim, retention_ms)

    async def release(self, message: Reported, store: AsyncDedupStore, claim: Claim) -> bool:
        return await store.release(claim)

    async def store_call(self, op: StoreOp, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await fn(*args)

    async def kept(
        self, message: Reported, op: StoreOp, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """:meth:`Meter.kept`, awaited: a store call of ``message`` alone (its FAILED record)."""
        return await fn(*args)


class AsyncMetered(AsyncMeter):
    """Times the awaited store calls as :class:`Metered` times the sync ones: a message's claim
    and CONSUMED mark that succeed as plain durations on it, any other call kept with it; a
    call for several messages reported when it returns."""

    meter: Metered

    async def claim(
        self, message: Reported, store: AsyncDedupStore, claim: Claim, lease_ms: int
    ) -> ClaimResult:
        begin = time.perf_counter()
        try:
            result = await store.claim(claim, lease_ms)
        except BaseException:
            _keep(message, StoreOp.CLAIM, begin, False)
            raise
        message.claim_seconds = time.perf_counter() - begin
        return result

    async def mark_consumed(
        self, message: Reported, store: AsyncDedupStore, claim: Claim, retention_ms: int
    ) -> None:
        begin = time.perf_counter()
        try:
            await store.mark_consumed(claim, retention_ms)
        except BaseException:
            _keep(message, StoreOp.MARK_CONSUMED, begin, False)
            raise
        message.mark_seconds = time.perf_counter() - begin

    async def release(self, message: Reported, store: AsyncDedupStore, claim: Claim) -> bool:
        begin = time.perf_counter()
        try:
            released = await store.release(claim)
        except BaseException:
            _keep(message, StoreOp.RELEASE, begin, False)
            raise
        _keep(message, StoreOp.RELEASE, begin, True)
        return released

    async def store_call(self, op: StoreOp, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        begin = time.perf_counter()
        try:
            result = await fn(*args)
        except BaseException:
            self.meter._store_operation(op, time.perf_counter() - begin, False)
            raise
        self.meter._store_operation(op, time.perf_counter() - begin, True)
        return result

    async def kept(
        self, message: Reported, op: StoreOp, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        begin = time.perf_counter()
        try:
            result = await fn(*args)
        except BaseException:
            _keep(message, op, begin, False)
            raise
        _keep(message, op, begin, True)
        return result


def _keep(message: Reported, op: StoreOp, begin: float, ok: bool) -> None:
    message.store_calls += ((op, time.perf_counter() - begin, ok),)


_ASYNC_UNMETERED = AsyncMeter(UNMETERED)
_METERS: weakref.WeakKeyDictionary[Meter, AsyncMeter] = weakref.WeakKeyDictionary()


def async_meter(meter: Meter) -> AsyncMeter:
    """The asyncio twin of a snapshot's meter, made once per meter."""
    if meter is UNMETERED:
        return _ASYNC_UNMETERED
    made = _METERS.get(meter)
    if made is None:
        assert isinstance(meter, Metered)
        made = _METERS[meter] = AsyncMetered(meter)
    return made
