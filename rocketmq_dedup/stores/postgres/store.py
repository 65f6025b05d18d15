"""The PostgreSQL store itself: validation, one statement per operation, the purge."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import (
    DedupConfigError,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StorePoolExhaustedError,
    StoreUnavailableError,
)
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import (
    Claim,
    ClaimResult,
    DedupStore,
    Record,
    StoreBoundary,
    claimed_after,
)
from rocketmq_dedup.stores.operations import Diagnosis, StoreStats, oldest_claims
from rocketmq_dedup.stores.postgres import connections
from rocketmq_dedup.stores.postgres.connections import (
    Connections,
    HotStatements,
    OwnConnections,
    Runner,
    UserPoolConnections,
    close_quietly,
    import_psycopg,
    is_pool_timeout,
    is_psycopg_connection,
    is_psycopg_pool,
    is_undefined_column,
    is_undefined_table,
    prepare_connection,
    type_name,
)
from rocketmq_dedup.stores.postgres.errors import PRIVILEGES, explain, refusal
from rocketmq_dedup.stores.postgres.outbox import PostgresOutboxTables
from rocketmq_dedup.stores.postgres.purge import PostgresPurgeSession, purge_step
from rocketmq_dedup.stores.postgres.records import (
    claim_columns,
    claim_row,
    listed_record,
    live_record,
    readable,
    unique_by_key,
)
from rocketmq_dedup.stores.postgres.sql import (
    ADD_REASON_SQL,
    CHECK_SQL,
    CLAIM_MANY_SQL,
    CLAIM_SQL,
    CLAIMS_SQL,
    COLUMNS_SQL,
    DEFAULT_TABLE_NAME,
    DELETE_SQL,
    MARK_FAILED_NO_REASON_SQL,
    MARK_FAILED_SQL,
    MARK_MANY_SQL,
    MARK_SQL,
    MARK_UPSERT_SQL,
    OLDEST_CONSUMED_SQL,
    PRIVILEGES_SQL,
    REASON_COLUMN,
    REASONS_SQL,
    RELEASE_MANY_SQL,
    RELEASE_SQL,
    RENEW_MANY_SQL,
    REQUIRED_COLUMNS,
    SELECT_SQL,
    STATS_SQL,
    USER_SQL,
    VERSION_SQL,
    outbox_table_names,
    quote_table,
    schema_statements,
    sequence_table_name,
    validate_table_name,
)
from rocketmq_dedup.stores.postgres.transaction import PostgresTransactions
from rocketmq_dedup.stores.purge import PurgeBatch
from rocketmq_dedup.stores.sql_common import (
    PurgeStep,
    SqlTables,
    add_reasons,
    deletable,
    detached_connections,
    failed_keys,
    is_sqlalchemy_engine,
    latency,
    pool_options,
    purge_in_key_order,
    records_of,
)

logger = logging.getLogger(__name__)

DEFAULT_POOL_SIZE = 8
MAX_POOL_SIZE = 1024
#: Seconds a caller waits for a connection when all ``pool_size`` are busy.
DEFAULT_POOL_TIMEOUT = 5.0
CONSUMING = DedupStatus.CONSUMING.value


def describe_conninfo(conninfo: str, keywords: Dict[str, Any]) -> str:
    """``user@host:port/dbname`` of a psycopg connection string and keywords (never the
    password); '' when they cannot be read."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(conninfo, **keywords)
    except Exception:  # a malformed string fails at connect time, with the driver's message
        return ""
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    user = params.get("user")
    database = params.get("dbname") or ""
    return f"{user}@{where}/{database}" if user else f"{where}/{database}"


def configured_user(source: Any) -> Optional[str]:
    """The user a source logs in as, from its connection string or keywords (a
    ``functools.partial`` of ``psycopg.connect``, a psycopg_pool pool, an engine's URL); None
    when it cannot be read. The start-up check asks the server (``current_user``)."""
    try:
        if is_psycopg_pool(source):
            conninfo, keywords = str(source.conninfo or ""), dict(source.kwargs or {})
        elif isinstance(source, functools.partial):
            positional = source.args[0] if source.args and isinstance(source.args[0], str) else ""
            keywords = {k: v for k, v in source.keywords.items() if k != "conninfo"}
            conninfo = str(source.keywords.get("conninfo", positional))
        elif is_sqlalchemy_engine(source):
            return source.url.username or None
        else:
            return None
        from psycopg.conninfo import conninfo_to_dict

        user = conninfo_to_dict(conninfo, **keywords).get("user")
    except Exception:  # a malformed string fails at connect time, with the driver's message
        return None
    return str(user) if user else None


def describe_source(source: Any) -> str:
    """Where a factory or a psycopg_pool pool connects, for messages."""
    if is_psycopg_pool(source):
        where = describe_conninfo(str(source.conninfo or ""), dict(source.kwargs or {}))
        return f"{where or 'pool'} (psycopg_pool {source.name})"
    if isinstance(source, functools.partial):
        conninfo = source.args[0] if source.args and isinstance(source.args[0], str) else ""
        keywords = {k: v for k, v in source.keywords.items() if k != "conninfo"}
        where = describe_conninfo(str(source.keywords.get("conninfo", conninfo)), keywords)
        return where or f"via {type_name(source.func)}"
    text = repr(source)
    return text if len(text) <= 120 else text[:117] + "..."


class PostgresBoundary(StoreBoundary):
    """The boundary the PostgreSQL stores share, sync and asyncio (no I/O): what a driver
    error is (:mod:`.errors`, :mod:`.connections`), each wrapped once, and the warning about a
    table made before FAILED records."""

    table_name: str
    _description: str
    #: The user a refusal's GRANT names: the configured one, then what the server reported
    #: to the last check.
    _user: Optional[str] = None

    def describe(self) -> str:
        return self._description

    def is_outage(self, exc: BaseException) -> bool:
        return connections.is_outage(exc)

    def misconfiguration(self, exc: BaseException) -> Optional[str]:
        """The GRANT to run, the login to fix or the server to point at, for a refusal
        (:mod:`.errors`: 42501 insufficient privilege, 25006 a read-only server, 28P01/28000
        a refused login)."""
        kind = refusal(exc)
        if kind is None:
            return None
        return explain(kind, server_message(exc), self.table_name, self._user)

    def wrap_error(self, exc: Exception) -> StoreError:
        """A pool that had no connection in time as :class:`StorePoolExhaustedError`; a
        refusal a person must fix as :class:`StoreMisconfiguredError` naming the fix; a
        missing table named as such; a lock wait or a deadlock as
        :class:`StoreLockConflictError`; the rest as any store."""
        fix = self.misconfiguration(exc)
        if fix is not None:
            text = f"{self.describe()}: {type(exc).__name__}: {server_message(exc)}"
            return StoreMisconfiguredError(text, fix)
        if is_pool_timeout(exc):
            return StorePoolExhaustedError(
                f"{self.describe()}: no free connection in the psycopg_pool pool: "
                f"{type(exc).__name__}: {exc} (not an outage: consumed later; size the pool "
                "for the consumer's threads or tasks)"
            )
        if is_undefined_table(exc):
            return StoreError(
                f"{self.describe()}: the table does not exist: create it with create_table() "
                "or the statements of `rocketmq-dedup schema postgres` "
                f"({server_message(exc)})"
            )
        text = f"{self.describe()}: {type(exc).__name__}: {server_message(exc)}"
        if connections.is_lock_conflict(exc):
            return StoreLockConflictError(text)
        return (StoreUnavailableError if self.is_outage(exc) else StoreError)(text)

    def _no_reason_column(self, exc: BaseException) -> None:
        """A table made before FAILED records: written without the reason, the fix logged."""
        _old_table_log.log(
            logging.WARNING,
            "%s: %s; FAILED records are written without their reason; add the column: %s",
            self._description,
            server_message(exc),
            ADD_REASON_SQL.format(table=quote_table(self.table_name)),
            about=self._description,
        )


class PostgresDedupStore(PostgresBoundary, SqlTables, DedupStore):
    """Dedup records in a PostgreSQL table (the ``[postgres]`` extra: psycopg 3).

    :param source: where connections come from: a zero-argument callable returning a new
        ``psycopg.Connection`` (e.g. ``functools.partial(psycopg.connect, "postgresql://...")``),
        a ``psycopg_pool.ConnectionPool``, or a SQLAlchemy ``Engine`` on ``postgresql+psycopg``
        (its raw connections, detached from the engine's pool).
    :param table_name: the table (created by :meth:`create_table` or ``rocketmq-dedup schema
        postgres``); used exactly as written (it is quoted), optionally ``schema.table``.
    :param pool_size: with a factory or an engine: at most this many connections, each taken
        by one operation and given back right after (a psycopg_pool pool has its own size).
    :param pool_timeout: how long (seconds) a caller waits when all of them are busy before
        the operation fails with :class:`StorePoolExhaustedError` (not an outage, so never a
        run without dedup); a psycopg_pool pool's own ``timeout`` applies to it.
    """

    #: The start-up check claims and releases probe records (INSERT, UPDATE, SELECT, DELETE).
    proves_writes = True
    longest_name = "63 bytes"

    def __init__(
        self,
        source: Any,
        table_name: str = DEFAULT_TABLE_NAME,
        pool_size: Optional[int] = None,
        pool_timeout: Optional[float] = None,
    ) -> None:
        import_psycopg()  # the [postgres] extra, named now rather than at the first message
        self.table_name = validate_table_name(table_name)
        self._table = table = quote_table(self.table_name)
        self._hot = hot = HotStatements(CLAIM_SQL.format(table=table), MARK_SQL.format(table=table))
        self.engine: Any = None
        #: The exactly-once mode's sequence table (``<table>_seq``); None when that name would
        #: be too long (a table name of 60-63 bytes): the mode then runs without one.
        self.sequence_table_name: Optional[str] = sequence_table_name(self.table_name)
        #: The user a refusal's GRANT names: the configured one, then what the server reported
        #: to the last check.
        self._user: Optional[str] = configured_user(source)
        if is_psycopg_pool(source):
            if pool_size is not None or pool_timeout is not None:
                raise DedupConfigError(
                    "pool_size and pool_timeout do not apply to a psycopg_pool pool: its own "
                    "max_size and timeout do"
                )
            where = describe_source(source)
            self._description = f"PostgreSQL {where} table {self.table_name}"
            self.connections: Connections = UserPoolConnections(source, hot, self._description)
            self._connect: Callable[[], Any] = functools.partial(
                import_psycopg().connect, str(source.conninfo or ""), **dict(source.kwargs or {})
            )
            transactions = PostgresTransactions(
                self.table_name, self.sequence_table_name, self.wrap_error, user_pool=source
            )
        else:
            connect, where = self._factory(source)
            self._connect = connect
            self._description = f"PostgreSQL {where} table {self.table_name}"
            size, timeout = pool_options(
                DEFAULT_POOL_SIZE if pool_size is None else pool_size,
                DEFAULT_POOL_TIMEOUT if pool_timeout is None else pool_timeout,
                MAX_POOL_SIZE,
            )
            self.connections = OwnConnections(connect, hot, size, timeout, self._description)
            transactions = PostgresTransactions(
                self.table_name,
                self.sequence_table_name,
                self.wrap_error,
                connect=connect,
                pool_size=size,
                pool_timeout=timeout,
                engine=self.engine,
            )
        #: The exactly-once mode's transactions (:mod:`.transaction`): on a factory, their own
        #: pool (opened on first use), so a transaction held for a whole handler never starves
        #: claims, marks and lease renewal; on a psycopg_pool pool or an engine, theirs.
        self.transactions: PostgresTransactions = transactions
        self._outbox: Optional[PostgresOutboxTables] = None
        self._run = self.connections.run
        self._sql: Dict[str, str] = {
            name: sql.format(table=table)
            for name, sql in (
                ("claim_many", CLAIM_MANY_SQL),
                ("mark_upsert", MARK_UPSERT_SQL),
                ("mark_many", MARK_MANY_SQL),
                ("release", RELEASE_SQL),
                ("release_many", RELEASE_MANY_SQL),
                ("renew_many", RENEW_MANY_SQL),
                ("select", SELECT_SQL),
                ("mark_failed", MARK_FAILED_SQL),
                ("mark_failed_no_reason", MARK_FAILED_NO_REASON_SQL),
                ("reasons", REASONS_SQL),
                ("delete", DELETE_SQL),
                ("stats", STATS_SQL),
                ("claims", CLAIMS_SQL),
                ("oldest", OLDEST_CONSUMED_SQL),
            )
        }

    def _factory(self, source: Any) -> Tuple[Callable[[], Any], str]:
        """A connection factory and its address, from a factory or an engine."""
        if is_sqlalchemy_engine(source):
            return self._engine_factory(source)
        if is_psycopg_connection(source):
            raise DedupConfigError(
                "the PostgreSQL store needs a connection factory or a pool, not one connection: "
                "pass functools.partial(psycopg.connect, ...) or a psycopg_pool.ConnectionPool"
            )
        if not callable(source) or isinstance(source, type):
            raise DedupConfigError(
                "the PostgreSQL store needs a zero-argument callable returning a new psycopg "
                "connection (e.g. functools.partial(psycopg.connect, 'postgresql://...')), a "
                "psycopg_pool.ConnectionPool or a SQLAlchemy engine; got "
                f"{'the class ' if isinstance(source, type) else ''}{type_name(source)}"
            )
        return source, describe_source(source)

    def _engine_factory(self, engine: Any) -> Tuple[Callable[[], Any], str]:
        """Connections from a SQLAlchemy engine, detached from its pool
        (:func:`~rocketmq_dedup.stores.sql_common.detached_connections`)."""
        dialect = getattr(engine, "dialect", None)
        name, driver = getattr(dialect, "name", None), getattr(dialect, "driver", None)
        if name != "postgresql" or driver != "psycopg":
            raise DedupConfigError(
                f"the SQLAlchemy engine is {name}+{driver}: the PostgreSQL store needs a "
                "postgresql+psycopg:// engine (psycopg 3)"
            )

        from rocketmq_dedup.stores.sqlalchemy_guard import install

        self.engine = engine
        install(engine)  # conn.commit()/rollback() refused while an exactly-once handler runs
        url = engine.url.render_as_string(hide_password=True)
        return detached_connections(engine), f"{url} (SQLAlchemy)"

    @property
    def pool(self) -> Any:
        """The store's own pool (a :class:`~rocketmq_dedup.stores.pool.BoundedPool`), or the
        application's ``psycopg_pool`` pool it borrows from."""
        return self.connections.pool

    @property
    def outbox(self) -> PostgresOutboxTables:
        """The outbox's tables (``<table>_outbox``, :mod:`.outbox`), with their own small pool
        of the source's connections (opened on first use). Raises :class:`DedupConfigError`
        when the table name leaves no room for their names (over 46 bytes)."""
        if self._outbox is None:
            self._outbox = PostgresOutboxTables(
                self._open_runner,
                self.table_name,
                float(getattr(self.pool, "timeout", None) or DEFAULT_POOL_TIMEOUT),
                self.describe,
                self.wrap_error,
            )
        return self._outbox

    def close(self) -> None:
        """Close the connections the store opened (busy ones when their operation ends); an
        application's psycopg_pool pool is left alone. The store stays usable."""
        self.connections.close()
        self.transactions.close()
        if self._outbox is not None:
            self._outbox.close()

    # -- operator API --------------------------------------------------------------------

    def create_table(self) -> None:
        """Create, if they do not exist (idempotent), every table the store uses, with their
        column comments (:func:`~rocketmq_dedup.stores.postgres.sql.schema_statements`): the
        dedup table, the exactly-once mode's sequence table (``<table>_seq``; see
        :mod:`rocketmq_dedup.transactional`), which stays empty unless that mode's
        ``sequence_key`` is used, and the outbox's (``<table>_outbox``, ``<table>_outbox_lane``;
        see :mod:`rocketmq_dedup.outbox`), empty unless used. A start-up check that ran before
        the table existed proves the writes here."""
        for statement in schema_statements(self.table_name):
            self._call(self._run, Runner.count, statement, ())
        if outbox_table_names(self.table_name) is None:
            logger.warning(
                "%s: no outbox tables (%s_outbox_by_status would be longer than 63 bytes)",
                self._description,
                self.table_name,
            )
        self.tables_created()

    def purge_expired(
        self,
        batch_size: int = 1000,
        dry_run: bool = False,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> int:
        """Delete every expired row; return how many were deleted (with ``dry_run``: how many
        are expired, deleting nothing).

        One pass over the table in primary-key order: each step reads ``batch_size`` keys and
        deletes the expired ones among them by key (a statement of its own: a short lock on
        expired rows only). Autovacuum reclaims the space of the rows deleted. Run it from a
        cron job or a timer; ``progress(rows scanned, rows expired)`` is called after each
        step."""

        def step(after: bytes, size: int) -> PurgeStep:
            batch: PurgeBatch = self._call(self._run, purge_step, self._table, after, size, dry_run)
            return batch.deleted, batch.scanned, batch.last_key

        return purge_in_key_order(step, batch_size, progress)

    def purge_session(self) -> PostgresPurgeSession:
        """A session of its own for the in-process purger (:class:`rocketmq_dedup.Purger`):
        a new connection (from the factory, the engine, or the psycopg_pool pool's conninfo,
        never one of a pool), that takes the table's purge lock (``pg_try_advisory_lock``) and
        deletes expired rows in batches (:mod:`rocketmq_dedup.stores.purge`)."""
        return PostgresPurgeSession(self._open_runner, self.table_name, self.wrap_error)

    def _open_runner(self) -> Runner:
        """A new connection of the store's source (never a pooled one), prepared, in a
        runner."""
        conn = self._connect()
        try:
            prepare_connection(conn)
            return Runner(conn, self._hot)
        except BaseException:
            close_quietly(conn)
            raise

    # -- I/O hooks -----------------------------------------------------------------------

    def do_check(self) -> None:
        """Connect (or borrow a connection) and ask the server which user the session is (what
        a refusal's GRANT names); the table may not exist yet."""
        ((user,),) = self._run(Runner.rows, USER_SQL, ())
        self._user = str(user)

    def is_missing_table(self, exc: BaseException) -> bool:
        return is_undefined_table(exc)

    def do_claim(self, claim: Claim, lease_ms: int) -> ClaimResult:
        return self._run(self._claim, claim, lease_ms)

    def _claim(self, runner: Runner, claim: Claim, lease_ms: int) -> ClaimResult:
        return decided(
            claim, *runner.claim(claim_row(claim, element_digest(claim.element), lease_ms))
        )

    def do_claim_many(self, claims: Sequence[Claim], lease_ms: int) -> List[ClaimResult]:
        return self._run(self._claim_many, claims, lease_ms)

    def _claim_many(
        self, runner: Runner, claims: Sequence[Claim], lease_ms: int
    ) -> List[ClaimResult]:
        digests, unique = unique_by_key(claims)
        columns = claim_columns(claims, digests, unique)
        rows = {
            bytes(key): (status, owner, left, claims)
            for key, status, owner, left, claims in runner.rows(
                self._sql["claim_many"], (lease_ms, *columns)
            )
        }
        results = []
        for claim, digest in zip(claims, digests, strict=True):
            found = rows.get(digest)  # a repeated element: as the batch's first claim left it
            if found is None:  # the upsert returns every row it was given
                raise StoreError(f"{self._description}: a claim's row was not returned")
            results.append(decided(claim, *found))
        return results

    def do_mark_consumed(self, claim: Claim, retention_ms: int) -> None:
        self._run(self._mark_consumed, claim, retention_ms)

    def _mark_consumed(self, runner: Runner, claim: Claim, retention_ms: int) -> None:
        digest = element_digest(claim.element)
        if not runner.mark((claim.owner, retention_ms, digest)):
            runner.count(self._sql["mark_upsert"], claim_row(claim, digest, retention_ms))

    def do_mark_consumed_many(self, claims: Sequence[Claim], retention_ms: int) -> None:
        digests, unique = unique_by_key(claims)
        columns = claim_columns(claims, digests, unique)
        self._run(Runner.count, self._sql["mark_many"], (retention_ms, *columns))

    def do_mark_failed(self, claim: Claim, retention_ms: int, reason: str) -> None:
        self._run(self._mark_failed, claim, retention_ms, reason)

    def _mark_failed(self, runner: Runner, claim: Claim, retention_ms: int, reason: str) -> None:
        row = claim_row(claim, element_digest(claim.element), retention_ms)
        try:
            runner.count(self._sql["mark_failed"], (*row, reason))
        except Exception as exc:
            if not is_undefined_column(exc):
                raise
            self._no_reason_column(exc)
            runner.count(self._sql["mark_failed_no_reason"], row)

    def do_release(self, claim: Claim) -> bool:
        params = (element_digest(claim.element), claim.owner)
        return self._run(Runner.count, self._sql["release"], params) == 1

    def do_release_many(self, claims: Sequence[Claim]) -> int:
        pairs = sorted({(element_digest(e), o) for e, o in claims})
        params = ([k for k, _ in pairs], [o for _, o in pairs])
        return self._run(Runner.count, self._sql["release_many"], params)

    def do_renew_many(self, claims: Sequence[Claim], lease_ms: int) -> List[bool]:
        wanted = [(element_digest(e), o) for e, o in claims]
        pairs = sorted(set(wanted))
        params = (lease_ms, [k for k, _ in pairs], [o for _, o in pairs])
        rows = self._run(Runner.rows, self._sql["renew_many"], params)
        renewed: Set[Tuple[bytes, str]] = {(bytes(k), o) for k, o in rows}
        return [pair in renewed for pair in wanted]

    def _select(self, runner: Runner, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """The live records of ``digests``, by digest."""
        return {
            bytes(key): live_record(status, owner, left)
            for key, status, owner, left in runner.rows(self._sql["select"], (list(digests),))
        }

    def do_read(self, element: DedupElement) -> Optional[Record]:
        return self.do_read_many([element])[0]

    def do_read_many(self, elements: Sequence[DedupElement]) -> List[Optional[Record]]:
        digests = [element_digest(e) for e in elements]
        return records_of(elements, digests, self._run(self._select_with_reasons, digests))

    def _select_with_reasons(self, runner: Runner, digests: Sequence[bytes]) -> Dict[bytes, Record]:
        """:meth:`_select`, and the reasons of the FAILED records among them (one more
        statement, only when there are some; none on a table without the column)."""
        records = self._select(runner, digests)
        failed = failed_keys(records)
        if failed:
            try:
                reasons = runner.rows(self._sql["reasons"], (failed,))
            except Exception as exc:
                if not is_undefined_column(exc):
                    raise
                self._no_reason_column(exc)
                reasons = []
            add_reasons(records, reasons)
        return records

    # -- operator hooks ------------------------------------------------------------------

    def do_delete(self, element: DedupElement, force: bool) -> Optional[DedupStatus]:
        status = deletable(self.do_read(element), force)
        if status is None:
            return None
        params = (element_digest(element), status.value)
        deleted = self._run(Runner.count, self._sql["delete"], params)
        return status if deleted else None

    def do_stats(self, application: str, limit: int) -> StoreStats:
        app = (readable(application),)
        counts = {str(s): int(n) for s, n in self._run(Runner.rows, self._sql["stats"], app)}
        claims = [listed_record(row) for row in self._run(Runner.rows, self._sql["claims"], app)]
        oldest = [listed_record(row) for row in self._run(Runner.rows, self._sql["oldest"], app)]
        return StoreStats(counts, oldest_claims(claims, limit), oldest[0] if oldest else None)

    def do_diagnose(self) -> List[Diagnosis]:
        version, encoding = self._run(Runner.rows, VERSION_SQL, ())[0]
        checks = [Diagnosis("server", True, f"PostgreSQL version {version}")]
        checks.append(
            Diagnosis(
                "encoding",
                encoding == "UTF8",
                f"server encoding {encoding}"
                + ("" if encoding == "UTF8" else ": readable columns need UTF8 for any key"),
            )
        )
        checks.append(latency(lambda: self._run(Runner.rows, CHECK_SQL, ())))
        checks += self._table_checks()
        return checks

    def _old_table_risk(self) -> str:
        return (
            f"{self.table_name} has no {REASON_COLUMN} column (made by an earlier version): "
            "FAILED records (PermanentFailure, parked poison messages) are written without "
            f"their reason; add it: {ADD_REASON_SQL.format(table=quote_table(self.table_name))}"
        )

    def do_risks(self) -> List[str]:
        """A table made before FAILED records (no reason column)."""
        name = quote_table(self.table_name)
        columns = {str(c) for c, _ in self._run(Runner.rows, COLUMNS_SQL, (name,))}
        return [self._old_table_risk()] if columns and REASON_COLUMN not in columns else []

    def _table_checks(self) -> List[Diagnosis]:
        """The table: its columns and primary key, and the user's privileges on it."""
        name = quote_table(self.table_name)
        columns = {str(c): bool(pk) for c, pk in self._run(Runner.rows, COLUMNS_SQL, (name,))}
        if not columns:
            return [
                Diagnosis(
                    "table",
                    False,
                    f"{self.table_name} does not exist: create_table(), or the statements of "
                    "`rocketmq-dedup schema postgres`",
                )
            ]
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            table = Diagnosis("table", False, f"missing column(s): {', '.join(missing)}")
        elif [c for c, pk in columns.items() if pk] != ["dedup_key"]:
            table = Diagnosis("table", False, "dedup_key is not the primary key")
        elif REASON_COLUMN not in columns:
            table = Diagnosis("table", True, self._old_table_risk(), warning=True)
        else:
            table = Diagnosis("table", True, f"{self.table_name}: columns and key as expected")
        ((*allowed, user),) = self._run(Runner.rows, PRIVILEGES_SQL, (name,))
        missing = [p for p, ok in zip(PRIVILEGES, allowed, strict=True) if not ok]
        grant = f"GRANT {', '.join(PRIVILEGES)} ON {self.table_name} TO {user}"
        privileges = Diagnosis(
            "privileges",
            not missing,
            f"{', '.join(PRIVILEGES)} on the table"
            + (f": {user} lacks {', '.join(missing)} ({grant})" if missing else ""),
        )
        return [table, privileges]


def decided(claim: Claim, status: str, owner: str, left_ms: int, claims: int) -> ClaimResult:
    """A claim's result from the row its upsert returned: taken if the row is this attempt's
    CONSUMING claim (owner tokens are unique per attempt; ``claims`` since the record was last
    settled, this one included), else refused by that live row."""
    if owner == claim.owner and status == CONSUMING:
        return claimed_after(claims)
    return ClaimResult(False, live_record(status, owner, left_ms))


#: The warning that a table has no reason column, at most once a minute per process.
_old_table_log = RateLimitedLog(logger, interval=60.0)


def server_message(exc: BaseException) -> str:
    """A driver error's message on one line: the server's primary message when it sent one
    (without libpq's LINE/caret context), else the first line of the text."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)
    lines = str(exc).strip().splitlines()
    return str(primary) if primary else (lines[0] if lines else type(exc).__name__)
