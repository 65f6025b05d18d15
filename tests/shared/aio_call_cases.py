"""Deduplicated calls on the asyncio path (``async with config.once(key)``, ``@deduplicated``
over an ``async def``), on every asyncio store: the sync cases' decision table, awaited. Each
test runs its own event loop (asyncio.run) and makes its store there (``make_config``)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, List

import pytest

from rocketmq_dedup import (
    DedupElement,
    DedupStatus,
    DedupUsageError,
    DuplicateConsumedError,
    DuplicateInProgressError,
    deduplicated,
)

#: ``await make_config(app, **settings)``: a config of this module's asyncio store, made on
#: the running loop, and the coroutine that closes it.
MakeConfig = Callable[..., Awaitable[Any]]


def test_an_async_block_runs_for_a_fresh_key_only(make_config: MakeConfig, app_name: str) -> None:
    """``async with config.once(key) as run``: truthy once, then a CONSUMED duplicate."""

    async def run() -> List[str]:
        config, close = await make_config(app_name)
        done: List[str] = []
        try:
            for _ in range(3):
                async with config.once("order-1") as block:
                    if block:
                        await asyncio.sleep(0)
                        done.append("charged")
                    else:
                        assert block.status is DedupStatus.CONSUMED
            element = DedupElement(app_name, "once", "", "order-1")
            assert await config.async_store.get_status(element) is DedupStatus.CONSUMED
        finally:
            await close()
        return done

    assert asyncio.run(run()) == ["charged"]


def test_an_async_function_runs_once_and_a_duplicate_raises(
    make_config: MakeConfig, app_name: str
) -> None:
    """@deduplicated over an async def: its value once; then DuplicateConsumedError; an
    exception releases the key."""

    async def run() -> List[str]:
        config, close = await make_config(app_name)
        ran: List[str] = []

        @deduplicated(config, key=lambda order: order)
        async def charge(order: str) -> str:
            ran.append(order)
            if order == "bad" and ran.count("bad") == 1:
                raise ValueError("declined")
            await asyncio.sleep(0)
            return f"receipt-{order}"

        try:
            assert await charge("o1") == "receipt-o1"
            with pytest.raises(DuplicateConsumedError):
                await charge("o1")
            with pytest.raises(ValueError):
                await charge("bad")
            assert await charge("bad") == "receipt-bad"
        finally:
            await close()
        return ran

    assert asyncio.run(run()) == ["o1", "bad", "bad"]


def test_concurrent_async_calls_run_once(make_config: MakeConfig, app_name: str) -> None:
    """16 tasks with one key at once: one runs; the others are duplicates (consumed, or in
    progress: no wait by default)."""

    async def run() -> List[str]:
        config, close = await make_config(app_name)
        answers: List[str] = []

        @deduplicated(config, key=lambda order: order)
        async def charge(order: str) -> None:
            await asyncio.sleep(0.05)

        async def attempt() -> None:
            try:
                await charge("hot")
                answers.append("ran")
            except DuplicateConsumedError:
                answers.append("consumed")
            except DuplicateInProgressError:
                answers.append("in progress")

        try:
            await asyncio.gather(*(attempt() for _ in range(16)))
        finally:
            await close()
        return answers

    answers = asyncio.run(run())
    assert answers.count("ran") == 1 and len(answers) == 16


def test_an_async_block_waits_for_a_key_in_progress(make_config: MakeConfig, app_name: str) -> None:
    """in_progress_wait_milli_seconds: the block waits (without blocking the loop: the holder
    finishes meanwhile) and ends a CONSUMED duplicate."""

    async def run() -> bool:
        config, close = await make_config(app_name)
        try:

            async def first() -> None:
                async with config.once("k") as block:
                    assert block
                    await asyncio.sleep(0.2)

            holder = asyncio.ensure_future(first())
            await asyncio.sleep(0.05)
            async with config.once("k", in_progress_wait_milli_seconds=5000) as block:
                fresh = bool(block)
            await holder
        finally:
            await close()
        return fresh

    assert asyncio.run(run()) is False


def test_a_cancelled_async_block_releases_its_key(make_config: MakeConfig, app_name: str) -> None:
    """A task cancelled in its block: the claim is released (the next block runs)."""

    async def run() -> bool:
        config, close = await make_config(app_name)
        try:

            async def body() -> None:
                async with config.once("k") as block:
                    assert block
                    await asyncio.sleep(10)

            task = asyncio.ensure_future(body())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with config.once("k") as block:
                return bool(block)
        finally:
            await close()

    assert asyncio.run(run()) is True


def test_an_async_duplicate_body_that_never_tests_run_is_a_usage_error(
    make_config: MakeConfig, app_name: str
) -> None:
    """As with the sync block: DedupUsageError when a duplicate's body never tested ``run``."""

    async def run() -> None:
        config, close = await make_config(app_name)
        try:
            async with config.once("k") as block:
                assert block
            with pytest.raises(DedupUsageError):
                async with config.once("k"):
                    pass
        finally:
            await close()

    asyncio.run(run())
