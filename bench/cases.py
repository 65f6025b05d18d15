"""The in-process cases: one class per case, each with its messages per repetition (N).

A case's life: ``setup()`` once; per repetition ``prepare(rep)`` (untimed: fresh messages, and
for the ``*_dup`` cases one untimed pass that consumes them), then ``measure(part)`` (timed) once
per round over consecutive parts of the messages (see :func:`bench.runner.run_rep`), the
handler-call check, ``cleanup()`` (deletes the rep's records); ``close()`` at the end.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import Any, Callable, ClassVar, Optional, Sequence

from bench.business import BenchError, BusinessTransaction
from bench.messages import CountingHandler, consume_all, make_messages
from bench.naive import (
    NAIVE_PG_SCHEMA,
    NAIVE_SCHEMA,
    NaiveMySQLDedup,
    NaivePostgresDedup,
    NaiveRedisDedup,
    uniq_key,
)
from bench.settings import (
    LEASE_MS,
    LIBRARY_KEY_PREFIX,
    LIBRARY_TABLE,
    NAIVE_KEY_PREFIX,
    NAIVE_TABLE,
    POWERTOOLS_KEY_PREFIX,
    RESERVE_MINUTES,
    TAG,
    TX_ACCOUNT_TABLE,
    TX_LEDGER_TABLE,
    Servers,
)
from rocketmq_dedup import DedupConcurrentListener, DedupConfig, TransactionalDedupListener
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.status import ConsumeStatus
from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.memory import MemoryDedupStore
from rocketmq_dedup.stores.mysql import schema_sql
from rocketmq_dedup.stores.mysql.sql import RECORD_INSERT_SQL
from rocketmq_dedup.stores.postgres import schema_statements as postgres_schema
from rocketmq_dedup.stores.postgres.sql import RECORD_COMMIT_SQL
from rocketmq_dedup.stores.redis import RedisDedupStore
from rocketmq_dedup.testing import ClassicMessage

OK = ConsumeStatus.CONSUME_SUCCESS
BATCH_SIZE = 32
THREADS = 8


class Context:
    """What the cases of one run share: the servers and a run id that keeps keys unique."""

    def __init__(self, servers: Servers, run_id: str) -> None:
        self.servers = servers
        self.run_id = run_id
        self.tables_made: set[str] = set()  # SQL tables (re)created by this run ("server:name")

    def app_name(self, case: str) -> str:
        return f"bench-{self.run_id}-{case}"


class BenchListener(DedupConcurrentListener):
    """The library's listener, as a user writes it: ``do_handle_msg`` is the business code."""

    def __init__(self, config: DedupConfig, handler: Callable[[Any], bool]) -> None:
        super().__init__(config)
        self.handler = handler

    def do_handle_msg(self, msg: Any) -> bool:
        return self.handler(msg)


class Case(abc.ABC):
    """One benchmark case. ``ok`` is what ``consume`` answers for a handled message."""

    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset()  # "redis", "mysql", "postgres", "broker"
    chunked: ClassVar[bool] = True  # measured in parts, one per round (see bench.runner)
    quick_n: ClassVar[int]
    full_n: ClassVar[int]
    in_quick: ClassVar[bool] = True
    duplicates: ClassVar[bool] = False
    ok: ClassVar[Any] = OK

    def __init__(self, ctx: Context, n: int) -> None:
        self.ctx = ctx
        self.n = n
        self.app = ctx.app_name(self.name)
        self.handler = CountingHandler()
        self.items: Sequence[Any] = ()
        #: what the last measure() used, when not this process (CPU s, voluntary and
        #: involuntary switches); None: the runner reads this process's usage
        self.usage: Optional[tuple[float, int, int]] = None

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Once per run, before the first repetition."""

    def prepare(self, rep: object) -> None:
        """Untimed: this repetition's messages; duplicates are consumed once here."""
        self.items = self.group(make_messages(f"{self.ctx.run_id}-{self.name}-{rep}", self.n))
        if self.duplicates:
            self.expect_no_failures(self.run(self.items), "the untimed first pass")

    def group(self, msgs: list[ClassicMessage]) -> Sequence[Any]:
        """How the timed loop receives the messages (one by one; batches override)."""
        return msgs

    def parts(self, rounds: int) -> list[Sequence[Any]]:
        """``self.items`` cut into ``rounds`` consecutive parts, measured one per round."""
        size = -(-len(self.items) // rounds)
        return [self.items[i * size : (i + 1) * size] for i in range(rounds)]

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        """Timed: consume ``items`` (default: all of this repetition's); return the elapsed
        seconds."""
        items = self.items if items is None else items
        start = time.perf_counter()
        failures = self.run(items)
        elapsed = time.perf_counter() - start
        self.expect_no_failures(failures, "the timed pass")
        return elapsed

    def run(self, items: Sequence[Any]) -> int:
        """Consume ``items``; return how many answers were not ``ok``."""
        return consume_all(self.consume, items, self.ok)

    @abc.abstractmethod
    def consume(self, item: Any) -> Any:
        """Consume one item (a message, or a batch)."""

    def expected_calls(self) -> int:
        """Handler calls the timed pass must make: every message, or none for duplicates."""
        return 0 if self.duplicates else self.n

    def details(self) -> dict[str, float]:
        """Figures of the last timed pass beyond its time and usage (kept in the JSON as their
        median over the repetitions); none by default."""
        return {}

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Delete this repetition's records."""

    def close(self) -> None:
        """Delete everything this case wrote; release its resources."""
        self.cleanup()

    def warm_up(self, n: int) -> None:
        """An untimed repetition with ``n`` messages (connections, scripts, caches)."""
        full_n, self.n = self.n, min(n, self.n)
        try:
            self.prepare("warmup")
            self.measure()
        finally:
            self.n = full_n
            self.cleanup()

    def expect_no_failures(self, failures: int, what: str) -> None:
        if failures:
            raise BenchError(f"{self.name}: {failures} of {self.n} messages not consumed in {what}")


# -- no store ------------------------------------------------------------------------------


class Noop(Case):
    """The handler called in a loop: the Python floor. The loop passes over the same
    ``DISTINCT`` messages again and again (N is large; no dedup, so repeats do not matter)."""

    name = "noop"
    quick_n, full_n = 3_000_000, 10_000_000
    ok = True
    DISTINCT: ClassVar[int] = 100_000

    def prepare(self, rep: object) -> None:
        distinct = make_messages(f"{self.ctx.run_id}-{self.name}-{rep}", self.DISTINCT)
        self.items = distinct * (self.n // self.DISTINCT) + distinct[: self.n % self.DISTINCT]

    def consume(self, item: Any) -> Any:
        return self.handler(item)


class MemoryFresh(Case):
    """The listener on the in-memory store (a new store each repetition)."""

    name = "memory_fresh"
    quick_n, full_n = 100_000, 300_000

    def prepare(self, rep: object) -> None:
        config = DedupConfig.enable_dedup_consume_config(
            self.app, MemoryDedupStore(), **listener_options()
        )
        self.listener = BenchListener(config, self.handler)
        super().prepare(rep)

    def consume(self, item: Any) -> Any:
        return self.listener(item)


class MemoryDup(MemoryFresh):
    """memory_fresh's messages again: every one a duplicate of a CONSUMED message."""

    name = "memory_dup"
    duplicates = True


class MemoryPrometheusFresh(MemoryFresh):
    """memory_fresh with Prometheus metrics on (a fresh registry each repetition)."""

    name = "memory_prometheus_fresh"

    def prepare(self, rep: object) -> None:
        from prometheus_client import CollectorRegistry

        from rocketmq_dedup.metrics import PrometheusMetrics

        config = DedupConfig.enable_dedup_consume_config(
            self.app,
            MemoryDedupStore(),
            metrics=PrometheusMetrics(CollectorRegistry()),
            **listener_options(),
        )
        self.listener = BenchListener(config, self.handler)
        Case.prepare(self, rep)


def listener_options() -> dict[str, Any]:
    return {
        "dedup_processing_expire_milli_seconds": LEASE_MS,
        "dedup_record_reserve_minutes": RESERVE_MINUTES,
    }


# -- Redis ---------------------------------------------------------------------------------


class RedisCase(Case):
    """A case on the bench's Redis; ``cleanup`` deletes the keys matching ``key_pattern``."""

    needs = frozenset({"redis"})
    quick_n, full_n = 4_000, 15_000

    def setup(self) -> None:
        self.client = self.ctx.servers.redis_client()

    @property
    @abc.abstractmethod
    def key_pattern(self) -> str: ...

    def cleanup(self) -> None:
        delete_keys(self.client, self.key_pattern)

    def close(self) -> None:
        super().close()
        self.client.close()


def delete_keys(client: Any, pattern: str, chunk: int = 1000) -> int:
    """Delete every key matching ``pattern``; return how many."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=chunk):
        batch.append(key)
        if len(batch) == chunk:
            deleted += client.unlink(*batch)
            batch = []
    if batch:
        deleted += client.unlink(*batch)
    return int(deleted)


def library_key_pattern(app: str) -> str:
    """The library's Redis keys of application ``app`` (a bench app name needs no escaping)."""
    return f"{LIBRARY_KEY_PREFIX}:{app}:*"


class LibraryRedisCase(RedisCase):
    """The library's listener on Redis."""

    def setup(self) -> None:
        super().setup()
        config = DedupConfig.enable_dedup_consume_config(
            self.app, self.client, key_prefix=LIBRARY_KEY_PREFIX, **listener_options()
        )
        self.listener = BenchListener(config, self.handler)

    @property
    def key_pattern(self) -> str:
        return library_key_pattern(self.app)

    def consume(self, item: Any) -> Any:
        return self.listener(item)


class RedisFresh(LibraryRedisCase):
    name = "redis_fresh"


class RedisDup(LibraryRedisCase):
    name = "redis_dup"
    quick_n, full_n = 6_000, 20_000
    duplicates = True


class RedisBatch32Fresh(LibraryRedisCase):
    """``listener.consume_message(batch)``, 32 messages per call."""

    name = "redis_batch32_fresh"
    quick_n, full_n = 32 * 1_000, 32 * 4_000

    def group(self, msgs: list[ClassicMessage]) -> Sequence[Any]:
        return [msgs[i : i + BATCH_SIZE] for i in range(0, len(msgs), BATCH_SIZE)]

    def consume(self, item: Any) -> Any:
        result = self.listener.consume_message(item)
        return result.status if result.consumed == len(item) else None


class RedisThreads8Fresh(LibraryRedisCase):
    """8 threads share one listener; each consumes its own share of fresh messages."""

    name = "redis_threads8_fresh"
    quick_n, full_n = 8_000, 30_000

    def run(self, items: Sequence[Any]) -> int:
        failures = [0] * THREADS
        shares = [items[i::THREADS] for i in range(THREADS)]

        def worker(index: int) -> None:
            failures[index] = consume_all(self.consume, shares[index], self.ok)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(failures)


class RedisThreads8NoCoalesceFresh(RedisThreads8Fresh):
    """``redis_threads8_fresh`` with the store's coalescing off (every thread sends its own
    commands through the client's pool): shows what coalescing buys."""

    name = "redis_threads8_nocoalesce_fresh"

    def setup(self) -> None:
        RedisCase.setup(self)
        store = RedisDedupStore(self.client, key_prefix=LIBRARY_KEY_PREFIX, coalesce=False)
        config = DedupConfig.enable_dedup_consume_config(self.app, store, **listener_options())
        self.listener = BenchListener(config, self.handler)


class RedisThreads8LockWakeFresh(RedisThreads8Fresh):
    """``redis_threads8_fresh`` with waiting threads woken through a ``threading.Lock`` (what
    the store uses for threads not confined to one CPU) instead of an eventfd (what pinned
    threads get): shows what the eventfd buys."""

    name = "redis_threads8_lockwake_fresh"

    def setup(self) -> None:
        RedisCase.setup(self)
        store = RedisDedupStore(self.client, key_prefix=LIBRARY_KEY_PREFIX)
        store._coalescer = coalesce.Coalescer(store._execute, waker=coalesce.LockWaker)
        config = DedupConfig.enable_dedup_consume_config(self.app, store, **listener_options())
        self.listener = BenchListener(config, self.handler)


class NaiveRedisCase(RedisCase):
    """The Java algorithm with plain redis-py (see :mod:`bench.naive`)."""

    def setup(self) -> None:
        super().setup()
        self.naive = NaiveRedisDedup(self.client, self.app, self.handler, NAIVE_KEY_PREFIX)

    @property
    def key_pattern(self) -> str:
        return f"{NAIVE_KEY_PREFIX}:{self.app}:*"

    def consume(self, item: Any) -> Any:
        return self.naive(item)


class RedisNaiveFresh(NaiveRedisCase):
    name = "redis_naive_fresh"


class RedisNaiveDup(NaiveRedisCase):
    name = "redis_naive_dup"
    quick_n, full_n = 5_000, 20_000
    duplicates = True


class LeaseContext:
    """Stands in for the Lambda context outside Lambda: Powertools derives the in-progress
    expiry from ``get_remaining_time_in_millis()``, here the same lease as the listener's."""

    def get_remaining_time_in_millis(self) -> int:
        return LEASE_MS


class PowertoolsCase(RedisCase):
    """AWS Powertools' ``idempotent_function`` with ``RedisCachePersistenceLayer`` on the same
    Redis. The payload is the message's identity (topic, tag, UNIQ_KEY); no local cache."""

    ok = True
    quick_n, full_n = 2_500, 10_000

    def setup(self) -> None:
        super().setup()
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )

        config = IdempotencyConfig(expires_after_seconds=RESERVE_MINUTES * 60)
        config.register_lambda_context(LeaseContext())  # type: ignore[arg-type]
        handler = self.handler

        @idempotent_function(  # type: ignore[untyped-decorator]
            data_keyword_argument="identity",
            persistence_store=RedisCachePersistenceLayer(client=self.client),
            config=config,
            key_prefix=self.powertools_prefix,
        )
        def handle(msg: Any, identity: dict[str, str]) -> bool:
            return handler(msg)

        self.handle = handle

    @property
    def powertools_prefix(self) -> str:
        return f"{POWERTOOLS_KEY_PREFIX}-{self.app}"

    @property
    def key_pattern(self) -> str:
        return f"{self.powertools_prefix}#*"

    def consume(self, item: Any) -> Any:
        identity = {"topic": item.topic, "tag": item.tags.decode(), "key": uniq_key(item)}
        return self.handle(item, identity=identity)


class PowertoolsFresh(PowertoolsCase):
    name = "powertools_fresh"


class PowertoolsDup(PowertoolsCase):
    name = "powertools_dup"
    duplicates = True


# -- MySQL ---------------------------------------------------------------------------------


class MySQLCase(Case):
    """A case on the bench's MariaDB tables; ``cleanup`` deletes this case's rows."""

    needs = frozenset({"mysql"})
    quick_n, full_n = 3_000, 10_000
    table: ClassVar[str]

    def setup(self) -> None:
        self.connect = self.ctx.servers.mysql_connect()
        self.admin = self.connect()
        self.admin.autocommit(True)

    def sql(self, statement: str, params: Optional[tuple[Any, ...]] = None) -> None:
        cur = self.admin.cursor()
        try:
            cur.execute(statement, params)
        finally:
            cur.close()

    def make_table(self, schema: str, table: Optional[str] = None) -> None:
        """Drop and create this case's table (or ``table``), once per run, so it has the
        current schema (a table left by an older run may differ; the cases sharing it set up
        in turn)."""
        table = self.table if table is None else table
        if f"mysql:{table}" not in self.ctx.tables_made:
            self.sql(f"DROP TABLE IF EXISTS `{table}`")
            self.sql(schema)
            self.ctx.tables_made.add(f"mysql:{table}")

    def cleanup(self) -> None:
        self.sql(f"DELETE FROM `{self.table}` WHERE application_name = %s", (self.app,))

    def close(self) -> None:
        super().close()
        self.admin.close()


class SQLListenerCase(Case):
    """The library's listener on a SQL case's table, given the connection factory
    (``self.connect``) as a user gives it; the store's connections are closed at the end."""

    connect: Callable[[], Any]
    table: ClassVar[str]

    listener: DedupConcurrentListener

    def start_listener(self) -> None:
        config = DedupConfig.enable_dedup_consume_config(
            self.app, self.connect, table_name=self.table, **listener_options()
        )
        self.listener = BenchListener(config, self.handler)

    def consume(self, item: Any) -> Any:
        return self.listener(item)

    def close(self) -> None:
        super().close()
        assert self.listener.dedup_config is not None
        assert self.listener.dedup_config.store is not None
        self.listener.dedup_config.store.close()


class LibraryMySQLCase(SQLListenerCase, MySQLCase):
    table = LIBRARY_TABLE

    def setup(self) -> None:
        super().setup()
        self.make_table(schema_sql(self.table))
        self.start_listener()


class MySQLFresh(LibraryMySQLCase):
    name = "mysql_fresh"


class MySQLDup(LibraryMySQLCase):
    name = "mysql_dup"
    duplicates = True


class MySQLNaiveFresh(MySQLCase):
    """The Java JDBC algorithm (INSERT + UPDATE, autocommit) on the Java original's table."""

    name = "mysql_naive_fresh"
    table = NAIVE_TABLE

    def setup(self) -> None:
        super().setup()
        self.make_table(NAIVE_SCHEMA.format(table=self.table))
        self.naive = NaiveMySQLDedup(self.connect(), self.table, self.app, self.handler)

    def consume(self, item: Any) -> Any:
        return self.naive(item)

    def close(self) -> None:
        super().close()
        self.naive.conn.close()


# -- PostgreSQL ------------------------------------------------------------------------------


FILLER_ROWS = 20_000
# A day's records of another application, CONSUMED, in each schema.
LIBRARY_FILLER = """\
INSERT INTO {table} (dedup_key, application_name, topic, tag, msg_uniq_key, status,
  owner_token, expire_time)
SELECT sha256(i::text::bytea), 'bench-filler', 'T', 'TagBench', i::text, 'CONSUMED', 'filler',
  now() + interval '1 day'
FROM generate_series(1, {rows}) AS i"""
NAIVE_FILLER = """\
INSERT INTO {table} (application_name, topic, tag, msg_uniq_key, status, expire_time)
SELECT 'bench-filler', 'T', 'TagBench', i::text, 'CONSUMED', 0
FROM generate_series(1, {rows}) AS i"""


class PostgresCase(Case):
    """A case on the bench's PostgreSQL tables; ``cleanup`` deletes this case's rows."""

    needs = frozenset({"postgres"})
    quick_n, full_n = 3_000, 10_000
    table: ClassVar[str]

    def setup(self) -> None:
        self.connect = self.ctx.servers.postgres_connect()
        self.admin = self.connect()
        self.admin.autocommit = True

    def make_table(
        self, statements: Sequence[str], filler: str = "", table: Optional[str] = None
    ) -> None:
        """Drop and create this case's table, once per run (a table left by an older run may
        have another schema; the cases sharing it set up in turn), with ``filler`` rows of
        another application in it and its statistics taken. A table the planner sees empty
        gets sequential scans in the generic plans of prepared statements (measured: the
        naive port's UPDATE by its four-column key scanned the table that each repetition
        grows, and ran at half speed); a table in use holds a day's records."""
        table = self.table if table is None else table
        if f"postgres:{table}" not in self.ctx.tables_made:
            self.admin.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in statements:
                self.admin.execute(statement)
            if filler:
                self.admin.execute(filler.format(table=table, rows=FILLER_ROWS))
            self.admin.execute(f"ANALYZE {table}")
            self.ctx.tables_made.add(f"postgres:{table}")

    def cleanup(self) -> None:
        self.admin.execute(f"DELETE FROM {self.table} WHERE application_name = %s", (self.app,))

    def close(self) -> None:
        super().close()
        self.admin.close()


class LibraryPostgresCase(SQLListenerCase, PostgresCase):
    """The library's listener on a PostgreSQL store: a partial of psycopg.connect, as the README
    shows it (the store's own pool)."""

    table = LIBRARY_TABLE

    def setup(self) -> None:
        super().setup()
        self.make_table(postgres_schema(self.table), LIBRARY_FILLER)
        self.start_listener()


class PostgresFresh(LibraryPostgresCase):
    name = "pg_fresh"


class PostgresDup(LibraryPostgresCase):
    name = "pg_dup"
    duplicates = True


class PostgresNaiveFresh(PostgresCase):
    """The Java JDBC algorithm (INSERT + UPDATE, autocommit) on the Java original's table, on
    PostgreSQL."""

    name = "pg_naive_fresh"
    table = NAIVE_TABLE

    def setup(self) -> None:
        super().setup()
        self.make_table([NAIVE_PG_SCHEMA.format(table=self.table)], NAIVE_FILLER)
        self.naive = NaivePostgresDedup(self.connect(), self.table, self.app, self.handler)

    def consume(self, item: Any) -> Any:
        return self.naive(item)

    def close(self) -> None:
        super().close()
        self.naive.conn.close()


# -- MySQL, exactly-once: the same business transaction with and without the dedup record --

TX_ACCOUNTS = 16  # account rows per case, updated round-robin

TX_ACCOUNT_SCHEMA = f"""CREATE TABLE `{TX_ACCOUNT_TABLE}` (
  application_name VARCHAR(191) NOT NULL,
  id               INT          NOT NULL,
  balance          BIGINT       NOT NULL DEFAULT 0,
  PRIMARY KEY (application_name, id)
) ENGINE=InnoDB"""

TX_LEDGER_SCHEMA = f"""CREATE TABLE `{TX_LEDGER_TABLE}` (
  id               BIGINT AUTO_INCREMENT PRIMARY KEY,
  application_name VARCHAR(191) NOT NULL,
  account          INT          NOT NULL,
  msg_id           VARCHAR(128) NOT NULL,
  amount           INT          NOT NULL,
  KEY (application_name)
) ENGINE=InnoDB"""


def business_transaction(app: str, statements: int, quote: str = "`") -> BusinessTransaction:
    """The business writes of ``app``'s messages on the bench's account and ledger tables."""
    return BusinessTransaction(
        app, statements, TX_ACCOUNT_TABLE, TX_LEDGER_TABLE, TX_ACCOUNTS, quote=quote
    )


class MySQLTxCase(MySQLCase):
    """A business transaction per message (``statements`` statements, see
    :class:`BusinessTransaction`) on the bench's MariaDB; ``cleanup`` deletes this case's
    ledger rows (and dedup records). Single-threaded, fresh messages."""

    table = TX_LEDGER_TABLE
    statements: ClassVar[int] = 2

    def setup(self) -> None:
        super().setup()
        self.make_table(TX_LEDGER_SCHEMA)
        self.make_table(TX_ACCOUNT_SCHEMA, TX_ACCOUNT_TABLE)
        self.sql(f"DELETE FROM `{TX_ACCOUNT_TABLE}` WHERE application_name = %s", (self.app,))
        values = ", ".join(["(%s, %s, 0)"] * TX_ACCOUNTS)
        params = tuple(v for i in range(TX_ACCOUNTS) for v in (self.app, i))
        self.sql(
            f"INSERT INTO `{TX_ACCOUNT_TABLE}` (application_name, id, balance) VALUES {values}",
            params,
        )
        self.business = business_transaction(self.app, self.statements)

    def close(self) -> None:
        self.sql(f"DELETE FROM `{TX_ACCOUNT_TABLE}` WHERE application_name = %s", (self.app,))
        super().close()


class BareTransaction(Case):
    """Mixed into a transaction case: the business transaction on ``self.conn`` (opened by the
    case, its transaction begun by its first statement), ended by :meth:`end` (COMMIT; the
    floor cases send the dedup record with it), rolled back on an error."""

    conn: Any
    business: BusinessTransaction

    def consume(self, item: Any) -> Any:
        try:
            self.handler(item)
            self.business(self.conn, item)
            self.end(item)
        except BaseException:
            self.conn.rollback()
            raise
        return OK

    def end(self, item: Any) -> None:
        self.conn.commit()

    def record_row(self, item: Any) -> tuple[Any, ...]:
        """The dedup record of ``item`` as the library writes it: key, readable columns,
        owner, retention (ms)."""
        digest = element_digest(DedupElement(self.app, item.topic, TAG, item.id))
        return (digest, self.app, item.topic, TAG, item.id, "owner.1@1", RESERVE_MINUTES * 60_000)

    def close(self) -> None:
        super().close()
        self.conn.close()


class ListenerTransaction(SQLListenerCase):
    """Mixed into a transaction case: the same business transaction through
    :class:`TransactionalDedupListener` on the case's connection factory, the writes through
    ``conn``, the dedup record sent with the COMMIT (the library's table)."""

    business: BusinessTransaction

    def start_tx_listener(self) -> None:
        config = DedupConfig.enable_dedup_consume_config(
            self.app, self.connect, table_name=LIBRARY_TABLE, **listener_options()
        )
        self.listener = BenchTxListener(config, self.handler, self.business)


def run_with_commit(conn: Any, statement: str, params: Sequence[Any]) -> None:
    """MySQL: ``statement; COMMIT`` in one text (one round trip), every result read."""
    cur = conn.cursor()
    try:
        cur.execute(statement, params)
        while cur.nextset():
            pass
    finally:
        cur.close()


class MySQLTxPlain(BareTransaction, MySQLTxCase):
    """The business transaction without dedup: the case opens it on its own connection
    (autocommit off, as the library's transaction connections), writes, COMMITs."""

    name = "mysql_tx_plain"

    def setup(self) -> None:
        super().setup()
        self.conn = self.connect()
        self.conn.autocommit(False)


class MySQLTxRecord(MySQLTxPlain):
    """The design's floor: ``mysql_tx_plain`` plus the dedup record, written by hand as the
    library writes it (the same row in the library's table, its INSERT sent with the COMMIT
    in one round trip), with none of the library's Python. ``mysql_tx_record/mysql_tx_plain``
    is the most a listener of this design can reach on the machine; the library's own cost is
    the gap between it and ``mysql_tx_dedup``."""

    name = "mysql_tx_record"

    def setup(self) -> None:
        super().setup()
        self.make_table(schema_sql(LIBRARY_TABLE), LIBRARY_TABLE)
        self.record = RECORD_INSERT_SQL.format(table=f"`{LIBRARY_TABLE}`") + "; COMMIT"

    def end(self, item: Any) -> None:
        run_with_commit(self.conn, self.record, self.record_row(item))

    def cleanup(self) -> None:
        super().cleanup()
        self.sql(f"DELETE FROM `{LIBRARY_TABLE}` WHERE application_name = %s", (self.app,))


class MySQLTxRecordNarrow(MySQLTxRecord):
    """``mysql_tx_record`` with a narrower record: the same statement and table, the readable
    columns empty but the application's (which ``stats`` counts by), as a record that kept
    only what ``inspect`` reads (it looks a record up by its key). Information:
    ``mysql_tx_record_narrow/mysql_tx_record``, issue 34.5's question."""

    name = "mysql_tx_record_narrow"
    in_quick = False

    def record_row(self, item: Any) -> tuple[Any, ...]:
        return narrow(super().record_row(item))


def narrow(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A record row with its topic, tag and key texts empty (key, application kept)."""
    key, app, _, _, _, *rest = row
    return (key, app, "", "", "", *rest)


class BenchTxListener(TransactionalDedupListener):
    """The exactly-once listener, as a user writes it: the business transaction on ``conn``."""

    def __init__(self, config: DedupConfig, handler: Callable[[Any], bool], business: Any) -> None:
        super().__init__(config)
        self.handler = handler
        self.business = business

    def do_handle_msg(self, msg: Any, conn: Any) -> bool:
        self.handler(msg)
        self.business(conn, msg)
        return True


class MySQLTxDedup(ListenerTransaction, MySQLTxCase):
    """The same business transaction through :class:`TransactionalDedupListener` (a
    mysqlclient factory)."""

    name = "mysql_tx_dedup"

    def setup(self) -> None:
        super().setup()
        self.make_table(schema_sql(LIBRARY_TABLE), LIBRARY_TABLE)
        self.start_tx_listener()

    def cleanup(self) -> None:
        super().cleanup()
        self.sql(f"DELETE FROM `{LIBRARY_TABLE}` WHERE application_name = %s", (self.app,))


class MySQLTx12Plain(MySQLTxPlain):
    """``mysql_tx_plain`` with a 12-statement business transaction (6 UPDATEs, 6 INSERTs)."""

    name = "mysql_tx12_plain"
    statements = 12
    in_quick = False


class MySQLTx12Dedup(MySQLTxDedup):
    """``mysql_tx_dedup`` with a 12-statement business transaction (6 UPDATEs, 6 INSERTs)."""

    name = "mysql_tx12_dedup"
    statements = 12
    in_quick = False


# -- PostgreSQL, exactly-once: the same business transaction with and without the record ----

PG_TX_ACCOUNT_SCHEMA = f"""CREATE TABLE {TX_ACCOUNT_TABLE} (
  application_name varchar(191) NOT NULL,
  id               int          NOT NULL,
  balance          bigint       NOT NULL DEFAULT 0,
  PRIMARY KEY (application_name, id)
)"""

PG_TX_LEDGER_SCHEMA = (
    f"""CREATE TABLE {TX_LEDGER_TABLE} (
  id               bigserial    PRIMARY KEY,
  application_name varchar(191) NOT NULL,
  account          int          NOT NULL,
  msg_id           varchar(128) NOT NULL,
  amount           int          NOT NULL
)""",
    f"CREATE INDEX ON {TX_LEDGER_TABLE} (application_name)",
)


class PostgresTxCase(PostgresCase):
    """A business transaction per message (:class:`BusinessTransaction`) on the bench's
    PostgreSQL; ``cleanup`` deletes this case's ledger rows (and dedup records).
    Single-threaded, fresh messages."""

    table = TX_LEDGER_TABLE
    statements: ClassVar[int] = 2

    def setup(self) -> None:
        super().setup()
        self.make_table(PG_TX_LEDGER_SCHEMA)
        self.make_table([PG_TX_ACCOUNT_SCHEMA], table=TX_ACCOUNT_TABLE)
        self.make_table(postgres_schema(LIBRARY_TABLE), LIBRARY_FILLER, LIBRARY_TABLE)
        self.admin.execute(
            f"DELETE FROM {TX_ACCOUNT_TABLE} WHERE application_name = %s", (self.app,)
        )
        self.admin.execute(
            f"INSERT INTO {TX_ACCOUNT_TABLE} (application_name, id) "
            "SELECT %s, i FROM generate_series(0, %s) AS i",
            (self.app, TX_ACCOUNTS - 1),
        )
        self.business = business_transaction(self.app, self.statements, quote='"')

    def cleanup(self) -> None:
        super().cleanup()
        self.admin.execute(f"DELETE FROM {LIBRARY_TABLE} WHERE application_name = %s", (self.app,))

    def close(self) -> None:
        self.admin.execute(
            f"DELETE FROM {TX_ACCOUNT_TABLE} WHERE application_name = %s", (self.app,)
        )
        super().close()


def pipeline_with_commit(conn: Any, statement: str, params: Sequence[Any]) -> None:
    """PostgreSQL: ``statement`` and ``COMMIT`` in one round trip (psycopg's pipeline, COMMIT
    as a statement of it: ``conn.commit()`` there would sync once more)."""
    with conn.pipeline():
        conn.execute(statement, params)
        conn.execute("COMMIT")


class PostgresTxPlain(BareTransaction, PostgresTxCase):
    """The business transaction without dedup, as psycopg runs one: a connection in its
    default mode (psycopg sends BEGIN before the first statement), the writes, COMMIT."""

    name = "pg_tx_plain"

    def setup(self) -> None:
        super().setup()
        self.conn = self.connect()


class PostgresTxRecord(PostgresTxPlain):
    """The design's floor on PostgreSQL: ``pg_tx_plain`` plus the dedup record, written by hand
    with the library's own statement (the same row in the library's table), sent with the
    COMMIT in one round trip (:func:`pipeline_with_commit`), none of the library's Python.
    Round trips per message, counted on the wire: 4, as many as ``pg_tx_plain`` (BEGIN, the
    two statements, COMMIT)."""

    name = "pg_tx_record"

    def setup(self) -> None:
        super().setup()
        self.record = RECORD_COMMIT_SQL.format(table=LIBRARY_TABLE)

    def end(self, item: Any) -> None:
        pipeline_with_commit(self.conn, self.record, self.record_row(item))


class PostgresTxRecordNarrow(PostgresTxRecord):
    """``pg_tx_record`` with a narrower record (:func:`narrow`: the readable columns empty but
    the application's); information: ``pg_tx_record_narrow/pg_tx_record``."""

    name = "pg_tx_record_narrow"
    in_quick = False

    def record_row(self, item: Any) -> tuple[Any, ...]:
        return narrow(super().record_row(item))


class PostgresTxDedup(ListenerTransaction, PostgresTxCase):
    """The same business transaction through :class:`TransactionalDedupListener` (a psycopg
    factory, as the README shows it)."""

    name = "pg_tx_dedup"

    def setup(self) -> None:
        super().setup()
        self.start_tx_listener()


IN_PROCESS_CASES: tuple[type[Case], ...] = (
    Noop,
    MemoryFresh,
    MemoryDup,
    MemoryPrometheusFresh,
    RedisFresh,
    RedisDup,
    RedisNaiveFresh,
    RedisNaiveDup,
    PowertoolsFresh,
    PowertoolsDup,
    RedisBatch32Fresh,
    RedisThreads8Fresh,
    RedisThreads8NoCoalesceFresh,
    RedisThreads8LockWakeFresh,
    MySQLFresh,
    MySQLDup,
    MySQLNaiveFresh,
    PostgresFresh,
    PostgresDup,
    PostgresNaiveFresh,
    MySQLTxPlain,
    MySQLTxDedup,
    MySQLTxRecord,
    MySQLTx12Plain,
    MySQLTx12Dedup,
    MySQLTxRecordNarrow,
    PostgresTxPlain,
    PostgresTxRecord,
    PostgresTxDedup,
    PostgresTxRecordNarrow,
)
