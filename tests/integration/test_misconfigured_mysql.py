"""A misconfigured MySQL/MariaDB store: an application user without the privileges it needs, a
server in ``read_only`` mode. The start-up check refuses it naming the GRANT or the read-only
server; at run time (``check_store=False``) every delivery is answered RECONSUME_LATER and no
handler runs without dedup, whatever ``store_failure_policy`` says. On every DB-API driver,
against a MariaDB of this module's own (the shared one is never made read-only)."""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any, Callable, Iterator, List

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    DedupConfigError,
    MySQLDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.integration.exactly_once.support import execute
from tests.integration.misconfigured import Counting, assert_never_run_without_dedup
from tests.integration.private_servers import DATABASE, PrivateMariaDB
from tests.integration.test_cli import run

DRIVERS = ["mysqlclient", "pymysql", "mysql-connector", "sqlalchemy"]
TABLE = "t_rocketmq_dedup"
TARGET = f"{DATABASE}.{TABLE}"
PASSWORD = "pw-misconfig"
LATER, SUCCESS = ConsumeStatus.RECONSUME_LATER, ConsumeStatus.CONSUME_SUCCESS
DML = "SELECT, INSERT, UPDATE, DELETE"


@pytest.fixture(scope="module")
def private_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    """This module's MariaDB: the dedup table (and its sequence table), and another table."""
    server = PrivateMariaDB(tmp_path_factory.mktemp("mariadb"))
    try:
        root = functools.partial(server.admin)
        MySQLDedupStore(root, f"{DATABASE}.{TABLE}").create_table()
        server.sql(f"CREATE TABLE {DATABASE}.t_other (id INT PRIMARY KEY)")
        server.sql(f"CREATE TABLE {DATABASE}.t_effects (k VARCHAR(64), v INT) ENGINE=InnoDB")
        yield server
    finally:
        server.stop()


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_user(private_mariadb: PrivateMariaDB) -> Iterator[Callable[..., str]]:
    """``make_user(grant, ...)``: a new user on 127.0.0.1 with those grants (``"SELECT ON
    db.t"``); dropped after the test."""
    users: List[str] = []

    def make(*grants: str) -> str:
        user = f"mc_{uuid.uuid4().hex[:10]}"
        private_mariadb.sql(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'")
        users.append(user)
        for grant in grants:
            private_mariadb.sql(f"GRANT {grant} TO '{user}'@'127.0.0.1'")
        return user

    yield make
    for user in users:
        private_mariadb.sql(f"DROP USER '{user}'@'127.0.0.1'")


@pytest.fixture
def read_only(private_mariadb: PrivateMariaDB) -> Iterator[None]:
    """The module's server in ``read_only`` mode for one test."""
    private_mariadb.sql("SET GLOBAL read_only = 1")
    yield
    private_mariadb.sql("SET GLOBAL read_only = 0")


def config_for(server: PrivateMariaDB, driver: str, user: str, **options: Any) -> DedupConfig:
    factory = server.connect(driver, user, PASSWORD)
    options.setdefault("table_name", TABLE)
    return DedupConfig.enable_dedup_consume_config(f"app-{user}", factory, **options)


def grant_of(user: str, target: str = TARGET) -> str:
    return f"GRANT {DML} ON {target} TO '{user}'@'127.0.0.1'"


@pytest.mark.parametrize(
    ("grants", "missing"),
    [
        ((f"SELECT ON {DATABASE}.t_other",), "INSERT"),  # no grant on the dedup table
        ((f"SELECT ON {TARGET}",), "INSERT"),
        ((f"SELECT, INSERT ON {TARGET}",), "UPDATE"),
        ((f"SELECT, INSERT, UPDATE ON {TARGET}",), "DELETE"),
    ],
)
def test_a_user_without_the_privileges_is_refused_at_start_naming_the_grant(
    private_mariadb: PrivateMariaDB,
    make_user: Callable[..., str],
    driver: str,
    grants: List[str],
    missing: str,
) -> None:
    """The start-up check claims and releases probe records: a missing privilege is a
    DedupConfigError naming it and the GRANT to run (before: SELECT 1 passed)."""
    user = make_user(*grants)
    with pytest.raises(DedupConfigError) as caught:
        config_for(private_mariadb, driver, user)
    message = str(caught.value)
    assert f"'{user}'@'127.0.0.1' lacks {missing} on {TARGET}: {grant_of(user)}" in message
    assert "command denied" in message


def test_a_user_without_access_or_a_wrong_password_is_refused_naming_it(
    private_mariadb: PrivateMariaDB, make_user: Callable[..., str], driver: str
) -> None:
    """No grant on the database at all (1044), a wrong password (1045): refused at start as
    what they are, not as an unreachable address."""
    user = make_user()
    with pytest.raises(DedupConfigError, match=f"'{user}'@'127.0.0.1' has no access to the "):
        config_for(private_mariadb, driver, user)
    factory = private_mariadb.connect(driver, user, "wrong")
    with pytest.raises(DedupConfigError, match="refused the login of"):
        DedupConfig.enable_dedup_consume_config("app", factory, table_name=TABLE)


@pytest.mark.parametrize(
    "grants",
    [(), (f"SELECT ON {DATABASE}.t_other",), (f"SELECT ON {TARGET}",)],
    ids=["no-access", "no-grant-on-the-table", "select-only"],
)
def test_a_user_without_insert_never_runs_a_handler_without_dedup(
    private_mariadb: PrivateMariaDB,
    make_user: Callable[..., str],
    driver: str,
    grants: List[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """check_store=False, the default policy "consume": each delivery is RECONSUME_LATER,
    logged as a refusal naming the fix, never an outage (before: the handler ran 3 times in
    3 deliveries on mysqlclient and PyMySQL, logged as "connection failed ... reconnecting")."""
    user = make_user(*grants)
    factory = private_mariadb.connect(driver, user, PASSWORD)
    errors = assert_never_run_without_dedup(factory, caplog, table_name=TABLE)
    assert f"'{user}'@'127.0.0.1'" in errors and f"GRANT {DML} ON {TARGET}" in errors


def test_a_read_only_server_is_refused_at_start_and_never_runs_a_handler_without_dedup(
    private_mariadb: PrivateMariaDB,
    make_user: Callable[..., str],
    driver: str,
    read_only: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A MariaDB in read_only mode (1290) with a user that may write: refused at start naming
    the read-only server; at run time RECONSUME_LATER, never run without dedup (before: it
    passed the check and ran every delivery)."""
    user = make_user(f"{DML} ON {TARGET}")
    with pytest.raises(DedupConfigError, match=r"1290.*takes no writes \(read-only\)"):
        config_for(private_mariadb, driver, user)
    factory = private_mariadb.connect(driver, user, PASSWORD)
    assert "takes no writes" in assert_never_run_without_dedup(factory, caplog, table_name=TABLE)


def test_a_user_with_select_insert_update_delete_works(
    private_mariadb: PrivateMariaDB, make_user: Callable[..., str], driver: str
) -> None:
    """SELECT, INSERT, UPDATE and DELETE on the table are enough: the check passes and a key
    runs once in three deliveries; a batch runs each of its keys once."""
    user = make_user(f"{DML} ON {TARGET}")
    listener = Counting(config_for(private_mariadb, driver, user))
    key = uuid.uuid4().hex
    assert deliver(listener, ClassicMessage("m1", uniq_key=key), times=3).answers == (SUCCESS,) * 3
    batch = [ClassicMessage(f"b{n}", uniq_key=f"{key}-{n}") for n in range(3)]
    assert listener.consume_message(batch).status is SUCCESS
    assert listener.consume_message(batch).status is SUCCESS
    assert listener.runs == 4
    listener.close()


class Effects(TransactionalDedupListener):
    """Writes one effect row per message; its sequence key is ("acct", the message's step)."""

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        execute(conn, "INSERT INTO t_effects (k, v) VALUES (%s, %s)", (msg.id, 1))
        return True

    def sequence_key(self, msg: Any) -> Any:
        return (msg.topic, int(msg.id.rpartition("-")[2]))


def test_the_exactly_once_listener_works_with_those_privileges_and_the_sequence_table(
    private_mariadb: PrivateMariaDB, make_user: Callable[..., str], driver: str
) -> None:
    """TransactionalDedupListener with the same privileges on the dedup table and on its
    sequence table (<table>_seq, for sequence_key): each step applied once in three
    deliveries, in order."""
    user = make_user(
        f"{DML} ON {TARGET}", f"{DML} ON {TARGET}_seq", f"SELECT, INSERT ON {DATABASE}.t_effects"
    )
    listener = Effects(config_for(private_mariadb, driver, user))
    entity = f"acct-{uuid.uuid4().hex[:8]}"
    for step in (1, 2):
        msg = ClassicMessage(f"{entity}-{step}", topic=entity, uniq_key=f"{entity}-{step}")
        assert deliver(listener, msg, times=3).answers == (SUCCESS,) * 3
    listener.close()
    rows = private_mariadb.sql(
        f"SELECT k, COUNT(*) FROM {DATABASE}.t_effects WHERE k LIKE '{entity}-%' GROUP BY k"
    )
    assert sorted(rows) == [(f"{entity}-1", 1), (f"{entity}-2", 1)]


def test_the_exactly_once_listener_without_the_privileges_commits_nothing_and_is_no_outage(
    private_mariadb: PrivateMariaDB,
    make_user: Callable[..., str],
    driver: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """TransactionalDedupListener, a user who may write its business table but only read the
    dedup table: the record's INSERT is refused, so each delivery rolls back (no effect
    committed) and is RECONSUME_LATER; the refusal is not logged as the business database
    being unavailable (before: it was, 1142 counting as an outage)."""
    user = make_user(f"SELECT ON {TARGET}", f"SELECT, INSERT ON {DATABASE}.t_effects")
    config = config_for(private_mariadb, driver, user, check_store=False)
    listener = Effects(config)
    msg = ClassicMessage(f"eo-{user}-1", topic=f"eo-{user}", uniq_key=f"eo-{user}-1")
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        assert deliver(listener, msg, times=3).answers == (LATER,) * 3
    listener.close()
    assert private_mariadb.sql(
        f"SELECT COUNT(*) FROM {DATABASE}.t_effects WHERE k = '{msg.id}'"
    ) == [(0,)]
    assert "unavailable" not in caplog.text and "command denied" in caplog.text
    assert "a configuration a person must fix" in caplog.text


def test_the_check_before_create_table_proves_the_writes_in_create_table(
    private_mariadb: PrivateMariaDB,
    make_user: Callable[..., str],
    driver: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The quick start builds the config (the check) before create_table(). A user without
    INSERT is refused there already (the server says "denied" before "no such table"); a
    missing table alone does not fail the check, and create_table() then proves the writes
    (here: naming a missing DELETE), and passes for a user with every privilege."""
    from rocketmq_dedup import StoreMisconfiguredError

    table = f"t_qs_{uuid.uuid4().hex[:8]}"
    target = f"{DATABASE}.{table}"
    reader = make_user(f"CREATE, SELECT ON {DATABASE}.*")
    with pytest.raises(DedupConfigError, match=f"lacks INSERT on {target}: GRANT"):
        config_for(private_mariadb, driver, reader, table_name=table)
    no_delete = make_user(f"CREATE, SELECT, INSERT, UPDATE ON {DATABASE}.*")
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        config = config_for(private_mariadb, driver, no_delete, table_name=table)
    assert "the table does not exist yet" in caplog.text
    assert isinstance(config.persist, MySQLDedupStore)
    with pytest.raises(StoreMisconfiguredError, match=f"lacks DELETE on {target}: GRANT"):
        config.persist.create_table()
    config.close()
    writer = make_user(f"CREATE, {DML} ON {DATABASE}.*")
    config = config_for(private_mariadb, driver, writer, table_name=table)
    assert isinstance(config.persist, MySQLDedupStore)
    config.persist.create_table()
    listener = Counting(config)
    assert deliver(listener, ClassicMessage("m1", uniq_key="k"), times=2).handler_runs == 1
    listener.close()


def test_check_names_the_missing_grant_and_the_read_only_server(
    private_mariadb: PrivateMariaDB, make_user: Callable[..., str]
) -> None:
    """rocketmq-dedup check proves the writes: a FAIL line naming the GRANT (exit 1); a
    writable user's writes pass; a read-only server is a FAIL line naming it."""
    reader = make_user(f"SELECT ON {TARGET}")
    failed = run("check", "--mysql", private_mariadb.url(reader, PASSWORD), "--table", TABLE)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"FAIL writes: the MySQL user '{reader}'@'127.0.0.1' lacks INSERT" in failed.stdout
    assert grant_of(reader) in failed.stdout
    writer = make_user(f"{DML} ON {TARGET}")
    url = private_mariadb.url(writer, PASSWORD)
    passed = run("check", "--mysql", url, "--table", TABLE, "--app", "orders")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "ok   writes: claimed, renewed, read and released probe records" in passed.stdout
    private_mariadb.sql("SET GLOBAL read_only = 1")
    try:
        refused = run("check", "--mysql", url, "--table", TABLE)
    finally:
        private_mariadb.sql("SET GLOBAL read_only = 0")
    assert refused.returncode == 1 and "FAIL writes: the MySQL server takes no writes" in (
        refused.stdout
    )
