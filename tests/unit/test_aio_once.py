"""Deduplicated calls on the asyncio memory store."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Tuple

import pytest

from rocketmq_dedup import DedupConfig, DedupConfigError, MemoryDedupStore, deduplicated
from rocketmq_dedup.aio import AsyncMemoryDedupStore
from tests.shared.aio_call_cases import *  # noqa: F403


@pytest.fixture
def make_config() -> Callable[..., Awaitable[Tuple[DedupConfig, Any]]]:
    async def make(app: str, **settings: Any) -> Tuple[DedupConfig, Any]:
        config = DedupConfig.enable_dedup_consume_config(app, AsyncMemoryDedupStore(), **settings)
        return config, config.aclose

    return make


def test_an_async_call_on_a_sync_store_is_refused() -> None:
    """An async def (or ``async with``) on a config of a sync store would block the loop:
    DedupConfigError when decorated; a sync call on an asyncio store is refused too."""
    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())

    async def work() -> None:
        pass

    with pytest.raises(DedupConfigError, match="asyncio store"):
        deduplicated(config, key=lambda: "k")(work)
    async_config = DedupConfig.enable_dedup_consume_config("app", AsyncMemoryDedupStore())
    with pytest.raises(DedupConfigError, match="async"), async_config.once("k"):
        pass
