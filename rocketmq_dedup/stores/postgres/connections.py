"""The PostgreSQL store's connections: where they come from, how each is prepared, and what
counts as an outage.

Three sources, one interface (:meth:`Connections.run`: run ``fn(runner, *args)`` on a connection
and give it back):

* :class:`OwnConnections`: a zero-argument factory returning a psycopg 3 connection (also what a
  SQLAlchemy ``Engine`` on ``postgresql+psycopg`` becomes: its raw connections, detached from
  the engine's pool). The store keeps them in its own bounded pool
  (:class:`~rocketmq_dedup.stores.pool.BoundedPool`: fork-safe, no thread of its own, an
  exhausted pool is :class:`~rocketmq_dedup.errors.StorePoolExhaustedError`). A lost connection
  (server restart) is replaced and the operation run once more: every statement is idempotent
  for its owner token.
* :class:`UserPoolConnections`: a ``psycopg_pool.ConnectionPool`` of the application's. Each
  operation borrows one connection and gives it back as it found it (autocommit restored);
  its size, timeout and checks are the pool's own. After a lost connection the pool checks its
  idle ones (``pool.check()``) before the one retry.

Every statement of the store runs in autocommit (:func:`prepare_connection`), so a failed
statement never leaves the session in an aborted transaction, and no transaction stays open
between operations. Statements run through psycopg's cursor (:class:`Runner`; psycopg prepares
a statement server-side after the connection's ``prepare_threshold`` runs), except a message's
two hot ones on the store's own connections: the claim and the mark go through libpq's calls on
the connection (:class:`LibpqRunner`: prepared once per connection, parameters encoded here).
A connection whose ``prepare_threshold`` is ``None`` (PgBouncer in transaction mode) gets no
prepared statement either way.

Outages (:func:`is_outage`): psycopg's ``OperationalError`` family (connection refused or lost,
the server shutting down or out of connections), except a pool's timeout (:func:`is_pool_timeout`:
the pool is busy, not the server down), what a working server answers to statements that
met each other (:data:`LOCK_CONFLICTS`: a deadlock, a serialization failure, a lock wait ended
by ``lock_timeout`` or ``statement_timeout``), and its refusals (:mod:`.errors`: a failed
login, a missing privilege, a read-only server). Those are store errors: the message is
consumed later, never run without dedup.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup.errors import MissingExtraError, StoreError
from rocketmq_dedup.stores.pool import BoundedPool
from rocketmq_dedup.stores.postgres.errors import refusal

logger = logging.getLogger(__name__)

T = TypeVar("T")

_POOL_ERRORS = frozenset({"PoolTimeout", "TooManyRequests"})


def import_psycopg() -> ModuleType:
    """psycopg (the ``[postgres]`` extra), imported on first use."""
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtraError("psycopg", "postgres") from exc
    return psycopg


def _module(obj: Any) -> str:
    return str(getattr(obj, "__module__", "") or "")


def is_psycopg_factory(client: Any) -> bool:
    """True for ``functools.partial(psycopg.connect, ...)`` (or of ``psycopg.Connection.connect``,
    or of a subclass's): a factory that is certainly PostgreSQL's. Any other callable is
    ambiguous (never imports psycopg)."""
    if not isinstance(client, functools.partial):
        return False
    func = client.func
    owner = getattr(func, "__self__", None)  # a bound classmethod: Connection.connect
    return _module(func).startswith("psycopg") or (
        isinstance(owner, type) and any(_module(k).startswith("psycopg") for k in owner.__mro__)
    )


def is_psycopg_pool(client: Any) -> bool:
    """True for a ``psycopg_pool.ConnectionPool`` (never imports psycopg_pool)."""
    return any(_module(k).startswith("psycopg_pool") for k in type(client).__mro__) and callable(
        getattr(client, "getconn", None)
    )


def is_psycopg_connection(client: Any) -> bool:
    """True for one psycopg connection (never imports psycopg)."""
    return any(_module(k).startswith("psycopg.") for k in type(client).__mro__) and hasattr(
        client, "pgconn"
    )


def is_pool_timeout(exc: BaseException) -> bool:
    """True if ``exc`` says a ``psycopg_pool`` pool had no connection to give in time."""
    return any(k.__name__ in _POOL_ERRORS for k in type(exc).__mro__) and _module(
        type(exc)
    ).startswith("psycopg_pool")


#: Sqlstates of the ``OperationalError`` family that a working server answers: class 40 (a
#: deadlock, a serialization failure), 55P03 (a lock not available within ``lock_timeout``) and
#: 57014 (a statement cancelled, e.g. by ``statement_timeout`` while it waited for a lock).
LOCK_CONFLICTS = ("40", "55P03", "57014")


def is_lock_conflict(exc: BaseException) -> bool:
    """True if ``exc`` is a lock wait or a deadlock (:data:`LOCK_CONFLICTS`)."""
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(LOCK_CONFLICTS)


def is_outage(exc: BaseException) -> bool:
    """True if ``exc`` means the server or the connection failed (module docstring): never a
    refusal a person must fix (:func:`~.errors.refusal`: a failed login, a missing privilege, a
    read-only server)."""
    psycopg = import_psycopg()
    return (
        isinstance(exc, psycopg.OperationalError)
        and not _module(type(exc)).startswith("psycopg_pool")
        and not is_lock_conflict(exc)
        and refusal(exc) is None
    )


def is_undefined_table(exc: BaseException) -> bool:
    """True for the server's "relation does not exist" (sqlstate 42P01)."""
    return getattr(exc, "sqlstate", None) == "42P01"


def is_undefined_column(exc: BaseException) -> bool:
    """True for the server's "column does not exist" (sqlstate 42703): a table made before a
    column was added."""
    return getattr(exc, "sqlstate", None) == "42703"


def type_name(value: Any) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def prepare_connection(conn: Any) -> None:
    """Make a connection fit for the store's statements: no transaction left open by whoever
    had it (rolled back), autocommit on, and the client encoding UTF-8 (a connection asking
    for another could not send a CJK key's readable columns)."""
    psycopg = import_psycopg()
    if not isinstance(conn, psycopg.Connection):
        raise StoreError(
            f"the PostgreSQL store needs psycopg 3 connections (psycopg.Connection); got "
            f"{type_name(conn)}"
        )
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()
    conn.autocommit = True
    if conn.info.encoding != "utf-8":
        conn.execute("SET client_encoding TO 'UTF8'")


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # already broken: nothing more to release
        logger.debug("closing a PostgreSQL connection failed", exc_info=True)


class HotStatements(NamedTuple):
    """The statements every message runs (``%s`` placeholders), which a :class:`LibpqRunner`
    runs through libpq's own calls."""

    claim: str
    """Parameters (key, application, topic, tag, key text, owner, lease ms); one row (status,
    owner, ms left, claims since last settled)."""
    mark: str
    """Parameters (owner, retention ms, key); no row."""


#: A row a claim statement returns: status, owner, milliseconds left, claims since the record
#: was last settled (``deliveries``).
ClaimRow = Tuple[str, str, int, int]


class Runner:
    """Runs the store's statements on one connection, through one cursor kept with it."""

    __slots__ = ("conn", "cursor", "generation", "hot", "idle_since", "pid")

    def __init__(self, conn: Any, hot: HotStatements) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.hot = hot
        self.generation = 0
        self.pid = os.getpid()
        self.idle_since = 0.0

    def claim(self, params: Sequence[Any]) -> ClaimRow:
        """Run the claim statement; its one row."""
        ((status, owner, left, claims),) = self.rows(self.hot.claim, params)
        return status, owner, left, claims

    def mark(self, params: Sequence[Any]) -> int:
        """Run the mark statement; how many rows it changed."""
        return self.count(self.hot.mark, params)

    def rows(self, sql: str, params: Any) -> List[Any]:
        """Execute ``sql``; return its rows."""
        cursor = self.cursor
        cursor.execute(sql, params)
        rows: List[Any] = cursor.fetchall()
        return rows

    def count(self, sql: str, params: Any) -> int:
        """Execute ``sql``; return how many rows it changed."""
        cursor = self.cursor
        cursor.execute(sql, params)
        return int(cursor.rowcount)

    def close(self) -> None:
        """Close the connection (its cursor goes with it)."""
        close_quietly(self.conn)


def libpq_text(sql: str) -> bytes:
    """``sql`` with psycopg's ``%s`` placeholders numbered as libpq's ``$1``, ``$2``..."""
    head, *rest = sql.split("%s")
    return "".join([head, *(f"${i}{part}" for i, part in enumerate(rest, 1))]).encode()


class LibpqRunner(Runner):
    """:class:`Runner` with the claim and the mark run through libpq's own calls on the
    connection (``conn.pgconn``, which releases the GIL while it waits): each prepared once per
    connection under a name of the store's, its parameters encoded here (the key as binary
    ``bytea``, the rest as UTF-8 text, as the session's client encoding is), no cursor, no
    adaptation, no prepared-statement cache (measured: 69.5 against 85.5 us of client CPU for a
    claim and a mark, AMD EPYC). Every other statement goes through the cursor."""

    __slots__ = ("_claim", "_mark", "_pgconn", "_prepared")

    _CLAIM_NAME = b"rocketmq_dedup_claim"
    _MARK_NAME = b"rocketmq_dedup_mark"

    #: Per parameter: 1 binary, 0 text.
    _CLAIM_FORMATS = (1, 0, 0, 0, 0, 0, 0)
    _MARK_FORMATS = (0, 0, 1)

    def __init__(self, conn: Any, hot: HotStatements) -> None:
        super().__init__(conn, hot)
        self._pgconn = conn.pgconn
        self._prepared = conn.prepare_threshold is not None
        self._claim: Optional[bytes] = None  # prepared at first use (the table may not exist
        self._mark: Optional[bytes] = None  # yet when the connection opens)

    def _statement(self, name: bytes, sql: str) -> bytes:
        """The name of ``sql`` prepared on this connection, or with prepared statements off
        its text (run unnamed each time)."""
        text = libpq_text(sql)
        if not self._prepared:
            return text
        self._check(self._pgconn.prepare(name, text), COMMAND_OK)
        return name

    def _run(self, statement: bytes, params: Sequence[Any], formats: Sequence[int]) -> Any:
        pgconn = self._pgconn
        if self._prepared:
            return pgconn.exec_prepared(statement, params, formats)
        return pgconn.exec_params(statement, params, param_formats=formats)

    def _check(self, result: Any, expected: int) -> Any:
        """``result`` if its status is ``expected``; else the driver's error for it: a lost
        connection as psycopg's ``OperationalError``, a statement's failure as the error
        class of its sqlstate."""
        if result.status == expected:
            return result
        psycopg = import_psycopg()
        if self._pgconn.status == psycopg.pq.ConnStatus.BAD:
            message = self._pgconn.get_error_message() or result.error_message
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            raise psycopg.OperationalError(message.strip() or "the connection was lost")
        raise psycopg.errors.error_from_result(result, encoding="utf-8")

    def claim(self, params: Sequence[Any]) -> ClaimRow:
        key, app, topic, tag, text, owner, lease_ms = params
        values = (
            key, app.encode(), topic.encode(), tag.encode(), text.encode(), owner.encode(),
            b"%d" % lease_ms,
        )  # fmt: skip
        if self._claim is None:
            self._claim = self._statement(self._CLAIM_NAME, self.hot.claim)
        result = self._check(self._run(self._claim, values, self._CLAIM_FORMATS), TUPLES_OK)
        status, owner_token, left, claims = (result.get_value(0, i) for i in range(4))
        return status.decode(), owner_token.decode(), int(left), int(claims)

    def mark(self, params: Sequence[Any]) -> int:
        owner, retention_ms, key = params
        values = (owner.encode(), b"%d" % retention_ms, key)
        if self._mark is None:
            self._mark = self._statement(self._MARK_NAME, self.hot.mark)
        result = self._check(self._run(self._mark, values, self._MARK_FORMATS), COMMAND_OK)
        return int(result.command_tuples or 0)


#: libpq's ExecStatus values the runner expects (PGRES_COMMAND_OK, PGRES_TUPLES_OK).
COMMAND_OK, TUPLES_OK = 1, 2


class Connections:
    """Where the store's statements run: :meth:`run` lends a :class:`Runner` to one
    operation."""

    #: The store's own pool, or the application's it borrows from.
    pool: Any

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    def close(self) -> None:
        """Close what the store opened itself (never the application's pool)."""


class OwnConnections(Connections):
    """A connection factory's connections, in the store's own bounded pool."""

    def __init__(
        self,
        connect: Callable[[], Any],
        hot: HotStatements,
        size: int,
        timeout: float,
        description: str,
    ) -> None:
        self._connect = connect
        self._hot = hot
        self.pool: BoundedPool[Runner] = BoundedPool(
            self._open, size, timeout, "PostgreSQL", is_outage, lambda: description
        )

    def _open(self) -> Runner:
        """A new connection from the factory, prepared, its hot statements too."""
        conn = self._connect()
        try:
            prepare_connection(conn)
            return LibpqRunner(conn, self._hot)
        except BaseException:
            close_quietly(conn)
            raise

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`BoundedPool.run`: a connection that raised is closed, and after a lost one
        the idle ones too, and ``fn`` runs once more on a new one."""
        return self.pool.run(fn, *args)

    def close(self) -> None:
        self.pool.close()


class UserPoolConnections(Connections):
    """The connections of an application's ``psycopg_pool.ConnectionPool``, borrowed per
    operation and given back in autocommit mode as they were."""

    def __init__(self, pool: Any, hot: HotStatements, description: str) -> None:
        self.pool = pool
        self._hot = hot
        self.description = description

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(runner, *args)`` on a borrowed connection; after a lost connection, have
        the pool check its idle ones and run ``fn`` once more."""
        for attempt in (1, 2):
            try:
                return self._run_once(fn, *args)
            except Exception as exc:
                if attempt == 2 or not is_outage(exc) or is_pool_timeout(exc):
                    raise
                logger.warning("%s: connection failed (%s); retrying", self.description, exc)
                self.pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_once(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self.pool
        conn = pool.getconn()
        autocommit: Optional[bool] = None
        try:
            autocommit = conn.autocommit
            prepare_connection(conn)
            return fn(Runner(conn, self._hot), *args)
        finally:
            if autocommit is False and not conn.closed:
                try:
                    conn.autocommit = False  # as the application set it
                except Exception:  # a broken connection: the pool discards it anyway
                    logger.debug("restoring autocommit failed", exc_info=True)
            pool.putconn(conn)
