"""``rocketmq-dedup outbox list|retry|drop|purge`` against real MariaDB and PostgreSQL: what an
operator sees of a parked row and each repair, row by row; ``schema`` prints the outbox's tables;
a store with no outbox (Redis) is refused in one line."""

from __future__ import annotations

import pytest

from rocketmq_dedup import DedupConfig, DedupConfigError
from rocketmq_dedup.cli import main
from rocketmq_dedup.outbox import FailureKind, Outbox, OutboxMessage, OutboxRelay, SendFailure
from tests.integration.outbox.support import Backend, RecordingSender, outbox_rows
from tests.integration.outbox.test_outbox_relay import quick_backoff, write  # noqa: F401
from tests.support import REDIS_URL, wait_for


def refuse_bad(message: OutboxMessage) -> None:
    if message.topic == "BAD":
        raise SendFailure(FailureKind.REFUSED, "the broker does not take BAD")


def test_list_retry_drop_and_purge_show_and_repair_a_parked_row(
    backend: Backend, outbox: Outbox, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row sent, one parked: list shows both (--status PARKED the parked one with its
    reason); retry puts it back to PENDING, drop gives it up, purge deletes the sent and dropped
    rows; each command exits 0."""
    store = [*backend.cli_options, "--table", table]
    write(outbox, "good")
    write(outbox, "bad", "BAD")
    with OutboxRelay(outbox, RecordingSender(refuse_bad), poll_interval_s=0.05):
        wait_for(lambda: outbox.tables.backlog().parked == 1, 10)
    assert outbox_rows(outbox)["good"][0] == "SENT"
    capsys.readouterr()
    assert main(["outbox", "list", *store]) == 0
    listed = capsys.readouterr().out
    assert "good" in listed and "bad" in listed and "PARKED" in listed
    assert main(["outbox", "list", "--status", "PARKED", *store]) == 0
    parked = capsys.readouterr().out
    assert "bad" in parked and "good" not in parked and "does not take BAD" in parked
    assert main(["outbox", "retry", "--all-parked", *store]) == 0
    assert "1 row(s) back to PENDING" in capsys.readouterr().out
    assert outbox_rows(outbox)["bad"][0] == "PENDING"
    with OutboxRelay(outbox, RecordingSender(refuse_bad), poll_interval_s=0.05):
        wait_for(lambda: outbox.tables.backlog().parked == 1, 10)
    [bad_id] = [row.id for row in outbox.tables.rows(None, 10, 0) if row.message_key == "bad"]
    assert main(["outbox", "drop", str(bad_id), *store]) == 0
    assert outbox_rows(outbox)["bad"][0] == "DROPPED"
    assert main(["outbox", "purge", "--older-than", "0s", *store]) == 0
    assert "deleted 2 row(s)" in capsys.readouterr().out
    assert outbox_rows(outbox) == {}


def test_schema_prints_the_outboxs_tables_that_create_table_made(
    backend: Backend, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``schema mysql|postgres`` prints the outbox's two tables beside the dedup table's, and
    create_table() made them (the fixture's): both exist, empty."""
    assert main(["schema", backend.name, "--table", table]) == 0
    printed = capsys.readouterr().out
    assert f"{table}_outbox" in printed and f"{table}_outbox_lane" in printed
    for name in (f"{table}_outbox", f"{table}_outbox_lane"):
        assert backend.db.sql(f"SELECT COUNT(*) FROM {name}") == [(0,)]


@pytest.mark.parametrize(
    "args", [["outbox", "list"], ["relay", "--namesrv", "127.0.0.1:9876", "--once"]], ids=" ".join
)
def test_the_outbox_commands_refuse_a_redis_store_in_one_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``outbox list`` and ``relay`` with ``--redis`` (a store with no outbox, the real Redis):
    exit status 2 and one line naming the databases that have one; no traceback."""
    assert main([*args, "--redis", REDIS_URL]) == 2
    err = capsys.readouterr().err
    assert "MySQL/MariaDB or PostgreSQL" in err and "Redis" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_an_outbox_on_a_redis_config_is_refused_naming_the_store() -> None:
    """Outbox(config) on a Redis config (checked against the real server): DedupConfigError
    naming the Redis store and the databases that have an outbox."""
    import redis

    config = DedupConfig.enable_dedup_consume_config("app", redis.Redis.from_url(REDIS_URL))
    try:
        with pytest.raises(DedupConfigError, match=r"MySQL/MariaDB or PostgreSQL.*Redis"):
            Outbox(config)
    finally:
        config.close()
