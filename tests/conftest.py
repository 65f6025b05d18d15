"""Fixtures for every layer: server clients (real Redis and MariaDB started by
scripts/services.sh; connected only when a test asks for them, and a missing server fails the
test loudly instead of skipping) and the store kinds. Each layer's conftest says which store
kinds its ``store`` fixture runs: tests/unit the memory store and a user store, tests/integration
the servers."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
import redis

from rocketmq_dedup import MemoryDedupStore, MySQLDedupStore, RedisDedupStore
from rocketmq_dedup.stores import make_store as make_store_for
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.stores.foreign import ForeignStore
from tests.support import REDIS_CLUSTER_URL, REDIS_URL, DuckStore, mysql_connect

TEST_TABLE = "t_rocketmq_dedup_test"
# "mysql" runs on mysqlclient (its connection API), "mysql_pymysql" on PyMySQL and
# "mysql_connector" on mysql-connector-python (both through DB-API cursors), each with its
# threads' requests coalesced; "mysql_uncoalesced": mysqlclient, each call on its own.
STORE_KINDS = [
    "memory",
    "redis",
    "redis_cluster",
    "mysql",
    "mysql_pymysql",
    "mysql_connector",
    "mysql_uncoalesced",
]
MYSQL_DRIVERS = {
    "mysql": "mysqlclient",
    "mysql_pymysql": "pymysql",
    "mysql_connector": "mysql-connector",
}


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
    raise ValueError(kind)
