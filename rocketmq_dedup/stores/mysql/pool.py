"""The MySQL store's connections: statement runners (one per connection, with mysqlclient's
fast path), their preparation for any driver, what counts as an outage, and the bounded pool
that hands them to operations (fork-safe: :mod:`rocketmq_dedup.stores.pool`)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from rocketmq_dedup.stores.mysql.sql import PARSE_ERROR, SESSION_SQL
from rocketmq_dedup.stores.pool import BoundedPool

logger = logging.getLogger(__name__)

# PEP 249 exception families that mean "the connection or the server failed".
_OUTAGE_ERRORS = frozenset({"OperationalError", "InterfaceError"})
# Server error codes that some drivers raise as OperationalError but that say the statement or
# the schema is wrong, not that the server failed: unknown column, syntax, no such table.
_SCHEMA_ERROR_CODES = frozenset({1054, 1064, 1146})
_CHARSET = "utf8mb4"


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` is in a PEP 249 ``OperationalError`` or ``InterfaceError`` family of any
    driver (matched on the class names along its MRO, so no driver is imported): the
    connection or the server failed. So is an error raised ``from`` one: mysql-connector-python
    reports a dead connection met while quoting parameters as ``ProgrammingError`` from
    ``OperationalError``. Anything else (``ProgrammingError`` for a missing table, ``TypeError``
    from a bug) is a defect, not an outage; so are the server's schema errors (unknown column,
    syntax, no such table) that mysqlclient raises as ``OperationalError``."""
    current: Optional[BaseException] = exc
    for _ in range(8):  # a short explicit-cause chain; never loops on a cycle
        if current is None:
            return False
        if any(cls.__name__ in _OUTAGE_ERRORS for cls in type(current).__mro__):
            code = current.args[0] if current.args else None
            return code not in _SCHEMA_ERROR_CODES
        current = current.__cause__
    return False


def error_code(exc: BaseException) -> Optional[int]:
    """The server error number of a driver exception (or of the one SQLAlchemy wraps)."""
    exc = getattr(exc, "orig", None) or exc
    code = getattr(exc, "errno", None)  # mysql-connector-python
    if isinstance(code, int):
        return code
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def column_text(value: Any) -> Any:
    """A text column's value as ``str``: drivers asked for ``use_unicode=False`` (or returning
    binary strings) give bytes."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def is_mysqlclient(conn: Any) -> bool:
    """True if ``conn`` is a mysqlclient (``MySQLdb``) connection; never imports it."""
    module = sys.modules.get("MySQLdb.connections")
    return module is not None and isinstance(conn, module.Connection)


def type_name(value: Any) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def prepare_connection(conn: Any) -> None:
    """Make a new connection fit for the store: autocommit on (a method in mysqlclient and
    PyMySQL, a property in mysql-connector-python), the session and the driver's own encoding
    switched to utf8mb4 (a factory asking for latin1 could not store a CJK key's readable
    columns), and the session time zone UTC (epoch arithmetic on the server's clock)."""
    if isinstance(getattr(type(conn), "autocommit", None), property):
        conn.autocommit = True  # mysql-connector-python (reading it would cost a round trip)
    else:
        conn.autocommit(True)
    cursor = conn.cursor()
    try:
        if hasattr(conn, "set_character_set"):  # mysqlclient, PyMySQL: also sets .encoding
            conn.set_character_set(_CHARSET)
        elif hasattr(conn, "set_charset_collation"):  # mysql-connector-python
            conn.set_charset_collation(_CHARSET)
        else:  # another driver: at least the session is right
            cursor.execute(f"SET NAMES {_CHARSET}")
        cursor.execute(SESSION_SQL)
    finally:
        cursor.close()


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # already broken: nothing more to release
        logger.debug("closing a MySQL connection failed", exc_info=True)


#: Statements with their parameters, run in order by :meth:`Runner.run_all`.
Statements = Sequence[Tuple[str, Sequence[Any]]]

#: PyMySQL's and mysql-connector-python's ``CLIENT_MULTI_STATEMENTS`` capability bit.
_MULTI_STATEMENTS = 1 << 16


class Runner:
    """Runs statements on one connection: any DB-API driver, through a cursor. The pool holds
    runners, so a runner's per-connection state (a cursor, mysqlclient's templates, whether the
    connection takes several statements in one text, its session's idle timeout) lives as long
    as its connection."""

    __slots__ = ("conn", "cursor", "generation", "idle_since", "multi", "pid", "wait_timeout")

    def __init__(self, conn: Any, cursor: Any = None) -> None:
        self.conn = conn
        self.cursor = cursor
        self.generation = 0
        self.pid = os.getpid()
        self.idle_since = 0.0  # time.monotonic() when last given back to its pool
        self.wait_timeout: Optional[int] = None  # the session's, when set by the store
        #: Whether several statements may go in one text: True, False, or None (not known yet:
        #: tried once, see :meth:`run_all`).
        self.multi: Optional[bool] = bool(getattr(conn, "client_flag", 0) & _MULTI_STATEMENTS)

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Execute ``sql`` (``%s`` placeholders); return the rows if ``fetch``, else the
        number of affected rows."""
        self.cursor.execute(sql, params)
        return self.cursor.fetchall() if fetch else self.cursor.rowcount

    def run_all(self, statements: Statements) -> None:
        """Run ``statements`` in order, in one round trip when the connection takes several
        statements in one text (else one by one); raise at the first that fails, whose
        followers do not run. A connection that turns out not to take them (the server
        answers a parse error before running anything) is remembered as such."""
        if self.multi is not False and len(statements) > 1:
            text = "; ".join(sql for sql, _ in statements)
            params = [value for _, values in statements for value in values]
            try:
                self._run_multi(text, params)
                self.multi = True
                return
            except Exception as exc:
                if self.multi is not None or error_code(exc) != PARSE_ERROR:
                    raise
                self.multi = False
        for sql, values in statements:
            self.run(sql, values, False)

    def _run_multi(self, text: str, params: Sequence[Any]) -> None:
        cursor = self.cursor
        cursor.execute(text, params)
        while cursor.nextset():
            pass

    def close(self) -> None:
        """Close the connection (its cursor goes with it)."""
        close_quietly(self.conn)


class MySQLdbRunner(Runner):
    """mysqlclient's own connection API: the same escaping as its cursor (``literal``), without
    the cursor's per-statement bookkeeping (measured: 27-32 us of client CPU a statement,
    against 38-45 us through the cursor). mysqlclient connects with multi-statements on unless
    told otherwise, which :meth:`run_all` finds out on first use."""

    __slots__ = ("_encoding", "_string_literal", "_templates")

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.multi = None  # on by default (the factory may have turned it off)
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

    def _query(self, sql: str, params: Sequence[Any]) -> None:
        conn = self.conn
        template = self._templates.get(sql)
        if template is None:
            template = sql.encode(conn.encoding)
            if len(self._templates) < 256:  # multi-row statements vary with the batch size
                self._templates[sql] = template
        literal = self._literal
        conn.query(template % tuple([literal(value) for value in params]))

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        self._query(sql, params)
        conn = self.conn
        if fetch:
            result = conn.store_result()
            return result.fetch_row(0) if result is not None else ()
        return conn.affected_rows()

    def _run_multi(self, text: str, params: Sequence[Any]) -> None:
        self._query(text, params)
        conn = self.conn
        while conn.next_result() == 0:  # raises at a statement that failed
            pass


class ConnectionPool(BoundedPool[Runner]):
    """The MySQL store's pool of statement runners (see
    :class:`~rocketmq_dedup.stores.pool.BoundedPool`)."""

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        size: int,
        timeout: float,
        describe: Optional[Callable[[], str]] = None,
    ) -> None:
        super().__init__(open_runner, size, timeout, "MySQL", is_connection_error, describe)
