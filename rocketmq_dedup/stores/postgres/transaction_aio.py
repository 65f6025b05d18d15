"""The exactly-once port on psycopg's async API (:class:`~rocketmq_dedup.stores.transaction.
AsyncTransaction`): one call of :func:`~rocketmq_dedup.exactly_once` over an ``async def``, on
an ``AsyncConnection`` of the asyncio PostgreSQL store's source. Every wait for the server is
an ``await`` on psycopg's async connection: nothing here blocks the event loop.

What is the sync module's (:mod:`.transaction`), shared: the statements (:mod:`.sql`: the record
refused by a live record of another attempt, the key's advisory try-lock), explicit ``BEGIN``
on a connection in autocommit mode (with the connection's isolation level, read-only,
deferrable, and ``SET LOCAL idle_in_transaction_session_timeout``: the hold), the handler's
``conn`` (:class:`~.transaction.HandlerConnection`: ``commit()``, ``rollback()``, ``close()``
and autocommit refused), the checks of the session after the handler and before reuse
(:class:`~.transaction.SessionChecks`), and the rules every SQL database shares
(:class:`~rocketmq_dedup.stores.sql_transaction.SqlTransactionRules`).

What differs: one statement per round trip (psycopg's async API, no libpq pipeline here):
BEGIN with the hold rides one simple query, sent before the first statement; the record, then
COMMIT, are two round trips (the sync port's pipeline makes them one); a refused record is
rolled back and the record in the way read (two more).

Sources (the asyncio store's): a factory of ``psycopg.AsyncConnection`` (a pool of the
transactions' own, apart from the store's, so a transaction held for a whole function never
starves claims), or an application's ``psycopg_pool.AsyncConnectionPool`` (a connection
borrowed per transaction and given back as found: autocommit restored; one left unfit is
closed, and the pool replaces it).
"""

from __future__ import annotations

import abc
import logging
from typing import Any, Awaitable, Callable, NamedTuple, Optional

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import Claim, Record
from rocketmq_dedup.stores.pool_aio import AsyncBoundedPool
from rocketmq_dedup.stores.postgres.records import claim_row, live_record
from rocketmq_dedup.stores.postgres.sql import (
    KEY_LOCK_SQL,
    RECORD_COMMIT_SQL,
    RECORD_READ_SQL,
    RECORD_REFUSED,
    quote_table,
)
from rocketmq_dedup.stores.postgres.transaction import (
    HandlerConnection,
    SessionChecks,
    begin_text,
    lock_key,
)
from rocketmq_dedup.stores.sql_transaction import AsyncSqlTransaction
from rocketmq_dedup.stores.transaction import (
    AsyncTransaction,
    AsyncTransactionSource,
    KeyClaim,
)

logger = logging.getLogger(__name__)


class AsyncTransactionSql(NamedTuple):
    """The transactions' statements (psycopg's ``%s`` placeholders), for a dedup table."""

    record: str
    read: str

    @classmethod
    def for_table(cls, table: str) -> AsyncTransactionSql:
        quoted = quote_table(table)
        return cls(RECORD_COMMIT_SQL.format(table=quoted), RECORD_READ_SQL.format(table=quoted))


# -- where a transaction's connection comes from --------------------------------------------------


class AsyncLease(abc.ABC):
    """An ``AsyncConnection`` lent to one transaction (:class:`~.transaction.Lease`, awaited)."""

    raw: Any

    def changed(self) -> Optional[str]:
        """Nothing of the handler's ``conn`` holds state of its own (no SQLAlchemy here)."""
        return None

    @abc.abstractmethod
    async def give_back(self, fit: bool) -> None:
        """Return the connection (``fit``: as found), or discard it."""


class OwnAsyncLease(AsyncLease):
    """A connection of the transactions' own pool (a factory's)."""

    def __init__(self, pool: AsyncBoundedPool[Any], raw: Any) -> None:
        self.pool = pool
        self.raw = raw

    async def give_back(self, fit: bool) -> None:
        await (self.pool.give if fit else self.pool.discard)(self.raw)


class UserAsyncPoolLease(AsyncLease):
    """A connection borrowed from an application's ``psycopg_pool.AsyncConnectionPool``, in
    autocommit mode while lent."""

    def __init__(self, pool: Any, raw: Any, found_autocommit: bool) -> None:
        self.pool = pool
        self.raw = raw
        self.found_autocommit = found_autocommit

    @classmethod
    async def borrow(cls, pool: Any) -> UserAsyncPoolLease:
        raw = await pool.getconn()
        try:
            found = bool(raw.autocommit)
            if not found:
                await raw.set_autocommit(True)
        except BaseException:
            await pool.putconn(raw)
            raise
        return cls(pool, raw, found)

    async def give_back(self, fit: bool) -> None:
        raw = self.raw
        try:
            if fit and not self.found_autocommit:
                await raw.set_autocommit(False)
            elif not fit:
                await raw.close()  # the pool replaces a closed connection
        finally:
            await self.pool.putconn(raw)


# -- the source and its transactions --------------------------------------------------------------


class AsyncPostgresTransactions(AsyncTransactionSource):
    """Opens the transactions of :func:`~rocketmq_dedup.exactly_once` over an ``async def``
    on the asyncio store's source (module docstring).

    :param wrap: the store's error for a driver error.
    :param pool: the transactions' own pool (a factory's), or None.
    :param user_pool: an application's ``AsyncConnectionPool``, borrowed from instead.
    """

    def __init__(
        self,
        table: str,
        wrap: Callable[[Exception], StoreError],
        *,
        pool: Optional[AsyncBoundedPool[Any]] = None,
        user_pool: Any = None,
    ) -> None:
        self._store_wrap = wrap
        self.pool = pool
        self.user_pool = user_pool
        self.sql = AsyncTransactionSql.for_table(table)

    def wrap(self, exc: BaseException) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        return self._store_wrap(exc if isinstance(exc, Exception) else Exception(exc))

    async def begin(self, hold_seconds: int) -> AsyncTransaction:
        try:
            lease = await self._lease()
        except StoreError:
            raise
        except Exception as exc:
            raise self.wrap(exc) from exc
        return AsyncPostgresTransaction(self, lease, hold_seconds)

    async def _lease(self) -> AsyncLease:
        if self.user_pool is not None:
            return await UserAsyncPoolLease.borrow(self.user_pool)
        assert self.pool is not None
        return OwnAsyncLease(self.pool, await self.pool.take())

    async def close(self) -> None:
        """Close the transactions' own connections (busy ones when their transaction ends)."""
        if self.pool is not None:
            await self.pool.close()


class AsyncPostgresTransaction(SessionChecks, AsyncSqlTransaction):
    """One call's transaction on a lent ``AsyncConnection`` (module docstring)."""

    def __init__(
        self, source: AsyncPostgresTransactions, lease: AsyncLease, hold_seconds: int
    ) -> None:
        super().__init__(source.wrap)
        self.sql = source.sql
        self.lease = lease
        raw = lease.raw
        self.conn = HandlerConnection(raw, self.refuse)
        self._pgconn = raw.pgconn
        self._backend = self._pgconn.backend_pid
        hold = b"SET LOCAL idle_in_transaction_session_timeout = %d" % (hold_seconds * 1000)
        #: BEGIN and the hold, until sent (with the first statement).
        self._begin: Optional[bytes] = b"%s; %s" % (begin_text(raw), hold)
        self._aborted = False

    # -- I/O ---------------------------------------------------------------------------------------

    async def _begun(self) -> None:
        """BEGIN and the hold, if they have not gone out yet (one round trip: a simple query
        of two statements)."""
        begin = self._begin
        if begin is not None:
            await self.lease.raw.execute(begin)
            self._begin = None

    async def _execute(self, sql: Any, params: Any = None) -> Any:
        """``sql`` in the transaction, after BEGIN."""
        await self._begun()
        return await self.lease.raw.execute(sql, params)

    async def _end(self, sql: bytes) -> str:
        """COMMIT or ROLLBACK; the server's answer (the transaction is over either way)."""
        self._open = False
        cursor = await self.lease.raw.execute(sql)
        return str(cursor.statusmessage)

    # -- the steps ---------------------------------------------------------------------------------

    async def _claim_key(self, element: DedupElement) -> KeyClaim:
        """The key's try-lock; once taken, its record (lock before read: the port's promise)."""
        digest = element_digest(element)
        cursor = await self._execute(KEY_LOCK_SQL, (lock_key(digest),))
        ((taken,),) = await cursor.fetchall()
        if not taken:
            return KeyClaim(False)
        return KeyClaim(True, await self._read(digest, element))

    async def _read(self, digest: bytes, element: DedupElement) -> Optional[Record]:
        cursor = await self.lease.raw.execute(self.sql.read, (digest,))
        rows = await cursor.fetchall()
        if not rows:
            return None
        status, owner, left = rows[0]
        return live_record(status, owner, int(left))._replace(element=element)

    async def before_handler(self) -> None:
        """BEGIN (and the hold) if no statement carried them yet."""
        await self._io(self._begun())

    async def _commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        """The record, then COMMIT; a refused record rolls back, and the record in the way is
        read and returned."""
        digest = element_digest(element)
        try:
            await self._execute(
                self.sql.record, claim_row(Claim(element, owner), digest, retention_ms)
            )
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != RECORD_REFUSED:
                raise
            await self._end(b"ROLLBACK")
            record = await self._read(digest, element)
            # gone meanwhile: answered as a copy in progress (the broker's retry runs it again)
            return record if record is not None else Record(DedupStatus.CONSUMING, element=element)
        self._check_committed(await self._end(b"COMMIT"))
        return None

    @staticmethod
    def _check_committed(tag: str) -> None:
        if tag != "COMMIT":  # e.g. ROLLBACK: the transaction had been aborted
            raise StoreError(f"the COMMIT answered {tag!r}: nothing was committed")

    async def _commit(self) -> None:
        if self._begin is not None:  # nothing was sent: nothing to commit
            self._open = False
            return
        self._check_committed(await self._end(b"COMMIT"))

    async def _rollback(self) -> None:
        if self._rollback_needed():
            await self._end(b"ROLLBACK")

    async def _give_back(self, fit: bool) -> None:
        await self.lease.give_back(fit)


def transactions_for(
    table: str,
    wrap: Callable[[Exception], StoreError],
    open_conn: Optional[Callable[[], Awaitable[Any]]],
    close_conn: Callable[[Any], Awaitable[None]],
    size: int,
    timeout: float,
    lost: Callable[[BaseException], bool],
    describe: Callable[[], str],
    user_pool: Any = None,
) -> AsyncPostgresTransactions:
    """The asyncio store's transactions: on a factory (``open_conn``), a pool of their own of
    ``size`` connections; else the application's pool."""
    if user_pool is not None:
        return AsyncPostgresTransactions(table, wrap, user_pool=user_pool)
    assert open_conn is not None
    pool = AsyncBoundedPool(open_conn, close_conn, size, timeout, "PostgreSQL", lost, describe)
    return AsyncPostgresTransactions(table, wrap, pool=pool)


__all__ = ["AsyncPostgresTransaction", "AsyncPostgresTransactions", "transactions_for"]
