"""Fixtures for every layer: server clients (real Redis, MariaDB and PostgreSQL started by
scripts/services.sh; connected only when a test asks for them, and a missing server fails the
test loudly instead of skipping) and the store kinds. Each layer's conftest says which store
kinds its ``store`` fixture runs: tests/unit the memory store and a user store, tests/integration
the servers."""

from __future__ import annotations

import ctypes
import functools
import uuid
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest
import redis

from rocketmq_dedup import MemoryDedupStore, MySQLDedupStore, PostgresDedupStore, RedisDedupStore
from rocketmq_dedup.stores import make_store as make_store_for
from rocketmq_dedup.stores.aio import AsyncDedupStore, AsyncMemoryDedupStore
from rocketmq_dedup.stores.aio import make_async_store as make_async_store_for
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.stores.foreign import ForeignStore
from tests import aio_support
from tests.aio_support import LoopThread
from tests.native import NativeBuildError, build_library
from tests.support import (
    MYSQL,
    PG_DSN,
    REDIS_CLUSTER_URL,
    REDIS_SENTINEL,
    REDIS_SENTINEL_MASTER,
    REDIS_URL,
    DuckStore,
    mysql_connect,
    pg_connect,
    pg_query,
)

TEST_TABLE = "t_rocketmq_dedup_test"
# "mysql" runs on mysqlclient (its connection API), "mysql_pymysql" on PyMySQL and
# "mysql_connector" on mysql-connector-python (both through DB-API cursors), each with its
# threads' requests coalesced; "mysql_uncoalesced": mysqlclient, each call on its own.
MYSQL_DRIVERS = {
    "mysql": "mysqlclient",
    "mysql_pymysql": "pymysql",
    "mysql_connector": "mysql-connector",
}
# PostgreSQL through psycopg 3: "postgres" a partial of psycopg.connect (make_store tells it
# from a MySQL factory; the store's own pool), "postgres_factory" a plain function returning
# connections set up against the store (autocommit off, no prepared statements, LATIN1 client
# encoding; built as PostgresDedupStore explicitly), "postgres_pool" a psycopg_pool pool,
# "postgres_sqlalchemy" a SQLAlchemy engine (postgresql+psycopg).
PG_KINDS = ["postgres", "postgres_factory", "postgres_pool", "postgres_sqlalchemy"]
STORE_KINDS = ["memory", "redis", "redis_cluster", *MYSQL_DRIVERS, "mysql_uncoalesced", *PG_KINDS]


@pytest.fixture(scope="session")
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: run scripts/services.sh up ({exc})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster_client() -> Iterator[Any]:
    try:
        client = redis.RedisCluster.from_url(REDIS_CLUSTER_URL)
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis Cluster not reachable at {REDIS_CLUSTER_URL}: services.sh up ({exc})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def mysql_table() -> str:
    """A fresh dedup table for the session."""
    connect = mysql_connect()
    try:
        conn = connect()
    except Exception as exc:
        pytest.fail(f"MariaDB is not reachable: run scripts/services.sh up ({exc})")
    cur = conn.cursor()
    cur.execute(f"DROP TABLE IF EXISTS {TEST_TABLE}")
    conn.close()
    MySQLDedupStore(connect, TEST_TABLE).create_table()
    return TEST_TABLE


@pytest.fixture(scope="session")
def pg_table() -> str:
    """A fresh PostgreSQL dedup table for the session."""
    try:
        pg_query(f"DROP TABLE IF EXISTS {TEST_TABLE}")
    except Exception as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_DSN}: scripts/services.sh up ({exc})")
    store = PostgresDedupStore(pg_connect(), TEST_TABLE)
    store.create_table()
    store.close()
    return TEST_TABLE


@pytest.fixture(scope="session")
def pg_pool() -> Iterator[Any]:
    """An application's psycopg_pool pool on the shared PostgreSQL."""
    import psycopg_pool

    pool = psycopg_pool.ConnectionPool(PG_DSN, min_size=1, max_size=8, timeout=10, open=True)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def pg_engine() -> Iterator[Any]:
    """A SQLAlchemy engine on the shared PostgreSQL (postgresql+psycopg)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(PG_DSN.replace("postgresql://", "postgresql+psycopg://"))
    yield engine
    engine.dispose()


def pg_factory() -> Any:
    """A plain function (make_store cannot tell it from a MySQL factory) returning psycopg
    connections set up against the store: autocommit off, no prepared statements, and a
    LATIN1 client encoding."""
    import psycopg

    def connect_orders_db() -> Any:
        return psycopg.connect(
            PG_DSN, autocommit=False, prepare_threshold=None, client_encoding="LATIN1"
        )

    return connect_orders_db


def make_pg_store(kind: str, request: pytest.FixtureRequest, **options: Any) -> DedupStore:
    """The PostgreSQL store of ``kind`` (:data:`PG_KINDS`) on the session's table, closed at
    the end of the test."""
    table = request.getfixturevalue("pg_table")
    store: DedupStore
    if kind == "postgres":
        store = make_store_for(pg_connect(), table_name=table, **options)
    elif kind == "postgres_factory":
        store = PostgresDedupStore(pg_factory(), table, **options)
    elif kind == "postgres_pool":
        store = make_store_for(request.getfixturevalue("pg_pool"), table_name=table, **options)
    elif kind == "postgres_sqlalchemy":
        store = make_store_for(request.getfixturevalue("pg_engine"), table_name=table, **options)
    else:
        raise ValueError(kind)
    assert isinstance(store, PostgresDedupStore)
    request.addfinalizer(store.close)
    return store


@pytest.fixture(scope="session")
def native_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """tests/native's callback_thread.c, built once per session in a temporary directory: it
    calls Python from native pthreads, as librocketmq calls a listener."""
    try:
        return build_library(tmp_path_factory.mktemp("native"))
    except NativeBuildError as exc:
        pytest.fail(f"cannot build the native callback library: {exc}")


#: The asyncio stores (tests/aio_support.py): each runs on the session's test event loop.
AIO_STORE_KINDS = [
    "aio_memory",
    "aio_redis",
    "aio_redis_cluster",
    "aio_redis_sentinel",
    "aio_postgres",
    "aio_postgres_pool",
    "aio_mysql",
]


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    """An event loop in a thread of its own, for the asyncio path's tests."""
    thread = LoopThread()
    aio_support.CURRENT.append(thread)
    yield thread
    aio_support.CURRENT.remove(thread)
    thread.stop()


def async_client(kind: str) -> Tuple[Any, Optional[Any]]:
    """The client of an asyncio server store of ``kind`` (:data:`AIO_STORE_KINDS`), made on
    the loop that will use it, and the application's pool to open and close with it
    (``aio_postgres_pool``: a psycopg_pool pool), if any."""
    if kind == "aio_mysql":
        import asyncmy

        params = {k: v for k, v in MYSQL.items() if k != "database"}
        return functools.partial(asyncmy.connect, db=MYSQL["database"], **params), None
    if kind == "aio_postgres":
        import psycopg

        return functools.partial(psycopg.AsyncConnection.connect, PG_DSN), None
    if kind == "aio_postgres_pool":
        import psycopg_pool

        pool = psycopg_pool.AsyncConnectionPool(PG_DSN, min_size=1, max_size=8, open=False)
        return pool, pool
    import redis.asyncio

    if kind == "aio_redis":
        return redis.asyncio.Redis.from_url(REDIS_URL), None
    if kind == "aio_redis_cluster":
        return redis.asyncio.RedisCluster.from_url(REDIS_CLUSTER_URL), None
    if kind == "aio_redis_sentinel":
        from redis.asyncio.sentinel import Sentinel

        host, port = REDIS_SENTINEL.rsplit(":", 1)
        return Sentinel([(host, int(port))]).master_for(REDIS_SENTINEL_MASTER), None
    raise ValueError(kind)


def async_store_options(kind: str, request: pytest.FixtureRequest) -> Dict[str, Any]:
    """The store options of an asyncio store of ``kind`` in a test: the session's table of
    its SQL database."""
    if kind.startswith("aio_postgres"):
        return {"table_name": request.getfixturevalue("pg_table")}
    if kind == "aio_mysql":
        return {"table_name": request.getfixturevalue("mysql_table")}
    return {}


async def close_async_client(client: Any, pool: Optional[Any]) -> None:
    """Close what :func:`async_client` made: the pool, or a Redis client (a factory has
    nothing to close)."""
    if pool is not None:
        await pool.close()
    elif hasattr(client, "aclose"):
        await client.aclose()


def make_async_store(kind: str, request: pytest.FixtureRequest) -> AsyncDedupStore:
    """An asyncio store of ``kind`` (:data:`AIO_STORE_KINDS`) on the test loop, closed with
    its client at the end of the test."""
    loop = request.getfixturevalue("loop_thread")  # every asyncio store is bound to it
    if kind == "aio_memory":
        return AsyncMemoryDedupStore()
    options = async_store_options(kind, request)

    async def open_client() -> Tuple[Any, Optional[Any]]:
        client, pool = async_client(kind)
        if pool is not None:
            await pool.open()
        return client, pool

    client, pool = loop.run(open_client())
    store = make_async_store_for(client, **options)
    assert store is not None

    def close() -> None:
        loop.run(store.aclose())
        loop.run(close_async_client(client, pool))

    request.addfinalizer(close)
    return store


@pytest.fixture
def app_name() -> str:
    """A unique application name, so tests never see each other's records."""
    return f"app-{uuid.uuid4().hex[:12]}"


def make_store(kind: str, request: pytest.FixtureRequest) -> DedupStore:
    if kind == "memory":
        return MemoryDedupStore()
    if kind == "foreign":  # a user's duck-typed store, through the adapter
        store = make_store_for(DuckStore())
        assert isinstance(store, ForeignStore)
        return store
    if kind == "redis":
        return RedisDedupStore(request.getfixturevalue("redis_client"))
    if kind == "redis_cluster":
        return RedisDedupStore(request.getfixturevalue("redis_cluster_client"))
    if kind in MYSQL_DRIVERS or kind == "mysql_uncoalesced":
        table = request.getfixturevalue("mysql_table")
        coalesce = kind != "mysql_uncoalesced"
        driver = MYSQL_DRIVERS.get(kind, "mysqlclient")
        store = MySQLDedupStore(mysql_connect(driver), table, coalesce=coalesce)
        request.addfinalizer(store.close)
        return store
    if kind in PG_KINDS:
        return make_pg_store(kind, request)
    raise ValueError(kind)
