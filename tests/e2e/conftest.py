"""E2E fixtures: the real broker (scripts/rocketmq.sh), real Redis, MariaDB and PostgreSQL, the
client installed in this environment. Anything missing fails the run; nothing is skipped."""

from __future__ import annotations

import subprocess
import uuid
from typing import Iterator, List, Tuple

import pytest

from rocketmq_dedup import MySQLDedupStore, PostgresDedupStore
from tests.e2e.clients import Producer, installed_client
from tests.e2e.harness import REPO, create_tables, rocketmq_script
from tests.support import mysql_connect, pg_connect

POOL = 24  # topics/groups created per session: one pair per test (17 take one now)


@pytest.fixture(scope="session")
def client() -> str:
    kind = installed_client()
    if kind == "none":
        pytest.fail(
            "no RocketMQ client installed: run the e2e suites from .venv-classic/.venv-grpc"
        )
    return kind


@pytest.fixture(scope="session")
def broker() -> None:
    status = subprocess.run([str(REPO / "scripts/rocketmq.sh"), "status"], capture_output=True)
    if status.returncode != 0:
        pytest.fail("RocketMQ is not running: scripts/rocketmq.sh up")


@pytest.fixture(scope="session")
def session_id(client: str) -> str:
    return f"{client}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def channels(broker: None, session_id: str) -> Iterator[List[Tuple[str, str]]]:
    """Fresh (topic, group) pairs with a 1 s retry backoff, created in one go."""
    topics = [f"E2E-{session_id}-{i}" for i in range(POOL)]
    groups = [f"e2e-{session_id}-{i}" for i in range(POOL)]
    rocketmq_script("both", " ".join(topics), " ".join(groups))
    yield list(zip(topics, groups, strict=False))


@pytest.fixture
def channel(channels: List[Tuple[str, str]]) -> Tuple[str, str]:
    assert channels, f"more e2e tests than POOL={POOL} channels"
    return channels.pop(0)


@pytest.fixture(scope="session")
def used_groups() -> List[str]:
    return []


@pytest.fixture(scope="session")
def producer(client: str, broker: None, channels: List[Tuple[str, str]]) -> Iterator[Producer]:
    create_tables()
    MySQLDedupStore(mysql_connect(), "t_rocketmq_dedup_e2e").create_table()
    PostgresDedupStore(pg_connect(), "t_rocketmq_dedup_e2e").create_table()
    p = Producer(client, tuple(t for t, _ in channels))
    yield p
    p.close()


def pytest_ignore_collect(collection_path, config):  # type: ignore[no-untyped-def]
    """Client-specific modules: the orderly consumer, the operator kit's sample consumer, the
    lost last retry and the outbox sample (classic), the SimpleConsumer (5.x)."""
    if collection_path.name in (
        "test_e2e_classic_orderly.py",
        "test_e2e_operations.py",
        "test_e2e_classic_dlq.py",
        "test_e2e_outbox_sample.py",
    ):
        return installed_client() != "classic"
    if collection_path.name == "test_e2e_grpc_simple.py":
        return installed_client() != "grpc"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The dead-letter check looks at every group the session used: it runs last, whatever
    the modules' names."""
    last = [item for item in items if item.module.__name__.endswith(".test_dead_letters")]
    items[:] = [item for item in items if item not in last] + last
