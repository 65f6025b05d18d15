"""Fixtures of the outbox's integration tests: each test on every database the outbox runs on
(``backend``: MariaDB and PostgreSQL, the real servers), a dedup table (and its outbox) per
test, every driver of the exactly-once mode, a business table per test. The broker is the e2e
tests' (tests/e2e/test_e2e_outbox.py)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.outbox import Outbox
from tests.integration.exactly_once.support import DRIVERS, EffectTable, make_config
from tests.integration.outbox.support import BACKENDS, Backend, create_tables, drop_tables


@pytest.fixture(params=BACKENDS, ids=repr)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Every database the outbox runs on."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def table(backend: Backend) -> Iterator[str]:
    """A dedup table of its own, with its outbox tables; dropped at the end."""
    name = create_tables(backend)
    yield name
    drop_tables(backend.db, name)


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Every driver of the exactly-once mode, MySQL's and PostgreSQL's."""
    return str(request.param)


@pytest.fixture
def client(backend: Backend) -> Any:
    """A connection factory of the database (the tests that need every driver take
    ``driver``)."""
    return backend.client()


@pytest.fixture
def config(client: Any, table: str) -> Iterator[DedupConfig]:
    config = make_config(client, table)
    yield config
    config.close()


@pytest.fixture
def outbox(config: DedupConfig) -> Outbox:
    return Outbox(config)


@pytest.fixture
def effects(backend: Backend) -> Iterator[EffectTable]:
    effects = EffectTable(backend.db)
    yield effects
    effects.drop()
