"""The asyncio coalescer's deferred requests (the asyncio stores' CONSUMED marks): they ride
the next round trip ahead of it, a timer of the loop sends them when none comes, flush() sends
them now, and a failed one is deferred again, then reported, by the sync coalescer's rule."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional

import pytest

from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.coalesce import Request
from rocketmq_dedup.stores.coalesce_aio import AsyncCoalescer


class Recorder:
    """An ``execute`` that records each batch's request kinds and when it ran; every request
    gets "done", or, while ``failing``, a ConnectionError."""

    def __init__(self) -> None:
        self.batches: List[List[str]] = []
        self.at: List[float] = []
        self.failing = False
        self.hold: Optional[asyncio.Event] = None  # set: a round trip waits for it

    async def __call__(self, batch: List[Request]) -> None:
        self.batches.append([r.kind for r in batch])
        self.at.append(time.monotonic())
        await asyncio.sleep(0)
        if self.hold is not None:
            await self.hold.wait()
        for r in batch:
            if self.failing:
                r.error = ConnectionError("lost")
            else:
                r.result = "done"


def claim() -> Request:
    return Request("claim", 1, [b"k"], ["v"])


def mark(key: bytes = b"a") -> Request:
    return Request("mark", 1, [key], ["v"])


def test_deferred_requests_ride_the_next_round_trip_ahead_of_it() -> None:
    """Deferred requests are not sent on their own: the next round trip carries them first,
    in the order they were deferred; its caller gets its own result."""

    async def scenario() -> None:
        execute = Recorder()
        coalescer = AsyncCoalescer(execute, defer_ms=60_000)
        coalescer.defer(Request("mark", 1, [b"a"], ["v"]))
        coalescer.defer(Request("mark2", 1, [b"b"], ["v"]))
        await asyncio.sleep(0.01)
        assert execute.batches == [] and coalescer.deferred == 2 and not coalescer.idle
        assert (await coalescer.run(claim())).result == "done"
        assert execute.batches == [["mark", "mark2", "claim"]]
        assert coalescer.deferred == 0 and coalescer.idle

    asyncio.run(scenario())


def test_a_deferred_request_no_round_trip_carries_is_sent_within_defer_ms() -> None:
    """With no other traffic the loop's timer sends a deferred request once it has waited
    ``defer_ms`` (40 ms): not before, and not much after; the next one too."""

    async def scenario() -> None:
        execute = Recorder()
        coalescer = AsyncCoalescer(execute, defer_ms=40)
        deferred_at = time.monotonic()
        coalescer.defer(mark())
        while not execute.batches:
            await asyncio.sleep(0.005)
        assert execute.batches == [["mark"]]
        assert 0.04 <= execute.at[0] - deferred_at < 0.04 + 0.5
        coalescer.defer(mark(b"b"))
        deadline = time.monotonic() + 5
        while not (len(execute.batches) == 2 and coalescer.idle):
            assert time.monotonic() < deadline, "the second deferred request was never sent"
            await asyncio.sleep(0.005)
        assert execute.batches[1] == ["mark"]

    asyncio.run(scenario())


def test_flush_sends_the_deferred_now_and_nothing_without_them() -> None:
    """flush() sends the deferred requests in a round trip of their own and returns once it
    is done; with none deferred it sends nothing."""

    async def scenario() -> None:
        execute = Recorder()
        coalescer = AsyncCoalescer(execute, defer_ms=60_000)
        await coalescer.flush()
        assert execute.batches == []
        deferred = mark()
        coalescer.defer(deferred)
        await coalescer.flush()
        assert execute.batches == [["mark"]] and deferred.result == "done"
        assert coalescer.idle

    asyncio.run(scenario())


def test_flush_during_a_round_trip_waits_for_it_and_sends_what_it_did_not_carry() -> None:
    """A flush while a round trip is in flight waits for it; a request deferred after that
    round trip took its batch goes in the flush's own."""

    async def scenario() -> None:
        execute = Recorder()
        execute.hold = asyncio.Event()
        coalescer = AsyncCoalescer(execute, defer_ms=60_000)
        running = asyncio.ensure_future(coalescer.run(claim()))
        while not execute.batches:  # the round trip has taken its batch
            await asyncio.sleep(0)
        late = mark()
        coalescer.defer(late)
        flushing = asyncio.ensure_future(coalescer.flush())
        await asyncio.sleep(0.01)
        assert not flushing.done()  # waiting for the round trip in flight
        execute.hold.set()
        await flushing
        await running
        assert execute.batches == [["claim"], ["mark"]] and late.result == "done"

    asyncio.run(scenario())


def test_a_failed_deferred_request_is_sent_again_then_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deferred request whose round trip failed rides the next ones again, up to
    DEFERRED_ATTEMPTS round trips once DEFERRED_KEEP_S has passed (0 here); then
    on_deferred_error is told, once, with it, and it is not sent again."""
    monkeypatch.setattr(coalesce, "DEFERRED_KEEP_S", 0.0)

    async def scenario() -> None:
        execute = Recorder()
        reported: List[Any] = []
        coalescer = AsyncCoalescer(
            execute, defer_ms=60_000, on_deferred_error=lambda r, e: reported.append((r, e))
        )
        deferred = mark()
        coalescer.defer(deferred)
        execute.failing = True
        for attempt in range(1, coalesce.DEFERRED_ATTEMPTS + 1):
            await coalescer.run(claim())
            assert execute.batches[-1] == ["mark", "claim"]
            assert coalescer.deferred == (0 if attempt == coalesce.DEFERRED_ATTEMPTS else 1)
        assert len(reported) == 1
        assert reported[0][0] == [deferred] and isinstance(reported[0][1], ConnectionError)
        await coalescer.run(claim())
        assert execute.batches[-1] == ["claim"]

    asyncio.run(scenario())


def test_a_deferred_request_outlives_a_store_outage_and_lands_after_it() -> None:
    """A store restarting fails every round trip for a while: a deferred mark is kept through
    ten failed round trips (within DEFERRED_KEEP_S), the timer backing off, and lands with the
    first round trip after the outage; nothing is reported."""

    async def scenario() -> None:
        execute = Recorder()
        reported: List[Any] = []
        coalescer = AsyncCoalescer(
            execute, defer_ms=10, on_deferred_error=lambda r, e: reported.append(r)
        )
        deferred = mark()
        coalescer.defer(deferred)
        execute.failing = True
        for _ in range(10):
            await coalescer.run(claim())
            assert coalescer.deferred == 1
        assert coalescer._retry_at - time.monotonic() > 0.5  # 10 ms doubled, at most 1 s
        execute.failing = False
        await coalescer.run(claim())
        assert execute.batches[-1] == ["mark", "claim"] and deferred.result == "done"
        assert reported == [] and coalescer.deferred == 0

    asyncio.run(scenario())
