"""The exactly-once port on the asyncio MySQL driver (:class:`~rocketmq_dedup.stores.
transaction.AsyncTransaction`; asyncmy, the ``[asyncmysql]`` extra): one call of
:func:`~rocketmq_dedup.exactly_once` over an ``async def``, on a connection of the asyncio MySQL
store's factory. Every wait for the server is an ``await`` on the driver: nothing here blocks the
event loop.

What is the sync module's (:mod:`.transaction`), shared: the statements (the record's INSERT,
refused by the key's primary key; the key's named lock; an expired record in the way deleted
and the record written again: :func:`~.transaction.in_the_way`), the end of a transaction with
the release of the named lock (:func:`~.transaction.end_statements`), the handler's ``conn``
(:class:`~.handler_connection.HandlerConnection`, refusing ``commit()``, ``rollback()``,
``begin()``, ``autocommit()``, ``close()``...; here ``ensure_closed()`` too), the session's
checks without a round trip (:func:`~.connection.session_id`,
:func:`~.connection.autocommit_on`), and the rules every SQL database shares
(:class:`~rocketmq_dedup.stores.sql_transaction.SqlTransactionRules`).

The connections are the transactions' own pool (apart from the store's, so a transaction held
for a whole function never starves claims), prepared as the store's (utf8mb4, UTC), then
autocommit off: a transaction begins with its first statement. Each connection's session idle
timeout (``wait_timeout``) is the hold, as in the sync port; one idle for nearly that long is
replaced before use. One statement per round trip (the sync port sends the record, COMMIT and
the lock's release in one text where the driver allows).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, List, Optional

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.base import Record
from rocketmq_dedup.stores.mysql.connection import (
    Statements,
    autocommit_on,
    idle_too_long,
    session_id,
)
from rocketmq_dedup.stores.mysql.errors import as_store_error
from rocketmq_dedup.stores.mysql.handler_connection import HandlerConnection
from rocketmq_dedup.stores.mysql.rows import lock_name, record_row
from rocketmq_dedup.stores.mysql.sql import KEY_LOCK_SQL
from rocketmq_dedup.stores.mysql.transaction import (
    AUTOCOMMIT,
    COMMIT,
    ROLLBACK,
    InTheWay,
    TransactionSql,
    end_statements,
    in_the_way,
    live_record,
    lock_taken,
    refused_by_a_record,
)
from rocketmq_dedup.stores.pool_aio import AsyncBoundedPool
from rocketmq_dedup.stores.sql_transaction import RECONNECTED, AsyncSqlTransaction
from rocketmq_dedup.stores.transaction import (
    AsyncTransaction,
    AsyncTransactionSource,
    KeyClaim,
)


class AsyncHandlerConnection(HandlerConnection):
    """The function's ``conn``: the sync port's refusals, and asyncmy's ``ensure_closed()``."""

    __slots__ = ()

    REFUSED_CALLS = HandlerConnection.REFUSED_CALLS | {"ensure_closed"}


class TxSession:
    """A connection of the transactions' pool, its session idle timeout (None: the server's
    default) and since when it is idle."""

    __slots__ = ("conn", "idle_since", "wait_timeout")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.wait_timeout: Optional[int] = None
        self.idle_since = time.monotonic()


class AsyncMySQLTransactions(AsyncTransactionSource):
    """Opens the transactions of :func:`~rocketmq_dedup.exactly_once` over an ``async def``
    (module docstring).

    :param open_conn: opens a new connection prepared as the store's (autocommit on, utf8mb4,
        UTC); here switched to autocommit off.
    :param close_conn: closes one.
    """

    def __init__(
        self,
        open_conn: Callable[[], Awaitable[Any]],
        close_conn: Callable[[Any], Awaitable[None]],
        table: str,
        pool_size: int,
        pool_timeout: float,
        lost: Callable[[BaseException], bool],
        describe: Callable[[], str],
    ) -> None:
        self._open_conn = open_conn
        self._close_conn = close_conn
        self.describe = describe
        self.sql = TransactionSql.for_tables(table, None)
        self.pool: AsyncBoundedPool[TxSession] = AsyncBoundedPool(
            self._open_session,
            self._close_session,
            pool_size,
            pool_timeout,
            "MySQL",
            lost,
            describe,
        )

    async def _open_session(self) -> TxSession:
        conn = await self._open_conn()
        try:
            await conn.autocommit(False)
        except BaseException:
            await self._close_conn(conn)
            raise
        return TxSession(conn)

    async def _close_session(self, session: TxSession) -> None:
        await self._close_conn(session.conn)

    def wrap(self, exc: BaseException) -> StoreError:
        """The library's error for a driver error of these transactions."""
        return as_store_error(exc, self.describe())

    async def begin(self, hold_seconds: int) -> AsyncTransaction:
        try:
            return AsyncMySQLTransaction(self, await self._take(hold_seconds))
        except StoreError:
            raise
        except Exception as exc:
            raise self.wrap(exc) from exc

    async def _take(self, hold_seconds: int) -> TxSession:
        """:meth:`~.transaction.MySQLTransactions._take`, awaited."""
        pool = self.pool
        while True:
            session = await pool.take()
            timeout = session.wait_timeout
            if timeout is None or not idle_too_long(session.idle_since, timeout):
                break
            await pool.discard(session)
        if timeout != hold_seconds:
            try:
                async with session.conn.cursor() as cursor:
                    await cursor.execute("SET SESSION wait_timeout = %s", (hold_seconds,))
            except BaseException:
                await pool.discard(session)
                raise
            session.wait_timeout = hold_seconds
        return session

    async def give_back(self, session: TxSession, fit: bool) -> None:
        if fit:
            session.idle_since = time.monotonic()
            await self.pool.give(session)
        else:
            await self.pool.discard(session)

    async def close(self) -> None:
        await self.pool.close()


class AsyncMySQLTransaction(AsyncSqlTransaction):
    """One call's transaction on a connection of the pool (module docstring)."""

    def __init__(self, source: AsyncMySQLTransactions, session: TxSession) -> None:
        super().__init__(source.wrap)
        self.source = source
        self.sql = source.sql
        self.session = session
        self._raw = session.conn
        self._session_id = session_id(self._raw)
        self.conn = AsyncHandlerConnection(self._raw, self.refuse)
        self._lock: Optional[str] = None  # the key's named lock, while this session holds it

    async def _run_all(self, statements: Statements) -> List[Any]:
        """Each statement in turn: its rows, or its affected row count."""
        results = []
        for sql, params in statements:
            async with self._raw.cursor() as cursor:
                await cursor.execute(sql, tuple(params))
                results.append(await cursor.fetchall() if cursor.description else cursor.rowcount)
        return results

    async def _end(self, end: Any) -> None:
        """COMMIT or ROLLBACK, then the named lock's release (if held)."""
        await self._run_all(end_statements(end, self._lock))
        self._lock = None

    async def _claim_key(self, element: DedupElement) -> KeyClaim:
        """The named lock first; once held, the record (lock before read)."""
        digest = element_digest(element)
        name = lock_name(digest)
        (taken,) = await self._run_all([(KEY_LOCK_SQL, (name,))])
        if not lock_taken(taken):
            return KeyClaim(False)
        self._lock = name
        (rows,) = await self._run_all([(self.sql.read_record, (digest,))])
        return KeyClaim(True, live_record(rows, element))

    async def _commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        """The record, then COMMIT; a record in the way refuses it, an expired one is deleted
        and the record written again (:meth:`~.transaction.MySQLTransaction.
        _insert_and_commit`)."""
        digest = element_digest(element)
        insert = (self.sql.insert, (*record_row(element, digest), owner, retention_ms))
        for attempt in (1, 2):
            try:
                await self._run_all([insert])
                await self._end(COMMIT)
            except Exception as exc:
                if not refused_by_a_record(exc):
                    raise
            else:
                self._open = False
                return None
            (rows,) = await self._run_all([(self.sql.lock_record, (digest,))])
            found = in_the_way(rows, attempt, element)
            if isinstance(found, Record):
                return found
            if found is InTheWay.EXPIRED:
                await self._run_all([(self.sql.delete_expired, (digest,))])
        raise AssertionError("unreachable")  # pragma: no cover

    async def _commit(self) -> None:
        await self._end(COMMIT)

    async def _rollback(self) -> None:
        await self._end(ROLLBACK)

    def _session_misuse(self) -> Optional[str]:
        if session_id(self._raw) != self._session_id:
            return RECONNECTED
        return AUTOCOMMIT if autocommit_on(self._raw) else None

    def _fit(self) -> bool:
        """Not while the session may still hold the key's named lock, nor on another session
        or in autocommit mode."""
        raw = self._raw
        return (
            super()._fit()
            and self._lock is None
            and session_id(raw) == self._session_id
            and autocommit_on(raw) is not True
        )

    async def _give_back(self, fit: bool) -> None:
        await self.source.give_back(self.session, fit)


__all__ = ["AsyncMySQLTransaction", "AsyncMySQLTransactions"]
