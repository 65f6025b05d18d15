"""The baselines: the Java original's algorithm (Jaskey/RocketMQDedupListener) written plainly.

Redis (``RedisPersit``): claim with ``SET key CONSUMING NX PX lease``; on success run the
handler, then ``SET key CONSUMED EX reserve`` (``DEL`` on failure); on a failed claim ``GET``
the record: CONSUMED acks the duplicate, CONSUMING asks for a retry, anything else runs the
handler. Key: ``prefix:app:topic[:tag]:uniqKey``, unescaped, as in Java.

MySQL (``JDBCPersit`` and its table): ``INSERT`` a CONSUMING row (client clock); on a
duplicate key ``SELECT`` the live row's status; after the handler ``UPDATE`` the row to
CONSUMED (``DELETE`` on failure). Autocommit, one connection. PostgreSQL: the same statements
on the same table, written for psycopg 3 (a unique violation for the duplicate key).
"""

from __future__ import annotations

import abc
import time
from typing import Any, Callable, Optional

from bench.settings import LEASE_MS, RESERVE_MINUTES
from rocketmq_dedup.status import ConsumeStatus

CONSUMING = "CONSUMING"
CONSUMED = "CONSUMED"

Handler = Callable[[Any], bool]


def uniq_key(msg: Any) -> str:
    """The message's UNIQ_KEY property, else its id (the Java default dedup key)."""
    uniq = msg.get_property("UNIQ_KEY")
    return str(uniq.decode() if uniq else msg.id)


class NaiveDedup(abc.ABC):
    """Java's ``DedupConsumeStrategy.invoke``; subclasses are its ``IPersist`` implementations.
    ``naive(msg)`` returns a ConsumeStatus."""

    def __init__(self, app: str, handler: Handler) -> None:
        self.app = app
        self.handler = handler

    def __call__(self, msg: Any) -> ConsumeStatus:
        record = self.record_id(msg)
        if self.set_consuming_if_nx(record):
            return self._handle(msg, record)
        status = self.get_status(record)
        if status == CONSUMED:
            return ConsumeStatus.CONSUME_SUCCESS
        if status == CONSUMING:
            return ConsumeStatus.RECONSUME_LATER
        return self._handle(msg, record)  # vanished or unreadable: consume without dedup

    def _handle(self, msg: Any, record: Any) -> ConsumeStatus:
        try:
            ok = self.handler(msg)
        except Exception:
            ok = False
        if ok:
            self.mark_consumed(record)
            return ConsumeStatus.CONSUME_SUCCESS
        self.delete(record)
        return ConsumeStatus.RECONSUME_LATER

    @abc.abstractmethod
    def record_id(self, msg: Any) -> Any: ...

    @abc.abstractmethod
    def set_consuming_if_nx(self, record: Any) -> bool: ...

    @abc.abstractmethod
    def get_status(self, record: Any) -> Optional[str]: ...

    @abc.abstractmethod
    def mark_consumed(self, record: Any) -> None: ...

    @abc.abstractmethod
    def delete(self, record: Any) -> None: ...


class NaiveRedisDedup(NaiveDedup):
    """The Java Redis algorithm with redis-py."""

    def __init__(self, client: Any, app: str, handler: Handler, key_prefix: str) -> None:
        super().__init__(app, handler)
        self.client = client
        self.key_prefix = key_prefix
        self.reserve_s = RESERVE_MINUTES * 60

    def record_id(self, msg: Any) -> str:
        tag = msg.tags.decode() if msg.tags else ""
        tag_part = f":{tag}" if tag else ""
        return f"{self.key_prefix}:{self.app}:{msg.topic}{tag_part}:{uniq_key(msg)}"

    def set_consuming_if_nx(self, record: str) -> bool:
        return bool(self.client.set(record, CONSUMING, nx=True, px=LEASE_MS))

    def get_status(self, record: str) -> Optional[str]:
        value = self.client.get(record)
        return value.decode() if value is not None else None

    def mark_consumed(self, record: str) -> None:
        self.client.set(record, CONSUMED, ex=self.reserve_s)

    def delete(self, record: str) -> None:
        self.client.delete(record)


NAIVE_SCHEMA = """\
CREATE TABLE IF NOT EXISTS `{table}` (
  application_name VARCHAR(255) NOT NULL,
  topic            VARCHAR(255) NOT NULL,
  tag              VARCHAR(16)  NOT NULL,
  msg_uniq_key     VARCHAR(255) NOT NULL,
  status           VARCHAR(16)  NOT NULL,
  expire_time      BIGINT(20)   NOT NULL,
  UNIQUE KEY uniq_key (application_name, topic, tag, msg_uniq_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8"""

_WHERE = "application_name = %s AND topic = %s AND tag = %s AND msg_uniq_key = %s"

Ident = tuple[str, str, str, str]


class NaiveSQLDedup(NaiveDedup):
    """The Java JDBC algorithm over one autocommit connection: ``table`` is the quoted name;
    ``duplicate_key`` the driver's exception for a duplicate key."""

    def __init__(
        self, conn: Any, table: str, app: str, handler: Handler, duplicate_key: type[Exception]
    ) -> None:
        super().__init__(app, handler)
        self.conn = conn
        self.duplicate_key = duplicate_key
        self.insert_sql = (
            f"INSERT INTO {table} (application_name, topic, tag, msg_uniq_key, status, "
            "expire_time) VALUES (%s, %s, %s, %s, %s, %s)"
        )
        self.select_sql = f"SELECT status FROM {table} WHERE {_WHERE} AND expire_time > %s"
        self.update_sql = f"UPDATE {table} SET status = %s, expire_time = %s WHERE {_WHERE}"
        self.delete_sql = f"DELETE FROM {table} WHERE {_WHERE}"
        self.reserve_ms = RESERVE_MINUTES * 60_000

    @abc.abstractmethod
    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        """Run one statement; its first row, if it returns rows."""

    def record_id(self, msg: Any) -> Ident:
        return (self.app, msg.topic, msg.tags.decode(), uniq_key(msg))

    def set_consuming_if_nx(self, record: Ident) -> bool:
        try:
            self._execute(self.insert_sql, (*record, CONSUMING, now_ms() + LEASE_MS))
        except self.duplicate_key:
            return False
        return True

    def get_status(self, record: Ident) -> Optional[str]:
        row = self._execute(self.select_sql, (*record, now_ms()))
        return str(row[0]) if row else None

    def mark_consumed(self, record: Ident) -> None:
        self._execute(self.update_sql, (CONSUMED, now_ms() + self.reserve_ms, *record))

    def delete(self, record: Ident) -> None:
        self._execute(self.delete_sql, record)


class NaiveMySQLDedup(NaiveSQLDedup):
    """The Java JDBC algorithm over one autocommit mysqlclient connection."""

    def __init__(self, conn: Any, table: str, app: str, handler: Handler) -> None:
        import MySQLdb

        super().__init__(conn, f"`{table}`", app, handler, MySQLdb.IntegrityError)
        self.conn.autocommit(True)

    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        cur = self.conn.cursor()
        try:
            cur.execute(sql, params)
            return cur.fetchone()
        finally:
            cur.close()


NAIVE_PG_SCHEMA = """\
CREATE TABLE IF NOT EXISTS {table} (
  application_name varchar(255) NOT NULL,
  topic            varchar(255) NOT NULL,
  tag              varchar(16)  NOT NULL,
  msg_uniq_key     varchar(255) NOT NULL,
  status           varchar(16)  NOT NULL,
  expire_time      bigint       NOT NULL,
  UNIQUE (application_name, topic, tag, msg_uniq_key)
)"""


class NaivePostgresDedup(NaiveSQLDedup):
    """The Java JDBC algorithm over one autocommit psycopg connection (the same statements;
    a unique violation for the duplicate key)."""

    def __init__(self, conn: Any, table: str, app: str, handler: Handler) -> None:
        import psycopg

        super().__init__(conn, table, app, handler, psycopg.errors.UniqueViolation)
        self.conn.autocommit = True

    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        cur = self.conn.execute(sql, params)
        return cur.fetchone() if cur.description else None


def now_ms() -> int:
    return int(time.time() * 1000)
