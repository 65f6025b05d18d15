"""FAILED records on a table made before them (no failure_reason column: CREATE TABLE IF NOT
EXISTS adds no column to an existing table): claims, marks and reads work as before; a FAILED
record is written without its reason, with a warning naming the ALTER TABLE that adds it."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable

import pytest

from rocketmq_dedup import DedupStatus, MySQLDedupStore, PostgresDedupStore
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import CLAIMED, Claim, DedupStore
from tests.support import mysql_connect, pg_connect, pg_query, sql


def old_table(kind: str, request: pytest.FixtureRequest, app_name: str = "") -> DedupStore:
    """A store on a table of its own, made as an earlier version made it: without
    failure_reason (made by this version's statements, the column then dropped)."""
    table = f"t_dedup_old_{uuid.uuid4().hex[:8]}"
    run_sql: Callable[..., Any] = sql if kind == "mysql" else pg_query
    store: DedupStore = (
        MySQLDedupStore(mysql_connect(), table)
        if kind == "mysql"
        else PostgresDedupStore(pg_connect(), table)
    )
    store.create_table()  # type: ignore[attr-defined]
    run_sql(f"ALTER TABLE {table} DROP COLUMN failure_reason")
    request.addfinalizer(lambda: run_sql(f"DROP TABLE IF EXISTS {table}"))
    request.addfinalizer(lambda: run_sql(f"DROP TABLE IF EXISTS {table}_seq"))
    return store


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_a_table_without_the_reason_column_keeps_working_and_says_how_to_add_it(
    kind: str, app_name: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """Claims and marks as before; a FAILED record written and read without its reason; the
    warning names the ALTER TABLE; the start-up check's risks name it too."""
    store = old_table(kind, request)
    done, failed = DedupElement(app_name, "T", "", "done"), DedupElement(app_name, "T", "", "f")
    assert store.claim(Claim(done, "o1"), 60_000) == CLAIMED
    store.mark_consumed(Claim(done, "o1"), 60_000)
    assert store.claim(Claim(failed, "o1"), 60_000) == CLAIMED
    with caplog.at_level(logging.WARNING):
        store.mark_failed(Claim(failed, "o1"), 60_000, "never")
        record = store.read(failed)
    assert record is not None and (record.status, record.reason) == (DedupStatus.FAILED, None)
    assert not store.claim(Claim(failed, "o2"), 60_000).claimed
    assert "ADD COLUMN failure_reason" in caplog.text
    assert any("ADD COLUMN failure_reason" in risk for risk in store.risks())
    store.close()


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_create_table_adds_the_reason_column_to_a_table_made_before(
    kind: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """create_table() on a table made by an earlier version adds failure_reason (before, its
    CREATE TABLE IF NOT EXISTS added nothing, and PostgreSQL's column comments failed); a
    FAILED record then keeps its reason, and the check has nothing left to say."""
    store = old_table(kind, request)
    store.create_table()  # type: ignore[attr-defined]
    assert store.risks() == []
    e = DedupElement(app_name, "T", "", "f")
    store.claim(Claim(e, "o1"), 60_000)
    store.mark_failed(Claim(e, "o1"), 60_000, "never")
    record = store.read(e)
    assert record is not None and record.reason == "never"
    store.close()
