"""The MySQL/MariaDB record store on an asyncio driver (the ``[asyncmysql]`` extra: asyncmy;
aiomysql works too): the sync store's table, statements (:mod:`.sql`), rows (:mod:`.rows`),
claim resolution and error sorting (:mod:`.errors`, :mod:`.privileges`); only the I/O differs.
A fresh claim is one ``INSERT IGNORE``; a duplicate one more ``SELECT``; an expired record is
taken over by the upsert that only overwrites a lapsed row. Connections in autocommit, utf8mb4,
UTC (the server's clock), in the store's own :class:`~rocketmq_dedup.stores.pool_aio.
AsyncBoundedPool`.

Why asyncmy: both maintained asyncio drivers speak the protocol to MySQL and MariaDB and turn
multi-statements on (what the exactly-once mode's record-with-COMMIT needs). asyncmy is
released the most (0.2.13 to 0.2.18 in 2026, Cython wheels for CPython 3.10-3.15), speaks
MariaDB's protocol extensions (bulk execution) and costs less CPU per statement. aiomysql
(pure Python over PyMySQL) went without a release from 2018 to 2022, is marked alpha, and its
0.3.2 cannot send a bytes parameter with PyMySQL 1.2 (it imports ``escape_bytes_prefixed``,
which PyMySQL 1.2 replaced by a string saying not to): every record key is one. A partial of
``aiomysql.connect`` is still recognised (with a PyMySQL it works with); asyncmy is the one
tested. asyncmy 0.2.18's ``set_charset`` fails: a connection not made in utf8mb4 (its default)
is refused with a message saying to pass ``charset='utf8mb4'``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup.errors import DedupConfigError, MissingExtraError, StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.aio import AsyncDedupStore, is_async_mysql_factory
from rocketmq_dedup.stores.base import (
    CLAIMED,
    HELD_BY_OTHER,
    Claim,
    ClaimResult,
    Record,
    parse_status,
)
from rocketmq_dedup.stores.mysql.connection import column_text
from rocketmq_dedup.stores.mysql.errors import (
    as_store_error,
    error_code,
    is_connection_error,
    refusal_code,
)
from rocketmq_dedup.stores.mysql.privileges import explain
from rocketmq_dedup.stores.mysql.rows import record_row
from rocketmq_dedup.stores.mysql.sql import (
    CHECK_SQL,
    CLAIM_ROW,
    CLAIM_SQL,
    DEFAULT_TABLE_NAME,
    INSERT_CLAIM_SQL,
    MARK_CONSUMED_ROW,
    MARK_CONSUMED_SQL,
    MARK_FAILED_SQL,
    MARK_FAILED_SQL_NO_REASON,
    MARK_SQL,
    MISSING_COLUMN,
    REASONS_SQL,
    RELEASE_SQL,
    RENEW_SQL,
    SELECT_SQL,
    SESSION_SQL,
    quote_table,
    schema_statements,
    validate_table_name,
)
from rocketmq_dedup.stores.mysql.store import (
    _CLAIM_ATTEMPTS,
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    MAX_POOL_SIZE,
    describe_factory,
    no_reason_column,
    settle_claims,
)
from rocketmq_dedup.stores.mysql.transaction_aio import AsyncMySQLTransactions
from rocketmq_dedup.stores.pool_aio import AsyncBoundedPool
from rocketmq_dedup.stores.sql_common import (
    add_reasons,
    failed_keys,
    pool_options,
    records_of,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

_CHARSET = "utf8mb4"


async def _run(conn: Any, sql: str, params: Sequence[Any], fetch: bool = False) -> Any:
    """Execute ``sql``; its rows if ``fetch``, else the affected row count."""
    async with conn.cursor() as cursor:
        await cursor.execute(sql, tuple(params))
        if fetch:
            return await cursor.fetchall()
        return cursor.rowcount


class AsyncMySQLDedupStore(AsyncDedupStore):
    """Dedup records in a MySQL/MariaDB table through an asyncio driver (module docstring).

    :param connect: ``functools.partial(asyncmy.connect, host=..., user=..., password=...,
        db=...)`` (or of ``aiomysql.connect``).
    :param table_name: the table (the sync store's schema: :meth:`create_table`).
    :param pool_size: at most this many connections (default 8).
    :param pool_timeout: how long a caller waits when all are busy (5 s), then
        :class:`~rocketmq_dedup.errors.StorePoolExhaustedError` (not an outage).
    """

    proves_writes = True

    def __init__(
        self,
        connect: Callable[[], Awaitable[Any]],
        table_name: str = DEFAULT_TABLE_NAME,
        pool_size: int = DEFAULT_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> None:
        if not is_async_mysql_factory(connect):
            raise DedupConfigError(
                "the asyncio MySQL store needs functools.partial(asyncmy.connect, ...) (the "
                "[asyncmysql] extra) or functools.partial(aiomysql.connect, ...)"
            )
        module = str(connect.func.__module__).partition(".")[0]  # type: ignore[attr-defined]
        try:
            __import__(module)
        except ImportError as exc:  # pragma: no cover - the partial was made with it
            raise MissingExtraError(module, "asyncmysql") from exc
        size, timeout = pool_options(pool_size, pool_timeout, MAX_POOL_SIZE)
        self.table_name = validate_table_name(table_name)
        self._table = quote_table(self.table_name)
        self._sql: Dict[str, str] = {
            "claim_one": INSERT_CLAIM_SQL.format(table=self._table, rows=CLAIM_ROW),
            "mark": MARK_SQL.format(table=self._table),
            "release": RELEASE_SQL.format(table=self._table),
            "renew": RENEW_SQL.format(table=self._table),
        }
        self._description = (
            f"MySQL {describe_factory(connect)} table {self.table_name} (asyncio, {module})"
        )
        keywords = connect.keywords if isinstance(connect, functools.partial) else {}
        self._database: Optional[str] = keywords.get("db", keywords.get("database"))
        self._pool: AsyncBoundedPool[Any] = AsyncBoundedPool(
            functools.partial(self._open, connect),
            _close,
            size,
            timeout,
            "MySQL",
            is_connection_error,
            self.describe,
        )
        #: The transactions of exactly_once over an async def (:mod:`.transaction_aio`): a
        #: pool of their own, so a transaction held for a whole function never starves claims.
        self.transactions = AsyncMySQLTransactions(
            functools.partial(self._open, connect),
            _close,
            self.table_name,
            size,
            timeout,
            is_connection_error,
            self.describe,
        )

    @staticmethod
    async def _open(connect: Callable[[], Awaitable[Any]]) -> Any:
        """A new connection, made fit for the store: autocommit, utf8mb4, UTC."""
        conn = await connect()
        try:
            await conn.autocommit(True)
            if _charset_of(conn) != _CHARSET:
                try:  # the session's and the driver's own encoding (a CJK key's columns)
                    await conn.set_charset(_CHARSET)
                except AttributeError as exc:  # asyncmy 0.2.18's set_charset is broken
                    raise StoreError(
                        f"the connection's character set is {_charset_of(conn)!r} and the "
                        "driver could not switch it: connect with charset='utf8mb4'"
                    ) from exc
            await _run(conn, SESSION_SQL, ())
        except BaseException:
            await _close(conn)
            raise
        return conn

    # -- the boundary: as the sync store's -------------------------------------------------

    def describe(self) -> str:
        return self._description

    def is_outage(self, exc: BaseException) -> bool:
        return is_connection_error(exc)

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        code = refusal_code(exc)
        if code is None:
            return None
        return explain(code, str(exc), self.table_name, None, self._database)

    def wrap_error(self, exc: Exception) -> StoreError:
        return as_store_error(exc, self.describe(), self.misconfiguration(exc))

    async def aclose(self) -> None:
        await self._pool.close()
        await self.transactions.close()

    async def create_table(self) -> None:
        """Create every table the store uses (the sync store's statements), if missing."""
        for statement in schema_statements(self.table_name):
            await self._call(self._pool.run, _run, statement, ())

    # -- I/O hooks -----------------------------------------------------------------------

    async def do_check(self) -> None:
        await self._pool.run(_run, CHECK_SQL, (), True)

    @staticmethod
    def _row(claim: Claim, digest: bytes, ms: int) -> List[Any]:
        return [*record_row(claim.element, digest), claim.owner, ms]

    async def _select_rows(
        self, conn: Any, digests: Sequence[bytes]
    ) -> Dict[bytes, Tuple[Record, int]]:
        """The sync store's: the live records of ``digests`` and their claims since last
        settled (``deliveries``), by digest."""
        sql = SELECT_SQL.format(table=self._table, marks=", ".join(["%s"] * len(digests)))
        return {
            bytes(row[0]): (
                Record(parse_status(column_text(row[1])), column_text(row[2]), max(0, int(row[3]))),
                int(row[4]),
            )
            for row in await _run(conn, sql, digests, True)
        }

    async def _select(self, conn: Any, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """The live records of ``digests`` by digest, with the reasons of the FAILED ones
        among them (one more statement, only when there are some), as the sync store reads."""
        rows = await self._select_rows(conn, digests)
        records = {key: record for key, (record, _) in rows.items()}
        failed = failed_keys(records)
        if failed:
            sql = REASONS_SQL.format(table=self._table, marks=", ".join(["%s"] * len(failed)))
            try:
                reasons = await _run(conn, sql, failed, True)
            except Exception as exc:
                if error_code(exc) != MISSING_COLUMN:
                    raise
                no_reason_column(self._description, self._table, exc)
                reasons = []
            add_reasons(records, reasons, column_text)
        return records

    async def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        results = await self._pool.run(self._claim_many, [claim], lease_ms)
        return results[0]

    async def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return await self._pool.run(self._claim_many, claims, lease_ms)

    async def _claim_many(
        self, conn: Any, claims: Sequence[Claim], lease_ms: int
    ) -> List[ClaimResult]:
        """The sync store's claim: a plain insert, then who holds each refused record; a
        record that vanished is taken over by the upsert, and read again."""
        digests = [element_digest(c.element) for c in claims]
        everything = list(range(len(claims)))
        if await self._write(conn, INSERT_CLAIM_SQL, claims, digests, everything, lease_ms) == len(
            claims
        ):
            return [CLAIMED] * len(claims)
        results: Dict[int, ClaimResult] = {}
        pending = everything
        for attempt in range(_CLAIM_ATTEMPTS):
            rows = await self._select_rows(conn, [digests[i] for i in pending])
            pending = settle_claims(pending, rows, claims, digests, results)
            if not pending or attempt == _CLAIM_ATTEMPTS - 1:
                break
            # The upsert's row count cannot say which rows it took (a live one is left
            # unchanged: 0): the next pass reads them.
            await self._write(conn, CLAIM_SQL, claims, digests, pending, lease_ms)
        for i in pending:
            results[i] = HELD_BY_OTHER
        return [results[i] for i in range(len(claims))]

    async def _write(
        self,
        conn: Any,
        template: str,
        claims: Sequence[Claim],
        digests: Sequence[bytes],
        indexes: List[int],
        lease_ms: int,
    ) -> int:
        indexes.sort(key=lambda i: digests[i])  # a stable key order: no deadlock between batches
        params: List[Any] = []
        for i in indexes:
            params += self._row(claims[i], digests[i], lease_ms)
        sql = template.format(table=self._table, rows=", ".join([CLAIM_ROW] * len(indexes)))
        return int(await _run(conn, sql, params))

    async def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        await self._pool.run(self._mark_one, claim, retention_ms)

    async def _mark_one(self, conn: Any, claim: Claim, retention_ms: int) -> None:
        digest = element_digest(claim.element)
        if not await _run(conn, self._sql["mark"], (claim.owner, retention_ms, digest)):
            await self._mark_many(conn, [claim], retention_ms)

    async def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        await self._pool.run(self._mark_many, claims, retention_ms)

    async def _mark_many(self, conn: Any, claims: Sequence[Claim], retention_ms: int) -> None:
        digests = [element_digest(c.element) for c in claims]
        params: List[Any] = []
        for i in sorted(range(len(claims)), key=lambda i: digests[i]):
            params += self._row(claims[i], digests[i], retention_ms)
        sql = MARK_CONSUMED_SQL.format(
            table=self._table, rows=", ".join([MARK_CONSUMED_ROW] * len(claims))
        )
        await _run(conn, sql, params)

    async def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        await self._pool.run(self._mark_failed, claim, retention_ms, reason)

    async def _mark_failed(self, conn: Any, claim: Claim, retention_ms: int, reason: str) -> None:
        """The sync store's: with the reason, else (a table made before FAILED records)
        without it, the fix logged."""
        row = self._row(claim, element_digest(claim.element), retention_ms)
        try:
            await _run(conn, MARK_FAILED_SQL.format(table=self._table), [*row, reason])
        except Exception as exc:
            if error_code(exc) != MISSING_COLUMN:
                raise
            no_reason_column(self._description, self._table, exc)
            await _run(conn, MARK_FAILED_SQL_NO_REASON.format(table=self._table), row)

    async def do_release_many(self, claims: Sequence[Claim]) -> int:
        return await self._pool.run(self._release, claims)

    async def _release(self, conn: Any, claims: Sequence[Claim]) -> int:
        sql = self._sql["release"]
        return sum([int(await _run(conn, sql, (element_digest(e), o))) == 1 for e, o in claims])

    async def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return await self._pool.run(self._renew, claims, lease_ms)

    async def _renew(self, conn: Any, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        sql = self._sql["renew"]
        return [int(await _run(conn, sql, (lease_ms, element_digest(e), o))) > 0 for e, o in claims]

    async def do_read(self, element: DedupElement) -> Optional[Record]:
        return (await self.do_read_many([element]))[0]

    async def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        digests = [element_digest(e) for e in elements]
        return records_of(elements, digests, await self._pool.run(self._select, digests))


def _charset_of(conn: Any) -> Optional[str]:
    """The connection's character set, as its driver keeps it (asyncmy: a method; aiomysql: a
    property)."""
    name = getattr(conn, "character_set_name", None)
    value = name() if callable(name) else name or getattr(conn, "charset", None)
    return str(value) if value else None


async def _close(conn: Any) -> None:
    try:
        await conn.ensure_closed()  # a graceful quit
    except Exception:
        logger.debug("closing a MySQL connection gracefully failed", exc_info=True)
        conn.close()


__all__ = ["AsyncMySQLDedupStore"]
