"""How a listener consumes messages: :mod:`.rules` (what handlers return and what keys are),
:mod:`.base` (the entry points, the pass-through strategy and the consume template),
:mod:`.plain` (:class:`ClaimStrategy`: claim, handler, CONSUMED or release) and
:mod:`.exactly_once` (the handler's writes and the record in one transaction).
:func:`make_strategy` picks one."""

from __future__ import annotations

from typing import Optional

from rocketmq_dedup.config import DedupConfig
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
    """The plain strategy for ``config``: dedup, or pass-through when it is None or disabled."""
    if config is None or not config.enabled or config.store is None:
        return PassThroughStrategy(hooks, config)
    return ClaimStrategy(config, hooks)


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
    "run_handler",
]
