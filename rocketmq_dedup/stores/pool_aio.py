"""The asyncio SQL stores' bounded connection pool (PostgreSQL, MySQL): the sync
:class:`~rocketmq_dedup.stores.pool.BoundedPool`'s rules on an event loop. At most ``size``
connections, each used by one operation at a time, reused last-in first-out; a caller that
finds them all busy waits (yielding the loop) up to ``timeout`` seconds, then gets
:class:`~rocketmq_dedup.errors.StorePoolExhaustedError` (not an outage). An operation that
raised discards its connection; after a lost one (``lost(exc)``) the idle ones are closed too
and the operation runs once more on a new connection (the stores' statements are idempotent for
their owner token)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Generic, List, Optional, TypeVar

from rocketmq_dedup.errors import StorePoolExhaustedError

logger = logging.getLogger(__name__)

C = TypeVar("C")
T = TypeVar("T")


class AsyncBoundedPool(Generic[C]):
    """At most ``size`` connections made by ``open_conn`` and closed by ``close_conn``."""

    def __init__(
        self,
        open_conn: Callable[[], Awaitable[C]],
        close_conn: Callable[[C], Awaitable[None]],
        size: int,
        timeout: float,
        server: str,
        lost: Callable[[BaseException], bool],
        describe: Callable[[], str],
    ) -> None:
        self._open = open_conn
        self._close = close_conn
        self.size = size
        self.timeout = timeout
        self.server = server
        self._lost = lost
        self._describe = describe
        self._idle: List[C] = []
        self._slots = 0  # open connections plus connects in flight
        self._freed: Optional[asyncio.Condition] = None  # made on the loop that uses the pool
        self._generation = 0
        self._born: dict[int, int] = {}  # id(conn) -> the generation it was opened in

    @property
    def open_count(self) -> int:
        return self._slots

    async def take(self) -> C:
        if self._idle:
            return self._idle.pop()
        if self._slots >= self.size:
            conn = await self._wait()
            if conn is not None:
                return conn
        self._slots += 1
        generation = self._generation
        try:
            conn = await self._open()
        except BaseException:
            self._slots -= 1
            await self._notify()
            raise
        self._born[id(conn)] = generation
        return conn

    async def _wait(self) -> Optional[C]:
        freed = self._condition()
        async with freed:
            try:
                await asyncio.wait_for(
                    freed.wait_for(lambda: bool(self._idle) or self._slots < self.size),
                    self.timeout,
                )
            except TimeoutError:
                raise StorePoolExhaustedError(
                    f"all {self.size} {self.server} connections of the pool stayed busy for "
                    f"{self.timeout:g} s (raise pool_size, or look for slow statements)"
                ) from None
        return self._idle.pop() if self._idle else None

    def _condition(self) -> asyncio.Condition:
        if self._freed is None:
            self._freed = asyncio.Condition()
        return self._freed

    async def _notify(self) -> None:
        freed = self._condition()
        async with freed:
            freed.notify()

    async def give(self, conn: C) -> None:
        if self._born.get(id(conn)) == self._generation:
            self._idle.append(conn)
            await self._notify()
        else:
            await self.discard(conn)

    async def discard(self, conn: C) -> None:
        if self._born.pop(id(conn), None) is None:
            return
        self._slots -= 1
        try:
            await self._close(conn)
        finally:
            await self._notify()

    async def drain(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.discard(conn)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(conn, *args)`` on a pooled connection (module docstring)."""
        for attempt in (1, 2):
            conn = await self.take()
            try:
                result = await fn(conn, *args)
            except BaseException as exc:
                await self.discard(conn)
                if attempt == 2 or not isinstance(exc, Exception) or not self._lost(exc):
                    raise
                logger.warning("%s: connection failed (%s); reconnecting", self._describe(), exc)
                await self.drain()
                continue
            await self.give(conn)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close the idle connections now and the busy ones when they come back."""
        self._generation += 1
        await self.drain()


__all__ = ["AsyncBoundedPool"]
