"""Record stores, and :func:`make_store`, which picks one for a client. Redis and MySQL need
their extras only when used."""

from __future__ import annotations

from typing import Any

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.stores.base import Claim, ClaimResult, DedupStore, Record
from rocketmq_dedup.stores.foreign import ForeignStore, looks_like_store
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.redis import RedisDedupStore, is_redis_client

#: The options each kind of store takes (keywords of its constructor).
_OPTIONS_BY_STORE = {
    RedisDedupStore: frozenset({"key_prefix", "defer_marks_ms"}),
    MySQLDedupStore: frozenset({"table_name", "pool_size", "pool_timeout", "defer_marks_ms"}),
}
STORE_OPTIONS = frozenset().union(*_OPTIONS_BY_STORE.values())


def is_sqlalchemy_engine(client: Any) -> bool:
    """True for a SQLAlchemy ``Engine`` (never imports SQLAlchemy)."""
    kind = type(client)
    return kind.__module__.startswith("sqlalchemy") and hasattr(client, "raw_connection")


def make_store(client: Any, **options: Any) -> DedupStore:
    """The store for ``client``: a redis-py ``Redis``/``RedisCluster`` -> :class:`RedisDedupStore`;
    a :class:`DedupStore` as it is; an object with ``claim``, ``mark_consumed`` and ``release`` ->
    its adapter; a SQLAlchemy ``Engine`` -> :class:`MySQLDedupStore` on the engine
    (:meth:`MySQLDedupStore.from_engine`); any other callable -> :class:`MySQLDedupStore` (a
    connection factory).
    ``options`` go to the store's constructor; an option the store does not take is an error."""
    if client is None:
        raise DedupConfigError(
            "client is None: pass a redis client, a MySQL connection factory or a store; "
            "use disable_dedup_consume_config(name) to turn dedup off"
        )
    if isinstance(client, type) and not hasattr(client, "cursor"):
        # e.g. redis.Redis itself: callable, so it would pass for a connection factory
        raise DedupConfigError(
            f"got the class {client.__module__}.{client.__qualname__}, not a client: pass an "
            "instance (redis.Redis(...)) or a zero-argument MySQL connection factory"
        )
    kind: Any
    engine = is_sqlalchemy_engine(client)  # not callable: it would be refused below
    if engine:
        kind = MySQLDedupStore
    elif is_redis_client(client):
        kind = RedisDedupStore
    elif isinstance(client, DedupStore) or looks_like_store(client):
        kind = None
    elif callable(client):
        kind = MySQLDedupStore
    else:
        raise DedupConfigError(
            f"unsupported client {type(client).__module__}.{type(client).__qualname__}: "
            "expected redis.Redis/RedisCluster, a zero-argument callable returning a new MySQL "
            "DB-API connection (e.g. functools.partial(MySQLdb.connect, ...)), or a store object"
        )
    allowed = _OPTIONS_BY_STORE.get(kind, frozenset())
    wrong = sorted(set(options) - allowed)
    if wrong:
        target = kind.__name__ if kind is not None else "a store object"
        raise DedupConfigError(
            f"option(s) {', '.join(wrong)} do not apply to {target}"
            + (f" (it takes: {', '.join(sorted(allowed))})" if allowed else "")
        )
    if kind is None:
        return client if isinstance(client, DedupStore) else ForeignStore(client)
    if engine:
        return MySQLDedupStore.from_engine(client, **options)
    store: DedupStore = kind(client, **options)
    return store


def check_reachable(store: DedupStore) -> None:
    """Reach ``store`` once (Redis ``PING``; MySQL connect and ``SELECT 1``); raise
    :class:`DedupConfigError` naming its address if that fails, so a wrong address is found at
    start-up, not at the first message."""
    try:
        store.check()
    except StoreError as exc:
        raise DedupConfigError(
            f"the dedup store {store.describe()} is not usable: {exc.__cause__ or exc}; "
            "fix the address, or pass check_store=False to start without it"
        ) from exc


__all__ = [
    "STORE_OPTIONS",
    "Claim",
    "ClaimResult",
    "DedupStore",
    "MemoryDedupStore",
    "MySQLDedupStore",
    "Record",
    "RedisDedupStore",
    "check_reachable",
    "make_store",
]
