"""The MySQL store's connections: statement runners (one per connection, with mysqlclient's
fast path), their preparation for any driver, what counts as an outage, and the bounded pool
that hands them to operations (fork-safe)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import StorePoolExhaustedError
from rocketmq_dedup.stores.mysql.sql import PARSE_ERROR, SESSION_SQL

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


_POOLS: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


class ConnectionPool:
    """At most ``size`` connections (as statement runners), each used by one operation at a
    time: :meth:`take` one, then :meth:`give` it back, or :meth:`discard` it after an error.

    * Idle runners are reused last-in first-out, so a lone caller keeps using one connection
      and the number open is the number of callers that were ever concurrent, up to ``size``.
    * When all ``size`` are busy a caller waits up to ``timeout`` seconds for one, then gets
      :class:`StorePoolExhaustedError`: not an outage (no server failed, the consumer's threads
      outnumber its connections), so the messages are consumed later, never without dedup.
    * Taking and giving back is a lock and a list pop/append (no object per call).
    * ``fork()``: in the child the pool starts empty (an ``os.register_at_fork`` hook). The
      parent's connections are never used, closed or freed there: closing one (mysqlclient
      also does it when the object is freed) would send COM_QUIT over the socket the parent
      still uses. That is at most ``size`` objects per fork generation.
    """

    def __init__(self, open_runner: Callable[[], Runner], size: int, timeout: float) -> None:
        self._open_runner = open_runner
        self.size = size
        self.timeout = timeout
        self._inherited: List[Runner] = []  # from the parent process: never touched
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._idle: List[Runner] = []
        self._live: List[Runner] = []  # open in this process, idle or busy
        self._slots = 0  # live runners plus connects in flight
        self._waiting = 0
        self._generation = 0
        self.pid = os.getpid()

    def _after_fork(self) -> None:
        inherited = self._live
        self._reset()
        self._inherited += inherited
        _never_free(inherited)

    @property
    def waiting(self) -> int:
        """Callers waiting for a connection."""
        return self._waiting

    @property
    def open_count(self) -> int:
        """How many connections this process has open (or is opening) from this pool."""
        return self._slots

    def take(self) -> Runner:
        """An idle runner, or a new one (a new connection) while fewer than ``size`` are open;
        else wait for one to come back."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            if self._slots >= self.size:
                runner = self._wait()
                if runner is not None:
                    return runner
            self._slots += 1
            generation = self._generation
        try:
            runner = self._open_runner()
        except BaseException:
            with self._lock:
                self._slots -= 1
                if self._waiting:
                    self._freed.notify()
            raise
        runner.generation = generation
        with self._lock:
            self._live.append(runner)
        return runner

    def _wait(self) -> Optional[Runner]:
        """With the lock held: wait until a runner is idle (return it) or a slot is free
        (return None); raise after ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        self._waiting += 1
        try:
            while not self._idle and self._slots >= self.size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StorePoolExhaustedError(
                        f"all {self.size} MySQL connections of the pool stayed busy for "
                        f"{self.timeout:g} s (raise pool_size, or look for slow statements)"
                    )
                self._freed.wait(remaining)
        finally:
            self._waiting -= 1
        return self._idle.pop() if self._idle else None

    def give(self, runner: Runner) -> None:
        """Return a runner whose operation succeeded."""
        with self._lock:
            if runner.generation == self._generation and runner.pid == self.pid:
                runner.idle_since = time.monotonic()
                self._idle.append(runner)
                if self._waiting:
                    self._freed.notify()
                return
        self.discard(runner)  # opened before close() or before a fork

    def discard(self, runner: Runner) -> None:
        """Drop a runner that failed (or is stale) and close its connection, unless it was
        inherited from the parent process."""
        with self._lock:
            if runner.pid != self.pid:
                return  # the parent's: stays in _inherited, never closed here
            try:
                self._live.remove(runner)
            except ValueError:  # already dropped by drain() or close()
                return
            self._slots -= 1
            if self._waiting:
                self._freed.notify()
        runner.close()

    def drain(self) -> None:
        """Close the idle connections (after a lost connection: they are most likely lost
        too, e.g. the server restarted). Busy ones are judged by their own operations."""
        with self._lock:
            idle, self._idle = self._idle, []
            for runner in idle:
                self._live.remove(runner)
            self._slots -= len(idle)
            if self._waiting:
                self._freed.notify_all()
        for runner in idle:
            runner.close()

    def close(self) -> None:
        """Close every idle connection now and every busy one when it comes back. The pool
        stays usable: the next :meth:`take` opens a new connection."""
        with self._lock:
            self._generation += 1
        self.drain()


def _never_free(objects: List[Any]) -> None:
    """Keep ``objects`` alive until the process ends, interpreter shutdown included: one
    reference more than anything will ever drop. Freeing a connection inherited across
    ``fork()`` would close it for the parent too (mysqlclient's dealloc sends COM_QUIT,
    mysql-connector-python's socket shuts the TCP connection down), and a list alone is
    cleared when the child exits normally."""
    if not objects:
        return
    try:
        import ctypes  # only in a forked child that inherited connections
    except ImportError:  # pragma: no cover - a Python built without ctypes
        logger.warning("no ctypes: connections inherited across fork() may close at exit")
        return
    incref = ctypes.pythonapi.Py_IncRef
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    for obj in objects:
        incref(obj)


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
