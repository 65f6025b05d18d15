"""Shared round trips for asyncio stores: the coalescing of :mod:`rocketmq_dedup.stores.
redis.coalesce`, on an event loop. The first request is sent at once (one turn of the loop
later); requests made while a round trip is in flight go together in the next one. No thread,
no waker: each caller awaits a future the sending task resolves.

A caller that is cancelled while its request is queued withdraws it (it is never sent); one
cancelled after it was sent does not stop it (the store's answer comes, and the caller's
strategy acts on it: a claim it no longer waits for is released). ``execute(batch)`` sets
``result`` or ``error`` on each request and never raises (short of a CancelledError, when the
loop shuts down: then every unanswered request gets it as its error).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Generic, List, Optional, Protocol, Tuple, TypeVar


class Answered(Protocol):
    result: Any
    error: Optional[BaseException]


R = TypeVar("R", bound=Answered)


class AsyncCoalescer(Generic[R]):
    """Runs requests through ``execute`` in combined batches, one round trip at a time."""

    def __init__(self, execute: Callable[[List[R]], Awaitable[None]]) -> None:
        self._execute = execute
        self._pending: List[Tuple[R, asyncio.Future[None]]] = []
        self._sender: Optional[asyncio.Task[None]] = None

    @property
    def idle(self) -> bool:
        """True when no round trip is in flight and nothing is queued."""
        return not self._pending and (self._sender is None or self._sender.done())

    async def run(self, request: R) -> R:
        """Execute ``request`` (alone or with others) and return it, result or error set."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        self._pending.append((request, answered))
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send_all())
        await answered
        return request

    async def _send_all(self) -> None:
        """Round trips until nothing is queued."""
        while self._pending:
            batch, self._pending = self._pending, []
            requests = [request for request, answered in batch if not answered.cancelled()]
            try:
                if requests:
                    await self._execute(requests)
            except BaseException as exc:  # the loop is shutting down: nobody is left unanswered
                for request in requests:
                    if request.result is None and request.error is None:
                        request.error = exc
                raise
            finally:
                for _, answered in batch:
                    if not answered.done():
                        answered.set_result(None)


__all__ = ["AsyncCoalescer"]
