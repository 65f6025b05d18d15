"""The strategies of a config's deduplicated calls: one of each kind per config, made on first
use (their lease keeper is one thread for every call of the config) and closed with it."""

from __future__ import annotations

import threading
from typing import Any, Optional

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.once.call import CALL_HOOKS
from rocketmq_dedup.once.strategy import CallStrategy, CallTransactionStrategy
from rocketmq_dedup.strategy import refuse_async_store
from rocketmq_dedup.strategy.exactly_once import transactions_of

_LOCK = threading.Lock()
PLAIN, EXACTLY_ONCE = "plain", "exactly_once"


def _strategies(config: Any) -> Any:
    from rocketmq_dedup.config import DedupConfig

    if not isinstance(config, DedupConfig):
        raise DedupConfigError(
            f"a deduplicated call needs a DedupConfig; got {type(config).__qualname__}"
        )
    return config.call_strategies


def plain_strategy(config: Any) -> Optional[CallStrategy]:
    """The config's plain call strategy; None when dedup is disabled."""
    strategies = _strategies(config)
    refuse_async_store(config, "a sync deduplicated call", "its async form (async with, async def)")
    if not config.enabled or config.store is None:
        return None
    strategy = strategies.get(PLAIN)
    if strategy is None:
        with _LOCK:
            strategy = strategies.get(PLAIN)
            if strategy is None:
                strategy = strategies[PLAIN] = CallStrategy(config, CALL_HOOKS)
    return strategy  # type: ignore[no-any-return]


def transaction_strategy(config: Any) -> CallTransactionStrategy:
    """The config's exactly-once call strategy; :class:`DedupConfigError` when its store has
    no transactions (the exactly-once mode's stores: MySQL/MariaDB, PostgreSQL)."""
    strategies = _strategies(config)
    store = config.store if config.enabled else None
    if store is None or transactions_of(store) is None:
        raise DedupConfigError(
            "exactly_once needs a DedupConfig with dedup enabled on a store with transactions "
            "(the exactly-once mode's: a connection factory or a SQLAlchemy Engine of the "
            f"business database); got {'dedup disabled' if store is None else repr(store)}"
        )
    strategy = strategies.get(EXACTLY_ONCE)
    if strategy is None:
        with _LOCK:
            strategy = strategies.get(EXACTLY_ONCE)
            if strategy is None:
                strategy = strategies[EXACTLY_ONCE] = CallTransactionStrategy(config, CALL_HOOKS)
    return strategy  # type: ignore[no-any-return]
