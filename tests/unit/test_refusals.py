"""A store's refusals a person must fix, told from outages without a server: the driver errors
the MySQL/MariaDB, PostgreSQL and Redis stores meet (as the drivers raise them), what each
becomes, and the fix its message names. The real servers' refusals:
tests/integration/test_misconfigured_*.py."""

from __future__ import annotations

import functools
from typing import List

import mysql.connector
import MySQLdb
import psycopg
import pymysql
import pytest
import redis

from rocketmq_dedup import (
    MySQLDedupStore,
    PostgresDedupStore,
    RedisDedupStore,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
)
from rocketmq_dedup.stores.mysql.privileges import explain

DENIED = "INSERT command denied to user 'app'@'10.0.0.7' for table `orders`.`t_rocketmq_dedup`"
READ_ONLY = "The MariaDB server is running with the --read-only option so it cannot execute this"


@pytest.fixture
def mysql_store() -> MySQLDedupStore:
    """A store whose factory names its database (never called: no I/O here)."""
    return MySQLDedupStore(functools.partial(MySQLdb.connect, database="orders", port=1))


@pytest.fixture
def redis_store() -> RedisDedupStore:
    """A store of a client that never connects, whose user is ``app``."""
    return RedisDedupStore(redis.Redis(host="127.0.0.1", port=1, username="app", password="pw"))


def test_mysql_refusals_of_every_driver_are_misconfigurations_not_outages(
    mysql_store: MySQLDedupStore,
) -> None:
    """1142, 1044, 1045, 1290 as mysqlclient, PyMySQL (OperationalError) and
    mysql-connector-python (ProgrammingError) raise them: not outages; each wraps into a
    StoreMisconfiguredError whose fix names the GRANT, the login or the read-only server."""
    refusals: List[Exception] = [
        MySQLdb.OperationalError(1142, DENIED),
        pymysql.err.OperationalError(1142, DENIED),
        mysql.connector.errors.ProgrammingError(msg=DENIED, errno=1142),
        MySQLdb.OperationalError(1044, "Access denied for user 'app'@'%' to database 'orders'"),
        pymysql.err.OperationalError(
            1045, "Access denied for user 'app'@'h' (using password: YES)"
        ),
        MySQLdb.OperationalError(1290, READ_ONLY),
        mysql.connector.errors.DatabaseError(msg=READ_ONLY, errno=1290),
    ]
    fixes = []
    for exc in refusals:
        assert not mysql_store.is_outage(exc), exc
        wrapped = mysql_store.wrap_error(exc)
        assert isinstance(wrapped, StoreMisconfiguredError), exc
        assert not isinstance(wrapped, StoreUnavailableError)
        assert str(wrapped).endswith(f"({wrapped.fix})")
        fixes.append(wrapped.fix)
    grant = "GRANT SELECT, INSERT, UPDATE, DELETE ON orders.t_rocketmq_dedup TO 'app'@'10.0.0.7'"
    assert (
        fixes[:3]
        == [f"the MySQL user 'app'@'10.0.0.7' lacks INSERT on orders.t_rocketmq_dedup: {grant}"] * 3
    )
    assert "has no access to the database" in fixes[3]
    assert "refused the login of 'app'@'h'" in fixes[4]
    assert fixes[5] == fixes[6] and "takes no writes (read-only)" in fixes[5]


def test_mysql_outages_and_defects_stay_what_they_were(mysql_store: MySQLDedupStore) -> None:
    """A lost connection is still an outage; a missing table still a defect."""
    lost = MySQLdb.OperationalError(2013, "Lost connection to MySQL server during query")
    assert isinstance(mysql_store.wrap_error(lost), StoreUnavailableError)
    missing = pymysql.err.ProgrammingError(1146, "Table 'orders.t' doesn't exist")
    defect = mysql_store.wrap_error(missing)
    assert type(defect) is StoreError


DEADLOCK = "Deadlock found when trying to get lock; try restarting transaction"
LOCK_WAIT = "Lock wait timeout exceeded; try restarting transaction"


def in_sqlalchemy(exc: Exception) -> Exception:
    """``exc`` as a SQLAlchemy engine raises it (the driver's error as ``orig``)."""
    import sqlalchemy.exc

    return sqlalchemy.exc.OperationalError("INSERT ...", {}, exc)


def test_mysql_lock_conflicts_of_every_driver_are_lock_conflicts_not_outages(
    mysql_store: MySQLDedupStore,
) -> None:
    """1205 (lock wait timeout) and 1213 (deadlock) as mysqlclient, PyMySQL,
    mysql-connector-python and SQLAlchemy raise them: StoreLockConflictError, never an outage
    (both arrive as OperationalError, the outage family, on most drivers)."""
    conflicts: List[Exception] = [
        MySQLdb.OperationalError(1205, LOCK_WAIT),
        MySQLdb.OperationalError(1213, DEADLOCK),
        pymysql.err.OperationalError(1205, LOCK_WAIT),
        pymysql.err.OperationalError(1213, DEADLOCK),
        mysql.connector.errors.DatabaseError(msg=LOCK_WAIT, errno=1205),
        mysql.connector.errors.InternalError(msg=DEADLOCK, errno=1213),
    ]
    conflicts += [in_sqlalchemy(exc) for exc in conflicts]
    for exc in conflicts:
        assert not mysql_store.is_outage(exc), exc
        assert isinstance(mysql_store.wrap_error(exc), StoreLockConflictError), exc


def test_mysql_refusals_through_sqlalchemy_are_misconfigurations(
    mysql_store: MySQLDedupStore,
) -> None:
    """A refusal SQLAlchemy wraps (1142, 1290) is still a misconfiguration naming the fix; a
    lost connection it wraps is still an outage."""
    for exc in (
        MySQLdb.OperationalError(1142, DENIED),
        pymysql.err.OperationalError(1290, READ_ONLY),
    ):
        wrapped = mysql_store.wrap_error(in_sqlalchemy(exc))
        assert isinstance(wrapped, StoreMisconfiguredError), exc
        assert not mysql_store.is_outage(in_sqlalchemy(exc))
    lost = in_sqlalchemy(MySQLdb.OperationalError(2013, "Lost connection to MySQL server"))
    assert mysql_store.is_outage(lost)
    assert isinstance(mysql_store.wrap_error(lost), StoreUnavailableError)


def test_the_grant_names_the_table_and_account_the_server_names() -> None:
    """MariaDB's `db`.`table` and MySQL's 'table'; the account the check read (CURRENT_USER)
    over the client's host in the message; several commands; another table (the sequence
    table)."""
    mysql8 = "INSERT command denied to user 'app'@'10.0.0.7' for table 't_rocketmq_dedup'"
    assert explain(1142, mysql8, "t_rocketmq_dedup", "'app'@'%'", "orders") == (
        "the MySQL user 'app'@'%' lacks INSERT on orders.t_rocketmq_dedup: GRANT SELECT, "
        "INSERT, UPDATE, DELETE ON orders.t_rocketmq_dedup TO 'app'@'%'"
    )
    seq = (
        "INSERT, UPDATE command denied to user 'app'@'h' for table `orders`.`t_rocketmq_dedup_seq`"
    )
    assert explain(1142, seq, "t_rocketmq_dedup").startswith(
        "the MySQL user 'app'@'h' lacks INSERT, UPDATE on orders.t_rocketmq_dedup_seq: GRANT"
    )
    assert " ON other.t_rocketmq_dedup TO " in explain(1142, mysql8, "other.t_rocketmq_dedup")
    column = "SELECT command denied to user 'app'@'h' for column 'status' in table 't_seq'"
    assert " lacks SELECT on orders.t_seq: GRANT " in explain(1143, column, "t", None, "orders")


@pytest.mark.parametrize(
    ("exc", "fix"),
    [
        (
            redis.exceptions.NoPermissionError(
                "this user has no permissions to run the 'set' command"
            ),
            "the Redis user 'app' may not run 'set' (ACL): the store needs +ping +get +set "
            "+pttl +evalsha +script|load +del +pexpire ~MSGDEDUP:*",
        ),
        (
            redis.exceptions.NoPermissionError(
                "this user has no permissions to access one of the keys used as arguments"
            ),
            "the Redis user 'app' may not use the dedup keys (ACL)",
        ),
        (  # Redis 7.0's answer when a script's command is denied
            redis.ResponseError(
                "The user executing the script can't run this command or subcommand script: "
                "5e1b, on @user_script:1."
            ),
            "may not run a command of the store's Lua scripts (ACL: they run get, set, del, "
            "pexpire)",
        ),
        (
            redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            "the Redis server at 127.0.0.1:1/0 is a read-only replica: point the client at the "
            "primary",
        ),
        (
            redis.exceptions.AuthenticationError(
                "invalid username-password pair or user is disabled."
            ),
            "refused the credentials of user 'app'",
        ),
    ],
    ids=["command", "keys", "script", "replica", "password"],
)
def test_redis_refusals_are_misconfigurations_naming_the_fix(
    redis_store: RedisDedupStore, exc: Exception, fix: str
) -> None:
    """NOPERM (a command, the keys), a script's command denied, READONLY, WRONGPASS: not
    outages; StoreMisconfiguredError naming the ACL rules, the replica, the credentials."""
    assert not redis_store.is_outage(exc)
    wrapped = redis_store.wrap_error(exc)
    assert isinstance(wrapped, StoreMisconfiguredError)
    assert fix in wrapped.fix


def test_redis_outages_stay_outages(redis_store: RedisDedupStore) -> None:
    """A lost connection, a timeout, other error replies (OOM, WRONGTYPE): still outages."""
    outages: List[Exception] = [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError(),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    ]
    for exc in outages:
        assert redis_store.is_outage(exc), exc
        assert isinstance(redis_store.wrap_error(exc), StoreUnavailableError), exc


# -- PostgreSQL ----------------------------------------------------------------------------------


@pytest.fixture
def pg_store() -> PostgresDedupStore:
    """A store of a factory that logs in as ``app`` (never called: no I/O here)."""
    return PostgresDedupStore(
        functools.partial(psycopg.connect, "postgresql://app@127.0.0.1:1/orders"),
        "sales.t_rocketmq_dedup",
    )


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (
            psycopg.errors.InsufficientPrivilege("permission denied for table t_rocketmq_dedup"),
            "the PostgreSQL user app lacks a privilege on sales.t_rocketmq_dedup: GRANT SELECT, "
            "INSERT, UPDATE, DELETE ON sales.t_rocketmq_dedup TO app",
        ),
        (
            psycopg.errors.InsufficientPrivilege(
                "permission denied for table t_rocketmq_dedup_seq"
            ),
            "GRANT SELECT, INSERT, UPDATE, DELETE ON sales.t_rocketmq_dedup_seq TO app",
        ),
        (
            psycopg.errors.InsufficientPrivilege("permission denied for schema sales"),
            "GRANT USAGE ON SCHEMA sales TO app",
        ),
        (
            psycopg.errors.ReadOnlySqlTransaction(
                "cannot execute INSERT in a read-only transaction"
            ),
            "takes no writes (a hot standby, or default_transaction_read_only",
        ),
        (
            psycopg.OperationalError(
                'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
                'FATAL:  password authentication failed for user "app"'
            ),
            "the PostgreSQL server refused the login of app",
        ),
        (
            psycopg.OperationalError(
                'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "app"'
            ),
            "refused the login of app",
        ),
        (
            psycopg.OperationalError(
                'connection failed: FATAL:  permission denied for database "orders"'
            ),
            "GRANT CONNECT ON DATABASE orders TO app",
        ),
    ],
    ids=["table", "sequence-table", "schema", "read-only", "password", "pg_hba", "connect"],
)
def test_postgres_refusals_are_misconfigurations_naming_the_fix(
    pg_store: PostgresDedupStore, error: Exception, fix: str
) -> None:
    """42501, 25006 (psycopg's classes carry the sqlstate) and the login failures libpq reports
    without one: StoreMisconfiguredError naming the fix, never an outage."""
    wrapped = pg_store.wrap_error(error)
    assert isinstance(wrapped, StoreMisconfiguredError), wrapped
    assert fix in wrapped.fix
    assert not pg_store.is_outage(error)


def test_postgres_outages_lock_conflicts_and_defects_stay_what_they_were(
    pg_store: PostgresDedupStore,
) -> None:
    """A refused connection and a server shutting down are outages; a deadlock a lock
    conflict; a missing table and a syntax error defects."""
    down = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused'
    )
    shutdown = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert type(pg_store.wrap_error(down)) is StoreUnavailableError
    assert type(pg_store.wrap_error(shutdown)) is StoreUnavailableError
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert type(pg_store.wrap_error(deadlock)) is StoreLockConflictError
    for defect in (
        psycopg.errors.UndefinedTable('relation "t_rocketmq_dedup" does not exist'),
        psycopg.errors.SyntaxError("syntax error"),
    ):
        assert type(pg_store.wrap_error(defect)) is StoreError
