"""Business transactions for the exactly-once mode (:mod:`rocketmq_dedup.transactional`): the
I/O half. A :class:`Transaction` is one message's transaction on the business database (the
database of the MySQL store): it starts it, gives the handler its connection, runs the
sequence guard's and the dedup record's statements inside it, and commits or rolls back.
What to do with each outcome is decided by the strategy, never here.

Two kinds, picked by the store:

* :class:`DbapiTransaction`: a connection taken from the store's transaction pool (each is
  prepared as the store's others, utf8mb4 and UTC, then switched to autocommit off whatever
  the connection factory asked for), so the transaction begins with its first statement, with
  no ``START TRANSACTION`` round trip, and ends with the COMMIT or ROLLBACK. The
  handler gets a :class:`HandlerConnection`: the same connection, with the calls that would end
  or reconfigure the transaction refused (:data:`REFUSED_CALLS`). The connection goes back to
  the pool after COMMIT or ROLLBACK; a connection that raised is closed, never reused.
* :class:`SqlAlchemyTransaction`: for a store built on a SQLAlchemy ``Engine``, a
  ``Connection`` from ``engine.connect()`` and its ``begin()`` (what ``engine.begin()`` does);
  the handler gets that ``Connection`` and the dedup statements run on it
  (``exec_driver_sql``). ``commit()``/``rollback()`` of that connection during the handler are
  refused by engine event listeners (see :func:`guard_engine`).

What cannot be prevented on either: SQL text that ends the transaction sent through a cursor
(``COMMIT``, ``ROLLBACK``, DDL, ``SET autocommit = 1``, which commit implicitly), or the raw
DB-API connection reached behind the proxy. Writes committed that way stay committed.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from rocketmq_dedup.errors import TransactionMisuseError
from rocketmq_dedup.message import DedupElement, element_digest, encode_text
from rocketmq_dedup.stores.mysql.pool import Runner
from rocketmq_dedup.stores.mysql.sql import DUPLICATE_ENTRY

if TYPE_CHECKING:
    from rocketmq_dedup.stores.mysql.store import MySQLDedupStore

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


def entity_digest(application: str, entity: str) -> bytes:
    """The sequence table's key: SHA-256 of the length-prefixed (application, entity)."""
    parts = []
    for field in (application, entity):
        data = encode_text(field)
        parts += [len(data).to_bytes(8, "big"), data]
    return hashlib.sha256(b"".join(parts)).digest()


def error_code(exc: BaseException) -> Optional[int]:
    """The server error number of a driver exception (or of the one SQLAlchemy wraps)."""
    exc = getattr(exc, "orig", None) or exc
    code = getattr(exc, "errno", None)  # mysql-connector-python
    if isinstance(code, int):
        return code
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


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
    """One message's transaction. Use: :meth:`begin`, optionally :meth:`lock_sequence`, the
    handler on :attr:`conn` inside :meth:`guarded`, :meth:`set_sequence`,
    :meth:`mark_consumed`, then :meth:`commit` or :meth:`rollback`; :meth:`close` always.

    Every method raises what the driver raised (the caller maps it to a store error); after
    that the transaction is :attr:`broken` and :meth:`close` discards its connection."""

    #: What the handler gets.
    conn: Any

    def __init__(self, store: MySQLDedupStore) -> None:
        self.store = store
        self.broken = False
        self.misuse: Optional[str] = None  # what the handler did that it must not
        self._guarding = False

    # -- driver-specific ------------------------------------------------------------------

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Run one statement in the transaction: rows if ``fetch``, else the row count."""

    @abc.abstractmethod
    def _begin(self) -> None: ...

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _rollback(self) -> None: ...

    @abc.abstractmethod
    def _release(self) -> None:
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

    def begin(self) -> None:
        try:
            self._begin()
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

    def lock_sequence(self, application: str, entity: str) -> Optional[int]:
        """Lock the entity's sequence row until the end of the transaction (creating it when
        new) and return its last applied sequence number (None: nothing applied yet)."""
        digest = entity_digest(application, entity)
        sql = self.store.transaction_sql
        self._run(sql["seq_lock"], (digest, _readable(application), _readable(entity)))
        rows = self._run(sql["seq_read"], (digest,), True)
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    def set_sequence(self, application: str, entity: str, seq: int) -> None:
        digest = entity_digest(application, entity)
        self._run(self.store.transaction_sql["seq_set"], (seq, digest))

    def mark_consumed(self, element: DedupElement, owner: str, retention_ms: int) -> bool:
        """Write the CONSUMED record in the transaction, fenced by ``owner``'s claim; False
        when another attempt owns or owned the key (this transaction must not commit).

        The fenced UPDATE matches the row only while it is still ``owner``'s CONSUMING claim.
        If it matches none, a plain INSERT is tried: the primary key refuses it when any record
        of the key exists, and it succeeds only when the record was lost (deleted), in which
        case no other attempt can commit the key after this one."""
        digest = element_digest(element)
        sql = self.store.transaction_sql
        if self._run(sql["fenced_mark"], (owner, retention_ms, digest, owner)) == 1:
            return True
        app, topic, tag, key = element
        row = (digest, _readable(app), _readable(topic), _readable(tag), _readable(key))
        try:
            self._execute(sql["fenced_insert"], (*row, owner, retention_ms), False)
        except Exception as exc:
            if error_code(exc) == DUPLICATE_ENTRY:  # the statement failed, not the connection
                return False
            self.broken = True
            raise
        return True

    def commit(self) -> None:
        try:
            self._commit()
        except BaseException:
            self.broken = True
            raise

    def rollback(self) -> None:
        """Roll back; never raises (a connection that cannot roll back is discarded, and the
        server rolls its transaction back when it is closed)."""
        try:
            self._rollback()
        except BaseException:
            self.broken = True
            logger.debug("rollback failed; the connection will be discarded", exc_info=True)

    def close(self) -> None:
        """Give the connection back (discard it if anything raised on it)."""
        self._guarding = False
        try:
            self._release()
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
    """A transaction on a connection of the store's pool (see the module docstring)."""

    def __init__(self, store: MySQLDedupStore, runner: Runner) -> None:
        super().__init__(store)
        self._runner = runner
        self.conn = HandlerConnection(runner.conn, self)

    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        return self._runner.run(sql, params, fetch)

    def _begin(self) -> None:
        """Nothing to send: the connection is in autocommit-off mode, so the transaction
        begins with its first statement. (A connection lost while idle in the pool fails that
        statement: the message is retried and the connection discarded.)"""

    def _commit(self) -> None:
        self._runner.conn.commit()

    def _rollback(self) -> None:
        self._runner.conn.rollback()

    def _release(self) -> None:
        self.store.return_runner(self._runner, self.broken or self.misuse is not None)


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


def guard_engine(engine: Any) -> None:
    """Install, once per engine, ``commit``/``rollback`` event listeners that raise
    :class:`TransactionMisuseError` when a handler calls ``conn.commit()``/``rollback()``
    (or ``close()``, which rolls back) on the ``Connection`` it was given: the event fires
    before the DB-API call, so the transaction is neither committed nor rolled back by it.
    Savepoints (``conn.begin_nested()``) stay allowed."""
    from sqlalchemy import event  # the [sqlalchemy] extra; only with an Engine

    with _GUARD_LOCK:
        if id(engine) in _GUARDED_ENGINES:
            return
        event.listen(engine, "commit", _refuse_end("commit"))
        event.listen(engine, "rollback", _refuse_end("rollback"))
        _GUARDED_ENGINES[id(engine)] = engine  # keeps the id unique while guarded


class SqlAlchemyTransaction(Transaction):
    """A transaction on a SQLAlchemy ``Connection`` of the store's engine (module docstring).

    Refused during the handler: ``conn.commit()``, ``conn.rollback()`` and ``conn.close()``
    (engine events, before any DB-API call). Detected after it: a transaction that is no longer
    the one begun, or a closed connection (-> rolled back, RECONSUME_LATER). Refused before it:
    a DB-API connection in autocommit mode (``isolation_level="AUTOCOMMIT"``), where
    ``begin()`` opens no transaction at all. Not prevented: ``conn.connection.commit()`` (the
    raw DB-API connection) and SQL text that ends the transaction."""

    def __init__(self, store: MySQLDedupStore, engine: Any) -> None:
        super().__init__(store)
        self.conn = engine.connect()
        self._root: Any = None

    def _execute(self, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        result = self.conn.exec_driver_sql(sql, tuple(params))
        return result.fetchall() if fetch else result.rowcount

    def _begin(self) -> None:
        self._root = self.conn.begin()
        dbapi = self.conn.connection.dbapi_connection
        get_autocommit = getattr(dbapi, "get_autocommit", None)  # mysqlclient, PyMySQL
        if get_autocommit is not None and get_autocommit():
            self.misuse = "autocommit"
            raise TransactionMisuseError(
                "the engine's connections are in autocommit mode (isolation_level="
                "'AUTOCOMMIT'): engine.begin() opens no transaction there, so the handler's "
                "writes could not be rolled back; use the default isolation level"
            )

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

    def _release(self) -> None:
        _GUARDED.pop(id(self.conn), None)
        if self.conn.closed:
            return
        if self.broken or self.misuse is not None:
            self.conn.invalidate()  # the DB-API connection is closed, not pooled
        self.conn.close()


def _readable(text: str) -> str:
    """The first 255 characters, for the readable columns (as the store writes them)."""
    return text[:255].encode("utf-8", "replace").decode("utf-8")
