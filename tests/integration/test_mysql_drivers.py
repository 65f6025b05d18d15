"""The MySQL store on every supported driver and connection setting, against the real MariaDB:
character sets and ``use_unicode=False``, what is an outage and what is a defect, check(),
describe(), and factories that make no DB-API connection."""

from __future__ import annotations

import functools
import uuid
from typing import Any, Dict

import mysql.connector
import MySQLdb
import pymysql
import pytest
import redis

from rocketmq_dedup import DedupConfigError, DedupElement, DedupStatus
from rocketmq_dedup.errors import StoreError, StoreUnavailableError
from rocketmq_dedup.stores.base import ALREADY_CONSUMED, CLAIMED, HELD_BY_OTHER, Claim
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from tests.integration.test_mysql_pool import CountingConnect
from tests.support import MYSQL, REDIS_URL, mysql_connect, outcome

DRIVERS = ["mysqlclient", "pymysql", "mysql-connector"]
KEYS = {"cjk": "订单-\u6d88\u606f-42", "emoji": "order-\U0001f600\U0001f680"}


def readable_row(table: str, e: DedupElement) -> Any:
    conn = mysql_connect()()
    try:
        cursor = conn.cursor()
        cursor.execute(
            f"SELECT tag, msg_uniq_key, status FROM {table} WHERE dedup_key = %s", (e.digest(),)
        )
        return cursor.fetchone()
    finally:
        conn.close()


# -- 3. drivers and connection settings ------------------------------------------------------


@pytest.mark.parametrize("key", sorted(KEYS))
@pytest.mark.parametrize(
    ("driver", "settings"),
    [
        ("mysqlclient", {"use_unicode": False}),
        ("mysqlclient", {"charset": "latin1"}),
        ("pymysql", {"use_unicode": False}),
        ("pymysql", {"charset": "latin1"}),
        ("mysql-connector", {"use_unicode": False}),
        ("mysql-connector", {"charset": "latin1"}),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value
    ),
)
def test_connection_settings_do_not_break_unicode_keys(
    mysql_table: str, app_name: str, driver: str, settings: Dict[str, Any], key: str
) -> None:
    """A factory asking for latin1 or bytes rows still claims, marks and reads a CJK or emoji
    key, and the readable columns hold the real text."""
    store = MySQLDedupStore(mysql_connect(driver, **settings), mysql_table)
    try:
        e = DedupElement(app_name, "T", "标签", KEYS[key])
        assert store.claim(Claim(e, "o1"), 60_000) == CLAIMED
        assert outcome(store.claim(Claim(e, "o2"), 60_000)) == outcome(HELD_BY_OTHER)
        assert store.get_status(e) is DedupStatus.CONSUMING
        store.mark_consumed(Claim(e, "o1"), 60_000)
        assert store.get_status(e) is DedupStatus.CONSUMED
        assert outcome(store.claim(Claim(e, "o3"), 60_000)) == outcome(ALREADY_CONSUMED)
        assert readable_row(mysql_table, e) == ("标签", KEYS[key], "CONSUMED")
    finally:
        store.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_driver_gets_an_autocommit_utf8mb4_utc_session(mysql_table: str, driver: str) -> None:
    """Each new connection is in autocommit, utf8mb4 and UTC, whatever the driver."""
    store = MySQLDedupStore(mysql_connect(driver, charset="latin1"), mysql_table)
    try:
        runner = store.pool.take()
        rows = runner.run(
            "SELECT @@autocommit, @@character_set_client, @@character_set_results, @@time_zone",
            (),
            True,
        )
        store.pool.give(runner)
        values = tuple(v.decode() if isinstance(v, (bytes, bytearray)) else v for v in rows[0])
        assert values == (1, "utf8mb4", "utf8mb4", "+00:00")
    finally:
        store.close()


# -- 4. a bug is not an outage ---------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_missing_table_is_a_store_error_not_an_outage(app_name: str, driver: str) -> None:
    """A missing table is a defect (StoreError naming the table), not an outage."""
    table = f"t_missing_{uuid.uuid4().hex[:8]}"
    store = MySQLDedupStore(mysql_connect(driver), table)
    try:
        with pytest.raises(StoreError, match=table) as caught:
            store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000)
        assert not isinstance(caught.value, StoreUnavailableError)
    finally:
        store.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_refused_connection_is_an_outage(mysql_table: str, app_name: str, driver: str) -> None:
    """A server that refuses connections is an outage, for claims and for check()."""
    store = MySQLDedupStore(mysql_connect(driver, port=1, connect_timeout=5), mysql_table)
    with pytest.raises(StoreUnavailableError):
        store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000)
    with pytest.raises(StoreUnavailableError):
        store.check()
    assert store.pool.open_count == 0  # the failed connects gave their slots back


def caused_by(exc: BaseException, cause: BaseException) -> BaseException:
    """``exc`` as if raised ``from cause``."""
    exc.__cause__ = cause
    return exc


def test_outage_is_the_pep249_operational_and_interface_families(mysql_table: str) -> None:
    """OperationalError/InterfaceError of any driver (by class name) are outages; other
    driver errors and plain bugs are not."""
    store = MySQLDedupStore(mysql_connect(), mysql_table)
    for outage in (
        MySQLdb.OperationalError(2013, "Lost connection"),
        MySQLdb.InterfaceError(0, ""),
        pymysql.err.OperationalError(2003, "refused"),
        pymysql.err.InterfaceError(0, ""),
        mysql.connector.errors.OperationalError("lost"),
        mysql.connector.errors.InterfaceError("refused"),
        type("OperationalError", (Exception,), {})(),  # an unknown driver's
        caused_by(  # how mysql-connector-python reports a dead connection while quoting
            mysql.connector.errors.ProgrammingError("Failed processing format-parameters"),
            mysql.connector.errors.OperationalError("MySQL Connection not available"),
        ),
    ):
        assert store.is_outage(outage), outage
    for defect in (
        MySQLdb.ProgrammingError(1146, "no such table"),
        MySQLdb.OperationalError(1054, "Unknown column 'x' in 'field list'"),  # mysqlclient's
        MySQLdb.IntegrityError(1062, "duplicate"),
        pymysql.err.ProgrammingError(1064, "syntax"),
        mysql.connector.errors.ProgrammingError("no such table"),
        TypeError("a bug"),
        KeyError("a bug"),
        caused_by(StoreError("wrapped"), TypeError("a bug")),
    ):
        assert not store.is_outage(defect), defect


def test_a_bug_in_the_factory_is_a_store_error(mysql_table: str, app_name: str) -> None:
    """A factory that raises TypeError (a bug) gives StoreError, not StoreUnavailableError."""

    def broken() -> Any:
        raise TypeError("connect() got an unexpected keyword argument 'hots'")

    store = MySQLDedupStore(broken, mysql_table)
    with pytest.raises(StoreError, match="hots") as caught:
        store.claim(Claim(DedupElement(app_name, "T", "", "k"), "o"), 60_000)
    assert not isinstance(caught.value, StoreUnavailableError)


# -- 5. check(), describe() and factories that make no connection ----------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_check_connects_before_the_table_exists(driver: str) -> None:
    """check() connects and runs SELECT 1: a table not created yet is fine."""
    counting = CountingConnect(mysql_connect(driver))
    store = MySQLDedupStore(counting, f"t_not_yet_{uuid.uuid4().hex[:8]}")
    try:
        store.check()
        assert counting.calls == 1
        assert counting.open_on_server() == 1  # pooled for the first message
    finally:
        store.close()


def test_check_rejects_a_factory_returning_no_connection(mysql_table: str) -> None:
    """A factory returning something without .cursor (a redis client) fails check() saying
    what it must return."""
    client = redis.Redis.from_url(REDIS_URL)
    store = MySQLDedupStore(lambda: client, mysql_table)
    with pytest.raises(StoreError, match=r"must return a DB-API connection; got redis.*Redis"):
        store.check()
    client.close()


def test_a_class_that_makes_no_connection_is_refused(mysql_table: str) -> None:
    """redis.Redis (the class, callable) is refused at construction."""
    with pytest.raises(DedupConfigError, match=r"DB-API connection.*redis.*Redis"):
        MySQLDedupStore(redis.Redis, mysql_table)


def test_describe_names_server_database_and_table(mysql_table: str) -> None:
    """describe() names user@host:port/db and the table, never the password."""
    store = MySQLDedupStore(mysql_connect(password="s3cret-pw"), mysql_table)
    text = store.describe()
    assert text == (
        f"MySQL {MYSQL['user']}@{MYSQL['host']}:{MYSQL['port']}/{MYSQL['database']} "
        f"table {mysql_table}"
    )
    assert "s3cret-pw" not in text
    socket = MySQLDedupStore(
        functools.partial(MySQLdb.connect, unix_socket="/run/mysqld.sock", db="app"), "t"
    )
    assert socket.describe() == "MySQL localhost:/run/mysqld.sock/app table t"


def test_describe_of_a_plain_function_uses_its_repr(mysql_table: str) -> None:
    """A factory that is not a partial is described by its repr, and errors carry it."""

    def connect_to_orders() -> Any:
        return mysql_connect(port=1)()

    store = MySQLDedupStore(connect_to_orders, mysql_table)
    assert "connect_to_orders" in store.describe()
    assert mysql_table in store.describe()
    with pytest.raises(StoreUnavailableError, match="connect_to_orders"):
        store.check()
