"""Deduplicated calls on the asyncio memory store."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Tuple

import pytest

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.aio import AsyncMemoryDedupStore
from tests.shared.aio_call_cases import *  # noqa: F403


@pytest.fixture
def make_config() -> Callable[..., Awaitable[Tuple[DedupConfig, Any]]]:
    async def make(app: str, **settings: Any) -> Tuple[DedupConfig, Any]:
        config = DedupConfig.enable_dedup_consume_config(app, AsyncMemoryDedupStore(), **settings)
        return config, config.aclose

    return make
