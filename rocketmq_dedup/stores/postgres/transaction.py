"""The exactly-once mode's transactions on PostgreSQL: the port of
:mod:`rocketmq_dedup.stores.transaction` on psycopg 3 connections (the rules every SQL database
shares: :mod:`rocketmq_dedup.stores.sql_transaction`). What to do with each outcome is the
strategy's (:mod:`rocketmq_dedup.strategy.exactly_once`).

**Transactions by explicit SQL.** A transaction's connection is in autocommit mode (psycopg
then sends no BEGIN of its own), and the transaction is ``BEGIN`` ... ``COMMIT``/``ROLLBACK``
sent by this module. psycopg sends its implicit BEGIN as a round trip of its own anyway, so an
explicit one costs nothing more; it also makes the handler's ``conn.transaction()`` a
SAVEPOINT (psycopg asks the server's transaction status), and it means that a session found
idle after the handler has had its transaction ended by the handler (``COMMIT``/``ROLLBACK``
sent as SQL): misuse. BEGIN honours the connection's ``isolation_level``, ``read_only`` and
``deferrable``; the mode assumes READ COMMITTED (PostgreSQL's default): under REPEATABLE READ or
SERIALIZABLE a step that waited for its entity's row fails with a serialization error (a lock
conflict: retried later).

**One round trip per step** (libpq's pipeline mode: :mod:`.pipeline`). BEGIN and
``SET LOCAL idle_in_transaction_session_timeout`` (the hold: a frozen consumer's transaction is
ended by the server after it, and SET LOCAL leaves nothing on the session) ride the first
statements of the transaction, sent lazily::

    at_commit                BEGIN; SET LOCAL    (before the handler: one simple query, not
                                                  a pipeline, as nothing goes with them)
    at_commit + entity       [BEGIN, SET LOCAL, the entity's row lock]
    before_handler           [BEGIN, SET LOCAL, the key's try-lock, the key's record]
    before_handler + entity  [BEGIN, SET LOCAL, the key's try-lock], then, only once the key's
                             lock is taken, [the entity's row lock, the key's record]
    commit                   [the entity's new number, the record, COMMIT]

The record (:data:`~.sql.RECORD_COMMIT_SQL`) fails when a live record of another attempt is in
the way (division_by_zero), so the COMMIT after it never runs: the transaction is rolled back
and the record in the way read (one more round trip) and returned. The key's lock for
``before_handler`` is ``pg_try_advisory_xact_lock`` on 64 bits of the key's digest, freed at
the end of the transaction.

**Sources** (the store's): a psycopg connection factory (a pool of the transactions' own,
apart from the store's, so a transaction held for a whole handler never starves claims and
renewals; prepared as the store's: autocommit, UTF-8; the statements prepared once per
connection), an application's ``psycopg_pool.ConnectionPool`` (a connection borrowed per
transaction and given back as found: autocommit restored, statements never prepared) and a
SQLAlchemy ``Engine`` on ``postgresql+psycopg`` (``engine.connect()`` + ``begin()``; the handler
gets that ``Connection``, the dedup statements run on its psycopg connection; as found, too).
On a psycopg connection the handler gets :class:`HandlerConnection`.

**After the handler**, without a round trip: a closed connection, another backend (a
reconnect), pipeline mode left on, a transaction ended (idle) are misuse: rolled back, retried
later, and the connection never serves another message. A transaction aborted by a failed
statement of the handler (PostgreSQL aborts the whole transaction) is retried later too, its
connection kept. What cannot be prevented: ``COMMIT`` sent as SQL text by the handler (what it
committed stays committed; the retry may apply it again).
"""

from __future__ import annotations

import abc
import logging
import os
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Set

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import Record
from rocketmq_dedup.stores.handler_connection import GuardedConnection
from rocketmq_dedup.stores.pool import BoundedPool
from rocketmq_dedup.stores.postgres import pipeline
from rocketmq_dedup.stores.postgres.connections import (
    close_quietly,
    is_undefined_column,
    prepare_connection,
)
from rocketmq_dedup.stores.postgres.pipeline import Statement, Step, error_of, failed
from rocketmq_dedup.stores.postgres.records import element_row, live_record, readable
from rocketmq_dedup.stores.postgres.sql import (
    KEY_LOCK_SQL,
    RECORD_COMMIT_SQL,
    RECORD_FAILED_NO_REASON_SQL,
    RECORD_FAILED_SQL,
    RECORD_READ_SQL,
    RECORD_REFUSED,
    SEQUENCE_LOCK_SQL,
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

#: libpq's PQtransactionStatus values (PQTRANS_IDLE, PQTRANS_INTRANS, PQTRANS_INERROR).
IDLE, INTRANS, INERROR = 0, 2, 3

#: How a handler that ended its transaction, or left it aborted, is told.
_ENDED = (
    "ended its transaction (COMMIT or ROLLBACK sent as SQL: what it committed stays committed, "
    "and the retry may apply it again)"
)
_ABORTED = (
    "left its transaction aborted: one of its statements failed, and PostgreSQL rolls back the "
    "whole transaction at a failed statement (run a statement that may fail inside "
    "conn.transaction(), a savepoint, to go on after it)"
)

_LOST = (
    "lost the session its transaction began on (ended by the server or an operator, or the "
    "connection broke)"
)

_COMMIT = Statement(b"COMMIT")
_ROLLBACK = Statement(b"ROLLBACK")
_NO_PARAMS: Sequence[Optional[bytes]] = ()


class HandlerConnection(GuardedConnection):
    """The handler's ``conn`` on a psycopg connection: everything passes through (``cursor()``,
    ``execute()``, ``transaction()``, a savepoint here, ``pipeline()``) except what would end the
    transaction (``commit()``, ``rollback()``, ``close()``), leave it (a two-phase transaction,
    a new connection) or reconfigure it (autocommit, isolation level, read-only, deferrable):
    refused."""

    __slots__ = ()

    REFUSED_CALLS = frozenset(
        {
            "close",
            "commit",
            "connect",
            "rollback",
            "set_autocommit",
            "set_deferrable",
            "set_isolation_level",
            "set_read_only",
            "tpc_begin",
            "tpc_commit",
            "tpc_prepare",
            "tpc_recover",
            "tpc_rollback",
        }
    )
    REFUSED_ASSIGNMENTS = frozenset({"autocommit", "deferrable", "isolation_level", "read_only"})


class TransactionSql(NamedTuple):
    """The transactions' statements, formatted for a dedup table and its sequence table."""

    record: Statement
    failed: Statement
    failed_no_reason: Statement
    read: Statement
    key_lock: Statement
    seq_lock: Statement
    seq_set: Statement

    @classmethod
    def for_tables(cls, table: str, sequence_table: Optional[str]) -> TransactionSql:
        quoted, seq = quote_table(table), quote_table(sequence_table or "unused")
        return cls(
            record=Statement.of(
                RECORD_COMMIT_SQL.format(table=quoted), (1, 0, 0, 0, 0, 0, 0), "rmqd_tx_record"
            ),
            failed=Statement.of(
                RECORD_FAILED_SQL.format(table=quoted), (1, 0, 0, 0, 0, 0, 0, 0), "rmqd_tx_failed"
            ),
            failed_no_reason=Statement.of(
                RECORD_FAILED_NO_REASON_SQL.format(table=quoted),
                (1, 0, 0, 0, 0, 0, 0),
                "rmqd_tx_failed_old",
            ),
            read=Statement.of(RECORD_READ_SQL.format(table=quoted), (1,), "rmqd_tx_read"),
            key_lock=Statement.of(KEY_LOCK_SQL, (0,), "rmqd_tx_key_lock"),
            seq_lock=Statement.of(SEQUENCE_LOCK_SQL.format(table=seq), (1, 0, 0), "rmqd_tx_seq"),
            seq_set=Statement.of(SEQUENCE_SET_SQL.format(table=seq), (0, 1), "rmqd_tx_seq_set"),
        )


def begin_text(conn: Any) -> bytes:
    """``BEGIN`` with the connection's transaction characteristics (psycopg's
    ``isolation_level``, ``read_only``, ``deferrable``), as psycopg itself would begin."""
    parts = [b"BEGIN"]
    level = conn.isolation_level
    if level is not None:
        parts += [b"ISOLATION LEVEL", level.name.replace("_", " ").encode()]
    if conn.read_only is not None:
        parts.append(b"READ ONLY" if conn.read_only else b"READ WRITE")
    if conn.deferrable is not None:
        parts.append(b"DEFERRABLE" if conn.deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def lock_key(digest: bytes) -> int:
    """The key's advisory lock: the first 64 bits of its digest, as a signed bigint."""
    return int.from_bytes(digest[:8], "big", signed=True)


# -- where a transaction's connection comes from --------------------------------------------------


class Lease(abc.ABC):
    """A psycopg connection lent to one transaction: ``raw`` runs the dedup statements, the
    handler gets :meth:`handler_conn`, :meth:`give_back` returns it."""

    raw: Any
    #: The statement names prepared on ``raw`` (None: prepare nothing: not the store's own).
    prepared: Optional[Set[bytes]] = None
    #: ``raw.autocommit`` as found (set True for the transaction; restored when given back).
    found_autocommit = True

    def own_autocommit(self) -> None:
        """Put ``raw`` in autocommit mode for the transaction (no round trip: psycopg only
        stops sending its own BEGIN)."""
        self.found_autocommit = bool(self.raw.autocommit)
        if not self.found_autocommit:
            self.raw.autocommit = True

    def restore_autocommit(self) -> None:
        if not self.found_autocommit:
            self.raw.autocommit = False

    def handler_conn(self, refuse: Callable[[str], None]) -> Any:
        """What the handler gets as ``conn``."""
        return HandlerConnection(self.raw, refuse)

    def guard(self, refuse: Callable[[str], None]) -> None:  # noqa: B027 - optional hook
        """Start refusing the ends of the transaction (a proxy refuses at all times)."""

    def unguard(self) -> None:  # noqa: B027 - optional hook
        """Stop refusing them."""

    def changed(self) -> Optional[str]:
        """How the handler's ``conn`` left the transaction, where it holds state of its own
        (SQLAlchemy's), as a phrase; None when it did not."""
        return None

    @abc.abstractmethod
    def give_back(self, fit: bool) -> None:
        """Return the connection (``fit``: as found), or discard it."""


class TxSession:
    """A connection of the transactions' own pool and the statements prepared on it."""

    __slots__ = ("conn", "generation", "idle_since", "pid", "prepared")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.prepared: Optional[Set[bytes]] = set() if conn.prepare_threshold is not None else None
        self.generation = 0
        self.pid = os.getpid()
        self.idle_since = 0.0

    def close(self) -> None:
        close_quietly(self.conn)


class OwnLease(Lease):
    """A connection of the transactions' own pool (a factory's)."""

    def __init__(self, pool: BoundedPool[TxSession]) -> None:
        self.pool = pool
        self.session = pool.take()
        self.raw = self.session.conn
        self.prepared = self.session.prepared

    def give_back(self, fit: bool) -> None:
        (self.pool.give if fit else self.pool.discard)(self.session)


class UserPoolLease(Lease):
    """A connection borrowed from an application's ``psycopg_pool`` pool."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.raw = pool.getconn()
        try:
            self.own_autocommit()
        except BaseException:
            pool.putconn(self.raw)
            raise

    def give_back(self, fit: bool) -> None:
        raw = self.raw
        try:
            if fit:
                self.restore_autocommit()
            else:
                close_quietly(raw)  # the pool replaces a closed connection
        finally:
            self.pool.putconn(raw)


class EngineLease(Lease):
    """A SQLAlchemy ``Connection`` of an application's engine, in ``begin()``; its psycopg
    connection runs the dedup statements."""

    def __init__(self, engine: Any) -> None:
        self.sa = engine.connect()
        try:
            self.root = self.sa.begin()
            self.raw = self.sa.connection.dbapi_connection
            self.own_autocommit()
        except BaseException:
            self.sa.invalidate()
            self.sa.close()
            raise

    def handler_conn(self, refuse: Callable[[str], None]) -> Any:
        return self.sa

    def guard(self, refuse: Callable[[str], None]) -> None:
        from rocketmq_dedup.stores.sqlalchemy_guard import guard

        guard(self.sa, refuse)

    def unguard(self) -> None:
        from rocketmq_dedup.stores.sqlalchemy_guard import unguard

        unguard(self.sa)

    def changed(self) -> Optional[str]:
        sa = self.sa
        if sa.closed:
            return "closed its connection"
        if sa.invalidated:  # SQLAlchemy's answer to a lost connection
            return _LOST
        if sa.connection.dbapi_connection is not self.raw:
            return RECONNECTED
        root = self.root
        if not root.is_active or sa.get_transaction() is not root:
            return "ended its transaction (commit() or rollback())"
        return None

    def give_back(self, fit: bool) -> None:
        sa = self.sa
        if sa.closed:
            return
        if fit:
            self.restore_autocommit()
            if self.root.is_active:
                self.root.rollback()  # SQLAlchemy's bookkeeping: the session is idle already
        elif not sa.invalidated:
            sa.invalidate()  # the psycopg connection is closed, never pooled again
        sa.close()


# -- the source and its transactions ------------------------------------------------------------


class PostgresTransactions(TransactionSource):
    """Opens the exactly-once mode's transactions on the store's source (module docstring).

    :param wrap: the store's error for a driver error.
    :param connect: a factory of new psycopg connections (the transactions' own pool).
    :param user_pool: an application's ``psycopg_pool`` pool, borrowed from instead.
    :param engine: a SQLAlchemy engine, whose connections run the transactions instead.
    """

    def __init__(
        self,
        table: str,
        sequence_table: Optional[str],
        wrap: Callable[[Exception], StoreError],
        *,
        connect: Optional[Callable[[], Any]] = None,
        pool_size: int = 8,
        pool_timeout: float = 5.0,
        user_pool: Any = None,
        engine: Any = None,
    ) -> None:
        self._store_wrap = wrap
        self._connect = connect
        self.user_pool = user_pool
        self.engine = engine
        self.sql = TransactionSql.for_tables(table, sequence_table)
        self.supports_sequences = sequence_table is not None
        self.pool: BoundedPool[TxSession] = BoundedPool(
            self._open_session, pool_size, pool_timeout, "PostgreSQL"
        )

    def _open_session(self) -> TxSession:
        """A new connection from the factory, prepared as the store's (autocommit, UTF-8)."""
        assert self._connect is not None
        conn = self._connect()
        try:
            prepare_connection(conn)
            return TxSession(conn)
        except BaseException:
            close_quietly(conn)
            raise

    def wrap(self, exc: BaseException) -> StoreError:
        """The store's error for a driver error of these transactions (for a SQLAlchemy
        error, the psycopg error it wraps)."""
        if isinstance(exc, StoreError):
            return exc
        orig = getattr(exc, "orig", None)
        driver = orig if isinstance(orig, Exception) else exc
        return self._store_wrap(driver if isinstance(driver, Exception) else Exception(driver))

    def begin(self, hold_seconds: int) -> Transaction:
        try:
            lease = self._lease()
        except StoreError:
            raise
        except Exception as exc:
            raise self.wrap(exc) from exc
        return PostgresTransaction(self, lease, hold_seconds)

    def _lease(self) -> Lease:
        if self.engine is not None:
            return EngineLease(self.engine)
        if self.user_pool is not None:
            return UserPoolLease(self.user_pool)
        return OwnLease(self.pool)

    def close(self) -> None:
        """Close the transactions' own connections (busy ones when their transaction ends)."""
        self.pool.close()


class SessionChecks:
    """What a transaction on a psycopg connection (sync or asyncio: the same ``pgconn``) reads
    of its session after the handler and before the connection is reused, without a round
    trip."""

    lease: Any
    broken: bool
    misused: Optional[str]
    _pgconn: Any
    _backend: int
    _aborted: bool
    _begin: Any

    def _session_misuse(self) -> Optional[str]:
        changed: Optional[str] = self.lease.changed()
        if changed is not None:
            return changed
        raw = self.lease.raw
        if raw.closed:
            return _LOST if raw.broken else "closed its connection"
        pgconn = self._pgconn
        if pgconn.backend_pid != self._backend:
            return RECONNECTED
        if pgconn.pipeline_status != pipeline.PIPELINE_OFF:
            self.broken = True
            return "left its connection in pipeline mode"
        status = pgconn.transaction_status
        if status == INTRANS:
            return None
        if status == IDLE:
            return _ENDED
        if status == INERROR:
            self._aborted = True
            return _ABORTED
        self.broken = True
        return "left a statement running on its connection"

    def _rollback_needed(self) -> bool:
        """Whether the transaction's end must send a ROLLBACK: not when nothing was sent
        (``_begin`` still pending) or the session is idle; not either when the connection
        cannot take one (closed, in pipeline mode, a statement running: marked broken, and
        closing it ends the session, which rolls it back)."""
        if self._begin is not None:  # nothing was sent: nothing to roll back
            return False
        pgconn = self._pgconn
        if self.lease.raw.closed or pgconn.pipeline_status != pipeline.PIPELINE_OFF:
            self.broken = True
            return False
        status = pgconn.transaction_status
        if status == IDLE:
            return False
        if status not in (INTRANS, INERROR):  # a statement still running: never reused
            self.broken = True
            return False
        return True

    def _fit(self) -> bool:
        """Not after an error of the dedup layer or misuse, unless the handler only left its
        transaction aborted (rolled back: the session is as it was); and only when the session
        is the one begun on, idle, out of pipeline mode."""
        if self.broken or (self.misused is not None and not self._aborted):
            return False
        pgconn = self._pgconn
        return (
            not self.lease.raw.closed
            and pgconn.backend_pid == self._backend
            and pgconn.transaction_status == IDLE
            and pgconn.pipeline_status == pipeline.PIPELINE_OFF
        )


class PostgresTransaction(SessionChecks, SqlTransaction):
    """One message's transaction on a lent psycopg connection (module docstring)."""

    def __init__(self, source: PostgresTransactions, lease: Lease, hold_seconds: int) -> None:
        super().__init__(source.wrap)
        self.sql = source.sql
        self.lease = lease
        self.conn = lease.handler_conn(self.refuse)
        raw = lease.raw
        self._pgconn = raw.pgconn
        self._backend = self._pgconn.backend_pid
        begin = begin_text(raw)
        hold = b"SET LOCAL idle_in_transaction_session_timeout = %d" % (hold_seconds * 1000)
        self._begin_steps: List[Step] = [
            (Statement(begin), _NO_PARAMS),
            (Statement(hold), _NO_PARAMS),
        ]
        #: The same two as one simple query, for when they go alone (:meth:`before_handler`).
        self._begin_text = b"%s; %s" % (begin, hold)
        #: BEGIN and the hold, until a pipeline carried them.
        self._begin: Optional[List[Step]] = self._begin_steps
        self._aborted = False  # the handler left its transaction aborted (the session is fine)

    # -- I/O ---------------------------------------------------------------------------------------

    def _send(self, steps: Sequence[Step]) -> List[Any]:
        """Run ``steps`` in one pipeline, after BEGIN if it has not gone out yet; each one's
        result (failed ones included). A failed BEGIN raises."""
        begin = self._begin
        if begin is not None:
            steps = [*begin, *steps]
        results = pipeline.run(self._pgconn, steps, self.lease.prepared)
        if begin is not None:
            for result in results[: len(begin)]:
                if failed(result):
                    raise error_of(self._pgconn, result)
            self._begin = None
            results = results[len(begin) :]
        return results

    def _run(self, steps: Sequence[Step]) -> List[Any]:
        """:meth:`_send`, raising the first statement's failure."""
        results = self._send(steps)
        for result in results:
            if failed(result):
                raise error_of(self._pgconn, result)
        return results

    # -- the steps ---------------------------------------------------------------------------------

    def _claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        """The key's try-lock first; once taken, [the entity's row,] then the record (the
        port's promises: lock before read, no read before a wait). Without an entity the read
        rides the lock's pipeline: it runs after the lock, and is ignored when the lock is
        held elsewhere."""
        digest = element_digest(element)
        lock: Step = (self.sql.key_lock, (b"%d" % lock_key(digest),))
        read: Step = (self.sql.read, (digest,))
        if entity is None:
            taken, rows = self._run([lock, read])
        else:
            (taken,) = self._run([lock])
        if taken.get_value(0, 0) != b"t":
            return KeyClaim(False)
        last = None
        if entity is not None:
            seq, rows = self._run([self._sequence_lock(entity), read])
            last = _last_seq(seq)
        return KeyClaim(True, _live_record(rows, element), last)

    def _sequence_lock(self, entity: Entity) -> Step:
        app, name = readable(entity.application).encode(), readable(entity.name).encode()
        return (self.sql.seq_lock, (entity.digest(), app, name))

    def _lock_sequence(self, entity: Entity) -> Optional[int]:
        (seq,) = self._run([self._sequence_lock(entity)])
        return _last_seq(seq)

    def before_handler(self) -> None:
        """BEGIN and the hold, if no pipeline carried them yet: alone, as one simple query
        (:func:`~.pipeline.run_text`)."""
        if self._begin is not None:
            self._io(self._begin_alone)

    def _begin_alone(self) -> None:
        for result in pipeline.run_text(self._pgconn, self._begin_text):
            if failed(result):
                raise error_of(self._pgconn, result)
        self._begin = None

    def _commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep],
    ) -> Optional[Record]:
        """[The sequence step,] the record and COMMIT in one pipeline; a refused record rolls
        back, and the record in the way is read and returned."""
        digest = element_digest(element)
        steps: List[Step] = []
        if applied is not None:
            steps.append((self.sql.seq_set, (b"%d" % applied.seq, applied.entity.digest())))
        steps.append((self.sql.record, _record_params(element, digest, owner, retention_ms)))
        return self._write_and_commit(steps, digest, element)

    def _commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        """ROLLBACK (the handler's writes), then a transaction of its own: the FAILED record
        and COMMIT, all in one pipeline; without the reason on a table made before FAILED
        records (no reason column). The rollback also frees a ``before_handler`` key lock
        (PostgreSQL's advisory lock is the transaction's): from there the record decides, as
        for any commit, since it is refused when a live record of another attempt is in the
        way."""
        digest = element_digest(element)
        params = _record_params(element, digest, owner, retention_ms)
        try:
            return self._rewrite(
                [(self.sql.failed, (*params, readable(reason).encode()))], digest, element
            )
        except Exception as exc:
            if not is_undefined_column(exc):
                raise
        logger.warning(
            "the dedup table has no failure_reason column (made by an earlier version): the "
            "FAILED record of %r is written without its reason (rocketmq-dedup check names the "
            "ALTER TABLE that adds it)",
            element,
        )
        return self._rewrite([(self.sql.failed_no_reason, params)], digest, element)

    def _rewrite(self, steps: List[Step], digest: bytes, element: DedupElement) -> Optional[Record]:
        """ROLLBACK what was begun, then ``steps`` (the last one the record) and COMMIT in a new
        transaction, in the same pipeline."""
        self._begin = (
            self._begin_steps
            if self._begin is not None
            else [(_ROLLBACK, _NO_PARAMS), *self._begin_steps]
        )
        return self._write_and_commit(steps, digest, element)

    def _write_and_commit(
        self, steps: List[Step], digest: bytes, element: DedupElement
    ) -> Optional[Record]:
        """``steps`` (the last one the record) and COMMIT in one pipeline; a refused record
        rolls back, and the record in the way is read and returned."""
        *before, written, committed = self._send([*steps, (_COMMIT, _NO_PARAMS)])
        for result in before:
            if failed(result):
                raise error_of(self._pgconn, result)
        if failed(written):
            if pipeline.sqlstate(written) != RECORD_REFUSED:
                raise error_of(self._pgconn, written)
            return self._refused(digest, element)
        self._check_committed(committed)
        return None

    def _refused(self, digest: bytes, element: DedupElement) -> Record:
        """The record was refused: ROLLBACK, and read the record in the way (one pipeline). A
        record gone meanwhile answers as a copy in progress: the handler's writes were rolled
        back, and the broker's retry runs the message again."""
        _, rows = self._run([(_ROLLBACK, _NO_PARAMS), (self.sql.read, (digest,))])
        self._open = False
        record = _live_record(rows, element)
        return record if record is not None else Record(DedupStatus.CONSUMING, element=element)

    def _check_committed(self, result: Any) -> None:
        """COMMIT's answer: COMMIT, or an error (the transaction is over either way)."""
        self._open = False
        if failed(result):
            raise error_of(self._pgconn, result)
        tag = result.command_status
        if tag != b"COMMIT":  # e.g. ROLLBACK: the transaction had been aborted
            raise StoreError(f"the COMMIT answered {tag!r}: nothing was committed")

    def _commit(self) -> None:
        if self._begin is not None:  # nothing was sent: nothing to commit
            return
        (committed,) = self._send([(_COMMIT, _NO_PARAMS)])
        self._check_committed(committed)

    def _rollback(self) -> None:
        if self._rollback_needed():
            self._run([(_ROLLBACK, _NO_PARAMS)])

    # -- the handler -------------------------------------------------------------------------------

    def _guard(self) -> None:
        self.lease.guard(self.refuse)

    def _unguard(self) -> None:
        self.lease.unguard()

    def _handler_raised(self, exc: BaseException) -> None:
        """A handler that raised an exception leaves a connection whose state the rollback
        and the give-back check; an interrupt (KeyboardInterrupt...) may have left it
        mid-statement."""
        if not isinstance(exc, Exception):
            self.broken = True

    # -- the end -----------------------------------------------------------------------------------

    def _give_back(self, fit: bool) -> None:
        self.lease.give_back(fit)


def _record_params(
    element: DedupElement, digest: bytes, owner: str, retention_ms: int
) -> List[Optional[bytes]]:
    """A record's parameters (key, application, topic, tag, key text, owner, retention ms)."""
    row = [value.encode() for value in element_row(element, digest)[1:]]
    return [digest, *row, owner.encode(), b"%d" % retention_ms]


def _last_seq(result: Any) -> Optional[int]:
    value = result.get_value(0, 0) if result.ntuples else None
    return None if value is None else int(value)


def _live_record(result: Any, element: DedupElement) -> Optional[Record]:
    """The record :data:`~.sql.RECORD_READ_SQL` read, if any."""
    if not result.ntuples:
        return None
    status, owner, left = (result.get_value(0, i) for i in range(3))
    return live_record(status.decode(), owner.decode(), int(left))._replace(element=element)


__all__ = [
    "HandlerConnection",
    "Lease",
    "PostgresTransaction",
    "PostgresTransactions",
    "SessionChecks",
    "TransactionSql",
    "begin_text",
    "lock_key",
]
