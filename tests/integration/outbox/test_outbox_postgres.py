"""The outbox on PostgreSQL, against the real server: refused with a clear error, by the API and
by the command line (only MySQL/MariaDB's store has outbox tables for now)."""

from __future__ import annotations

import pytest

from rocketmq_dedup import DedupConfigError
from rocketmq_dedup.cli import main
from rocketmq_dedup.outbox import Outbox
from tests.integration.exactly_once.support import PG_DRIVERS, dispose, make_client, make_config
from tests.support import PG_DSN


@pytest.mark.parametrize("driver", PG_DRIVERS)
def test_an_outbox_on_a_postgresql_store_is_refused_naming_mysql_on_every_driver(
    driver: str, table: str
) -> None:
    """A PostgreSQL config of each source (factory, psycopg_pool pool, SQLAlchemy engine), its
    server checked: Outbox(config) raises DedupConfigError naming MySQL/MariaDB as the one
    database supported for now and the PostgreSQL store."""
    client = make_client(driver)
    config = make_config(client, table)
    try:
        with pytest.raises(DedupConfigError) as refused:
            Outbox(config)
        said = str(refused.value)
        assert "supports only MySQL/MariaDB for now" in said and "PostgreSQL store" in said
    finally:
        config.close()
        dispose(client)


@pytest.mark.parametrize(
    "args", [["outbox", "list"], ["relay", "--namesrv", "127.0.0.1:9876", "--once"]], ids=" ".join
)
def test_the_outbox_commands_refuse_a_postgresql_store_in_one_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``outbox list`` and ``relay`` with ``--postgres``: exit status 2 and one line saying the
    outbox supports only MySQL/MariaDB for now; no traceback."""
    assert main([*args, "--postgres", PG_DSN]) == 2
    err = capsys.readouterr().err
    assert "supports only MySQL/MariaDB for now" in err and "PostgreSQL store" in err
    assert "Traceback" not in err and err.count("\n") == 1
