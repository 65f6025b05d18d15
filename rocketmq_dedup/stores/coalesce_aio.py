"""Shared round trips for asyncio stores: the coalescing of :mod:`rocketmq_dedup.stores.
coalesce`, on an event loop. The first request is sent at once (one turn of the loop later);
requests made while a round trip is in flight go together in the next one. No thread, no
waker: each caller awaits a future the sending task resolves.

**Deferred requests** (:meth:`AsyncCoalescer.defer`: the stores' CONSUMED marks) are not
awaited: each rides the next round trip, ahead of the requests in it, or, when none comes, is
sent by a timer of the loop at most ``defer_ms`` after it was deferred; :meth:`AsyncCoalescer.
flush` (the stores' reads and ``aclose()``) sends them at once. A deferred request whose round
trip failed is deferred again and then reported to ``on_deferred_error`` by the sync
coalescer's rule (:func:`~rocketmq_dedup.stores.coalesce.settle_deferred`). Deferred requests
the loop never got to send (a loop closed without the store's ``aclose()``) are not sent.

A caller that is cancelled while its request is queued withdraws it (it is never sent); one
cancelled after it was sent does not stop it (the store's answer comes, and the caller's
strategy acts on it: a claim it no longer waits for is released). ``execute(batch)`` sets
``result`` or ``error`` on each request and never raises (short of a CancelledError, when the
loop shuts down: then every unanswered request gets it as its error).
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, List, Optional, Tuple

from rocketmq_dedup.stores.coalesce import Request, settle_deferred


class AsyncCoalescer:
    """Runs :class:`~rocketmq_dedup.stores.coalesce.Request` objects through ``execute`` in
    combined batches, one round trip at a time, the deferred ones first."""

    def __init__(
        self,
        execute: Callable[[List[Request]], Awaitable[None]],
        defer_ms: int = 0,
        on_deferred_error: Optional[Callable[[List[Request], BaseException], None]] = None,
    ) -> None:
        self._execute = execute
        self._defer_s = defer_ms / 1000
        self._on_deferred_error = on_deferred_error
        self._pending: List[Tuple[Request, asyncio.Future[None]]] = []
        self._deferred: List[Request] = []
        self._retry_at = 0.0  # after a failed round trip: the timer sends them no sooner
        self._timer: Optional[asyncio.TimerHandle] = None
        self._sender: Optional[asyncio.Task[None]] = None

    @property
    def deferred(self) -> int:
        """Deferred requests not sent yet."""
        return len(self._deferred)

    @property
    def idle(self) -> bool:
        """True when no round trip is in flight and nothing is queued or deferred."""
        return not self._pending and not self._deferred and not self._sending

    @property
    def _sending(self) -> bool:
        return self._sender is not None and not self._sender.done()

    async def run(self, request: Request) -> Request:
        """Execute ``request`` (alone or with others) and return it, result or error set."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        self._pending.append((request, answered))
        if not self._sending:
            self._sender = loop.create_task(self._send_all())
        await answered
        return request

    def defer(self, request: Request) -> None:
        """Queue ``request`` without waiting for it: it rides the next round trip, or the
        loop's timer sends it within ``defer_ms``."""
        request.deferred_at = time.monotonic()
        self._deferred.append(request)
        self._arm_timer()

    async def flush(self) -> None:
        """Send the deferred requests now, in one round trip (after the one in flight, which
        may carry them); nothing when there are none."""
        while self._sending:
            await asyncio.shield(self._sender)  # type: ignore[arg-type]
        if self._deferred:
            self._sender = asyncio.get_running_loop().create_task(self._send_all(flush=True))
            await asyncio.shield(self._sender)

    def _arm_timer(self) -> None:
        """The timer that sends the deferred requests when no round trip carried them."""
        if self._timer is None and self._deferred:
            loop = asyncio.get_running_loop()
            delay = max(self._defer_s, self._retry_at - time.monotonic())
            self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._deferred and not self._sending:
            loop = asyncio.get_running_loop()
            self._sender = loop.create_task(self._send_all(flush=True))
        # a round trip in flight: its end arms the timer again for what it did not carry

    async def _send_all(self, flush: bool = False) -> None:
        """Round trips until nothing is queued (``flush``: at least one, for the deferred)."""
        while self._pending or (flush and self._deferred):
            flush = False
            batch, self._pending = self._pending, []
            deferred, self._deferred = self._deferred, []
            requests = deferred + [
                request for request, answered in batch if not answered.cancelled()
            ]
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
                if deferred:
                    self._settle([r for r in deferred if r.error is not None])
        self._arm_timer()

    def _settle(self, failed: List[Request]) -> None:
        """Failed deferred requests: deferred again (first), or reported."""
        again, given_up, self._retry_at = settle_deferred(failed, self._defer_s)
        self._deferred[:0] = again
        if given_up and self._on_deferred_error is not None:
            self._on_deferred_error(given_up, given_up[0].error)  # type: ignore[arg-type]


__all__ = ["AsyncCoalescer"]
