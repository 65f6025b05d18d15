"""TransactionalDedupListener on MariaDB and PostgreSQL: a handler's permanent failure rolls its
writes back and commits the FAILED record alone (the port's commit_failure), on every driver; on
a table made before FAILED records the record is committed without its reason."""

from __future__ import annotations

from typing import Any

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupStatus, PermanentFailure
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import bounded_reason
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    Database,
    EffectListener,
    EffectTable,
    is_postgres,
    make_config,
)

LATER = ConsumeStatus.RECONSUME_LATER


def refuse(msg: Any, conn: Any) -> Any:
    raise PermanentFailure(f"{msg.id}: no such account")


def config_on(client: Any, table: str, **options: Any) -> DedupConfig:
    """A config of a new application on ``table``, created if it does not exist."""
    config = make_config(client, table, **options)
    config.persist.create_table()  # type: ignore[attr-defined]
    return config


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
def test_a_permanent_failure_commits_the_failed_record_without_the_handlers_writes(
    client: Any, table: str, effects: EffectTable, claim: str
) -> None:
    """The handler wrote its row, then raised PermanentFailure: no row committed, the FAILED
    record with the reason committed, RECONSUME_LATER; the redelivery runs no handler."""
    config = config_on(client, table, exactly_once_claim=claim)
    listener = EffectListener(config, effects, refuse)
    assert listener(ClassicMessage("m1")) is LATER
    assert effects.count("m1") == 0
    store = config.persist
    assert store is not None
    record = store.read(DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1"))
    assert record is not None
    assert (record.status, record.reason) == (DedupStatus.FAILED, "m1: no such account")
    assert listener(ClassicMessage("m1", reconsume_times=1)) is LATER
    assert listener.calls == {"m1": 1}


def test_a_long_reason_is_committed_bounded_as_the_stores_keep_it(
    client: Any, table: str, effects: EffectTable
) -> None:
    """A reason longer than the column (and with line breaks) is committed as every store
    keeps one (bounded_reason: one line, 255 characters, an ellipsis last), not refused by the
    database."""
    config = config_on(client, table)

    def refuse_at_length(msg: Any, conn: Any) -> Any:
        raise PermanentFailure("no such account:\n" + "x" * 400)

    listener = EffectListener(config, effects, refuse_at_length)
    assert listener(ClassicMessage("m1")) is LATER
    assert config.persist is not None
    record = config.persist.read(DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1"))
    assert record is not None and record.status is DedupStatus.FAILED
    assert record.reason == bounded_reason("no such account:\n" + "x" * 400)
    assert len(record.reason) == 255 and record.reason.endswith("\u2026")


def test_an_old_table_gets_the_failed_record_without_its_reason(
    client: Any,
    driver: str,
    db: Database,
    table: str,
    effects: EffectTable,
    request: pytest.FixtureRequest,
) -> None:
    """A table made before FAILED records (no failure_reason column): the record is still
    committed, without the reason, and a copy is answered from it."""
    old = f"{table}_old"
    config_on(client, table)
    db.sql(f"DROP TABLE IF EXISTS {old}")
    like = f"({'LIKE ' + table + ' INCLUDING ALL'})" if is_postgres(driver) else f"LIKE {table}"
    db.sql(f"CREATE TABLE {old} {like}")
    db.sql(f"ALTER TABLE {old} DROP COLUMN failure_reason")
    request.addfinalizer(lambda: db.sql(f"DROP TABLE IF EXISTS {old}"))
    config: DedupConfig = make_config(client, old)
    listener = EffectListener(config, effects, refuse)
    assert listener(ClassicMessage("m1")) is LATER
    assert config.persist is not None
    record = config.persist.read(DedupElement(config.application_name, "TEST-TOPIC", "TagA", "m1"))
    assert record is not None and (record.status, record.reason) == (DedupStatus.FAILED, None)
    assert listener(ClassicMessage("m1", reconsume_times=1)) is LATER
    assert listener.calls == {"m1": 1} and effects.count("m1") == 0
