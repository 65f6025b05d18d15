"""The integration layer: ``store`` runs on every server kind (Redis, Redis Cluster, MariaDB
through mysqlclient, PyMySQL and mysql-connector-python, and mysqlclient without coalescing,
PostgreSQL through a psycopg factory of either shape, a psycopg_pool pool and a SQLAlchemy
engine); tests are marked ``redis``, ``mysql`` or ``postgres`` by the servers they use (a
private server a test starts itself counts: ``private_redis``, ``private_mariadb``)."""

from __future__ import annotations

from typing import List

import pytest

from rocketmq_dedup.stores.base import DedupStore
from tests.conftest import MYSQL_DRIVERS, PG_KINDS, make_store

STORE_KINDS = ["redis", "redis_cluster", *MYSQL_DRIVERS, "mysql_uncoalesced", *PG_KINDS]
_REDIS_FIXTURES = {"redis_client", "redis_cluster_client", "private_redis"}
_MYSQL_FIXTURES = {"mysql_table", "private_mariadb"}
_PG_FIXTURES = {"pg_table", "pg_pool", "pg_engine"}


@pytest.fixture
def fresh_thread_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listeners here do not keep a native callback thread's Python state (see
    rocketmq_dedup._threads, tested in tests/unit/test_threads.py): every native callback runs
    on a fresh state, where a thread-local is lost at each message, the case the stores' own
    defences (a bounded MySQL pool, Redis wakers not kept per thread) must hold in."""
    from rocketmq_dedup import _threads

    monkeypatch.setattr(_threads, "keep_thread_state", lambda: None)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest) -> DedupStore:
    """Every server store kind."""
    return make_store(request.param, request)


@pytest.fixture(params=["redis", "redis_cluster", "mysql", "postgres"])
def shared_store_kind(request: pytest.FixtureRequest) -> str:
    """Store kinds shared between processes."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Mark each test with the servers it uses (``-m redis`` / ``-m mysql`` / ``-m postgres``
    select them)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        kind = str(params.get("store", params.get("shared_store_kind", "")))
        if names & _REDIS_FIXTURES or kind.startswith(("redis", "aio_redis")):
            item.add_marker(pytest.mark.redis)
        if names & _MYSQL_FIXTURES or kind.startswith(("mysql", "aio_mysql")):
            item.add_marker(pytest.mark.mysql)
        if names & _PG_FIXTURES or kind.startswith(("postgres", "aio_postgres")):
            item.add_marker(pytest.mark.postgres)
