"""Fixtures of the exactly-once tests: every driver the mode supports, a dedup table per
module, a business table per test."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from tests.integration.exactly_once.support import (
    DRIVERS,
    EffectTable,
    dispose,
    make_client,
    make_config,
    sql,
    unique,
)


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[str]:
    """This module's dedup table (and its sequence table), dropped at the end."""
    name = unique(f"t_eo_{request.module.__name__.rpartition('_')[2][:8]}")
    yield name
    for suffix in ("", "_seq", "_outbox", "_outbox_lane"):
        sql(f"DROP TABLE IF EXISTS {name}{suffix}")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Every driver: DB-API factories and SQLAlchemy engines."""
    return str(request.param)


@pytest.fixture
def client(driver: str) -> Iterator[Any]:
    """A connection factory, or an Engine, of ``driver``."""
    client = make_client(driver)
    yield client
    dispose(client)


@pytest.fixture
def config(client: Any, table: str) -> Iterator[DedupConfig]:
    """A config of a new application on this module's table, the tables created."""
    config = make_config(client, table)
    assert isinstance(config.persist, MySQLDedupStore)
    config.persist.create_table()
    yield config
    config.close()


@pytest.fixture
def effects() -> Iterator[EffectTable]:
    """A business table of its own."""
    effects = EffectTable()
    yield effects
    effects.drop()
