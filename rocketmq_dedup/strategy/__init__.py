"""How a listener consumes messages: :mod:`.rules` (what handlers return and what keys are),
:mod:`.base` (the entry points, the pass-through strategy and the consume template),
:mod:`.plain` (:class:`ClaimStrategy`: claim, handler, CONSUMED or release) and
:mod:`.exactly_once` (the handler's writes and the record in one transaction).
:func:`make_strategy` picks one."""

from __future__ import annotations

from typing import Optional

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.strategy.base import (
    BatchResult,
    DedupTemplate,
    Delivery,
    PassThroughStrategy,
    Strategy,
)
from rocketmq_dedup.strategy.plain import ClaimStrategy
from rocketmq_dedup.strategy.rules import (
    LATER,
    SUCCESS,
    KeyRefused,
    handler_status,
    key_text,
    run_handler,
)


def make_strategy(config: Optional[DedupConfig], hooks: Hooks) -> Strategy:
    """The plain strategy for ``config``: dedup, or pass-through when it is None or disabled.
    A config of an asyncio store is refused (:mod:`rocketmq_dedup.aio` serves it)."""
    refuse_async_store(config, "DedupConcurrentListener", "AsyncDedupConcurrentListener")
    if config is None or not config.enabled or config.store is None:
        return PassThroughStrategy(hooks, config)
    return ClaimStrategy(config, hooks)


def refuse_async_store(config: Optional[DedupConfig], what: str, instead: str) -> None:
    """Raise :class:`DedupConfigError` when ``config``'s store is an asyncio one: ``what``
    (a sync listener or call) would block its event loop, or run without dedup."""
    store = config.async_store if config is not None else None
    if store is not None:
        raise DedupConfigError(
            f"{what} runs on threads, and this config's store is an asyncio store "
            f"({store.describe()}): use {instead} (rocketmq_dedup.aio), or give "
            "the config a sync client"
        )


__all__ = [
    "LATER",
    "SUCCESS",
    "BatchResult",
    "ClaimStrategy",
    "DedupTemplate",
    "Delivery",
    "KeyRefused",
    "PassThroughStrategy",
    "Strategy",
    "handler_status",
    "key_text",
    "make_strategy",
    "refuse_async_store",
    "run_handler",
]
