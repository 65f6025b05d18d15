"""A message whose handler kills its consumer: each consumer that takes it dies in its handler
(SIGKILL from inside, a process of its own), its claim lapses, and the next one takes it over;
with ``max_lapsed_claims=3`` the fourth consumer parks it (FAILED, its handler not run) instead
of dying. On real stores, through the listener."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest

from rocketmq_dedup import DedupStatus
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import DedupStore
from tests.conftest import make_store
from tests.support import REPO, wait_for


def consumer(
    kind: str, table: str, app: str, key: str, most: int = 3
) -> subprocess.CompletedProcess[str]:
    """One consumer process that takes the message (tests/integration/poison_consumer.py)."""
    module = "tests.integration.poison_consumer"
    return subprocess.run(
        [sys.executable, "-m", module, kind, table, app, key, str(most)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("kind", ["redis", "mysql", "postgres"])
def test_a_message_that_kills_three_consumers_is_parked_by_the_fourth(
    kind: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """Three consumers die in the handler (SIGKILL); the fourth finds three lapsed claims and
    parks the message: FAILED with the reason, answered RECONSUME_LATER (permanent_failure
    "dlq"), the handler not run; a fifth answers the copy the same way without dying."""
    store: DedupStore = make_store(kind, request)
    table = getattr(store, "table_name", "")
    key = f"poison-{uuid.uuid4().hex[:8]}"
    element = DedupElement(app_name, "TEST-TOPIC", "TagA", key)
    for _ in range(3):
        died = consumer(kind, table, app_name, key)
        assert died.returncode == -signal.SIGKILL, died.stderr
        record = store.read(element)
        assert record is not None and record.status is DedupStatus.CONSUMING  # never settled
        wait_for(lambda: store.read(element) is None, timeout=10)  # its lease lapses
    parked, again = consumer(kind, table, app_name, key), consumer(kind, table, app_name, key)
    for survivor in (parked, again):
        assert survivor.returncode == 0, survivor.stderr
        assert survivor.stdout.strip().splitlines()[-1] == '{"answer": "RECONSUME_LATER"}'
    assert "a poison message: its handler ended 3 consumers" in parked.stderr  # ERROR logged
    record: Any = store.read(element)
    assert (record.status, record.reason) == (
        DedupStatus.FAILED,
        "its handler ended 3 consumers (claims lapsed, never settled)",
    )


def test_without_max_lapsed_claims_the_fourth_consumer_dies_too(
    app_name: str, request: pytest.FixtureRequest
) -> None:
    """Control, what happened before (and with the default, 0): every consumer that takes the
    message dies in its handler, the fourth as the first."""
    store: DedupStore = make_store("redis", request)
    key = f"poison-{uuid.uuid4().hex[:8]}"
    element = DedupElement(app_name, "TEST-TOPIC", "TagA", key)
    for _ in range(4):
        died = consumer("redis", "", app_name, key, most=0)
        assert died.returncode == -signal.SIGKILL, died.stderr
        wait_for(lambda: store.read(element) is None, timeout=10)
