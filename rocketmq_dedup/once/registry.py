"""The strategies of a config's deduplicated calls: one of each kind per config, made on first
use (their lease keeper is one thread for every call of the config) and closed with it."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, TypeVar

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.once.call import ASYNC_CALL_HOOKS, CALL_HOOKS
from rocketmq_dedup.once.strategy import (
    AsyncCallStrategy,
    AsyncCallTransactionStrategy,
    CallStrategy,
    CallTransactionStrategy,
)
from rocketmq_dedup.stores.transaction import AsyncTransactionSource
from rocketmq_dedup.strategy import refuse_async_store
from rocketmq_dedup.strategy.exactly_once import transactions_of

_LOCK = threading.Lock()
S = TypeVar("S")
PLAIN, EXACTLY_ONCE, ASYNC = "plain", "exactly_once", "asyncio"
ASYNC_EXACTLY_ONCE = "asyncio_exactly_once"


def _strategies(config: Any) -> Any:
    from rocketmq_dedup.config import DedupConfig

    if not isinstance(config, DedupConfig):
        raise DedupConfigError(
            f"a deduplicated call needs a DedupConfig; got {type(config).__qualname__}"
        )
    return config.call_strategies


def _made(strategies: Dict[str, Any], kind: str, make: Callable[[], S]) -> S:
    """The config's strategy of ``kind``, made once (under a lock) on first use."""
    strategy = strategies.get(kind)
    if strategy is None:
        with _LOCK:
            strategy = strategies.get(kind)
            if strategy is None:
                strategy = strategies[kind] = make()
    return strategy


def plain_strategy(config: Any) -> Optional[CallStrategy]:
    """The config's plain call strategy; None when dedup is disabled."""
    strategy = getattr(config, "call_strategies", {}).get(PLAIN)
    if strategy is not None:  # made (and its config checked) before: every call's path
        return strategy  # type: ignore[no-any-return]
    strategies = _strategies(config)
    refuse_async_store(config, "a sync deduplicated call", "its async form (async with, async def)")
    if not config.enabled or config.store is None:
        return None
    return _made(strategies, PLAIN, lambda: CallStrategy(config, CALL_HOOKS))


def transaction_strategy(config: Any) -> CallTransactionStrategy:
    """The config's exactly-once call strategy; :class:`DedupConfigError` when its store has
    no transactions (the exactly-once mode's stores: MySQL/MariaDB, PostgreSQL)."""
    strategies = _strategies(config)
    refuse_async_store(config, "a sync exactly_once function (a def)", "an async def")
    store = config.store if config.enabled else None
    if store is None or transactions_of(store) is None:
        raise DedupConfigError(
            "exactly_once needs a DedupConfig with dedup enabled on a store with transactions "
            "(the exactly-once mode's: a connection factory or a SQLAlchemy Engine of the "
            f"business database); got {'dedup disabled' if store is None else repr(store)}"
        )
    return _made(strategies, EXACTLY_ONCE, lambda: CallTransactionStrategy(config, CALL_HOOKS))


def async_strategy(config: Any) -> Optional[AsyncCallStrategy]:
    """The config's asyncio call strategy; None when dedup is disabled. A config of a sync
    store is refused: its calls would block the event loop."""
    strategies = _strategies(config)
    if not config.enabled:
        return None
    if config.async_store is None:
        raise DedupConfigError(
            "an async deduplicated call (async with config.once, an async def) needs a config "
            "of an asyncio store (redis.asyncio, psycopg's async API, asyncmy): this config's "
            "store would block the event loop; use the sync form, or an asyncio client"
        )
    return _made(strategies, ASYNC, lambda: AsyncCallStrategy(config, CALL_HOOKS))


def async_transaction_strategy(config: Any) -> AsyncCallTransactionStrategy:
    """The config's exactly-once call strategy for an ``async def``; :class:`DedupConfigError`
    unless its store is an asyncio store with transactions (PostgreSQL on psycopg's async
    API, MySQL/MariaDB on asyncmy)."""
    strategies = _strategies(config)
    store = config.async_store if config.enabled else None
    transactions = getattr(store, "transactions", None)
    if not isinstance(transactions, AsyncTransactionSource):
        if not config.enabled:
            got = "dedup disabled"
        elif store is None:
            got = f"the sync store {config.store!r} (it would block the event loop)"
        else:
            got = repr(store)
        raise DedupConfigError(
            "exactly_once over an async def needs a DedupConfig with dedup enabled on an "
            "asyncio SQL store: PostgreSQL through psycopg's async API (functools.partial("
            "psycopg.AsyncConnection.connect, dsn) or a psycopg_pool.AsyncConnectionPool) or "
            "MySQL/MariaDB through asyncmy (functools.partial(asyncmy.connect, ...)); Redis and "
            f"the memory store have no transactions; got {got}"
        )
    return _made(
        strategies,
        ASYNC_EXACTLY_ONCE,
        lambda: AsyncCallTransactionStrategy(config, ASYNC_CALL_HOOKS, transactions),
    )


def exactly_once_config(config: Any) -> None:
    """Refuse, when ``exactly_once(config, ...)`` is called, a config with no exactly-once
    transactions at all (whether they fit the function, sync for a def and asyncio for an
    async def, is checked when it is decorated)."""
    _strategies(config)
    if config.enabled and config.async_store is not None:
        async_transaction_strategy(config)
        return
    store = config.store if config.enabled else None
    if store is None or transactions_of(store) is None:
        raise DedupConfigError(
            "exactly_once needs a DedupConfig with dedup enabled on a store with transactions: "
            "for a def, the exactly-once mode's (a connection factory, a pool or a SQLAlchemy "
            "Engine of the business database: MySQL/MariaDB, PostgreSQL); for an async def, "
            "PostgreSQL through psycopg's async API or MySQL/MariaDB through asyncmy; got "
            f"{'dedup disabled' if store is None else repr(store)}"
        )
