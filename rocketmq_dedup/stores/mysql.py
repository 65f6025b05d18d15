"""MySQL / MariaDB record store over any DB-API driver (mysqlclient, the ``[mysql]`` extra,
or PyMySQL).

* Identity: ``dedup_key`` = SHA-256 of the length-prefixed (application, topic, tag, key), so
  tags and keys of any length and any Unicode never truncate or collide, and comparisons are
  binary (case-sensitive). The readable columns keep the first 255 characters for operators.
* Time: leases and retention are computed from the database server's clock (the session time
  zone is set to UTC so epoch conversions are exact), never the client's.
* A fresh claim is one ``INSERT IGNORE``; a duplicate costs one more ``SELECT``; an expired
  record is taken over by one ``INSERT ... ON DUPLICATE KEY UPDATE`` that only overwrites
  a row whose lease or retention has passed (checked in the same statement). Marking CONSUMED
  is one ``UPDATE`` of the claimed row.
* ``purge_expired()`` walks the table in primary-key order, ``batch_size`` rows at a time, and
  deletes the expired ones: one pass reads every row once. The table has no ``expire_time``
  index: it would cost every claim and every CONSUMED mark an index write (measured: 4 % of a
  message's time, BENCHMARKS.md), and the purge is a background job.
* Connections: one per thread, opened from the zero-argument ``connect`` callable, autocommit;
  a lost connection (server restart) is reopened and the statement retried once. Every
  statement is idempotent for its owner token, so the retry is safe. On mysqlclient
  connections statements run through its connection API (same escaping, no cursor
  bookkeeping); other drivers go through DB-API cursors.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import (
    CLAIMED,
    HELD_BY_OTHER,
    ClaimResult,
    DedupStore,
    parse_status,
)

logger = logging.getLogger(__name__)

DEFAULT_TABLE_NAME = "t_rocketmq_dedup"
READABLE_CHARS = 255
_TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,63}(\.[A-Za-z_][A-Za-z0-9_$]{0,63})?$")
_RETRYABLE_ERRORS = ("OperationalError", "InterfaceError")
_CLAIM_ATTEMPTS = 3

# The database server's clock, in epoch milliseconds (the session time zone is UTC).
NOW_MS = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

SCHEMA_SQL = """\
CREATE TABLE IF NOT EXISTS {table} (
  dedup_key        BINARY(32)      NOT NULL COMMENT 'SHA-256 of (application, topic, tag, key)',
  application_name VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  topic            VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  tag              VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  msg_uniq_key     VARCHAR(255)    NOT NULL COMMENT 'first 255 characters, for operators',
  status           VARCHAR(16)     NOT NULL COMMENT 'CONSUMING or CONSUMED',
  owner_token      VARCHAR(64)     NOT NULL COMMENT 'the claim that wrote the row',
  expire_time      BIGINT          NOT NULL COMMENT 'epoch ms, database server clock',
  deliveries       BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'claims and duplicates seen',
  PRIMARY KEY (dedup_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

_COLUMNS = "dedup_key, application_name, topic, tag, msg_uniq_key, status, owner_token, expire_time"

# One row per element: a fresh CONSUMING claim, or the takeover of an expired record.
# Assignments run left to right, so expire_time is compared before it is overwritten.
# `deliveries` always changes, so rowcount is 1 for an insert and 2 for an existing row,
# with or without the CLIENT_FOUND_ROWS flag.
CLAIM_SQL = f"""\
INSERT INTO {{table}} ({_COLUMNS}) VALUES {{rows}}
ON DUPLICATE KEY UPDATE
  deliveries = deliveries + 1,
  status = IF(expire_time <= {NOW_MS}, VALUES(status), status),
  owner_token = IF(expire_time <= {NOW_MS}, VALUES(owner_token), owner_token),
  expire_time = IF(expire_time <= {NOW_MS}, VALUES(expire_time), expire_time)"""

# Claims fresh elements only: rows that exist (live or expired) are skipped, not touched.
INSERT_CLAIM_SQL = f"INSERT IGNORE INTO {{table}} ({_COLUMNS}) VALUES {{rows}}"

CLAIM_ROW = f"(%s, %s, %s, %s, %s, 'CONSUMING', %s, {NOW_MS} + %s)"

# A success is always recorded, whoever holds the row now.
MARK_CONSUMED_SQL = f"""\
INSERT INTO {{table}} ({_COLUMNS}) VALUES {{rows}}
ON DUPLICATE KEY UPDATE
  status = VALUES(status), owner_token = VALUES(owner_token), expire_time = VALUES(expire_time)"""

MARK_CONSUMED_ROW = f"(%s, %s, %s, %s, %s, 'CONSUMED', %s, {NOW_MS} + %s)"

SELECT_SQL = (
    f"SELECT dedup_key, status, owner_token FROM {{table}} "
    f"WHERE dedup_key IN ({{marks}}) AND expire_time > {NOW_MS}"
)
RELEASE_SQL = (
    "DELETE FROM {table} WHERE dedup_key = %s AND owner_token = %s AND status = 'CONSUMING'"
)
MARK_SQL = (
    f"UPDATE {{table}} SET status = 'CONSUMED', owner_token = %s, "
    f"expire_time = {NOW_MS} + %s WHERE dedup_key = %s"
)
RENEW_SQL = (
    f"UPDATE {{table}} SET expire_time = {NOW_MS} + %s "
    "WHERE dedup_key = %s AND owner_token = %s AND status = 'CONSUMING'"
)
# The purge's scan: the next batch of keys after a key, in primary-key order (a consistent,
# unlocked read), each with whether it has expired on the server's clock.
PURGE_SCAN_SQL = (
    f"SELECT dedup_key, expire_time <= {NOW_MS} FROM {{table}} "
    "WHERE dedup_key > %s ORDER BY dedup_key LIMIT %s"
)
# Deletes the listed rows that are still expired (one may have been taken over since the scan).
PURGE_SQL = f"DELETE FROM {{table}} WHERE dedup_key IN ({{marks}}) AND expire_time <= {NOW_MS}"


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a plain (optionally schema-qualified) identifier."""
    if not isinstance(name, str) or not _TABLE_NAME_RE.match(name):
        raise DedupConfigError(
            f"invalid table_name {name!r}: use letters, digits, _ or $ (optionally db.table)"
        )
    return name


def schema_sql(table_name: str = DEFAULT_TABLE_NAME) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement for the dedup table."""
    return SCHEMA_SQL.format(table=_quote(validate_table_name(table_name)))


def _quote(table_name: str) -> str:
    return ".".join(f"`{part}`" for part in table_name.split("."))


def _readable(text: str) -> str:
    if text.isascii():  # the common case: nothing to replace
        return text[:READABLE_CHARS]
    return text[:READABLE_CHARS].encode("utf-8", "replace").decode("utf-8")


class MySQLDedupStore(DedupStore):
    """Dedup records in a MySQL/MariaDB table.

    :param connect: a zero-argument callable returning a new DB-API connection, e.g.
        ``functools.partial(MySQLdb.connect, host=..., user=..., password=..., database=...)``.
    :param table_name: the table (created by :meth:`create_table` or ``python -m
        rocketmq_dedup schema mysql``).
    """

    driver_errors = (Exception,)  # any DB-API error; the driver module is the user's choice

    def __init__(self, connect: Callable[[], Any], table_name: str = DEFAULT_TABLE_NAME) -> None:
        if not callable(connect):
            raise DedupConfigError(
                "the MySQL store needs a zero-argument callable returning a new DB-API "
                "connection, e.g. functools.partial(MySQLdb.connect, host=..., ...); "
                f"got {type(connect)!r}"
            )
        self._connect = connect
        self.table_name = validate_table_name(table_name)
        table = _quote(table_name)
        self._sql: Dict[str, str] = {
            "release": RELEASE_SQL.format(table=table),
            "purge_scan": PURGE_SCAN_SQL.format(table=table),
            "renew": RENEW_SQL.format(table=table),
            "mark": MARK_SQL.format(table=table),
            "schema": schema_sql(table_name),
        }
        self._table = table
        self._claim_one = INSERT_CLAIM_SQL.format(table=table, rows=CLAIM_ROW)
        self._local = threading.local()
        self._all_connections: List[Any] = []
        self._conn_lock = threading.Lock()

    # -- connections ---------------------------------------------------------------------

    def _runner(self) -> _Runner:
        """This thread's statement runner (on its own connection, opened on first use)."""
        runner: Optional[_Runner] = getattr(self._local, "runner", None)
        if runner is None:
            conn = self._connect()
            conn.autocommit(True)
            cur = conn.cursor()
            cur.execute("SET time_zone = '+00:00'")
            if _is_mysqlclient(conn):
                cur.close()
                runner = _MySQLdbRunner(conn)
            else:
                runner = _Runner(conn, cur)
            self._local.runner = runner
            with self._conn_lock:
                self._all_connections.append(conn)
        return runner

    def _drop_connection(self) -> None:
        runner: Optional[_Runner] = getattr(self._local, "runner", None)
        self._local.runner = None
        if runner is not None:
            with self._conn_lock:
                if runner.conn in self._all_connections:
                    self._all_connections.remove(runner.conn)
            try:
                runner.conn.close()
            except Exception:  # the connection is already broken
                logger.debug("closing a broken MySQL connection failed", exc_info=True)

    def _execute(self, sql: str, params: Sequence[Any], fetch: bool = False) -> Any:
        """Run one statement on this thread's connection; reconnect and retry once when the
        connection was lost. Returns the rows when ``fetch`` else the rowcount."""
        for attempt in (1, 2):
            try:
                return self._runner().run(sql, params, fetch)
            except Exception as exc:
                if attempt == 2 or type(exc).__name__ not in _RETRYABLE_ERRORS:
                    raise
                logger.warning("MySQL connection failed (%s); reconnecting", exc)
                self._drop_connection()
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close every connection this store opened."""
        with self._conn_lock:
            conns, self._all_connections = self._all_connections, []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                logger.debug("closing a MySQL connection failed", exc_info=True)
        self._local = threading.local()

    # -- operator API --------------------------------------------------------------------

    def create_table(self) -> None:
        """Create the dedup table if it does not exist (idempotent)."""
        self._call(self._execute, self._sql["schema"], ())

    def purge_expired(self, batch_size: int = 1000) -> int:
        """Delete every expired row; return how many were deleted.

        One pass over the table in primary-key order: each step reads ``batch_size`` keys
        and deletes the expired ones among them by key, so a step holds row locks on expired
        rows only, never on a live row or a gap a claim could insert into. Run it from a cron
        job or a timer, off-peak for large tables."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise DedupConfigError(f"batch_size must be a positive int; got {batch_size!r}")
        return int(self._call(self._purge, batch_size))

    def _purge(self, batch_size: int) -> int:
        total, after = 0, b""  # every key is 32 bytes, so b"" sorts first
        while True:
            rows = self._execute(self._sql["purge_scan"], (after, batch_size), fetch=True)
            expired = [bytes(key) for key, is_expired in rows if is_expired]
            if expired:
                sql = PURGE_SQL.format(table=self._table, marks=", ".join(["%s"] * len(expired)))
                total += int(self._execute(sql, expired))
            if len(rows) < batch_size:
                return total
            after = bytes(rows[-1][0])

    # -- I/O hooks -----------------------------------------------------------------------

    def _row(self, element: DedupElement, digest: bytes, owner: str, ms: int) -> List[Any]:
        app, topic, tag, key = element
        return [digest, _readable(app), _readable(topic), _readable(tag), _readable(key), owner, ms]

    def _select(self, digests: Sequence[bytes]) -> Dict[bytes, Any]:
        sql = SELECT_SQL.format(table=self._table, marks=", ".join(["%s"] * len(digests)))
        return {bytes(row[0]): row for row in self._execute(sql, digests, fetch=True)}

    def do_claim(self, element: DedupElement, owner: str, lease_ms: int) -> ClaimResult:
        digest = element_digest(element)
        row = self._row(element, digest, owner, lease_ms)
        if self._execute(self._claim_one, row) == 1:  # inserted: the fresh message
            return CLAIMED
        return self._settle([element], [owner], [digest], lease_ms)[0]

    def do_claim_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[ClaimResult]:
        digests = [element_digest(e) for e in elements]
        everything = list(range(len(elements)))
        # First a plain insert: the cheapest statement, and a live record is left alone.
        if self._write(INSERT_CLAIM_SQL, elements, owners, digests, everything, lease_ms) == len(
            elements
        ):
            return [CLAIMED] * len(elements)
        return self._settle(elements, owners, digests, lease_ms)

    def _write(
        self,
        template: str,
        elements: Sequence[DedupElement],
        owners: Sequence[str],
        digests: Sequence[bytes],
        indexes: List[int],
        lease_ms: int,
    ) -> int:
        """One multi-row claim statement for ``indexes``; returns its rowcount."""
        # A stable key order keeps concurrent multi-row writes from deadlocking.
        indexes.sort(key=lambda i: digests[i])
        params: List[Any] = []
        for i in indexes:
            params += self._row(elements[i], digests[i], owners[i], lease_ms)
        sql = template.format(table=self._table, rows=", ".join([CLAIM_ROW] * len(indexes)))
        return int(self._execute(sql, params))

    def _settle(
        self,
        elements: Sequence[DedupElement],
        owners: Sequence[str],
        digests: Sequence[bytes],
        lease_ms: int,
    ) -> List[ClaimResult]:
        """After the insert: read who holds each record; records that are not live (expired,
        or released meanwhile) are taken over by the upsert, and read again."""
        results: Dict[int, ClaimResult] = {}
        pending = list(range(len(elements)))
        for attempt in range(_CLAIM_ATTEMPTS):
            rows = self._select([digests[i] for i in pending])
            vanished = []
            for i in pending:
                row = rows.get(digests[i])
                if row is None:
                    vanished.append(i)
                elif row[2] == owners[i] and row[1] == DedupStatus.CONSUMING.value:
                    results[i] = CLAIMED
                else:
                    results[i] = ClaimResult(False, parse_status(row[1]))
            pending = vanished
            if not pending or attempt == _CLAIM_ATTEMPTS - 1:
                break
            if self._write(CLAIM_SQL, elements, owners, digests, pending, lease_ms) == len(pending):
                for i in pending:  # every row inserted (1 each; a takeover counts 2)
                    results[i] = CLAIMED
                pending = []
                break
        for i in pending:  # kept vanishing: leave it to a later retry
            results[i] = HELD_BY_OTHER
        return [results[i] for i in range(len(elements))]

    def do_mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> None:
        digest = element_digest(element)
        # The row is normally still ours: one UPDATE. If it vanished, the upsert recreates it.
        if not self._execute(self._sql["mark"], (owner, retention_ms, digest)):
            self.do_mark_consumed_many([element], [owner], retention_ms)

    def do_mark_consumed_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], retention_ms: int
    ) -> None:
        params: List[Any] = []
        order = sorted(range(len(elements)), key=lambda i: element_digest(elements[i]))
        for i in order:
            params += self._row(elements[i], element_digest(elements[i]), owners[i], retention_ms)
        sql = MARK_CONSUMED_SQL.format(
            table=self._table, rows=", ".join([MARK_CONSUMED_ROW] * len(elements))
        )
        self._execute(sql, params)

    def do_release(self, element: DedupElement, owner: str) -> bool:
        return int(self._execute(self._sql["release"], (element_digest(element), owner))) == 1

    def do_release_many(self, elements: Sequence[DedupElement], owners: Sequence[str]) -> int:
        return sum(self.do_release(e, o) for e, o in zip(elements, owners))

    def do_renew_many(
        self, elements: Sequence[DedupElement], owners: Sequence[str], lease_ms: int
    ) -> List[bool]:
        sql = self._sql["renew"]
        return [
            int(self._execute(sql, (lease_ms, element_digest(e), o))) > 0
            for e, o in zip(elements, owners)
        ]

    def do_get_status(self, element: DedupElement) -> Optional[DedupStatus]:
        row = self._select([element_digest(element)]).get(element_digest(element))
        return parse_status(row[1]) if row is not None else None


class _Runner:
    """Runs statements on one connection: any DB-API driver, through a cursor."""

    __slots__ = ("conn", "cursor")

    def __init__(self, conn: Any, cursor: Any = None) -> None:
        self.conn = conn
        self.cursor = cursor

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Execute ``sql`` (``%s`` placeholders); return the rows if ``fetch``, else the
        number of affected rows."""
        self.cursor.execute(sql, params)
        return self.cursor.fetchall() if fetch else self.cursor.rowcount


class _MySQLdbRunner(_Runner):
    """mysqlclient's own connection API: the same escaping as its cursor (``literal``), without
    the cursor's per-statement bookkeeping (measured: 27-32 us of client CPU a statement,
    against 38-45 us through the cursor)."""

    __slots__ = ("_encoding", "_string_literal", "_templates")

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self._templates: Dict[str, bytes] = {}
        self._encoding: str = conn.encoding
        self._string_literal = conn.string_literal

    def _literal(self, value: Any) -> bytes:
        """``conn.literal(value)``, with the store's two common types inlined."""
        kind = type(value)
        if kind is int:  # what escape() renders for an int
            return b"%d" % value
        quoted: bytes
        if kind is str:  # as literal() does it
            quoted = self._string_literal(value.encode(self._encoding))
        else:
            quoted = self.conn.literal(value)
        return quoted

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        conn = self.conn
        template = self._templates.get(sql)
        if template is None:
            template = sql.encode(conn.encoding)
            if len(self._templates) < 256:  # multi-row statements vary with the batch size
                self._templates[sql] = template
        literal = self._literal
        conn.query(template % tuple([literal(value) for value in params]))
        if fetch:
            result = conn.store_result()
            return result.fetch_row(0) if result is not None else ()
        return conn.affected_rows()


def _is_mysqlclient(conn: Any) -> bool:
    """True if ``conn`` is a mysqlclient (``MySQLdb``) connection; never imports it."""
    module = sys.modules.get("MySQLdb.connections")
    return module is not None and isinstance(conn, module.Connection)
