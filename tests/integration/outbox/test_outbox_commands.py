"""``rocketmq-dedup outbox list|retry|drop|purge`` against real MariaDB: what an operator sees
of a parked row and each repair, row by row."""

from __future__ import annotations

import pytest

from rocketmq_dedup.cli import main
from rocketmq_dedup.outbox import FailureKind, Outbox, OutboxMessage, OutboxRelay, SendFailure
from tests.integration.outbox.support import RecordingSender, outbox_rows
from tests.integration.outbox.test_outbox_relay import quick_backoff, write  # noqa: F401
from tests.support import MYSQL, wait_for

MYSQL_URL = "mysql://{user}:{password}@{host}:{port}/{database}".format(**MYSQL)


def refuse_bad(message: OutboxMessage) -> None:
    if message.topic == "BAD":
        raise SendFailure(FailureKind.REFUSED, "the broker does not take BAD")


def test_list_retry_drop_and_purge_show_and_repair_a_parked_row(
    outbox: Outbox, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row sent, one parked: list shows both (--status PARKED the parked one with its
    reason); retry puts it back to PENDING, drop gives it up, purge deletes the sent and dropped
    rows; each command exits 0."""
    store = ["--mysql", MYSQL_URL, "--table", table]
    write(outbox, "good")
    write(outbox, "bad", "BAD")
    with OutboxRelay(outbox, RecordingSender(refuse_bad), poll_interval_s=0.05):
        wait_for(lambda: outbox.tables.backlog().parked == 1, 10)
    assert outbox_rows(table)["good"][0] == "SENT"
    capsys.readouterr()
    assert main(["outbox", "list", *store]) == 0
    listed = capsys.readouterr().out
    assert "good" in listed and "bad" in listed and "PARKED" in listed
    assert main(["outbox", "list", "--status", "PARKED", *store]) == 0
    parked = capsys.readouterr().out
    assert "bad" in parked and "good" not in parked and "does not take BAD" in parked
    assert main(["outbox", "retry", "--all-parked", *store]) == 0
    assert "1 row(s) back to PENDING" in capsys.readouterr().out
    assert outbox_rows(table)["bad"][0] == "PENDING"
    with OutboxRelay(outbox, RecordingSender(refuse_bad), poll_interval_s=0.05):
        wait_for(lambda: outbox.tables.backlog().parked == 1, 10)
    [bad_id] = [row.id for row in outbox.tables.rows(None, 10, 0) if row.message_key == "bad"]
    assert main(["outbox", "drop", str(bad_id), *store]) == 0
    assert outbox_rows(table)["bad"][0] == "DROPPED"
    assert main(["outbox", "purge", "--older-than", "0s", *store]) == 0
    assert "deleted 2 row(s)" in capsys.readouterr().out
    assert outbox_rows(table) == {}
