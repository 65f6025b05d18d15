"""The MySQL store itself: validation, operations over pooled connections, the purge."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import (
    CLAIMED,
    HELD_BY_OTHER,
    Claim,
    ClaimResult,
    DedupStore,
    Record,
    claimed_after,
    parse_status,
)
from rocketmq_dedup.stores.coalesce import (
    DEFAULT_DEFER_MS,
    Coalescer,
    DeferredMarks,
    Request,
    by_kind,
    deliver,
    marks_failed_reporter,
)
from rocketmq_dedup.stores.mysql.connection import (
    MySQLdbRunner,
    Runner,
    close_quietly,
    column_text,
    is_mysqlclient,
    prepare_connection,
    type_name,
)
from rocketmq_dedup.stores.mysql.errors import (
    NO_SUCH_TABLE,
    as_store_error,
    error_code,
    is_connection_error,
    refusal_code,
)
from rocketmq_dedup.stores.mysql.outbox import MySQLOutboxTables
from rocketmq_dedup.stores.mysql.pool import ConnectionPool
from rocketmq_dedup.stores.mysql.privileges import explain, grant_account
from rocketmq_dedup.stores.mysql.purge import MySQLPurgeSession, purge_step
from rocketmq_dedup.stores.mysql.rows import readable, record_row
from rocketmq_dedup.stores.mysql.sql import (
    ACCOUNT_SQL,
    ADD_REASON_SQL,
    CHECK_SQL,
    CLAIM_ROW,
    CLAIM_SQL,
    CLAIMS_SQL,
    COLUMNS_SQL,
    DEFAULT_TABLE_NAME,
    DELETE_SQL,
    INSERT_CLAIM_SQL,
    MARK_CONSUMED_ROW,
    MARK_CONSUMED_SQL,
    MARK_FAILED_SQL,
    MARK_FAILED_SQL_NO_REASON,
    MARK_MANY_SQL,
    MARK_SQL,
    MISSING_COLUMN,
    OLDEST_CONSUMED_SQL,
    REASON_COLUMN,
    REASONS_SQL,
    RELEASE_SQL,
    RENEW_SQL,
    REQUIRED_COLUMNS,
    SELECT_SQL,
    STATS_SQL,
    VERSION_SQL,
    outbox_table_names,
    quote_table,
    schema_statements,
    sequence_table_name,
    validate_table_name,
)
from rocketmq_dedup.stores.mysql.transaction import MySQLTransactions
from rocketmq_dedup.stores.operations import Diagnosis, StoreStats, oldest_claims
from rocketmq_dedup.stores.postgres.connections import is_psycopg_connection
from rocketmq_dedup.stores.purge import PurgeBatch
from rocketmq_dedup.stores.sql_common import (
    PurgeStep,
    SqlTables,
    add_reasons,
    deletable,
    detached_connections,
    failed_keys,
    latency,
    pool_options,
    purge_in_key_order,
    records_of,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POOL_SIZE = 8
MAX_POOL_SIZE = 1024
#: Seconds a caller waits for a connection when all ``pool_size`` are busy, before the
#: operation fails as an outage.
DEFAULT_POOL_TIMEOUT = 5.0
_CLAIM_ATTEMPTS = 3
#: The kinds of the coalesced requests (:mod:`rocketmq_dedup.stores.coalesce`).
_CLAIM, _MARK, _RELEASE = "claim", "mark", "release"


def describe_factory(connect: Callable[[], Any]) -> str:
    """``user@host:port/db`` from a ``functools.partial`` factory's keywords (never the
    password), else the factory's repr."""
    keywords = connect.keywords if isinstance(connect, functools.partial) else {}
    host, socket = keywords.get("host"), keywords.get("unix_socket")
    database = keywords.get("database", keywords.get("db"))
    if host is None and socket is None and database is None:
        if isinstance(connect, functools.partial):  # its repr would show the password
            return f"via {type_name(connect.func)}"
        text = repr(connect)
        return text if len(text) <= 120 else text[:117] + "..."
    if socket is not None and host in (None, "localhost"):
        where = f"localhost:{socket}"
    else:
        where = f"{host or 'localhost'}:{keywords.get('port', 3306)}"
    user = keywords.get("user")
    return f"{user}@{where}/{database or ''}" if user else f"{where}/{database or ''}"


class MySQLDedupStore(DeferredMarks, SqlTables, DedupStore):
    """Dedup records in a MySQL/MariaDB table.

    :param connect: a zero-argument callable returning a new DB-API connection (mysqlclient,
        PyMySQL or mysql-connector-python), e.g.
        ``functools.partial(MySQLdb.connect, host=..., user=..., password=..., database=...)``.
    :param table_name: the table (created by :meth:`create_table` or ``python -m
        rocketmq_dedup schema mysql``).
    :param pool_size: at most this many connections, each taken by one operation (a claim, a
        mark, a release, a renewal, a purge step) and given back right after; a caller that
        finds all of them busy waits for one.
    :param pool_timeout: how long (seconds) such a caller waits before the operation fails
        with :class:`StorePoolExhaustedError` (default 5 s: far beyond any healthy statement,
        short enough to answer RECONSUME_LATER before RocketMQ's consume timeout); not an
        outage, so never a run without dedup.
    :param coalesce: combine the claims, CONSUMED marks and releases of concurrent threads
        into shared round trips (one statement per kind, sent together on one pooled
        connection; a request that arrives alone is sent at once). ``False``: each call takes
        a connection of the pool for its own statements.
    :param defer_marks_ms: with coalescing, how long a CONSUMED mark may wait for a later round
        trip to carry it (the listener returns without waiting for it; see the package docs);
        ``0``: every mark is written before the listener returns.
    """

    #: The start-up check claims and releases probe records (INSERT, UPDATE, SELECT, DELETE).
    proves_writes = True
    longest_name = "64 characters"

    def __init__(
        self,
        connect: Callable[[], Any],
        table_name: str = DEFAULT_TABLE_NAME,
        pool_size: int = DEFAULT_POOL_SIZE,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        coalesce: bool = True,
        defer_marks_ms: int = DEFAULT_DEFER_MS,
    ) -> None:
        if not callable(connect) or (isinstance(connect, type) and not hasattr(connect, "cursor")):
            # a class such as redis.Redis is callable, but makes no DB-API connection
            raise DedupConfigError(
                "the MySQL store needs a zero-argument callable returning a new DB-API "
                "connection, e.g. functools.partial(MySQLdb.connect, host=..., ...); "
                f"got {'the class ' if isinstance(connect, type) else ''}{type_name(connect)}"
            )
        pool_size, pool_timeout = pool_options(pool_size, pool_timeout, MAX_POOL_SIZE)
        self._connect = connect
        self.table_name = validate_table_name(table_name)
        table = quote_table(table_name)
        self._sql: Dict[str, str] = {
            "release": RELEASE_SQL.format(table=table),
            "renew": RENEW_SQL.format(table=table),
            "mark": MARK_SQL.format(table=table),
        }
        self._table = table
        self._claim_one = INSERT_CLAIM_SQL.format(table=table, rows=CLAIM_ROW)
        self._description = f"MySQL {describe_factory(connect)} table {self.table_name}"
        #: The account and database the server reported to the last check (for the GRANT a
        #: refusal names); until then the database the factory names, if any.
        self._account: Optional[str] = None
        keywords = connect.keywords if isinstance(connect, functools.partial) else {}
        self._database: Optional[str] = keywords.get("database", keywords.get("db"))
        self._pool = ConnectionPool(self._open_runner, pool_size, pool_timeout, self.describe)
        self._op = self._pool.run
        self._init_deferred_marks(defer_marks_ms, coalesce)
        self._coalescer = (
            Coalescer(
                self._execute,
                defer_ms=defer_marks_ms,
                on_deferred_error=marks_failed_reporter(self.describe),
            )
            if coalesce
            else None
        )
        #: The exactly-once mode's sequence table (``<table>_seq``); None when that name would
        #: be too long (a table name of 61-64 characters): the mode then runs without one.
        self.sequence_table_name: Optional[str] = sequence_table_name(table_name)
        #: The exactly-once mode's transactions (:mod:`.transaction`): their own pool (opened on
        #: first use), so a transaction held for a whole handler never starves claims, marks
        #: and lease renewal.
        self.transactions: MySQLTransactions = MySQLTransactions(
            self._open_runner,
            table_name,
            self.sequence_table_name,
            pool_size,
            float(pool_timeout),
            self.describe,
        )
        self._outbox: Optional[MySQLOutboxTables] = None

    @classmethod
    def from_engine(cls, engine: Any, **options: Any) -> MySQLDedupStore:
        """The store on a SQLAlchemy ``Engine`` (the ``[sqlalchemy]`` extra): its connections
        come from ``engine.raw_connection()``, detached from the engine's pool (the store
        keeps them in its own pool, in autocommit mode, which must never leak into the
        engine's pool), and the exactly-once mode runs its transactions on the engine
        (``engine.connect()`` + ``begin()``), with the dedup statements on that connection."""
        dialect = getattr(getattr(engine, "dialect", None), "name", None)
        if dialect not in ("mysql", "mariadb"):
            raise DedupConfigError(
                f"the SQLAlchemy engine's dialect is {dialect!r}: the MySQL store needs a "
                "mysql:// or mariadb:// engine (mysqlclient, PyMySQL)"
            )

        from rocketmq_dedup.stores.mysql.sqlalchemy_guard import guard_engine

        store = cls(detached_connections(engine), **options)
        store.transactions.engine = engine
        url = engine.url.render_as_string(hide_password=True)
        store._description = f"MySQL {url} (SQLAlchemy) table {store.table_name}"
        store._database = engine.url.database  # named in the GRANT a refusal prints
        guard_engine(engine)
        return store

    @property
    def engine(self) -> Any:
        """The SQLAlchemy ``Engine`` the store was built on (:meth:`from_engine`), else None."""
        return self.transactions.engine

    @property
    def outbox(self) -> MySQLOutboxTables:
        """The outbox's tables (``<table>_outbox``, :mod:`.outbox`), with their own small
        pool (opened on first use). Raises :class:`DedupConfigError` when the table name
        leaves no room for their names (over 52 characters)."""
        if self._outbox is None:
            self._outbox = MySQLOutboxTables(
                self._open_runner, self.table_name, self._pool.timeout, self.describe
            )
        return self._outbox

    @property
    def coalescer(self) -> Optional[Coalescer]:
        """What combines concurrent threads' requests into shared round trips (None with
        ``coalesce=False``)."""
        return self._coalescer

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool (for operators and tests: ``open_count``, ``take``/``give``)."""
        return self._pool

    @property
    def pool_size(self) -> int:
        """At most this many connections are open."""
        return self._pool.size

    @property
    def pool_timeout(self) -> float:
        """How long (seconds) an operation waits for a connection when all are busy."""
        return self._pool.timeout

    def describe(self) -> str:
        return self._description

    def is_outage(self, exc: BaseException) -> bool:
        return is_connection_error(exc)

    def wrap_error(self, exc: Exception) -> StoreError:
        """Refusals a person must fix (:meth:`misconfiguration`), outages, lock conflicts and
        defects told apart (:mod:`.errors`)."""
        return as_store_error(exc, self.describe(), self.misconfiguration(exc))

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        """The GRANT to run, the login to fix or the server to point at, for a refusal
        (:mod:`.privileges`: 1142 command denied, 1044/1045 access denied, 1290 read-only...)."""
        code = refusal_code(exc)
        if code is None:
            return None
        return explain(code, str(exc), self.table_name, self._account, self._database)

    # -- connections ---------------------------------------------------------------------

    def _open_runner(self) -> Runner:
        """A new connection from the factory, prepared, in the fastest runner for its driver."""
        conn = self._connect()
        if not hasattr(conn, "cursor"):
            raise StoreError(
                f"{self._description}: the connection factory must return a DB-API "
                f"connection; got {type_name(conn)}"
            )
        if is_psycopg_connection(conn):  # a factory make_store could not tell from MySQL's
            close_quietly(conn)
            raise StoreError(
                f"{self._description}: the connection factory returned a PostgreSQL "
                "connection (psycopg): build PostgresDedupStore(factory), or pass "
                "functools.partial(psycopg.connect, ...), which is recognised"
            )
        try:
            prepare_connection(conn)
            if is_mysqlclient(conn):
                return MySQLdbRunner(conn)
            return Runner(conn, conn.cursor())
        except BaseException:
            close_quietly(conn)
            raise

    @staticmethod
    def _run(runner: Runner, sql: str, params: Sequence[Any], fetch: bool = False) -> Any:
        return runner.run(sql, params, fetch)

    def close(self) -> None:
        """Send the deferred CONSUMED marks; close every connection of the pool (busy ones
        when their operation ends). The store stays usable: it reconnects on its next
        operation."""
        self._flush_marks()
        self._pool.close()
        self.transactions.close()
        if self._outbox is not None:
            self._outbox.close()

    # -- operator API --------------------------------------------------------------------

    def create_table(self) -> None:
        """Create, if they do not exist (idempotent), every table the store uses
        (:func:`~rocketmq_dedup.stores.mysql.sql.schema_statements`): the dedup table, the
        exactly-once mode's sequence table (``<table>_seq``; see
        :mod:`rocketmq_dedup.transactional`), which stays empty unless that mode's
        ``sequence_key`` is used, and the outbox's (``<table>_outbox``,
        ``<table>_outbox_lane``; see :mod:`rocketmq_dedup.outbox`), empty unless used."""
        for statement in schema_statements(self.table_name):
            self._call(self._op, self._run, statement, ())
        if outbox_table_names(self.table_name) is None:
            logger.warning(
                "%s: no outbox tables (%s_outbox_lane would be longer than 64 characters)",
                self._description,
                self.table_name,
            )
        self._add_reason_column()
        self.tables_created()

    def _add_reason_column(self) -> None:
        """A table made before FAILED records gets their reason's column (``CREATE TABLE IF
        NOT EXISTS`` adds none to an existing table); without the ALTER privilege it is logged,
        and the table keeps working without it."""
        if REASON_COLUMN in self._call(self._columns):
            return
        try:
            self._call(self._op, self._run, ADD_REASON_SQL.format(table=self._table), ())
        except StoreError as exc:
            logger.warning("%s (%s)", self._old_table_risk(), exc.__cause__ or exc)
        else:
            logger.info("%s: added the %s column", self._description, REASON_COLUMN)

    def purge_expired(
        self,
        batch_size: int = 1000,
        dry_run: bool = False,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> int:
        """Delete every expired row; return how many were deleted (with ``dry_run``: how many
        are expired, deleting nothing).

        One pass over the table in primary-key order: each step reads ``batch_size`` keys
        and deletes the expired ones among them by key, so a step holds row locks on expired
        rows only, never on a live row or a gap a claim could insert into. Run it from a cron
        job or a timer, off-peak for large tables. Each step takes a pooled connection and
        gives it back; ``progress(rows scanned, rows expired)`` is called after each step."""

        def step(after: bytes, size: int) -> PurgeStep:
            batch: PurgeBatch = self._call(self._op, purge_step, self._table, after, size, dry_run)
            return batch.deleted, batch.scanned, batch.last_key

        return purge_in_key_order(step, batch_size, progress)

    def purge_session(self) -> MySQLPurgeSession:
        """A session of its own for the in-process purger (:class:`rocketmq_dedup.Purger`):
        a new connection from the factory, outside the pool, that takes the table's purge
        lock (``GET_LOCK``) and deletes expired rows in batches
        (:mod:`rocketmq_dedup.stores.purge`)."""
        return MySQLPurgeSession(self._open_runner, self.table_name, self._table, self.wrap_error)

    # -- I/O hooks -----------------------------------------------------------------------

    def do_check(self) -> None:
        """Connect (or take a pooled connection) and ask the server which account it matched
        and the session's database (what a refusal's GRANT names); the table may not exist
        yet (``create_table()`` comes after)."""
        account, database = self._op(self._run, ACCOUNT_SQL, (), True)[0]
        self._account = grant_account(str(column_text(account)))
        if database is not None:
            self._database = str(column_text(database))

    def is_missing_table(self, exc: BaseException) -> bool:
        return error_code(exc) == NO_SUCH_TABLE

    @staticmethod
    def _row(claim: Claim, digest: bytes, ms: int) -> List[Any]:
        """A claim's row values: key, readable columns, owner, and the lease or retention."""
        return [*record_row(claim.element, digest), claim.owner, ms]

    def _select(self, runner: Runner, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """The live records of ``digests``, by digest."""
        return {key: record for key, (record, _) in self._select_rows(runner, digests).items()}

    def _select_rows(
        self, runner: Runner, digests: Sequence[bytes]
    ) -> Dict[bytes, Tuple[Record, int]]:
        """The live records of ``digests`` and their claims since last settled
        (``deliveries``), by digest (the one place rows become records)."""
        sql = SELECT_SQL.format(table=self._table, marks=", ".join(["%s"] * len(digests)))
        return {
            bytes(row[0]): (
                Record(parse_status(column_text(row[1])), column_text(row[2]), max(0, int(row[3]))),
                int(row[4]),
            )
            for row in runner.run(sql, digests, True)
        }

    # Claims, marks and releases: coalesced (the default), or each on a pooled connection.

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        self._note_lease(lease_ms)
        if self._coalescer is not None:
            return self._request(_CLAIM, lease_ms, [claim])[0]  # type: ignore[no-any-return]
        return self._op(self._claim, claim, lease_ms)

    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        self._note_lease(lease_ms)
        if self._coalescer is not None:
            return list(self._request(_CLAIM, lease_ms, claims))
        return self._op(self._claim_many, claims, lease_ms)

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        coalescer = self._coalescer
        if coalescer is None:
            self._op(self._mark_consumed, claim, retention_ms)
        else:
            self._mark(coalescer, retention_ms, [claim])

    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        coalescer = self._coalescer
        if coalescer is None:
            self._op(self._mark_consumed_many, claims, retention_ms)
        else:
            self._mark(coalescer, retention_ms, claims)

    def _mark(self, coalescer: Coalescer, retention_ms: int, claims: Sequence[Claim]) -> None:
        """Mark CONSUMED: deferred to a later round trip when allowed, else now."""
        if self.marks_deferred:
            coalescer.defer(Request(_MARK, retention_ms, claims, ()))
        else:
            self._request(_MARK, retention_ms, claims)

    def do_release(self, claim: Claim) -> bool:
        return self.do_release_many([claim]) == 1

    def do_release_many(self, claims: Sequence[Claim]) -> int:
        if self._coalescer is not None:
            return sum(self._request(_RELEASE, 0, claims))
        return self._op(self._delete_claims, claims)

    def _request(self, kind: str, millis: int, claims: Sequence[Claim]) -> Any:
        """Run one request through the coalescer; its per-claim results."""
        request = Request(kind, millis, claims, ())
        self._coalescer.run(request)  # type: ignore[union-attr]
        if request.error is not None:
            raise request.error  # the original: DedupStore._call wraps it, once
        return request.result

    def _flush_marks(self) -> None:
        """Send the deferred CONSUMED marks (a read of the store sees every mark made)."""
        if self._coalescer is not None:
            self._coalescer.flush()

    def _execute(self, batch: List[Request]) -> None:
        """The coalescer's round trip: the batch on one pooled connection. Never raises
        (short of a BaseException): an error goes to every request of the batch."""
        try:
            self._op(self._run_batch, batch)
        except Exception as exc:
            for request in batch:
                request.error = exc

    def _run_batch(self, runner: Runner, batch: List[Request]) -> None:
        """One statement per (kind, millis) of the batch (a release: one per claim), sent in
        one round trip, in the batch's order: deferred marks, then the rest (a copy claimed
        in the same round trip as its twin's mark is refused by the CONSUMED record). Claims
        the plain insert did not all win are resolved as :meth:`_claim_many` does. The whole
        batch is safe to run again on a new connection (``_op`` does after a lost one)."""
        statements: List[Tuple[str, Sequence[Any]]] = []
        groups = []
        for (kind, millis), members in by_kind(batch).items():
            claims = [claim for request in members for claim in request.keys]
            digests = [element_digest(claim.element) for claim in claims]
            indexes = list(range(len(claims)))
            if kind == _RELEASE:
                release = self._sql["release"]
                statements += [
                    (release, (d, c.owner)) for c, d in zip(claims, digests, strict=True)
                ]
            elif kind == _MARK:
                statements.append(self._mark_statement(claims, digests, millis))
            else:
                statements.append(
                    self._claim_statement(INSERT_CLAIM_SQL, claims, digests, indexes, millis)
                )
            groups.append((kind, millis, members, claims, digests))
        results = runner.run_all(statements)
        at = 0
        for kind, millis, members, claims, digests in groups:
            if kind == _RELEASE:
                deliver(members, [int(n) == 1 for n in results[at : at + len(claims)]])
                at += len(claims)
                continue
            written = int(results[at])
            at += 1
            if kind == _MARK:
                if written < len(claims):  # a row vanished (or was marked already)
                    runner.run(*self._upsert_marks(claims, digests, millis), False)
                deliver(members, [None] * len(claims))
            elif written == len(claims):
                deliver(members, [CLAIMED] * len(claims))
            else:
                deliver(members, self._resolve_refused(runner, claims, digests, millis))

    def _claim(self, runner: Runner, claim: Claim, lease_ms: int) -> ClaimResult:
        digest = element_digest(claim.element)
        if runner.run(self._claim_one, self._row(claim, digest, lease_ms), False) == 1:
            return CLAIMED  # inserted: the fresh message
        return self._resolve_refused(runner, [claim], [digest], lease_ms)[0]

    def _claim_many(
        self, runner: Runner, claims: Sequence[Claim], lease_ms: int
    ) -> List[ClaimResult]:
        digests = [element_digest(c.element) for c in claims]
        everything = list(range(len(claims)))
        # First a plain insert: the cheapest statement, and a live record is left alone.
        sql, params = self._claim_statement(INSERT_CLAIM_SQL, claims, digests, everything, lease_ms)
        if int(runner.run(sql, params, False)) == len(claims):
            return [CLAIMED] * len(claims)
        return self._resolve_refused(runner, claims, digests, lease_ms)

    def _claim_statement(
        self,
        template: str,
        claims: Sequence[Claim],
        digests: Sequence[bytes],
        indexes: List[int],
        lease_ms: int,
    ) -> Tuple[str, List[Any]]:
        """One multi-row claim statement for ``indexes`` (sorted by key in place)."""
        # A stable key order keeps concurrent multi-row writes from deadlocking.
        indexes.sort(key=lambda i: digests[i])
        params: List[Any] = []
        for i in indexes:
            params += self._row(claims[i], digests[i], lease_ms)
        sql = template.format(table=self._table, rows=", ".join([CLAIM_ROW] * len(indexes)))
        return sql, params

    def _resolve_refused(
        self,
        runner: Runner,
        claims: Sequence[Claim],
        digests: Sequence[bytes],
        lease_ms: int,
    ) -> List[ClaimResult]:
        """After the insert: read who holds each record; records that are not live (expired,
        or released meanwhile) are taken over by the upsert, and read again."""
        results: Dict[int, ClaimResult] = {}
        pending = list(range(len(claims)))
        for attempt in range(_CLAIM_ATTEMPTS):
            rows = self._select_rows(runner, [digests[i] for i in pending])
            pending = settle_claims(pending, rows, claims, digests, results)
            if not pending or attempt == _CLAIM_ATTEMPTS - 1:
                break
            # The upsert's row count cannot say which rows it took (a live one is left
            # unchanged: 0): the next pass reads them.
            runner.run(*self._claim_statement(CLAIM_SQL, claims, digests, pending, lease_ms), False)
        for i in pending:  # kept vanishing: leave it to a later retry
            results[i] = HELD_BY_OTHER
        return [results[i] for i in range(len(claims))]

    def _mark_consumed(self, runner: Runner, claim: Claim, retention_ms: int) -> None:
        digest = element_digest(claim.element)
        # The row is normally still ours: one UPDATE. If it vanished, the upsert recreates it.
        if not runner.run(self._sql["mark"], (claim.owner, retention_ms, digest), False):
            runner.run(*self._upsert_marks([claim], [digest], retention_ms), False)

    def _mark_consumed_many(
        self, runner: Runner, claims: Sequence[Claim], retention_ms: int
    ) -> None:
        digests = [element_digest(c.element) for c in claims]
        sql, params = self._mark_statement(claims, digests, retention_ms)
        if int(runner.run(sql, params, False)) < len(claims):  # a row vanished
            runner.run(*self._upsert_marks(claims, digests, retention_ms), False)

    def _mark_statement(
        self, claims: Sequence[Claim], digests: Sequence[bytes], retention_ms: int
    ) -> Tuple[str, List[Any]]:
        """One UPDATE that marks every claim's row CONSUMED (whoever holds it now); it counts
        the rows it matched, fewer than the claims when one vanished (then
        :meth:`_upsert_marks`)."""
        params: List[Any] = []
        for claim, digest in zip(claims, digests, strict=True):
            params += (digest, claim.owner)
        params.append(retention_ms)
        params += digests
        sql = MARK_MANY_SQL.format(
            table=self._table,
            cases=" ".join(["WHEN %s THEN %s"] * len(claims)),
            marks=", ".join(["%s"] * len(claims)),
        )
        return sql, params

    def _upsert_marks(
        self, claims: Sequence[Claim], digests: Sequence[bytes], retention_ms: int
    ) -> Tuple[str, List[Any]]:
        """One multi-row upsert that leaves every claim's record CONSUMED, written again if it
        vanished (a success is always recorded)."""
        params: List[Any] = []
        for i in sorted(range(len(claims)), key=lambda i: digests[i]):
            params += self._row(claims[i], digests[i], retention_ms)
        sql = MARK_CONSUMED_SQL.format(
            table=self._table, rows=", ".join([MARK_CONSUMED_ROW] * len(claims))
        )
        return sql, params

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        """Never deferred, and not coalesced: a FAILED record is rare, and its statement may
        fail on a table made before FAILED records (then it is written again without the
        reason), which would fail every request sharing its round trip. It runs on a pooled
        connection of its own, after the deferred CONSUMED marks were sent (a success marked
        before is never downgraded by it)."""
        self._flush_marks()
        self._op(self._mark_failed, claim, retention_ms, reason)

    def _mark_failed(self, runner: Runner, claim: Claim, retention_ms: int, reason: str) -> None:
        row = self._row(claim, element_digest(claim.element), retention_ms)
        try:
            runner.run(MARK_FAILED_SQL.format(table=self._table), [*row, reason], False)
        except Exception as exc:
            if error_code(exc) != MISSING_COLUMN:
                raise
            self._no_reason_column(exc)
            runner.run(MARK_FAILED_SQL_NO_REASON.format(table=self._table), row, False)

    def _no_reason_column(self, exc: BaseException) -> None:
        no_reason_column(self._description, self._table, exc)

    def _delete_claims(self, runner: Runner, claims: Sequence[Claim]) -> int:
        sql = self._sql["release"]
        return sum(int(runner.run(sql, (element_digest(e), o), False)) == 1 for e, o in claims)

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        return self._op(self._renew_many, claims, lease_ms)

    def _renew_many(self, runner: Runner, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        sql = self._sql["renew"]
        return [
            int(runner.run(sql, (lease_ms, element_digest(e), o), False)) > 0 for e, o in claims
        ]

    def do_read(self, element: DedupElement) -> Optional[Record]:
        return self.do_read_many([element])[0]

    def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        self._flush_marks()
        digests = [element_digest(e) for e in elements]
        return records_of(elements, digests, self._op(self._select_with_reasons, digests))

    def _select_with_reasons(self, runner: Runner, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """:meth:`_select`, and the reasons of the FAILED records among them (one more
        statement, only when there are some; none on a table without the column)."""
        records = self._select(runner, digests)
        failed = failed_keys(records)
        if failed:
            sql = REASONS_SQL.format(table=self._table, marks=", ".join(["%s"] * len(failed)))
            try:
                reasons = runner.run(sql, failed, True)
            except Exception as exc:
                if error_code(exc) != MISSING_COLUMN:
                    raise
                self._no_reason_column(exc)
                reasons = []
            add_reasons(records, reasons, column_text)
        return records

    # -- operator hooks ------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any]) -> Any:
        return self._op(self._run, sql.format(table=self._table), params, True)

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        status = deletable(self.do_read(element), force)
        if status is None:
            return None
        sql = DELETE_SQL.format(table=self._table)
        deleted = self._op(self._run, sql, (element_digest(element), status.value))
        return status if deleted else None

    def do_stats(self, application: str, limit: int) -> StoreStats:
        self._flush_marks()
        app = readable(application)
        counts = {str(column_text(s)): int(n) for s, n in self._query(STATS_SQL, (app,))}
        claims = [_listed(row) for row in self._query(CLAIMS_SQL, (app,))]
        oldest = [_listed(row) for row in self._query(OLDEST_CONSUMED_SQL, (app,))]
        return StoreStats(counts, oldest_claims(claims, limit), oldest[0] if oldest else None)

    def _columns(self) -> Dict[str, str]:
        """The table's columns and their keys (none: no such table)."""
        schema, _, table = self.table_name.rpartition(".")
        rows = self._op(self._run, COLUMNS_SQL, (schema or None, table), True)
        return {str(column_text(name)): str(column_text(key)) for name, key in rows}

    def _old_table_diagnosis(self) -> Diagnosis:
        """A table made before FAILED records: it works, but keeps no reasons (a warning)."""
        return Diagnosis("table", True, self._old_table_risk(), warning=True)

    def _old_table_risk(self) -> str:
        return (
            f"{self.table_name} has no {REASON_COLUMN} column (made by an earlier version): "
            "FAILED records (PermanentFailure, parked poison messages) are written without "
            f"their reason; add it: {ADD_REASON_SQL.format(table=self._table)}"
        )

    def do_risks(self) -> List[str]:
        """A table made before FAILED records (no reason column)."""
        columns = self._columns()
        return [self._old_table_risk()] if columns and REASON_COLUMN not in columns else []

    def do_diagnose(self) -> List[Diagnosis]:
        checks: List[Diagnosis] = []
        version = str(column_text(self._op(self._run, VERSION_SQL, (), True)[0][0]))
        checks.append(Diagnosis("server", True, f"version {version}"))
        checks.append(latency(lambda: self._op(self._run, CHECK_SQL, (), True)))
        columns = self._columns()
        if not columns:
            checks.append(
                Diagnosis("table", False, f"{self.table_name} does not exist: create_table()")
            )
            return checks
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            checks.append(Diagnosis("table", False, f"missing column(s): {', '.join(missing)}"))
        elif columns.get("dedup_key") != "PRI":
            checks.append(Diagnosis("table", False, "dedup_key is not the primary key"))
        elif REASON_COLUMN not in columns:
            checks.append(self._old_table_diagnosis())
        else:
            checks.append(
                Diagnosis("table", True, f"{self.table_name}: columns and key as expected")
            )
        return checks


#: The warning that a table has no reason column, at most once a minute per process.
_old_table_log = RateLimitedLog(logger, interval=60.0)


def settle_claims(
    pending: List[int],
    rows: Dict[bytes, Tuple[Record, int]],
    claims: Sequence[Claim],
    digests: Sequence[bytes],
    results: Dict[int, ClaimResult],
) -> List[int]:
    """One pass of a claim's resolution after its insert or upsert (the sync and asyncio
    stores): each pending claim's row, read back, says whether the claim holds it (written or
    taken over by the upsert: claimed, with the claims before it that lapsed since the record
    was last settled) or another attempt does (refused by that record); the claims whose row
    vanished meanwhile are returned, to be upserted and read again."""
    vanished = []
    for i in pending:
        record, deliveries = rows.get(digests[i], (None, 0))
        if record is None:
            vanished.append(i)
        elif record.owner == claims[i].owner and record.status is DedupStatus.CONSUMING:
            results[i] = claimed_after(deliveries)
        else:
            results[i] = ClaimResult(False, record)
    return vanished


def no_reason_column(description: str, table: str, exc: BaseException) -> None:
    """A table made before FAILED records (no reason column): the record is written without
    its reason; the log (rate-limited) says what adds the column. ``table``: quoted."""
    _old_table_log.log(
        logging.WARNING,
        "%s has no %s column (%s): FAILED records are written without their reason; add it: %s",
        description,
        REASON_COLUMN,
        exc,
        ADD_REASON_SQL.format(table=table),
        about=description,
    )


def _listed(row: Sequence[Any]) -> Record:
    """A record listed by ``stats``: its element from the readable columns."""
    app, topic, tag, key, status, owner, left = (column_text(v) for v in row)
    element = DedupElement(app, topic, tag, key)
    return Record(parse_status(status), owner, max(0, int(left)), element)
