"""Record stores, and :func:`make_store`, which picks one for a client. Redis and MySQL need
their extras only when used."""

from __future__ import annotations

import logging
from typing import Any

from rocketmq_dedup.errors import DedupConfigError, StoreError, StoreMisconfiguredError
from rocketmq_dedup.stores.base import PROBE_APPLICATION, Claim, ClaimResult, DedupStore, Record
from rocketmq_dedup.stores.foreign import ForeignStore, looks_like_store
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.redis import RedisDedupStore, is_redis_client

logger = logging.getLogger(__name__)

#: The options each kind of store takes (keywords of its constructor).
_OPTIONS_BY_STORE = {
    RedisDedupStore: frozenset({"key_prefix"}),
    MySQLDedupStore: frozenset({"table_name", "pool_size", "pool_timeout"}),
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


def check_usable(store: DedupStore, application: str = PROBE_APPLICATION) -> None:
    """The start-up check: reach ``store`` once (Redis ``PING``; MySQL connect and ``SELECT
    CURRENT_USER()``), prove it can claim and release (:meth:`DedupStore.prove_writes`, in
    ``application``'s key space), and log at WARNING what puts its records at risk
    (:meth:`DedupStore.risks`: a Redis that evicts keys). Raise :class:`DedupConfigError`
    naming the address, or the missing privilege, ACL rule or the read-only server, so a
    store that cannot work is found at start-up, not at the first message."""
    try:
        store.check()
        store.prove_writes(application)
    except StoreMisconfiguredError as exc:
        raise DedupConfigError(
            f"the dedup store {store.describe()} refused the start-up check: "
            f"{exc.__cause__ or exc}; {exc.fix} (check_store=False starts without the check: "
            "the messages are then consumed later until it is fixed)"
        ) from exc
    except StoreError as exc:
        raise DedupConfigError(
            f"the dedup store {store.describe()} is not usable: {exc.__cause__ or exc}; "
            "fix the address, or pass check_store=False to start without it"
        ) from exc
    for risk in store.risks():
        logger.warning("the dedup store %s: %s", store.describe(), risk)


__all__ = [
    "STORE_OPTIONS",
    "Claim",
    "ClaimResult",
    "DedupStore",
    "MemoryDedupStore",
    "MySQLDedupStore",
    "Record",
    "RedisDedupStore",
    "check_usable",
    "make_store",
]
