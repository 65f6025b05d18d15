"""Fixtures of the outbox's integration tests: a dedup table (and its outbox) per module, every
MySQL driver of the exactly-once mode, a business table per test. Real MariaDB; the broker is
the e2e tests' (tests/e2e/test_e2e_outbox.py)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.outbox import Outbox
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from tests.integration.exactly_once.support import (
    MYSQL_DRIVERS,
    EffectTable,
    dispose,
    make_client,
    make_config,
    unique,
)
from tests.integration.outbox.support import drop_tables
from tests.support import mysql_connect


@pytest.fixture
def table() -> Iterator[str]:
    """A dedup table of its own, with its outbox tables; dropped at the end."""
    name = unique("t_obx")
    MySQLDedupStore(mysql_connect(), name).create_table()
    yield name
    drop_tables(name)


@pytest.fixture(params=MYSQL_DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Every MySQL driver of the exactly-once mode (the outbox is on MySQL/MariaDB only for now:
    PostgreSQL's refusal is test_outbox_postgres.py's)."""
    return str(request.param)


@pytest.fixture
def client() -> Iterator[Any]:
    """A mysqlclient connection factory (the tests that need every driver take ``driver``)."""
    client = make_client("mysqlclient")
    yield client
    dispose(client)


@pytest.fixture
def config(client: Any, table: str) -> Iterator[DedupConfig]:
    config = make_config(client, table)
    yield config
    config.close()


@pytest.fixture
def outbox(config: DedupConfig) -> Outbox:
    return Outbox(config)


@pytest.fixture
def effects() -> Iterator[EffectTable]:
    effects = EffectTable()
    yield effects
    effects.drop()
