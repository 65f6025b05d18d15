"""Business transactions for the exactly-once mode (:mod:`rocketmq_dedup.transactional`): the
I/O half. A :class:`TransactionFactory` owns the pool of transaction connections and the
statements, formatted for its tables; a :class:`Transaction` is one message's transaction on
the business database: it gives the handler its connection, runs the sequence guard's and the
dedup record's statements inside it, and commits or rolls back. What to do with each outcome is
decided by the strategy (:mod:`rocketmq_dedup.strategy.exactly_once`), never here.

The dedup record travels with the COMMIT: ``INSERT`` of the CONSUMED record, then ``COMMIT``,
in one round trip on a connection that takes several statements in one text (mysqlclient's
default), else one after the other. The record's primary key lets one copy of a message commit:
the INSERT fails with ER_DUP_ENTRY when a record of the key exists (the COMMIT after it does
not run), and the transaction is rolled back.

Two kinds, picked by the factory:

* :class:`DbapiTransaction`: a connection taken from the factory's pool (each prepared as the
  store's others, utf8mb4 and UTC, then switched to autocommit off whatever the connection
  factory asked for), so the transaction begins with its first statement, with no
  ``START TRANSACTION`` round trip, and ends with the COMMIT or ROLLBACK. The handler gets a
  :class:`HandlerConnection`: the same connection, with the calls that would end or reconfigure
  the transaction refused (:data:`REFUSED_CALLS`). The connection goes back to the pool after
  COMMIT or ROLLBACK; a connection that raised is closed, never reused.
* :class:`SqlAlchemyTransaction`: for a store built on a SQLAlchemy ``Engine``, a
  ``Connection`` from ``engine.connect()`` and its ``begin()`` (what ``engine.begin()`` does);
  the handler gets that ``Connection`` and the dedup statements run on it
  (``exec_driver_sql``), the record's INSERT and the COMMIT one after the other.
  ``commit()``/``rollback()`` of that connection during the handler are refused by engine event
  listeners (see :func:`guard_engine`).

Each transaction connection's session idle timeout (``wait_timeout``) is the longest an attempt
may hold its key: a consumer frozen in its handler (SIGSTOP, a hung VM) leaves its session idle,
and the server ends it after that long, rolling its transaction back and freeing its row locks
and named lock; a killed consumer's session ends at once (its socket closes). A pooled
connection idle for nearly that long is replaced before use, never handed out half-dead.

What cannot be prevented on either kind: SQL text that ends the transaction sent through a
cursor (``COMMIT``, ``ROLLBACK``, DDL, ``SET autocommit = 1``, which commit implicitly), or the
raw DB-API connection reached behind the proxy. Writes committed that way stay committed.
"""

from __future__ import annotations

import abc
import base64
import enum
import hashlib
import logging
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from rocketmq_dedup.errors import TransactionMisuseError
from rocketmq_dedup.message import DedupElement, element_digest, encode_text
from rocketmq_dedup.stores.base import Record, parse_status
from rocketmq_dedup.stores.mysql.pool import (
    ConnectionPool,
    Runner,
    Statements,
    column_text,
    error_code,
)
from rocketmq_dedup.stores.mysql.sql import (
    DUPLICATE_ENTRY,
    KEY_LOCK_SQL,
    KEY_UNLOCK_SQL,
    MARK_CONSUMED_ROW,
    RECORD_DELETE_EXPIRED_SQL,
    RECORD_INSERT_SQL,
    RECORD_LOCK_SQL,
    SEQUENCE_LOCK_SQL,
    SEQUENCE_READ_SQL,
    SEQUENCE_SET_SQL,
    quote_table,
)

logger = logging.getLogger(__name__)

#: Calls on the handler's DB-API connection that are refused: each would end the message's
#: transaction (PyMySQL's ``begin()`` and mysql-connector's ``start_transaction()`` commit the
#: open one), leave it (``close()``), or make later statements autocommit.
REFUSED_CALLS = frozenset(
    {
        "autocommit",
        "begin",
        "change_user",
        "close",
        "cmd_reset_connection",
        "commit",
        "reset_session",
        "rollback",
        "set_autocommit",
        "start_transaction",
    }
)

#: A pooled transaction connection idle for this much less than its session's idle timeout is
#: replaced rather than used (the server may be about to end its session).
IDLE_MARGIN_S = 1.0


def idle_too_long(idle_since: float, timeout: float) -> bool:
    """Whether a connection idle since ``idle_since`` (``time.monotonic()``) has come within
    :data:`IDLE_MARGIN_S` of its session idle timeout: the server may end it any moment."""
    return time.monotonic() - idle_since >= timeout - IDLE_MARGIN_S


def entity_digest(application: str, entity: str) -> bytes:
    """The sequence table's key: SHA-256 of the length-prefixed (application, entity)."""
    parts = []
    for field in (application, entity):
        data = encode_text(field)
        parts += [len(data).to_bytes(8, "big"), data]
    return hashlib.sha256(b"".join(parts)).digest()


def lock_name(digest: bytes) -> str:
    """The named lock (``GET_LOCK``) of a record key: 58 characters (the server takes 64)."""
    return "rocketmq_dedup:" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def readable(text: str) -> str:
    """The first 255 characters, for the readable columns (as the store writes them)."""
    if text.isascii():
        return text[:255]
    return text[:255].encode("utf-8", "replace").decode("utf-8")


def record_row(element: DedupElement, digest: bytes) -> List[Any]:
    """The key and readable columns of ``element``'s row."""
    app, topic, tag, key = element
    return [digest, readable(app), readable(topic), readable(tag), readable(key)]


class KeyLock(enum.Enum):
    """What :meth:`Transaction.lock_key` found."""

    TAKEN = "taken"
    """No live record, and this session now holds the key's named lock."""
    HELD = "held"
    """Another session holds the key's named lock: a copy is in its handler."""
    RECORDED = "recorded"
    """The key has a live record (see :attr:`Transaction.found`)."""


class Refused(NamedTuple):
    """Why the record's INSERT was refused: the record in the way."""

    record: Record


class TransactionFactory:
    """Opens the exactly-once mode's transactions: owns the pool of transaction connections
    (apart from the store's pool of claims, so a transaction held for a whole handler never
    starves them) and the statements, formatted for its tables.

    :param open_runner: opens a new prepared connection (the store's).
    :param table: the dedup table; ``sequence_table``: its ``<table>_seq`` (None: none).
    :param engine: a SQLAlchemy ``Engine`` to run transactions on instead of the pool.
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table: str,
        sequence_table: Optional[str],
        pool_size: int,
        pool_timeout: float,
        engine: Any = None,
    ) -> None:
        self._open_runner = open_runner
        self.engine = engine
        self.pool = ConnectionPool(self._open_tx_runner, pool_size, pool_timeout)
        quoted, seq = quote_table(table), quote_table(sequence_table or "unused")
        self.sql: Dict[str, str] = {
            "insert": RECORD_INSERT_SQL.format(table=quoted),
            "lock_record": RECORD_LOCK_SQL.format(table=quoted),
            "delete_expired": RECORD_DELETE_EXPIRED_SQL.format(table=quoted),
            "lock_key": KEY_LOCK_SQL.format(table=quoted),
            "unlock_key": KEY_UNLOCK_SQL,
            "seq_lock": SEQUENCE_LOCK_SQL.format(table=seq),
            "seq_read": SEQUENCE_READ_SQL.format(table=seq),
            "seq_set": SEQUENCE_SET_SQL.format(table=seq),
        }
        assert MARK_CONSUMED_ROW in RECORD_INSERT_SQL  # one row layout for every CONSUMED write

    def begin(self, hold_seconds: int) -> Transaction:
        """Open one message's transaction, whose session ends after ``hold_seconds`` idle.
        Raises what the driver raised (the caller wraps it)."""
        if self.engine is not None:
            tx = SqlAlchemyTransaction(self, self.engine)
            try:
                tx.begin(hold_seconds)
            except BaseException:
                tx.close()
                raise
            return tx
        return DbapiTransaction(self, self._take(hold_seconds))

    def _take(self, hold_seconds: int) -> Runner:
        """A pooled connection fit for a transaction: one idle for nearly its session's idle
        timeout is replaced; the timeout is set when it differs (once per connection)."""
        pool = self.pool
        while True:
            runner = pool.take()
            timeout = runner.wait_timeout
            if timeout is None or not idle_too_long(runner.idle_since, timeout):
                break
            pool.discard(runner)
        if timeout != hold_seconds:
            try:
                runner.run("SET SESSION wait_timeout = %s", (hold_seconds,), False)
            except BaseException:
                pool.discard(runner)
                raise
            runner.wait_timeout = hold_seconds
        return runner

    def _open_tx_runner(self) -> Runner:
        """A connection for transactions: prepared as any, then autocommit off, so that a
        transaction begins with its first statement (no ``START TRANSACTION`` round trip) and
        whatever the factory asked for."""
        runner = self._open_runner()
        conn = runner.conn
        try:
            if isinstance(getattr(type(conn), "autocommit", None), property):
                conn.autocommit = False  # mysql-connector-python
            else:
                conn.autocommit(False)
        except BaseException:
            runner.close()
            raise
        runner.idle_since = time.monotonic()
        return runner

    def give_back(self, runner: Runner, discard: bool) -> None:
        """Return a transaction's connection to the pool, or close it."""
        if discard:
            self.pool.discard(runner)
        else:
            self.pool.give(runner)

    def close(self) -> None:
        self.pool.close()


class HandlerConnection:
    """The handler's ``conn`` on a DB-API driver: the transaction's connection, everything
    passing through (``cursor()``, ``escape()``, attributes), except :data:`REFUSED_CALLS`,
    which raise :class:`TransactionMisuseError` (and fail the message even if the handler
    catches it and returns True)."""

    __slots__ = ("_conn", "_tx")

    def __init__(self, conn: Any, tx: Transaction) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_tx", tx)

    def __getattr__(self, name: str) -> Any:
        if name in REFUSED_CALLS:
            tx = self._tx

            def refused(*args: Any, **kwargs: Any) -> Any:
                tx.refuse(name)

            return refused
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in REFUSED_CALLS:  # mysql-connector-python: conn.autocommit = True
            self._tx.refuse(name)
        setattr(self._conn, name, value)

    def __repr__(self) -> str:
        return f"<HandlerConnection of {self._conn!r}>"


class Transaction(abc.ABC):
    """One message's transaction. Use: optionally :meth:`lock_key` and :meth:`lock_sequence`,
    the handler on :attr:`conn` inside :meth:`guarded`, then :meth:`commit_record` (or
    :meth:`commit`) or :meth:`rollback`; :meth:`close` always.

    Every method raises what the driver raised (the caller maps it to a store error); after
    that the transaction is :attr:`broken` and :meth:`close` discards its connection."""

    #: What the handler gets.
    conn: Any

    def __init__(self, factory: TransactionFactory) -> None:
        self.factory = factory
        self.sql = factory.sql
        self.broken = False
        self.misuse: Optional[str] = None  # what the handler did that it must not
        self._guarding = False
        self._lock: Optional[str] = None  # the named lock this session holds
        #: The live record :meth:`lock_key` found (``KeyLock.RECORDED``).
        self.found: Optional[Record] = None

    # -- driver-specific ------------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Run one statement in the transaction: rows if ``fetch``, else the row count."""

    @abc.abstractmethod
    def _execute_all(self, statements: Statements) -> None:
        """Run statements in order (one round trip where the connection allows); raise at the
        first that fails."""

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _rollback(self) -> None: ...

    @abc.abstractmethod
    def _give_back(self) -> None:
        """Give the connection back (or discard it when :attr:`broken`)."""

    def ended_by_handler(self) -> Optional[str]:
        """After the handler: how it ended the transaction itself, if it visibly did."""
        return self.misuse

    def _enter_guard(self) -> None:  # noqa: B027 - optional hook
        """Start refusing misuse (the DB-API proxy refuses at all times)."""

    def _exit_guard(self) -> None:  # noqa: B027 - optional hook
        """Stop refusing misuse."""

    # -- the steps --------------------------------------------------------------------------

    def _run(self, sql: str, params: Sequence[Any], fetch: bool = False) -> Any:
        try:
            return self._execute(sql, params, fetch)
        except BaseException:
            self.broken = True
            raise

    def refuse(self, what: str) -> None:
        """Called by the guards: record the misuse and raise it into the handler."""
        if self.misuse is None:
            self.misuse = what
        raise TransactionMisuseError(
            f"do_handle_msg called {what} on its connection: the listener ends the message's "
            "transaction itself (return True to commit, False or raise to roll back), and the "
            "connection is in use until then"
        )

    def guarded(self) -> _Guard:
        """A context manager for the handler call: misuse is refused while it is open."""
        return _Guard(self)

    def lock_key(self, element: DedupElement) -> KeyLock:
        """Before the handler (``claim="before_handler"``): the key's live record, or its named
        lock, in one round trip. The lock is freed with the COMMIT or ROLLBACK."""
        digest = element_digest(element)
        name = lock_name(digest)
        rows = self._run(self.sql["lock_key"], (name, digest), True)
        status, taken = rows[0] if rows else (None, None)
        if status is not None:
            self.found = Record(parse_status(column_text(status)), element=element)
            return KeyLock.RECORDED
        if taken is not None and int(taken) == 1:
            self._lock = name
            return KeyLock.TAKEN
        return KeyLock.HELD

    def lock_sequence(self, application: str, entity: str) -> Optional[int]:
        """Lock the entity's sequence row until the end of the transaction (creating it when
        new) and return its last applied sequence number (None: nothing applied yet)."""
        digest = entity_digest(application, entity)
        self._run(self.sql["seq_lock"], (digest, readable(application), readable(entity)))
        rows = self._run(self.sql["seq_read"], (digest,), True)
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    def commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        sequence: Optional[Tuple[str, str, int]] = None,
    ) -> Optional[Refused]:
        """Write the CONSUMED record (and the entity's new sequence number, ``(application,
        entity, seq)``) and COMMIT, in one round trip where the connection allows. Returns
        None when committed; else the record that refused it (the transaction is then still
        open: the caller rolls it back). An expired record in the way is deleted and the
        record written again, in the same transaction."""
        digest = element_digest(element)
        insert = (self.sql["insert"], (*record_row(element, digest), owner, retention_ms))
        statements: List[Tuple[str, Sequence[Any]]] = []
        if sequence is not None:
            app, entity, seq = sequence
            statements.append((self.sql["seq_set"], (seq, entity_digest(app, entity))))
        statements.append(insert)
        for attempt in (1, 2):
            try:
                self._write_and_commit(statements)
                return None
            except Exception as exc:
                if error_code(exc) != DUPLICATE_ENTRY:
                    self.broken = True
                    raise
            rows = self._run(self.sql["lock_record"], (digest,), True)
            if not rows:  # deleted meanwhile (an operator): write it again
                statements = [insert]
                continue
            status, holder, expired = rows[0]
            if not int(expired) or attempt == 2:
                record = Record(parse_status(column_text(status)), column_text(holder))
                return Refused(record._replace(element=element))
            self._run(self.sql["delete_expired"], (digest,))
            statements = [insert]  # the sequence update (if any) is already done
        raise AssertionError("unreachable")  # pragma: no cover

    def _write_and_commit(self, statements: List[Tuple[str, Sequence[Any]]]) -> None:
        """``statements``, COMMIT, and the named lock's release, in one go where possible."""
        self._execute_all([*statements, *self._end_statements("COMMIT")])
        self._lock = None

    def _end_statements(self, end: str) -> List[Tuple[str, Sequence[Any]]]:
        """``end`` (COMMIT or ROLLBACK), then the release of the named lock this session
        holds, if any."""
        statements: List[Tuple[str, Sequence[Any]]] = [(end, ())]
        if self._lock is not None:
            statements.append((self.sql["unlock_key"], (self._lock,)))
        return statements

    def commit(self) -> None:
        """COMMIT without a record (a message without a dedup key)."""
        try:
            self._commit()
        except BaseException:
            self.broken = True
            raise

    def rollback(self) -> None:
        """Roll back (and free the named lock); never raises (a connection that cannot is
        discarded, and the server rolls its transaction back and frees its locks when the
        session ends)."""
        try:
            if self._lock is not None:
                self._execute_all(self._end_statements("ROLLBACK"))
                self._lock = None
            else:
                self._rollback()
        except BaseException:
            self.broken = True
            logger.debug("rollback failed; the connection will be discarded", exc_info=True)

    def close(self) -> None:
        """Give the connection back (discard it if anything raised on it, or if it may still
        hold the named lock)."""
        self._guarding = False
        if self._lock is not None:
            self.broken = True
        try:
            self._give_back()
        except Exception:
            logger.debug("closing a transaction's connection failed", exc_info=True)


class _Guard:
    __slots__ = ("_tx",)

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx

    def __enter__(self) -> None:
        self._tx._guarding = True
        self._tx._enter_guard()

    def __exit__(self, *exc_info: object) -> None:
        self._tx._guarding = False
        self._tx._exit_guard()


class DbapiTransaction(Transaction):
    """A transaction on a connection of the factory's pool (see the module docstring); it
    begins with its first statement."""

    def __init__(self, factory: TransactionFactory, runner: Runner) -> None:
        super().__init__(factory)
        self._runner = runner
        self.conn = HandlerConnection(runner.conn, self)

    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        return self._runner.run(sql, params, fetch)

    def _execute_all(self, statements: Statements) -> None:
        self._runner.run_all(statements)

    def _commit(self) -> None:
        self._runner.conn.commit()

    def _rollback(self) -> None:
        self._runner.conn.rollback()

    def _give_back(self) -> None:
        self.factory.give_back(self._runner, self.broken or self.misuse is not None)


# -- SQLAlchemy -----------------------------------------------------------------------------------

#: Connections whose handler is running, by ``id()``: their commit/rollback events refuse.
_GUARDED: Dict[int, Transaction] = {}
_GUARDED_ENGINES: Dict[int, Any] = {}
_GUARD_LOCK = threading.Lock()


def _refuse_end(event: str) -> Any:
    def listener(conn: Any, *args: Any) -> None:
        tx = _GUARDED.get(id(conn))
        if tx is not None and tx._guarding:
            tx.refuse(f"{event}()")

    return listener


#: In a pooled SQLAlchemy connection's ``info`` (which lives as long as its DB-API connection):
#: the session idle timeout this library set on it, and since when it has been idle in the pool.
_WAIT_TIMEOUT_INFO = "rocketmq_dedup_wait_timeout"
_IDLE_SINCE_INFO = "rocketmq_dedup_idle_since"


def _stamp_idle(dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin``: when a connection whose idle timeout this library lowered went idle."""
    if record is not None and _WAIT_TIMEOUT_INFO in record.info:
        record.info[_IDLE_SINCE_INFO] = time.monotonic()


def _replace_if_timed_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Pool ``checkout`` (the application's, or the store's): a connection idle in the engine's
    pool for (nearly) the session idle timeout this library set on it has been, or is about
    to be, ended by the server. ``DisconnectionError`` makes the pool connect anew, so no
    checkout, ours or the application's, gets a session the lowered timeout ended (the
    application's engine keeps working without ``pool_pre_ping``)."""
    info = record.info
    since = info.pop(_IDLE_SINCE_INFO, None)
    timeout = info.get(_WAIT_TIMEOUT_INFO)
    if since is not None and timeout is not None and idle_too_long(since, timeout):
        info.pop(_WAIT_TIMEOUT_INFO, None)  # the next DB-API connection has the default
        from sqlalchemy import exc

        raise exc.DisconnectionError("the session's idle timeout (wait_timeout) lapsed")


def guard_engine(engine: Any) -> None:
    """Install, once per engine, ``commit``/``rollback`` event listeners that raise
    :class:`TransactionMisuseError` when a handler calls ``conn.commit()``/``rollback()``
    (or ``close()``, which rolls back) on the ``Connection`` it was given: the event fires
    before the DB-API call, so the transaction is neither committed nor rolled back by it.
    Savepoints (``conn.begin_nested()``) stay allowed. Also pool ``checkin``/``checkout``
    listeners that replace a pooled connection whose lowered session idle timeout lapsed
    while it sat in the engine's pool (:func:`_replace_if_timed_out`)."""
    from sqlalchemy import event  # the [sqlalchemy] extra; only with an Engine

    with _GUARD_LOCK:
        if id(engine) in _GUARDED_ENGINES:
            return
        event.listen(engine, "commit", _refuse_end("commit"))
        event.listen(engine, "rollback", _refuse_end("rollback"))
        event.listen(engine, "checkin", _stamp_idle)
        event.listen(engine, "checkout", _replace_if_timed_out)
        _GUARDED_ENGINES[id(engine)] = engine  # keeps the id unique while guarded


class SqlAlchemyTransaction(Transaction):
    """A transaction on a SQLAlchemy ``Connection`` of the factory's engine (module docstring).

    Refused during the handler: ``conn.commit()``, ``conn.rollback()`` and ``conn.close()``
    (engine events, before any DB-API call). Detected after it: a transaction that is no longer
    the one begun, or a closed connection (-> rolled back, RECONSUME_LATER). Refused before it:
    a DB-API connection in autocommit mode (``isolation_level="AUTOCOMMIT"``), where
    ``begin()`` opens no transaction at all. Not prevented: ``conn.connection.commit()`` (the
    raw DB-API connection) and SQL text that ends the transaction."""

    def __init__(self, factory: TransactionFactory, engine: Any) -> None:
        super().__init__(factory)
        self.conn = engine.connect()
        self._root: Any = None

    def begin(self, hold_seconds: int) -> None:
        try:
            self._root = self.conn.begin()
            dbapi = self.conn.connection.dbapi_connection
            get_autocommit = getattr(dbapi, "get_autocommit", None)  # mysqlclient, PyMySQL
            if get_autocommit is not None and get_autocommit():
                self.misuse = "autocommit"
                raise TransactionMisuseError(
                    "the engine's connections are in autocommit mode (isolation_level="
                    "'AUTOCOMMIT'): engine.begin() opens no transaction there, so the "
                    "handler's writes could not be rolled back; use the default isolation level"
                )
            info = self.conn.connection.info  # lives as long as the DB-API connection
            if info.get(_WAIT_TIMEOUT_INFO) != hold_seconds:
                self._execute("SET SESSION wait_timeout = %s", (hold_seconds,), False)
                info[_WAIT_TIMEOUT_INFO] = hold_seconds
        except BaseException:
            self.broken = True
            raise

    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        result = self.conn.exec_driver_sql(sql, tuple(params))
        return result.fetchall() if fetch else result.rowcount

    def _execute_all(self, statements: Statements) -> None:
        for sql, params in statements:
            if sql == "COMMIT":
                self._root.commit()
            elif sql == "ROLLBACK":
                self._rollback()
            else:
                self._execute(sql, params, False)

    def ended_by_handler(self) -> Optional[str]:
        if self.misuse is not None:
            return self.misuse
        if self.conn.closed:
            return "close()"
        root = self._root
        if root is None or not root.is_active or self.conn.get_transaction() is not root:
            return "commit() or rollback()"
        return None

    def _enter_guard(self) -> None:
        _GUARDED[id(self.conn)] = self

    def _exit_guard(self) -> None:
        _GUARDED.pop(id(self.conn), None)

    def _commit(self) -> None:
        self._root.commit()

    def _rollback(self) -> None:
        if self.conn.closed:
            return
        if self._root is not None and self.conn.get_transaction() is self._root:
            self._root.rollback()
        elif self.conn.in_transaction():  # a transaction the handler began after its own
            self.conn.rollback()

    def _give_back(self) -> None:
        _GUARDED.pop(id(self.conn), None)
        if self.conn.closed:
            return
        if self.broken or self.misuse is not None:
            self.conn.invalidate()  # the DB-API connection is closed, not pooled
        self.conn.close()


__all__ = [
    "REFUSED_CALLS",
    "DbapiTransaction",
    "HandlerConnection",
    "KeyLock",
    "Refused",
    "SqlAlchemyTransaction",
    "Transaction",
    "TransactionFactory",
    "entity_digest",
    "guard_engine",
    "lock_name",
    "readable",
    "record_row",
]
