"""The PostgreSQL record store on psycopg's async API (the ``[postgres]`` extra): the sync
store's table, statements (:mod:`.sql`), rows (:mod:`.records`), decisions (a claim's row ->
its result) and error sorting (:mod:`.connections`); only the I/O differs. One statement per
decision, every statement in autocommit.

Sources: ``functools.partial(psycopg.AsyncConnection.connect, dsn, ...)`` (the store keeps at
most ``pool_size`` connections in its own pool: :class:`~rocketmq_dedup.stores.pool_aio.
AsyncBoundedPool`), or an application's ``psycopg_pool.AsyncConnectionPool`` (borrowed per
operation and given back as found; its own size and timeout apply)."""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.aio import AsyncDedupStore, is_async_postgres_source
from rocketmq_dedup.stores.base import Claim, ClaimResult, Record
from rocketmq_dedup.stores.pool_aio import AsyncBoundedPool
from rocketmq_dedup.stores.postgres import connections
from rocketmq_dedup.stores.postgres.connections import (
    import_psycopg,
    is_pool_timeout,
    is_undefined_column,
)
from rocketmq_dedup.stores.postgres.records import (
    claim_columns,
    claim_row,
    live_record,
    unique_by_key,
)
from rocketmq_dedup.stores.postgres.sql import (
    CLAIM_MANY_SQL,
    CLAIM_SQL,
    DEFAULT_TABLE_NAME,
    MARK_FAILED_NO_REASON_SQL,
    MARK_FAILED_SQL,
    MARK_MANY_SQL,
    MARK_SQL,
    MARK_UPSERT_SQL,
    REASONS_SQL,
    RELEASE_MANY_SQL,
    RELEASE_SQL,
    RENEW_MANY_SQL,
    SELECT_SQL,
    USER_SQL,
    quote_table,
    schema_statements,
    validate_table_name,
)
from rocketmq_dedup.stores.postgres.store import (
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    MAX_POOL_SIZE,
    PostgresBoundary,
    configured_user,
    decided,
    describe_conninfo,
)
from rocketmq_dedup.stores.postgres.transaction_aio import (
    AsyncPostgresTransactions,
    transactions_for,
)
from rocketmq_dedup.stores.sql_common import (
    add_reasons,
    failed_keys,
    pool_options,
    records_of,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STATEMENTS = {
    "claim": CLAIM_SQL,
    "claim_many": CLAIM_MANY_SQL,
    "mark": MARK_SQL,
    "mark_upsert": MARK_UPSERT_SQL,
    "mark_many": MARK_MANY_SQL,
    "mark_failed": MARK_FAILED_SQL,
    "mark_failed_no_reason": MARK_FAILED_NO_REASON_SQL,
    "reasons": REASONS_SQL,
    "release": RELEASE_SQL,
    "release_many": RELEASE_MANY_SQL,
    "renew_many": RENEW_MANY_SQL,
    "select": SELECT_SQL,
}


async def prepare_connection(conn: Any) -> None:
    """The sync store's preparation, awaited: no transaction left open, autocommit on, the
    client encoding UTF-8."""
    psycopg = import_psycopg()
    if not isinstance(conn, psycopg.AsyncConnection):
        raise StoreError(
            "the asyncio PostgreSQL store needs psycopg.AsyncConnection connections; got "
            f"{type(conn).__module__}.{type(conn).__qualname__}"
        )
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        await conn.rollback()
    await conn.set_autocommit(True)
    if conn.info.encoding != "utf-8":
        await conn.execute("SET client_encoding TO 'UTF8'")


async def _rows(conn: Any, sql: str, params: Any) -> List[Any]:
    cursor = await conn.execute(sql, params)
    rows: List[Any] = await cursor.fetchall()
    return rows


async def _count(conn: Any, sql: str, params: Any) -> int:
    cursor = await conn.execute(sql, params)
    return int(cursor.rowcount)


class AsyncPostgresDedupStore(PostgresBoundary, AsyncDedupStore):
    """Dedup records in a PostgreSQL table through psycopg's async API (module docstring).

    :param source: ``functools.partial(psycopg.AsyncConnection.connect, dsn, ...)`` or a
        ``psycopg_pool.AsyncConnectionPool``.
    :param table_name: the table (:meth:`create_table`; the sync store's schema).
    :param pool_size: with a factory, at most this many connections (default 8).
    :param pool_timeout: with a factory, how long a caller waits when all are busy (5 s).
    """

    proves_writes = True

    def __init__(
        self,
        source: Any,
        table_name: str = DEFAULT_TABLE_NAME,
        pool_size: Optional[int] = None,
        pool_timeout: Optional[float] = None,
    ) -> None:
        import_psycopg()
        if not is_async_postgres_source(source):
            raise DedupConfigError(
                "the asyncio PostgreSQL store needs functools.partial(psycopg.AsyncConnection."
                "connect, ...) or a psycopg_pool.AsyncConnectionPool"
            )
        self.table_name = validate_table_name(table_name)
        self._user = configured_user(source)
        table = quote_table(self.table_name)
        self._sql: Dict[str, str] = {k: v.format(table=table) for k, v in _STATEMENTS.items()}
        self._user_pool: Any = None
        self._pool: Optional[AsyncBoundedPool[Any]] = None
        #: The transactions of exactly_once over an async def (:mod:`.transaction_aio`): on a
        #: factory, their own pool, so a transaction held for a whole function never starves
        #: claims; on a psycopg_pool pool, that pool.
        self.transactions: AsyncPostgresTransactions
        if isinstance(source, functools.partial):
            conninfo = source.args[0] if source.args and isinstance(source.args[0], str) else ""
            keywords = {k: v for k, v in source.keywords.items() if k != "conninfo"}
            where = describe_conninfo(str(source.keywords.get("conninfo", conninfo)), keywords)
            size, timeout = pool_options(
                DEFAULT_POOL_SIZE if pool_size is None else pool_size,
                DEFAULT_POOL_TIMEOUT if pool_timeout is None else pool_timeout,
                MAX_POOL_SIZE,
            )
            self._pool = AsyncBoundedPool(
                functools.partial(self._open, source),
                _close,
                size,
                timeout,
                "PostgreSQL",
                connections.is_outage,
                self.describe,
            )
            self.transactions = transactions_for(
                self.table_name,
                self.wrap_error,
                functools.partial(self._open, source),
                _close,
                size,
                timeout,
                connections.is_outage,
                self.describe,
            )
        else:
            if pool_size is not None or pool_timeout is not None:
                raise DedupConfigError(
                    "pool_size and pool_timeout do not apply to a psycopg_pool pool: its own "
                    "max_size and timeout do"
                )
            self._user_pool = source
            self.transactions = transactions_for(
                self.table_name,
                self.wrap_error,
                None,
                _close,
                0,
                0.0,
                connections.is_outage,
                self.describe,
                user_pool=source,
            )
            where = f"{describe_conninfo(str(source.conninfo or ''), dict(source.kwargs or {}))}"
            where = f"{where or 'pool'} (psycopg_pool {source.name})"
        self._description = f"PostgreSQL {where} table {self.table_name} (asyncio)"

    @staticmethod
    async def _open(connect: Callable[[], Awaitable[Any]]) -> Any:
        conn = await connect()
        try:
            await prepare_connection(conn)
        except BaseException:
            await _close(conn)
            raise
        return conn

    async def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._pool is not None:
            return await self._pool.run(fn, *args)
        for attempt in (1, 2):
            try:
                async with self._user_pool.connection() as conn:
                    await prepare_connection(conn)
                    return await fn(conn, *args)
            except Exception as exc:
                if attempt == 2 or not connections.is_outage(exc) or is_pool_timeout(exc):
                    raise
                logger.warning("%s: connection failed (%s); retrying", self._description, exc)
                await self._user_pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        await self.transactions.close()

    async def create_table(self) -> None:
        """Create the dedup table if it does not exist (the sync store's statements)."""
        for statement in schema_statements(self.table_name):
            await self._call(self._run, _count, statement, ())

    # -- I/O hooks -----------------------------------------------------------------------

    async def do_check(self) -> None:
        """Connect (or borrow a connection) and ask the server which user the session is (what
        a refusal's GRANT names), as the sync store does."""
        ((user,),) = await self._run(_rows, USER_SQL, ())
        self._user = str(user)

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        params = claim_row(claim, element_digest(claim.element), lease_ms)
        ((status, owner, left, claims),) = await self._run(_rows, self._sql["claim"], params)
        return decided(claim, status, owner, left, claims)

    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        digests, unique = unique_by_key(claims)
        columns = claim_columns(claims, digests, unique)
        found = await self._run(_rows, self._sql["claim_many"], (lease_ms, *columns))
        rows = {bytes(key): tuple(row) for key, *row in found}
        results = []
        for claim, digest in zip(claims, digests, strict=True):
            row = rows.get(digest)
            if row is None:
                raise StoreError(f"{self._description}: a claim's row was not returned")
            results.append(decided(claim, *row))
        return results

    async def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        await self._run(self._mark, claim, retention_ms)

    async def _mark(self, conn: Any, claim: Claim, retention_ms: int) -> None:
        digest = element_digest(claim.element)
        if not await _count(conn, self._sql["mark"], (claim.owner, retention_ms, digest)):
            await _count(conn, self._sql["mark_upsert"], claim_row(claim, digest, retention_ms))

    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        digests, unique = unique_by_key(claims)
        columns = claim_columns(claims, digests, unique)
        await self._run(_count, self._sql["mark_many"], (retention_ms, *columns))

    async def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        await self._run(self._mark_failed, claim, retention_ms, reason)

    async def _mark_failed(self, conn: Any, claim: Claim, retention_ms: int, reason: str) -> None:
        """The sync store's: with the reason, else (a table made before FAILED records)
        without it, the fix logged."""
        row = claim_row(claim, element_digest(claim.element), retention_ms)
        try:
            await _count(conn, self._sql["mark_failed"], (*row, reason))
        except Exception as exc:
            if not is_undefined_column(exc):
                raise
            self._no_reason_column(exc)
            await _count(conn, self._sql["mark_failed_no_reason"], row)

    async def do_release(self, claim: Claim) -> bool:
        params = (element_digest(claim.element), claim.owner)
        return await self._run(_count, self._sql["release"], params) == 1

    async def do_release_many(self, claims: Sequence[Claim]) -> int:
        pairs = sorted({(element_digest(e), o) for e, o in claims})
        params = ([k for k, _ in pairs], [o for _, o in pairs])
        return await self._run(_count, self._sql["release_many"], params)

    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        wanted = [(element_digest(e), o) for e, o in claims]
        pairs = sorted(set(wanted))
        params = (lease_ms, [k for k, _ in pairs], [o for _, o in pairs])
        rows = await self._run(_rows, self._sql["renew_many"], params)
        renewed: Set[Tuple[bytes, str]] = {(bytes(k), o) for k, o in rows}
        return [pair in renewed for pair in wanted]

    async def do_read(self, element: DedupElement) -> Optional[Record]:
        return (await self.do_read_many([element]))[0]

    async def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        digests = [element_digest(e) for e in elements]
        return records_of(elements, digests, await self._run(self._select, digests))

    async def _select(self, conn: Any, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """The live records of ``digests`` by digest, with the reasons of the FAILED ones
        among them (one more statement, only when there are some), as the sync store reads."""
        rows = await _rows(conn, self._sql["select"], (list(digests),))
        records = {bytes(k): live_record(status, owner, left) for k, status, owner, left in rows}
        failed = failed_keys(records)
        if failed:
            try:
                reasons = await _rows(conn, self._sql["reasons"], (failed,))
            except Exception as exc:
                if not is_undefined_column(exc):
                    raise
                self._no_reason_column(exc)
                reasons = []
            add_reasons(records, reasons)
        return records


async def _close(conn: Any) -> None:
    try:
        await conn.close()
    except Exception:  # already broken
        logger.debug("closing a PostgreSQL connection failed", exc_info=True)


__all__ = ["AsyncPostgresDedupStore", "prepare_connection"]
