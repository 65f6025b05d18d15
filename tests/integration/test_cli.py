"""The ``rocketmq-dedup`` console script, run as installed, in a subprocess, against real Redis,
MariaDB and PostgreSQL: every command, and one clear line with exit status 2 for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from rocketmq_dedup import DedupElement, DedupStatus
from rocketmq_dedup.owner import new_owner_token
from rocketmq_dedup.stores.base import Claim, DedupStore
from tests.conftest import make_store
from tests.support import MYSQL, PG_DSN, REDIS_URL, pg_bindir, pg_query

SCRIPT = Path(sys.executable).parent / "rocketmq-dedup"
MYSQL_URL = "mysql://{user}:{password}@{host}:{port}/{database}".format(**MYSQL)


def run(*args: str, env: Any = None) -> subprocess.CompletedProcess[str]:
    """The installed console script; never a traceback on stderr."""
    result = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(params=["redis", "mysql", "postgres"])
def target(request: pytest.FixtureRequest) -> Any:
    """(store, the CLI's store options) for each server."""
    store = make_store(request.param, request)
    if request.param == "redis":
        return store, ["--redis", REDIS_URL]
    if request.param == "postgres":
        return store, ["--postgres", PG_DSN, "--table", request.getfixturevalue("pg_table")]
    table = request.getfixturevalue("mysql_table")
    return store, ["--mysql", MYSQL_URL, "--table", table]


@pytest.fixture(params=["mysql", "postgres"])
def sql_target(request: pytest.FixtureRequest) -> Any:
    """(store, the CLI's store options) for each SQL server."""
    if request.param == "postgres":
        options = ["--postgres", PG_DSN, "--table", request.getfixturevalue("pg_table")]
    else:
        options = ["--mysql", MYSQL_URL, "--table", request.getfixturevalue("mysql_table")]
    return make_store(request.param, request), options


def element_args(app: str, key: str) -> List[str]:
    return ["--app", app, "--topic", "T", "--tag", "TagA", key]


def test_help_lists_every_command_and_version_works() -> None:
    """--help lists each command with one line; --version prints the version."""
    result = run("--help")
    assert result.returncode == 0
    for command in ("check", "inspect", "release", "stats", "purge", "schema"):
        assert f"  {command} " in result.stdout
    version = run("--version")
    assert version.returncode == 0 and "0.1.0" in version.stdout


def test_check_reports_version_features_and_round_trip(target: Any) -> None:
    """check: the server version, the features the store uses, the round trip; exit 0."""
    _, options = target
    result = run("check", *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "version" in result.stdout and "round trip" in result.stdout
    assert "FAIL" not in result.stdout


@pytest.mark.parametrize("url", ["--mysql", "--postgres"])
def test_check_of_a_missing_table_fails_clearly(url: str) -> None:
    """check on a MySQL or PostgreSQL table that does not exist: a FAIL line naming it, exit
    status 1."""
    result = run("check", url, MYSQL_URL if url == "--mysql" else PG_DSN, "--table", "t_never")
    assert result.returncode == 1
    assert "FAIL table: t_never does not exist" in result.stdout


def test_inspect_release_and_stats(target: Any, app_name: str) -> None:
    """A stuck claim is shown by inspect and stats, removed by release; a CONSUMED record is
    kept without --force and removed with it."""
    store, options = target
    stuck, done = (
        DedupElement(app_name, "T", "TagA", "k1"),
        DedupElement(app_name, "T", "TagA", "k2"),
    )
    assert store.claim(Claim(stuck, new_owner_token()), 60_000).claimed
    owner = new_owner_token()
    store.claim(Claim(done, owner), 60_000)
    store.mark_consumed(Claim(done, owner), 60_000)

    shown = run("inspect", *options, *element_args(app_name, "k1"))
    assert shown.returncode == 0 and "CONSUMING" in shown.stdout and "time left" in shown.stdout
    stats = run("stats", *options, "--app", app_name)
    assert stats.returncode == 0
    assert "CONSUMED" in stats.stdout and "CONSUMING" in stats.stdout and " k1 " in stats.stdout

    assert run("release", *options, *element_args(app_name, "k1")).returncode == 0
    assert store.get_status(stuck) is None
    refused = run("release", *options, *element_args(app_name, "k2"))
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert store.get_status(done) is DedupStatus.CONSUMED
    assert run("release", *options, *element_args(app_name, "k2"), "--force").returncode == 0
    assert store.get_status(done) is None


def test_stats_shows_the_oldest_consumed_record_against_the_retention(
    target: Any, app_name: str
) -> None:
    """The CONSUMED record with the least time left: its age from its owner token's time, the
    retention that gives (age + time left), and the redelivery horizon, flagged when longer;
    with a token that carries no time, its age is the retention given less its time left."""
    store, options = target
    newer, older = (DedupElement(app_name, "T", "", k) for k in ("newer", "older"))
    owner = new_owner_token()
    store.claim(Claim(newer, owner), 60_000)
    store.mark_consumed(Claim(newer, owner), 50 * 60_000)
    store.mark_consumed(Claim(older, new_owner_token()), 30 * 60_000)

    result = run("stats", *options, "--app", app_name)
    assert result.returncode == 0, result.stderr
    shown = result.stdout[result.stdout.index("oldest CONSUMED record:") :]
    assert "T older" in shown and "time left           30.0 min" in shown
    assert "retention           30.0 min (about)" in shown
    assert "4.8 h (16 retries) LONGER than the retention" in shown
    covered = run("stats", *options, "--app", app_name, "--max-reconsume-times", "3")
    assert "1.7 min (3 retries)" in covered.stdout and "LONGER" not in covered.stdout

    store.mark_consumed(Claim(older, "written-by-another-program"), 20 * 60_000)
    given = run("stats", *options, "--app", app_name, "--retention-minutes", "60")
    shown = given.stdout[given.stdout.index("oldest CONSUMED record:") :]
    assert "age                 40.0 min (T older)" in shown
    assert "retention           1.0 h (given)" in shown


def test_purge_dry_run_then_purge(sql_target: Any, app_name: str) -> None:
    """purge --dry-run counts expired rows and deletes nothing; purge deletes them."""
    store: DedupStore
    store, options = sql_target
    element = DedupElement(app_name, "T", "TagA", "gone")
    store.claim(Claim(element, new_owner_token()), 1)
    dry = run("purge", *options, "--dry-run")
    assert dry.returncode == 0 and "would delete" in dry.stdout
    done = run("purge", *options)
    assert done.returncode == 0 and "deleted" in done.stdout
    assert run("purge", *options, "--dry-run").stdout.count("would delete 0 ") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "--mysql", "http://nowhere"], "bad MySQL URL"),
        (["check", "--redis", "redis://127.0.0.1:1/0"], "cannot reach"),
        (["check", "--mysql", "mysql://dedup:dedup@127.0.0.1:1/dedup_test"], "cannot reach"),
        (["check"], "name one store"),
        (["check", "--mysql", MYSQL_URL, "--postgres", PG_DSN], "name one store"),
        (["check", "--postgres", "mysql://x@h/db"], "bad PostgreSQL URL"),
        (["check", "--postgres", "postgresql://x@h:notaport/db"], "bad PostgreSQL URL"),
        (["check", "--postgres", "postgresql://dedup:dedup@127.0.0.1:1/x"], "cannot reach"),
        (["stats", "--postgres", PG_DSN, "--table", "t_never_created", "--app", "a"], "exist"),
        (["schema", "postgres", "--table", "x; DROP"], "invalid table_name"),
        (["inspect", "--redis", REDIS_URL, "--app", "a", "--topic", "T", "nokey"], "no live"),
        (["stats", "--mysql", MYSQL_URL, "--table", "t_never_created", "--app", "a"], "Error"),
        (["purge", "--redis", REDIS_URL], "purge is for --mysql and --postgres"),
        (["schema", "mysql", "--table", "x; DROP"], "invalid table_name"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args: List[str], message: str) -> None:
    """Bad URLs, unreachable servers, unknown tables and keys: one clear line, exit 2."""
    result = run(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_passwords_may_come_from_the_environment(mysql_table: str) -> None:
    """The MySQL password from ROCKETMQ_DEDUP_MYSQL_PASSWORD, the URL from the environment."""
    url = "mysql://{user}@{host}:{port}/{database}".format(**MYSQL)
    env = {"ROCKETMQ_DEDUP_MYSQL_URL": url, "ROCKETMQ_DEDUP_MYSQL_PASSWORD": MYSQL["password"]}
    result = run("check", "--table", mysql_table, env=env)
    assert result.returncode == 0, result.stderr


def test_the_postgres_password_may_come_from_the_environment(pg_table: str) -> None:
    """The PostgreSQL URL and password from ROCKETMQ_DEDUP_POSTGRES_URL and _PASSWORD."""
    url = PG_DSN.replace(":dedup@", "@")
    env = {"ROCKETMQ_DEDUP_POSTGRES_URL": url, "ROCKETMQ_DEDUP_POSTGRES_PASSWORD": "dedup"}
    result = run("check", "--table", pg_table, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    without = run("check", "--table", pg_table, env={"ROCKETMQ_DEDUP_POSTGRES_URL": url})
    assert without.returncode == 2 and "password" in without.stderr


def test_schema_postgres_prints_what_create_table_runs(app_name: str) -> None:
    """schema postgres prints statements that, run by psql, make a table the store uses."""
    result = run("schema", "postgres", "--table", f"t_{app_name.replace('-', '_')}")
    assert result.returncode == 0 and 'CREATE TABLE IF NOT EXISTS "t_app_' in result.stdout
    table = f"t_{app_name.replace('-', '_')}"
    psql = Path(pg_bindir()) / "psql"
    applied = subprocess.run(
        [str(psql), "-X", "-v", "ON_ERROR_STOP=1", PG_DSN],
        input=result.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    try:
        checked = run("check", "--postgres", PG_DSN, "--table", table)
        assert checked.returncode == 0 and "FAIL" not in checked.stdout, checked.stdout
    finally:
        pg_query(f"DROP TABLE {table}")


def test_schema_mysql_prints_the_ddl() -> None:
    """schema mysql prints the CREATE TABLE statement."""
    result = run("schema", "mysql", "--table", "t_x")
    assert result.returncode == 0 and "CREATE TABLE IF NOT EXISTS `t_x`" in result.stdout


def test_inspect_shows_a_failed_records_reason_and_stats_counts_it(
    target: Any, app_name: str
) -> None:
    """inspect shows a FAILED record's status and reason; stats counts FAILED records."""
    store, options = target
    failed = DedupElement(app_name, "T", "TagA", "k1")
    owner = new_owner_token()
    store.claim(Claim(failed, owner), 60_000)
    store.mark_failed(Claim(failed, owner), 60_000, "amount must be positive: -5")
    shown = run("inspect", *options, *element_args(app_name, "k1"))
    assert shown.returncode == 0, shown.stderr
    assert "FAILED" in shown.stdout and "amount must be positive: -5" in shown.stdout
    stats = run("stats", *options, "--app", app_name)
    assert stats.returncode == 0 and "FAILED" in stats.stdout


@pytest.mark.parametrize("kind", ["mysql", "postgres"])
def test_check_of_a_table_made_before_failed_records_warns_with_the_alter(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A table without failure_reason (made by an earlier version): check passes with a warn
    line naming the ALTER TABLE that adds it."""
    from tests.integration.test_failed_records_old_tables import old_table

    store = old_table(kind, request)
    table = store.table_name  # type: ignore[attr-defined]
    result = run("check", f"--{kind}", MYSQL_URL if kind == "mysql" else PG_DSN, "--table", table)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warn table:" in result.stdout and "ADD COLUMN failure_reason" in result.stdout
