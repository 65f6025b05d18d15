"""One MySQL connection as the store uses it: prepared for any driver (autocommit, utf8mb4, UTC),
and a statement :class:`Runner` per connection (with mysqlclient's fast path) that also reads,
without a round trip, what the driver knows of its session: which session it is, and whether it
is in autocommit mode."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from rocketmq_dedup.stores.mysql.errors import PARSE_ERROR, error_code
from rocketmq_dedup.stores.mysql.sql import SESSION_SQL
from rocketmq_dedup.stores.sql_common import column_text

logger = logging.getLogger(__name__)

_CHARSET = "utf8mb4"


def is_mysqlclient(conn: Any) -> bool:
    """True if ``conn`` is a mysqlclient (``MySQLdb``) connection; never imports it."""
    module = sys.modules.get("MySQLdb.connections")
    return module is not None and isinstance(conn, module.Connection)


def type_name(value: Any) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def set_autocommit(conn: Any, on: bool) -> None:
    """Switch a DB-API connection's autocommit mode: a method in mysqlclient and PyMySQL, a
    property in mysql-connector-python (reading it would cost a round trip)."""
    if isinstance(getattr(type(conn), "autocommit", None), property):
        conn.autocommit = on
    else:
        conn.autocommit(on)


def prepare_connection(conn: Any) -> None:
    """Make a new connection fit for the store: autocommit on, the session and the driver's own
    encoding switched to utf8mb4 (a factory asking for latin1 could not store a CJK key's
    readable columns), and the session time zone UTC (epoch arithmetic on the server's
    clock)."""
    set_autocommit(conn, True)
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


def session_id(conn: Any) -> Optional[int]:
    """The server's id of the connection's session, as the driver learnt it when it connected
    (no round trip): mysqlclient's and PyMySQL's ``thread_id()``, mysql-connector-python's
    ``connection_id``; None when the driver does not say. A reconnect changes it."""
    thread_id = getattr(conn, "thread_id", None)
    value = thread_id() if callable(thread_id) else getattr(conn, "connection_id", None)
    return value if isinstance(value, int) else None


def autocommit_on(conn: Any) -> Optional[bool]:
    """Whether the session is in autocommit mode, from the status of the server's last answer
    (no round trip): mysqlclient's and PyMySQL's ``get_autocommit()``; None when the driver
    keeps no such status (mysql-connector-python)."""
    get_autocommit = getattr(conn, "get_autocommit", None)
    return bool(get_autocommit()) if callable(get_autocommit) else None


def _method(conn: Any, name: str) -> Optional[Callable[[], Any]]:
    """``conn``'s method ``name``, bound, or None when it has none."""
    method = getattr(conn, name, None)
    return method if callable(method) else None


#: A connection idle for this much less than its session's idle timeout is replaced rather than
#: used (the server may be about to end its session).
IDLE_MARGIN_S = 1.0


def idle_too_long(idle_since: float, timeout: float) -> bool:
    """Whether a connection idle since ``idle_since`` (``time.monotonic()``) has come within
    :data:`IDLE_MARGIN_S` of its session idle timeout: the server may end it any moment."""
    return time.monotonic() - idle_since >= timeout - IDLE_MARGIN_S


#: Text values a mysqlclient runner keeps quoted (see :class:`MySQLdbRunner`): bounded, cleared
#: when full (about 0.5 MiB at most).
QUOTED_CACHE_ENTRIES = 4096

#: Statements with their parameters, run in order by :meth:`Runner.run_all`.
Statements = Sequence[Tuple[str, Sequence[Any]]]

#: PyMySQL's and mysql-connector-python's ``CLIENT_MULTI_STATEMENTS`` capability bit.
_MULTI_STATEMENTS = 1 << 16


class Runner:
    """Runs statements on one connection: any DB-API driver, through a cursor. The pool holds
    runners, so a runner's per-connection state (a cursor, mysqlclient's templates, whether the
    connection takes several statements in one text, its session's idle timeout and id) lives
    as long as its connection."""

    __slots__ = (
        "_get_autocommit",
        "_thread_id",
        "conn",
        "cursor",
        "generation",
        "idle_since",
        "multi",
        "pid",
        "session",
        "wait_timeout",
    )

    def __init__(self, conn: Any, cursor: Any = None) -> None:
        self.conn = conn
        self.cursor = cursor
        self.generation = 0
        self.pid = os.getpid()
        self.idle_since = 0.0  # time.monotonic() when last given back to its pool
        self.wait_timeout: Optional[int] = None  # the session's, when set by the store
        # the driver's own probes (mysqlclient's and PyMySQL's), looked up once: the session
        # is checked twice a message in the exactly-once mode
        self._thread_id = _method(conn, "thread_id")
        self._get_autocommit = _method(conn, "get_autocommit")
        #: The session this connection opened (:func:`session_id`): a runner whose session
        #: changed (a reconnect) is never used again.
        self.session = self.session_now()
        #: Whether several statements may go in one text: True, False, or None (not known yet:
        #: tried once, see :meth:`run_all`).
        self.multi: Optional[bool] = bool(getattr(conn, "client_flag", 0) & _MULTI_STATEMENTS)

    def session_now(self) -> Optional[int]:
        """:func:`session_id` of the connection (no round trip)."""
        thread_id = self._thread_id
        if thread_id is None:
            return session_id(self.conn)
        value = thread_id()
        return value if isinstance(value, int) else None

    def same_session(self) -> bool:
        """Whether the connection is still on the session it opened (no round trip)."""
        return self.session_now() == self.session

    def autocommit_on(self) -> Optional[bool]:
        """:func:`autocommit_on` of the connection (no round trip)."""
        get_autocommit = self._get_autocommit
        return bool(get_autocommit()) if get_autocommit is not None else None

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Execute ``sql`` (``%s`` placeholders); return the rows if ``fetch``, else the
        number of affected rows."""
        self.cursor.execute(sql, params)
        return self.cursor.fetchall() if fetch else self.cursor.rowcount

    def run_all(self, statements: Statements) -> List[Any]:
        """Run ``statements`` in order, in one round trip when the connection takes several
        statements in one text (else one by one); return each one's rows (a statement with a
        result set) or affected row count. Raises at the first that fails, whose followers do
        not run. A connection that turns out not to take several statements (the server
        answers a parse error before running anything) is remembered as such."""
        if self.multi is not False and len(statements) > 1:
            text = "; ".join(sql for sql, _ in statements)
            params = [value for _, values in statements for value in values]
            try:
                results = self._run_multi(text, params)
                self.multi = True
                return results
            except Exception as exc:
                if self.multi is not None or error_code(exc) != PARSE_ERROR:
                    raise
                self.multi = False
        return [self._run_one(sql, values) for sql, values in statements]

    def run_text(self, text: str, params: Sequence[Any]) -> List[Any]:
        """Run ``text``, several statements already joined (``"; "``), in one round trip, on a
        connection known to take them (:attr:`multi` True); each one's rows or affected row
        count. Raises at the first that fails, whose followers do not run."""
        return self._run_multi(text, params)

    def _run_one(self, sql: str, params: Sequence[Any]) -> Any:
        cursor = self.cursor
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description is not None else cursor.rowcount

    def _run_multi(self, text: str, params: Sequence[Any]) -> List[Any]:
        cursor = self.cursor
        cursor.execute(text, params)
        results = []
        while True:
            results.append(cursor.fetchall() if cursor.description is not None else cursor.rowcount)
            if not cursor.nextset():
                return results

    def close(self) -> None:
        """Close the connection (its cursor goes with it)."""
        close_quietly(self.conn)


class MySQLdbRunner(Runner):
    """mysqlclient's own connection API: the same escaping as its cursor (``literal``), without
    the cursor's per-statement bookkeeping (measured: 27-32 us of client CPU a statement,
    against 38-45 us through the cursor). mysqlclient connects with multi-statements on unless
    told otherwise, which :meth:`run_all` finds out on first use."""

    __slots__ = ("_encoding", "_quoted", "_string_literal", "_templates")

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.multi = None  # on by default (the factory may have turned it off)
        self._templates: dict[str, bytes] = {}
        self._encoding: str = conn.encoding
        self._string_literal = conn.string_literal
        #: Text values quoted lately: a message's claim and its CONSUMED mark send the same
        #: application, topic, tag, key and owner, and most messages share the first three.
        self._quoted: dict[str, bytes] = {}

    def _literal(self, value: Any) -> bytes:
        """``conn.literal(value)`` for the store's three common types: an int as ``literal()``
        renders it; text quoted as ``literal()`` quotes it (remembered, see ``_quoted``);
        bytes (the binary keys) as a hex literal, ``X'...'``, which the server reads as the same
        binary string (``literal()`` escapes bytes in Python: 2.7 against 0.1 us here)."""
        kind = type(value)
        if kind is int:
            return b"%d" % value
        if kind is str:
            text = self._quoted.get(value)
            if text is None:
                text = self._string_literal(value.encode(self._encoding))
                if len(self._quoted) >= QUOTED_CACHE_ENTRIES:
                    self._quoted.clear()
                self._quoted[value] = text
            return text
        if kind is bytes:
            return b"X'%s'" % value.hex().encode("ascii")
        quoted: bytes = self.conn.literal(value)
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

    def _result(self) -> Any:
        """The current result: its rows, or the affected row count when it has none."""
        conn = self.conn
        result = conn.store_result()
        return result.fetch_row(0) if result is not None else conn.affected_rows()

    def run(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        self._query(sql, params)
        if fetch:
            result = self.conn.store_result()
            return result.fetch_row(0) if result is not None else ()
        return self.conn.affected_rows()

    def _run_one(self, sql: str, params: Sequence[Any]) -> Any:
        self._query(sql, params)
        return self._result()

    def _run_multi(self, text: str, params: Sequence[Any]) -> List[Any]:
        self._query(text, params)
        conn = self.conn
        results = [self._result()]
        while conn.next_result() == 0:  # raises at a statement that failed
            results.append(self._result())
        return results


__all__ = [
    "IDLE_MARGIN_S",
    "MySQLdbRunner",
    "Runner",
    "Statements",
    "autocommit_on",
    "close_quietly",
    "column_text",
    "idle_too_long",
    "is_mysqlclient",
    "prepare_connection",
    "session_id",
    "set_autocommit",
    "type_name",
]
