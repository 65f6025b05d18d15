"""A misconfigured PostgreSQL store: a user without the privileges it needs, a server that takes
no writes (``default_transaction_read_only`` for the user, a hot standby). The start-up check
refuses it naming the GRANT or the read-only server; at run time (``check_store=False``) every
delivery is answered RECONSUME_LATER and no handler runs without dedup, whatever
``store_failure_policy`` says; the exactly-once listener commits nothing and is no outage. On
every kind of source, against a PostgreSQL of this module's own (the shared one is never made
read-only, and its users are not ours to make)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Iterator, List

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    DedupConfigError,
    PostgresDedupStore,
    StoreMisconfiguredError,
    TransactionalDedupListener,
)
from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.integration.misconfigured import Counting, assert_never_run_without_dedup
from tests.integration.test_cli import run
from tests.support import PrivatePostgres, pg_connect, pg_query

pytestmark = pytest.mark.postgres

SOURCES = ["factory", "pool", "sqlalchemy"]
TABLE = "t_rocketmq_dedup"
DML = "SELECT, INSERT, UPDATE, DELETE"
LATER, SUCCESS = ConsumeStatus.RECONSUME_LATER, ConsumeStatus.CONSUME_SUCCESS


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    """This module's PostgreSQL: the dedup table (and its sequence table), a business table."""
    server = PrivatePostgres("misconfig").create()
    try:
        store = PostgresDedupStore(pg_connect(server.dsn), TABLE)
        store.create_table()
        store.close()
        pg_query("CREATE TABLE t_effects (k varchar(64), v int)", dsn=server.dsn)
        yield server
    finally:
        server.destroy()


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_user(server: PrivatePostgres) -> Iterator[Callable[..., str]]:
    """``make_user(grant, ...)``: a new login role with those grants (``"SELECT ON t"``);
    dropped after the test."""
    users: List[str] = []

    def make(*grants: str) -> str:
        user = f"mc_{uuid.uuid4().hex[:10]}"
        pg_query(f"CREATE ROLE {user} LOGIN", dsn=server.dsn)
        users.append(user)
        for grant in grants:
            pg_query(f"GRANT {grant} TO {user}", dsn=server.dsn)
        return user

    yield make
    for user in users:
        pg_query(f"DROP OWNED BY {user}", dsn=server.dsn)
        pg_query(f"DROP ROLE {user}", dsn=server.dsn)


def dsn_of(server: PrivatePostgres, user: str) -> str:
    return f"postgresql://{user}@127.0.0.1:{server.port}/postgres"


def client_of(kind: str, dsn: str, request: pytest.FixtureRequest) -> Any:
    """A source of ``kind`` on ``dsn``, closed at the end of the test."""
    if kind == "factory":
        return pg_connect(dsn, connect_timeout=3)
    if kind == "pool":
        import psycopg_pool

        pool = psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=4, timeout=5, open=True)
        request.addfinalizer(pool.close)
        return pool
    import sqlalchemy

    engine = sqlalchemy.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://"))
    request.addfinalizer(engine.dispose)
    return engine


def config_for(client: Any, user: str, **options: Any) -> DedupConfig:
    options.setdefault("table_name", TABLE)
    return DedupConfig.enable_dedup_consume_config(f"app-{user}", client, **options)


def grant_of(user: str, target: str = TABLE) -> str:
    return f"GRANT {DML} ON {target} TO {user}"


@pytest.mark.parametrize(
    "grants",
    [
        (),
        (f"SELECT ON {TABLE}",),
        (f"SELECT, INSERT ON {TABLE}",),
        (f"SELECT, INSERT, UPDATE ON {TABLE}",),
    ],
    ids=["nothing", "select", "select-insert", "no-delete"],
)
def test_a_user_without_the_privileges_is_refused_at_start_naming_the_grant(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    grants: List[str],
    request: pytest.FixtureRequest,
) -> None:
    """The start-up check claims and releases probe records: a missing privilege (42501) is a
    DedupConfigError naming the table and the GRANT to run for the user the server reported
    (before: SELECT 1 passed, and the first message failed)."""
    user = make_user(*grants)
    with pytest.raises(DedupConfigError) as caught:
        config_for(client_of(source, dsn_of(server, user), request), user)
    message = str(caught.value)
    assert f"the PostgreSQL user {user} lacks a privilege on {TABLE}: {grant_of(user)}" in message
    assert "permission denied for table" in message


def test_a_user_who_may_not_connect_is_refused_naming_it(
    server: PrivatePostgres, make_user: Callable[..., str], request: pytest.FixtureRequest
) -> None:
    """A role without LOGIN (the server's 28000, reported by libpq without a sqlstate): refused
    at start as a login to fix, not as an unreachable address."""
    user = make_user()
    pg_query(f"ALTER ROLE {user} NOLOGIN", dsn=server.dsn)
    with pytest.raises(DedupConfigError, match=f"refused the login of {user}"):
        config_for(client_of("factory", dsn_of(server, user), request), user)


@pytest.mark.parametrize("grants", [(), (f"SELECT ON {TABLE}",)], ids=["nothing", "select-only"])
def test_a_user_without_insert_never_runs_a_handler_without_dedup(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    grants: List[str],
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """check_store=False, the default policy "consume": each delivery is RECONSUME_LATER,
    logged as a refusal naming the fix, never an outage (before: 42501 was a StoreError, and
    the policy "consume" does not apply to those: the same answers, but not counted as
    store_misconfigured nor naming the GRANT)."""
    user = make_user(*grants)
    client = client_of(source, dsn_of(server, user), request)
    errors = assert_never_run_without_dedup(client, caplog, table_name=TABLE)
    assert grant_of(user) in errors


def test_a_read_only_user_is_refused_at_start_and_never_runs_a_handler_without_dedup(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """default_transaction_read_only for the user (25006, as on a hot standby): refused at
    start naming the read-only server; at run time RECONSUME_LATER, never run without
    dedup."""
    user = make_user(f"{DML} ON {TABLE}")
    pg_query(f"ALTER ROLE {user} SET default_transaction_read_only = on", dsn=server.dsn)
    dsn = dsn_of(server, user)
    with pytest.raises(DedupConfigError, match=r"read-only transaction.*takes no writes"):
        config_for(client_of(source, dsn, request), user)
    errors = assert_never_run_without_dedup(
        client_of(source, dsn, request), caplog, table_name=TABLE
    )
    assert "takes no writes" in errors


def test_a_hot_standby_is_refused_at_start_naming_it(server: PrivatePostgres) -> None:
    """A real hot standby of the module's server (streaming replication): its reads work, its
    writes are refused (25006): the start-up check and rocketmq-dedup check name the read-only
    server, the exactly-once listener's transaction is no outage."""
    standby = server.standby("misconfig-standby")
    try:
        dsn = f"postgresql://postgres@127.0.0.1:{standby.port}/postgres"
        with pytest.raises(DedupConfigError, match="takes no writes"):
            DedupConfig.enable_dedup_consume_config(
                "app-standby", pg_connect(dsn), table_name=TABLE
            )
        checked = run("check", "--postgres", dsn, "--table", TABLE)
        assert checked.returncode == 1 and "FAIL writes: the PostgreSQL server takes no writes" in (
            checked.stdout
        )
    finally:
        standby.destroy()


def test_a_user_with_select_insert_update_delete_works(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    request: pytest.FixtureRequest,
) -> None:
    """SELECT, INSERT, UPDATE and DELETE on the table are enough: the check passes and a key
    runs once in three deliveries; a batch runs each of its keys once."""
    user = make_user(f"{DML} ON {TABLE}")
    listener = Counting(config_for(client_of(source, dsn_of(server, user), request), user))
    key = uuid.uuid4().hex
    assert deliver(listener, ClassicMessage("m1", uniq_key=key), times=3).answers == (SUCCESS,) * 3
    batch = [ClassicMessage(f"b{n}", uniq_key=f"{key}-{n}") for n in range(3)]
    assert listener.consume_message(batch).status is SUCCESS
    assert listener.consume_message(batch).status is SUCCESS
    assert listener.runs == 4
    listener.close()


class Effects(TransactionalDedupListener):
    """Writes one effect row per message; its sequence key is (its topic, the message's
    step)."""

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        statement = "INSERT INTO t_effects (k, v) VALUES (%s, %s)"
        if hasattr(conn, "exec_driver_sql"):
            conn.exec_driver_sql(statement, (msg.id, 1))
        else:
            conn.execute(statement, (msg.id, 1))
        return True

    def sequence_key(self, msg: Any) -> Any:
        return (msg.topic, int(msg.id.rpartition("-")[2]))


def effect_count(server: PrivatePostgres, like: str) -> List[Any]:
    return pg_query(
        "SELECT k, count(*) FROM t_effects WHERE k LIKE %s GROUP BY k ORDER BY k",
        like,
        dsn=server.dsn,
    )


def test_the_exactly_once_listener_works_with_those_privileges_and_the_sequence_table(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    request: pytest.FixtureRequest,
) -> None:
    """TransactionalDedupListener with the same privileges on the dedup table and on its
    sequence table (<table>_seq, for sequence_key): each step applied once in three
    deliveries, in order."""
    user = make_user(f"{DML} ON {TABLE}", f"{DML} ON {TABLE}_seq", "SELECT, INSERT ON t_effects")
    listener = Effects(config_for(client_of(source, dsn_of(server, user), request), user))
    entity = f"acct-{uuid.uuid4().hex[:8]}"
    for step in (1, 2):
        msg = ClassicMessage(f"{entity}-{step}", topic=entity, uniq_key=f"{entity}-{step}")
        assert deliver(listener, msg, times=3).answers == (SUCCESS,) * 3
    listener.close()
    assert effect_count(server, f"{entity}-%") == [(f"{entity}-1", 1), (f"{entity}-2", 1)]


@pytest.mark.parametrize(
    ("grants", "named"),
    [
        ((f"SELECT ON {TABLE}", f"{DML} ON {TABLE}_seq", "SELECT, INSERT ON t_effects"), TABLE),
        ((f"{DML} ON {TABLE}", "SELECT, INSERT ON t_effects"), f"{TABLE}_seq"),
    ],
    ids=["record", "sequence-table"],
)
def test_the_exactly_once_listener_without_the_privileges_commits_nothing_and_is_no_outage(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    source: str,
    grants: List[str],
    named: str,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """TransactionalDedupListener, a user who may write its business table but not the dedup
    record (or not the sequence table): each delivery rolls back (no effect committed) and is
    RECONSUME_LATER, logged as a refusal naming the GRANT on the table the server named, never
    as the business database being unavailable."""
    user = make_user(*grants)
    client = client_of(source, dsn_of(server, user), request)
    listener = Effects(config_for(client, user, check_store=False))
    msg = ClassicMessage(f"eo-{user}-1", topic=f"eo-{user}", uniq_key=f"eo-{user}-1")
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        assert deliver(listener, msg, times=3).answers == (LATER,) * 3
    listener.close()
    assert effect_count(server, msg.id) == []
    assert "unavailable" not in caplog.text and "permission denied" in caplog.text
    assert "a configuration a person must fix" in caplog.text
    assert grant_of(user, named) in caplog.text


def test_the_check_before_create_table_proves_the_writes_in_create_table(
    server: PrivatePostgres,
    make_user: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """The quick start builds the config (the check) before create_table(): a missing table
    does not fail the check, and create_table() then proves the writes (the user owns the
    tables it creates)."""
    table = f"t_qs_{uuid.uuid4().hex[:8]}"
    writer = make_user("CREATE ON SCHEMA public")
    client = client_of("factory", dsn_of(server, writer), request)
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        config = config_for(client, writer, table_name=table)
    assert "the table does not exist yet" in caplog.text
    assert isinstance(config.persist, PostgresDedupStore)
    config.persist.create_table()
    listener = Counting(config)
    assert deliver(listener, ClassicMessage("m1", uniq_key="k"), times=2).handler_runs == 1
    listener.close()
    pg_query(f"REVOKE DELETE ON {table} FROM {writer}", dsn=server.dsn)
    with pytest.raises(StoreMisconfiguredError, match=f"lacks a privilege on {table}: GRANT"):
        config.persist.prove_writes("orders")


def test_check_names_the_missing_grant_and_the_writes(
    server: PrivatePostgres, make_user: Callable[..., str]
) -> None:
    """rocketmq-dedup check: a FAIL line naming the privileges the user lacks and the GRANT
    (exit 1; before: "missing (GRANT them to the store's user)"); a writable user's writes are
    proved."""
    reader = make_user(f"SELECT ON {TABLE}")
    failed = run("check", "--postgres", dsn_of(server, reader), "--table", TABLE)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    lacks = f"FAIL privileges: {DML} on the table: {reader} lacks INSERT, UPDATE, DELETE"
    assert lacks in failed.stdout
    assert grant_of(reader) in failed.stdout
    writer = make_user(f"{DML} ON {TABLE}")
    passed = run("check", "--postgres", dsn_of(server, writer), "--table", TABLE, "--app", "o")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "ok   writes: claimed, renewed, read and released probe records" in passed.stdout
