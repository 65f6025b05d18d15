"""Record stores, and :func:`make_store`, which picks one for a client. Redis, MySQL and
PostgreSQL need their extras only when used."""

from __future__ import annotations

import logging
from typing import Any

from rocketmq_dedup.errors import DedupConfigError, StoreError, StoreMisconfiguredError
from rocketmq_dedup.stores.base import PROBE_APPLICATION, Claim, ClaimResult, DedupStore, Record
from rocketmq_dedup.stores.foreign import ForeignStore, looks_like_store
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from rocketmq_dedup.stores.postgres.connections import (
    is_psycopg_connection,
    is_psycopg_factory,
    is_psycopg_pool,
)
from rocketmq_dedup.stores.redis import RedisDedupStore, is_redis_client
from rocketmq_dedup.stores.sql_common import is_sqlalchemy_engine

logger = logging.getLogger(__name__)

#: The options each kind of store takes (keywords of its constructor).
_OPTIONS_BY_STORE = {
    RedisDedupStore: frozenset({"key_prefix", "defer_marks_ms"}),
    MySQLDedupStore: frozenset({"table_name", "pool_size", "pool_timeout", "defer_marks_ms"}),
    PostgresDedupStore: frozenset({"table_name", "pool_size", "pool_timeout"}),
}
STORE_OPTIONS = frozenset().union(*_OPTIONS_BY_STORE.values())


def is_postgres_engine(engine: Any) -> bool:
    """True for a SQLAlchemy ``Engine`` of the ``postgresql`` dialect."""
    return getattr(getattr(engine, "dialect", None), "name", None) == "postgresql"


def make_store(client: Any, **options: Any) -> DedupStore:
    """The store for ``client``: a redis-py ``Redis``/``RedisCluster`` -> :class:`RedisDedupStore`;
    a :class:`DedupStore` as it is; an object with ``claim``, ``mark_consumed`` and ``release`` ->
    its adapter; a SQLAlchemy ``Engine`` -> :class:`PostgresDedupStore` on a ``postgresql``
    engine, else :class:`MySQLDedupStore` on it (:meth:`MySQLDedupStore.from_engine`); a
    ``psycopg_pool.ConnectionPool`` or a ``functools.partial`` of ``psycopg.connect`` ->
    :class:`PostgresDedupStore`; any other callable -> :class:`MySQLDedupStore` (a connection
    factory: build a :class:`PostgresDedupStore` explicitly for a PostgreSQL factory of another
    shape).
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
        kind = PostgresDedupStore if is_postgres_engine(client) else MySQLDedupStore
    elif is_redis_client(client):
        kind = RedisDedupStore
    elif isinstance(client, DedupStore) or looks_like_store(client):
        kind = None
    elif is_psycopg_pool(client) or is_psycopg_factory(client):
        kind = PostgresDedupStore
    elif is_psycopg_connection(client):
        raise DedupConfigError(
            "got one psycopg connection: pass a factory, functools.partial(psycopg.connect, "
            "...), or a psycopg_pool.ConnectionPool (the store uses several connections)"
        )
    elif callable(client):
        kind = MySQLDedupStore
    else:
        raise DedupConfigError(
            f"unsupported client {type(client).__module__}.{type(client).__qualname__}: "
            "expected redis.Redis/RedisCluster, a zero-argument callable returning a new MySQL "
            "DB-API connection (e.g. functools.partial(MySQLdb.connect, ...)), "
            "functools.partial(psycopg.connect, ...) or a psycopg_pool.ConnectionPool "
            "(PostgreSQL), a SQLAlchemy engine, or a store object"
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
    if engine and kind is MySQLDedupStore:
        return MySQLDedupStore.from_engine(client, **options)
    store: DedupStore = kind(client, **options)
    return store


def check_usable(store: DedupStore, application: str = PROBE_APPLICATION) -> None:
    """The start-up check: reach ``store`` once (Redis ``PING``; MySQL connect and ``SELECT
    CURRENT_USER()``; PostgreSQL connect and ``SELECT current_user``), prove it can claim and
    release (:meth:`DedupStore.prove_writes`, in ``application``'s key space), and log at
    WARNING what puts its records at risk
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
    "PostgresDedupStore",
    "Record",
    "RedisDedupStore",
    "check_usable",
    "make_store",
]
