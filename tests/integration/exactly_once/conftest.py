"""Fixtures of the exactly-once tests: every driver the mode supports (MySQL's and
PostgreSQL's), the database it reaches, a dedup table per module on each database, a business
table per test. Each test is marked ``mysql`` or ``postgres`` by the driver it runs on."""

from __future__ import annotations

from typing import Any, Iterator, List

import pytest

from rocketmq_dedup import DedupConfig
from tests.integration.exactly_once.support import (
    DRIVERS,
    MYSQL_DB,
    POSTGRES_DB,
    SQL_STORES,
    Database,
    EffectTable,
    database,
    dispose,
    is_postgres,
    make_client,
    make_config,
    unique,
)


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[str]:
    """This module's dedup table (and its sequence table) on each database, dropped at the
    end."""
    name = unique(f"t_eo_{request.module.__name__.rpartition('_')[2][:8]}")
    yield name
    for db in (MYSQL_DB, POSTGRES_DB):
        db.drop(name, f"{name}_seq")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Every driver: MySQL's DB-API factories and engines, psycopg's factory, pool and
    engine."""
    return str(request.param)


@pytest.fixture
def db(driver: str) -> Database:
    """The database ``driver`` reaches."""
    return database(driver)


@pytest.fixture
def client(driver: str) -> Iterator[Any]:
    """A connection factory, a pool or an Engine, of ``driver``."""
    client = make_client(driver)
    yield client
    dispose(client)


@pytest.fixture
def config(client: Any, table: str) -> Iterator[DedupConfig]:
    """A config of a new application on this module's table, the tables created."""
    config = make_config(client, table)
    assert isinstance(config.persist, SQL_STORES)
    config.persist.create_table()
    yield config
    config.close()


@pytest.fixture
def effects(db: Database) -> Iterator[EffectTable]:
    """A business table of its own, on the driver's database."""
    effects = EffectTable(db)
    yield effects
    effects.drop()


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Mark each test ``postgres`` or ``mysql`` by the driver it runs on (a test without a
    driver is marked by its module)."""
    for item in items:
        if not item.nodeid.startswith("tests/integration/exactly_once/"):
            continue
        callspec = getattr(item, "callspec", None)
        driver = callspec.params.get("driver") if callspec is not None else None
        if driver is not None:
            item.add_marker(pytest.mark.postgres if is_postgres(driver) else pytest.mark.mysql)
