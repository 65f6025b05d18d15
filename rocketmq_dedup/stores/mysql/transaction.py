"""The exactly-once mode's transactions on MySQL/MariaDB: the port of
:mod:`rocketmq_dedup.stores.transaction`, on the store's connections or on a SQLAlchemy engine.
What to do with each outcome is the strategy's (:mod:`rocketmq_dedup.strategy.exactly_once`).

The dedup record travels with the COMMIT: the record's ``INSERT``, ``COMMIT`` (and the release
of the key's named lock, if held) in one round trip on a connection that takes several
statements in one text (mysqlclient's default), else one after the other. The record's primary
key lets one copy of a message commit: its INSERT fails with ER_DUP_ENTRY when a record of the
key exists (the COMMIT after it does not run).

Two kinds, picked by :class:`MySQLTransactions`:

* :class:`DbapiTransaction`: a connection of the source's own pool (prepared as the store's
  others, utf8mb4 and UTC, then autocommit off whatever the factory asked for), so the
  transaction begins with its first statement, with no ``START TRANSACTION`` round trip. The
  handler gets a :class:`~.handler_connection.HandlerConnection`: the same connection with the
  calls that would end, leave or reconfigure the transaction refused.
* :class:`SqlAlchemyTransaction`: for a store built on a SQLAlchemy ``Engine``, a
  ``Connection`` from ``engine.connect()`` and its ``begin()``; the handler gets that
  ``Connection`` (its ``commit()``/``rollback()``/``close()`` refused: :mod:`.sqlalchemy_guard`),
  and the dedup statements run on it.

A transaction commits only on the session it began, in a transaction. After the handler the
session is checked with what the driver knows without a round trip
(:func:`~.connection.session_id`, :func:`~.connection.autocommit_on`): a session that changed
(a reconnect) or that is in autocommit mode (``SET autocommit = 1`` sent as SQL text) is
misuse: rolled back, RECONSUME_LATER, and the connection is never given to another message
(checked again when it is given back). mysql-connector-python keeps no autocommit status; there
the session is asked (one round trip) only when the handler left no transaction open. A driver
that reconnects by itself (mysqlclient with its reconnect option on) never does so while a
transaction is open (the client libraries refuse to): the COMMIT then fails as a lost
connection.

Each transaction connection's session idle timeout (``wait_timeout``) is the longest an attempt
may hold its key: a consumer frozen in its handler leaves its session idle, and the server ends
it after that long, rolling its transaction back and freeing its row locks and named lock. A
pooled connection idle for nearly that long is replaced before use.

What cannot be prevented: SQL text that ends the transaction (``COMMIT``, DDL,
``SET autocommit = 1``): what it committed stays committed (the message is then retried, so
those writes may apply twice); and the raw DB-API connection reached behind the proxy.
"""

from __future__ import annotations

import abc
import enum
import logging
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

from rocketmq_dedup.errors import StoreError, TransactionMisuseError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.base import Record, parse_status
from rocketmq_dedup.stores.mysql.connection import (
    Runner,
    Statements,
    autocommit_on,
    column_text,
    idle_too_long,
    session_id,
    set_autocommit,
)
from rocketmq_dedup.stores.mysql.errors import DUPLICATE_ENTRY, as_store_error, error_code
from rocketmq_dedup.stores.mysql.handler_connection import HandlerConnection
from rocketmq_dedup.stores.mysql.pool import ConnectionPool
from rocketmq_dedup.stores.mysql.rows import lock_name, readable, record_row
from rocketmq_dedup.stores.mysql.sql import (
    AUTOCOMMIT_SQL,
    KEY_LOCK_SQL,
    KEY_UNLOCK_SQL,
    MISSING_COLUMN,
    RECORD_DELETE_EXPIRED_SQL,
    RECORD_FAILED_SQL,
    RECORD_FAILED_SQL_NO_REASON,
    RECORD_INSERT_SQL,
    RECORD_LOCK_SQL,
    RECORD_READ_SQL,
    SEQUENCE_LOCK_SQL,
    SEQUENCE_READ_SQL,
    SEQUENCE_SET_SQL,
    quote_table,
)
from rocketmq_dedup.stores.sql_transaction import RECONNECTED, SqlTransaction
from rocketmq_dedup.stores.transaction import (
    Entity,
    KeyClaim,
    SequenceStep,
    Transaction,
    TransactionSource,
)

logger = logging.getLogger(__name__)

#: How a session that went into autocommit mode is told.
AUTOCOMMIT = "switched its session to autocommit mode (SET autocommit = 1)"
COMMIT: Tuple[str, Sequence[Any]] = ("COMMIT", ())
ROLLBACK: Tuple[str, Sequence[Any]] = ("ROLLBACK", ())


class TransactionSql(NamedTuple):
    """The transactions' statements, formatted for a dedup table and its sequence table."""

    insert: str
    insert_commit: str  # the record's INSERT and COMMIT in one text (one round trip)
    insert_failed: str
    insert_failed_no_reason: str
    read_record: str
    lock_record: str
    delete_expired: str
    seq_lock: str
    seq_read: str
    seq_set: str

    @classmethod
    def for_tables(cls, table: str, sequence_table: Optional[str]) -> TransactionSql:
        quoted, seq = quote_table(table), quote_table(sequence_table or "unused")
        insert = RECORD_INSERT_SQL.format(table=quoted)
        return cls(
            insert=insert,
            insert_commit=f"{insert}; COMMIT",
            insert_failed=RECORD_FAILED_SQL.format(table=quoted),
            insert_failed_no_reason=RECORD_FAILED_SQL_NO_REASON.format(table=quoted),
            read_record=RECORD_READ_SQL.format(table=quoted),
            lock_record=RECORD_LOCK_SQL.format(table=quoted),
            delete_expired=RECORD_DELETE_EXPIRED_SQL.format(table=quoted),
            seq_lock=SEQUENCE_LOCK_SQL.format(table=seq),
            seq_read=SEQUENCE_READ_SQL.format(table=seq),
            seq_set=SEQUENCE_SET_SQL.format(table=seq),
        )


class MySQLTransactions(TransactionSource):
    """Opens the exactly-once mode's transactions: owns the pool of transaction connections
    (apart from the store's pool, so a transaction held for a whole handler never starves
    claims, look-ups and lease renewal) and the statements.

    :param open_runner: opens a new prepared connection (the store's).
    :param sequence_table: the ``<table>_seq`` table; None: no sequence guard.
    :param describe: the store's description, for errors.
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table: str,
        sequence_table: Optional[str],
        pool_size: int,
        pool_timeout: float,
        describe: Callable[[], str],
    ) -> None:
        self._open_runner = open_runner
        self.describe = describe
        self.engine: Any = None  # a SQLAlchemy Engine to run transactions on instead
        self.pool = ConnectionPool(self._open_tx_runner, pool_size, pool_timeout)
        self.sql = TransactionSql.for_tables(table, sequence_table)
        self.supports_sequences = sequence_table is not None

    def begin(self, hold_seconds: int) -> Transaction:
        try:
            if self.engine is not None:
                return SqlAlchemyTransaction(self, self.engine, hold_seconds)
            return DbapiTransaction(self, self._take(hold_seconds))
        except (StoreError, TransactionMisuseError):
            raise
        except Exception as exc:
            raise self.wrap(exc) from exc

    def wrap(self, exc: BaseException) -> StoreError:
        """The library's error for a driver error of these transactions."""
        return as_store_error(exc, self.describe())

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
        transaction begins with its first statement (no ``START TRANSACTION`` round trip)
        whatever the factory asked for."""
        runner = self._open_runner()
        try:
            set_autocommit(runner.conn, False)
        except BaseException:
            runner.close()
            raise
        runner.idle_since = time.monotonic()
        return runner

    def give_back(self, runner: Runner, fit: bool) -> None:
        """Return a transaction's connection to the pool, or close it when it is not fit for
        another message."""
        if fit:
            self.pool.give(runner)
        else:
            self.pool.discard(runner)

    def close(self) -> None:
        self.pool.close()


class MySQLTransaction(SqlTransaction):
    """The steps of the port on MySQL (module docstring; the rules around them:
    :class:`~rocketmq_dedup.stores.sql_transaction.SqlTransaction`); subclasses run the
    statements on a DB-API connection or a SQLAlchemy one."""

    #: The key's named lock, while this session holds it.
    _lock: Optional[str] = None

    def __init__(self, source: MySQLTransactions) -> None:
        self._wrap = source.wrap  # (SqlTransactionRules.__init__, without a call a message)
        self.source = source
        self.sql = source.sql

    # -- driver-specific ------------------------------------------------------------------

    @abc.abstractmethod
    def _run_all(self, statements: Statements) -> List[Any]:
        """Run statements in the transaction (one round trip where the connection allows);
        each one's rows or affected row count. Raises what the driver raised."""

    @abc.abstractmethod
    def _commit_after(self, statements: Statements) -> None:
        """Run ``statements``, COMMIT, then the named lock's release (if held)."""

    @abc.abstractmethod
    def _session_changed(self) -> Optional[str]:
        """How the connection left the session the transaction began on, if it did (a
        reconnect, a closed or ended transaction), without a round trip."""

    def _commit(self) -> None:
        self._commit_after([])

    def _fit(self) -> bool:
        """Not while the session may still hold the key's named lock."""
        return super()._fit() and self._lock is None

    # -- the steps ---------------------------------------------------------------------------

    def _claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        """The named lock first; once held, [the entity's row,] then the record (module
        docstring of :mod:`rocketmq_dedup.stores.transaction`: lock before read, no snapshot
        before a wait). Without an entity the read rides the lock's round trip (it runs after
        the lock, and is ignored when the lock is held elsewhere)."""
        digest = element_digest(element)
        name = lock_name(digest)
        lock = (KEY_LOCK_SQL, (name,))
        read = (self.sql.read_record, (digest,))
        if entity is None:
            taken, rows = self._run_all([lock, read])
        else:
            (taken,) = self._run_all([lock])
        if not lock_taken(taken):
            return KeyClaim(False)
        self._lock = name
        last = None
        if entity is not None:
            _, seq_rows, rows = self._run_all([*self._sequence_lock(entity), read])
            last = _last_seq(seq_rows)
        return KeyClaim(True, live_record(rows, element), last)

    def _sequence_lock(self, entity: Entity) -> Statements:
        """Lock the entity's row (creating it when new), then read it."""
        digest = entity.digest()
        return [
            (self.sql.seq_lock, (digest, readable(entity.application), readable(entity.name))),
            (self.sql.seq_read, (digest,)),
        ]

    def _lock_sequence(self, entity: Entity) -> Optional[int]:
        _, rows = self._run_all(self._sequence_lock(entity))
        return _last_seq(rows)

    def _commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep],
    ) -> Optional[Record]:
        """The record [and the sequence step], then COMMIT; an expired record in the way is
        deleted and the record written again, in the same transaction."""
        digest = element_digest(element)
        insert = (self.sql.insert, (*record_row(element, digest), owner, retention_ms))
        statements: List[Tuple[str, Sequence[Any]]] = []
        if applied is not None:
            statements.append((self.sql.seq_set, (applied.seq, applied.entity.digest())))
        return self._insert_and_commit(element, digest, [*statements, insert], insert)

    def _commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        """ROLLBACK (the handler's writes; a named lock is a session's and stays), then the
        FAILED record alone and COMMIT; without the reason on a table made before FAILED
        records (no reason column)."""
        self._run_all([ROLLBACK])
        digest = element_digest(element)
        row = (*record_row(element, digest), owner, retention_ms)
        insert = (self.sql.insert_failed, (*row, reason))
        try:
            return self._insert_and_commit(element, digest, [insert], insert)
        except Exception as exc:
            if error_code(exc) != MISSING_COLUMN:
                raise
        logger.warning(
            "the dedup table has no failure_reason column (made by an earlier version): the "
            "FAILED record of %r is written without its reason (rocketmq-dedup check names the "
            "ALTER TABLE that adds it)",
            element,
        )
        self._run_all([ROLLBACK])
        insert = (self.sql.insert_failed_no_reason, row)
        return self._insert_and_commit(element, digest, [insert], insert)

    def _insert_and_commit(
        self,
        element: DedupElement,
        digest: bytes,
        statements: Statements,
        insert: Tuple[str, Sequence[Any]],
    ) -> Optional[Record]:
        """``statements`` (ending with the record's ``insert``) and COMMIT; a record in the
        way refuses it, an expired one is deleted and ``insert`` run again."""
        for attempt in (1, 2):
            try:
                self._commit_after(statements)
            except Exception as exc:
                if not refused_by_a_record(exc):
                    raise
            else:
                self._open = False
                return None
            (rows,) = self._run_all([(self.sql.lock_record, (digest,))])
            found = in_the_way(rows, attempt, element)
            if isinstance(found, Record):
                return found
            if found is InTheWay.EXPIRED:
                self._run_all([(self.sql.delete_expired, (digest,))])
            statements = [insert]  # the sequence update (if any) is already done
        raise AssertionError("unreachable")  # pragma: no cover

    def _end_statements(self, end: Tuple[str, Sequence[Any]]) -> Statements:
        return end_statements(end, self._lock)


class InTheWay(enum.Enum):
    """What refused a record's INSERT, when it is not a live record to answer with."""

    GONE = "gone"  # deleted meanwhile (an operator): write it again
    EXPIRED = "expired"  # an expired record: delete it, then write again


def refused_by_a_record(exc: BaseException) -> bool:
    """Whether a record's INSERT (or the COMMIT after it) failed on the key's primary key."""
    return error_code(exc) == DUPLICATE_ENTRY


def in_the_way(rows: Any, attempt: int, element: DedupElement) -> Union[Record, InTheWay]:
    """What the record in the way of an INSERT is (its row locked by
    :data:`~.sql.RECORD_LOCK_SQL`): the live record of another attempt to answer with (an
    expired one too, on the second attempt), or what to do before writing again."""
    if not rows:
        return InTheWay.GONE
    status, holder, expired = rows[0]
    if not int(expired) or attempt == 2:
        record = Record(parse_status(column_text(status)), column_text(holder))
        return record._replace(element=element)
    return InTheWay.EXPIRED


def end_statements(end: Tuple[str, Sequence[Any]], lock: Optional[str]) -> Statements:
    """``end`` (COMMIT or ROLLBACK), then the release of the key's named ``lock``, if held."""
    if lock is None:
        return [end]
    return [end, (KEY_UNLOCK_SQL, (lock,))]


class DbapiTransaction(MySQLTransaction):
    """A transaction on a connection of the source's pool (module docstring)."""

    def __init__(self, source: MySQLTransactions, runner: Runner) -> None:
        super().__init__(source)
        self._runner = runner
        self.conn = HandlerConnection(runner.conn, self.refuse)

    def _run_all(self, statements: Statements) -> List[Any]:
        return self._runner.run_all(statements)

    def _commit_after(self, statements: Statements) -> None:
        runner = self._runner
        if (
            len(statements) == 1
            and statements[0][0] is self.sql.insert
            and self._lock is None
            and runner.multi
        ):  # a fresh message's record: its text joined with the COMMIT's once, not per message
            runner.run_text(self.sql.insert_commit, statements[0][1])
            return
        runner.run_all([*statements, *self._end_statements(COMMIT)])
        self._lock = None

    def _rollback(self) -> None:
        self._runner.run_all(self._end_statements(ROLLBACK))
        self._lock = None

    def _session_changed(self) -> Optional[str]:
        if not self._runner.same_session():
            return RECONNECTED
        return None

    def _session_misuse(self) -> Optional[str]:
        changed = self._session_changed()
        if changed is not None:
            return changed
        runner = self._runner
        autocommit = runner.autocommit_on()
        if autocommit is None and not getattr(runner.conn, "in_transaction", True):
            # a driver that keeps no autocommit status (mysql-connector-python), and no
            # transaction open: ask (a handler that touched no table, or autocommit on)
            rows = runner.run(AUTOCOMMIT_SQL, (), True)
            autocommit = bool(rows and int(rows[0][0]))
        return AUTOCOMMIT if autocommit else None

    def _give_back(self, fit: bool) -> None:
        runner = self._runner
        fit = fit and runner.same_session() and runner.autocommit_on() is not True
        self.source.give_back(runner, fit)


class SqlAlchemyTransaction(MySQLTransaction):
    """A transaction on a SQLAlchemy ``Connection`` of the source's engine (module docstring).

    Refused during the handler: ``conn.commit()``, ``conn.rollback()`` and ``conn.close()``
    (engine events, before any DB-API call). Detected after it: a transaction that is no longer
    the one begun, a closed connection, a changed or autocommit session (-> rolled back,
    RECONSUME_LATER). Refused before it: a DB-API connection in autocommit mode
    (``isolation_level="AUTOCOMMIT"``), where ``begin()`` opens no transaction at all."""

    def __init__(self, source: MySQLTransactions, engine: Any, hold_seconds: int) -> None:
        super().__init__(source)
        self._root: Any = None
        self._session: Optional[int] = None
        self.conn = engine.connect()
        try:
            self._root = self.conn.begin()
            dbapi = self._dbapi()
            self._session = session_id(dbapi)
            if autocommit_on(dbapi):
                self.misused = AUTOCOMMIT
                raise TransactionMisuseError(
                    "the engine's connections are in autocommit mode (isolation_level="
                    "'AUTOCOMMIT'): engine.begin() opens no transaction there, so the "
                    "handler's writes could not be rolled back; use the default isolation level"
                )
            from rocketmq_dedup.stores.mysql.sqlalchemy_guard import WAIT_TIMEOUT_INFO

            info = self.conn.connection.info  # lives as long as the DB-API connection
            if info.get(WAIT_TIMEOUT_INFO) != hold_seconds:
                self.conn.exec_driver_sql("SET SESSION wait_timeout = %s", (hold_seconds,))
                info[WAIT_TIMEOUT_INFO] = hold_seconds
        except BaseException:
            self.broken = True
            self.close()
            raise

    def _dbapi(self) -> Any:
        return self.conn.connection.dbapi_connection

    def _run_all(self, statements: Statements) -> List[Any]:
        results = []
        for sql, params in statements:
            result = self.conn.exec_driver_sql(sql, tuple(params))
            results.append(result.fetchall() if result.returns_rows else result.rowcount)
        return results

    def _commit_after(self, statements: Statements) -> None:
        self._run_all(statements)
        self._root.commit()
        self._release_lock()

    def _rollback(self) -> None:
        conn = self.conn
        if conn.closed or conn.invalidated:
            return
        root = self._root
        if root is not None and conn.get_transaction() is root and root.is_active:
            root.rollback()
        elif conn.in_transaction():  # a transaction the handler began after its own
            conn.rollback()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._run_all([(KEY_UNLOCK_SQL, (self._lock,))])
            self._lock = None

    def _session_changed(self) -> Optional[str]:
        conn = self.conn
        if conn.closed:
            return "closed its connection"
        if conn.invalidated or session_id(self._dbapi()) != self._session:
            return RECONNECTED
        return None

    def _session_misuse(self) -> Optional[str]:
        changed = self._session_changed()
        if changed is not None:
            return changed
        root = self._root
        if root is None or not root.is_active or self.conn.get_transaction() is not root:
            return "ended its transaction (commit() or rollback())"
        return AUTOCOMMIT if autocommit_on(self._dbapi()) else None

    def _guard(self) -> None:
        from rocketmq_dedup.stores.sqlalchemy_guard import guard

        guard(self.conn, self.refuse)

    def _unguard(self) -> None:
        from rocketmq_dedup.stores.sqlalchemy_guard import unguard

        unguard(self.conn)

    def _give_back(self, fit: bool) -> None:
        conn = self.conn
        if conn.closed:
            return
        if not fit and not conn.invalidated:
            conn.invalidate()  # the DB-API connection is closed, never pooled again
        conn.close()


def lock_taken(value: Any) -> bool:
    """``GET_LOCK``'s answer: 1 taken, 0 held by another session; NULL (an error on the
    server, such as the session being killed) raises."""
    rows = value
    result = rows[0][0] if rows else None
    if result is None:
        raise StoreError("GET_LOCK answered NULL: the server could not take the key's lock")
    return int(result) == 1


def _last_seq(rows: Any) -> Optional[int]:
    value = rows[0][0] if rows else None
    return None if value is None else int(value)


def live_record(rows: Any, element: DedupElement) -> Optional[Record]:
    """The record :data:`~.sql.RECORD_READ_SQL` read, if any."""
    if not rows:
        return None
    status, owner, left = rows[0]
    return Record(parse_status(column_text(status)), column_text(owner), max(0, int(left)), element)


__all__ = [
    "AUTOCOMMIT",
    "COMMIT",
    "ROLLBACK",
    "DbapiTransaction",
    "InTheWay",
    "MySQLTransaction",
    "MySQLTransactions",
    "SqlAlchemyTransaction",
    "TransactionSql",
    "end_statements",
    "in_the_way",
    "live_record",
    "lock_taken",
    "refused_by_a_record",
]
