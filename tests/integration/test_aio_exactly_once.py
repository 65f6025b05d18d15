"""@exactly_once over an ``async def`` on the real servers: the function's writes through its
asyncio connection commit with its record, once per key, whatever the copies, failures and
cancellations; and no call blocks the event loop (asyncio's debug mode against a server that
answers late)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

import asyncmy
import psycopg
import psycopg_pool
import pytest

from rocketmq_dedup import (
    DedupConfig,
    DedupConfigError,
    DedupStatus,
    DuplicateConsumedError,
    DuplicateInProgressError,
    TransactionMisuseError,
    exactly_once,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.sql_transaction import AsyncSqlTransaction
from tests.aio_support import DelayProxy
from tests.support import MYSQL, PG_DSN, sql

#: The asyncio sources: PostgreSQL through a factory of AsyncConnection (the store's own pools)
#: or an application's AsyncConnectionPool; MariaDB through asyncmy.
SOURCES = ["postgres", "postgres_pool", "mariadb"]
EFFECTS = f"aioeo_effects_{uuid.uuid4().hex[:8]}"


def run(work: Callable[[], Awaitable[Any]], debug: bool = False) -> Any:
    return asyncio.run(work(), debug=debug)


def on_postgres(statement: str, *params: Any) -> List[Any]:
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture(scope="module")
def table() -> Iterator[str]:
    """A fresh dedup table name and an effects table (the functions' writes) on both servers."""
    name = f"aioeo_{uuid.uuid4().hex[:8]}"
    on_postgres(f"CREATE TABLE {EFFECTS} (k text NOT NULL, v text)")
    sql(f"CREATE TABLE {EFFECTS} (k varchar(64) NOT NULL, v varchar(64)) ENGINE=InnoDB")
    yield name
    for drop in (f"DROP TABLE {EFFECTS}", f"DROP TABLE IF EXISTS {name}"):
        on_postgres(drop)
        sql(drop)


def effects(key: str) -> List[str]:
    """The committed rows the functions wrote for ``key`` on either server (read by another
    session; a key is written on one server only)."""
    query = f"SELECT v FROM {EFFECTS} WHERE k = %s"
    return [v for (v,) in [*on_postgres(query, key), *sql(query, key)]]


async def write(conn: Any, key: str, value: str = "paid") -> None:
    """The function's write through its ``conn`` (psycopg's or asyncmy's)."""
    async with conn.cursor() as cursor:
        await cursor.execute(f"INSERT INTO {EFFECTS} (k, v) VALUES (%s, %s)", (key, value))


@contextlib.asynccontextmanager
async def configured(
    source: str, table: str, where: Optional[Tuple[str, int]] = None, app: str = "", **settings: Any
) -> AsyncIterator[DedupConfig]:
    """A config on the asyncio store of ``source`` (at ``where``: host and port, default the
    shared server), its table made; closed (and its pool) on the way out."""
    pool = None
    client: Any
    if source == "mariadb":
        host, port = where or (MYSQL["host"], MYSQL["port"])
        params = {k: v for k, v in MYSQL.items() if k not in ("database", "host", "port")}
        client = functools.partial(
            asyncmy.connect, db=MYSQL["database"], host=host, port=port, **params
        )
    else:
        dsn = PG_DSN
        if where is not None:
            parts = urlsplit(PG_DSN)
            netloc = f"{parts.username}:{parts.password}@{where[0]}:{where[1]}"
            dsn = parts._replace(netloc=netloc).geturl()
        if source == "postgres":
            client = functools.partial(psycopg.AsyncConnection.connect, dsn)
        else:
            pool = psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=16, open=False)
            client = pool
            await pool.open()
    config = DedupConfig.enable_dedup_consume_config(
        app or f"app-{uuid.uuid4().hex[:12]}", client, table_name=table, **settings
    )
    try:
        assert config.async_store is not None
        await config.async_store.create_table()  # type: ignore[attr-defined]
        yield config
    finally:
        await config.aclose()
        if pool is not None:
            await pool.close()


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def key() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


def test_a_fresh_key_commits_its_writes_with_its_record_once(
    source: str, table: str, key: str
) -> None:
    """The first call commits its row and its CONSUMED record and returns the function's
    value; the next calls do not run the function and raise DuplicateConsumedError."""
    runs: List[str] = []

    async def work() -> None:
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order: order, topic="payments")
            async def pay(conn: Any, order: str) -> str:
                runs.append(order)
                await write(conn, order)
                return f"paid {order}"

            assert await pay(key) == f"paid {key}"
            for _ in range(2):
                with pytest.raises(DuplicateConsumedError):
                    await pay(key)
            assert config.async_store is not None
            element = DedupElement(config.application_name, "payments", "", key)
            record = await config.async_store.read(element)
            assert record is not None and record.status is DedupStatus.CONSUMED

    run(work)
    assert runs == [key]
    assert effects(key) == ["paid"]


def live_transactions() -> int:
    """The asyncio transactions the interpreter still holds."""
    return sum(isinstance(o, AsyncSqlTransaction) for o in gc.get_objects())


def test_a_calls_transaction_is_freed_as_soon_as_it_ends(source: str, table: str) -> None:
    """With the cyclic garbage collector off, the transactions of calls that committed are
    gone once each call ended: the connection proxy the function was given refers back to its
    transaction, and that cycle would leave every call's transaction to the collector (the
    sync transactions' fix, on the asyncio ones). (A call that raises is left to the collector
    by its exception's traceback, as any raised exception's frames are.)"""

    async def work() -> None:
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order, fail: order, topic="payments")
            async def pay(conn: Any, order: str, fail: bool) -> None:
                await write(conn, order)
                if fail:
                    raise ValueError("declined")

            await pay(f"warm-{uuid.uuid4().hex[:8]}", False)  # opens the connections
            gc.collect()
            gc.disable()
            try:
                before = live_transactions()
                for _ in range(3):
                    await pay(f"order-{uuid.uuid4().hex[:12]}", False)
                assert live_transactions() == before
            finally:
                gc.enable()

    run(work)


def test_a_function_that_raises_rolls_back_its_writes_and_record_and_runs_again(
    source: str, table: str, key: str
) -> None:
    """The function writes, then raises: the write and the record are rolled back, the
    exception propagates; the next call runs and commits once."""
    attempts: List[int] = []

    async def work() -> None:
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order: order, topic="payments")
            async def pay(conn: Any, order: str) -> None:
                attempts.append(1)
                await write(conn, order, f"attempt {len(attempts)}")
                if len(attempts) == 1:
                    raise ValueError("card declined")

            with pytest.raises(ValueError, match="card declined"):
                await pay(key)
            assert effects(key) == []
            assert config.async_store is not None
            element = DedupElement(config.application_name, "payments", "", key)
            assert await config.async_store.read(element) is None
            await pay(key)

    run(work)
    assert effects(key) == ["attempt 2"]


def test_a_function_that_commits_by_itself_is_refused_and_rolled_back(
    source: str, table: str, key: str
) -> None:
    """await conn.commit() in the function is refused (TransactionMisuseError raised into
    it); the transaction rolls back and the caller gets the refusal."""

    async def work() -> None:
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order: order)
            async def pay(conn: Any, order: str) -> None:
                await write(conn, order)
                await conn.commit()

            with pytest.raises(TransactionMisuseError):
                await pay(key)

    run(work)
    assert effects(key) == []


def test_concurrent_tasks_with_one_key_commit_once(source: str, table: str, key: str) -> None:
    """16 tasks call with one key at once: one commits; every other call is a duplicate
    (committed, or in progress in this process), and the row exists once."""

    async def work() -> List[str]:
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order: order)
            async def pay(conn: Any, order: str) -> None:
                await write(conn, order)
                await asyncio.sleep(0.05)  # the others arrive while it is in its transaction

            async def attempt() -> str:
                try:
                    await pay(key)
                except DuplicateConsumedError:
                    return "duplicate"
                except DuplicateInProgressError:
                    return "in progress"
                return "committed"

            return list(await asyncio.gather(*(attempt() for _ in range(16))))

    answers = run(work)
    assert answers.count("committed") == 1 and len(answers) == 16
    assert effects(key) == ["paid"]


def test_copies_in_two_processes_commit_once(source: str, table: str, key: str) -> None:
    """Two configs of one application (two processes' stores): the second copy runs while the
    first is still in its function ("at_commit": nothing locks it out) and commits first; the
    first's COMMIT then finds the record: its write is rolled back and it raises
    DuplicateConsumedError. The row exists once."""

    async def work() -> None:
        inside, finish = asyncio.Event(), asyncio.Event()
        async with (
            configured(source, table) as first_config,
            configured(source, table, app=first_config.application_name) as other,
        ):

            @exactly_once(first_config, key=lambda order: order, topic="pay")
            async def first(conn: Any, order: str) -> None:
                await write(conn, order, "first")
                inside.set()
                await finish.wait()

            @exactly_once(other, key=lambda order: order, topic="pay")
            async def second(conn: Any, order: str) -> str:
                await write(conn, order, "second")
                return "second committed"

            running = asyncio.ensure_future(first(key))
            await asyncio.wait_for(inside.wait(), 20)
            assert await second(key) == "second committed"
            finish.set()
            with pytest.raises(DuplicateConsumedError):
                await asyncio.wait_for(running, 20)

    run(work)
    assert effects(key) == ["second"]


def test_a_key_locked_by_another_process_is_in_progress_before_the_function(
    source: str, table: str, key: str
) -> None:
    """exactly_once_claim="before_handler": while another process's call holds the key's
    lock, a call does not run its function and raises DuplicateInProgressError once its wait
    ends; after the holder commits, a call is a duplicate of it."""
    runs: List[str] = []

    async def work() -> None:
        settings = {"exactly_once_claim": "before_handler"}
        inside, finish = asyncio.Event(), asyncio.Event()
        async with (
            configured(source, table, **settings) as holder_config,
            configured(source, table, app=holder_config.application_name, **settings) as other,
        ):

            @exactly_once(holder_config, key=lambda order: order, topic="pay")
            async def hold(conn: Any, order: str) -> None:
                await write(conn, order, "holder")
                inside.set()
                await finish.wait()

            @exactly_once(other, key=lambda o: o, topic="pay", in_progress_wait_milli_seconds=200)
            async def copy(conn: Any, order: str) -> None:
                runs.append(order)

            running = asyncio.ensure_future(hold(key))
            await asyncio.wait_for(inside.wait(), 20)
            with pytest.raises(DuplicateInProgressError):
                await copy(key)
            finish.set()
            await asyncio.wait_for(running, 20)
            with pytest.raises(DuplicateConsumedError):
                await copy(key)

    run(work)
    assert runs == []
    assert effects(key) == ["holder"]


def test_a_cancelled_call_rolls_back_and_a_later_call_runs(
    source: str, table: str, key: str
) -> None:
    """A call cancelled inside its function: its write is rolled back, no record is left,
    the caller sees CancelledError, and the next call runs and commits."""

    async def work() -> None:
        inside = asyncio.Event()
        async with configured(source, table) as config:

            @exactly_once(config, key=lambda order, value: order)
            async def pay(conn: Any, order: str, value: str) -> None:
                await write(conn, order, value)
                inside.set()
                await asyncio.sleep(30 if value == "cancelled" else 0)

            running = asyncio.ensure_future(pay(key, "cancelled"))
            await asyncio.wait_for(inside.wait(), 20)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert effects(key) == []
            await pay(key, "second")

    run(work)
    assert effects(key) == ["second"]


def test_an_async_def_on_a_store_without_asyncio_transactions_is_refused() -> None:
    """exactly_once over an async def on a config of a sync store, or of an asyncio store with
    no transactions (redis.asyncio): DedupConfigError naming what is supported, when
    decorated."""
    import redis.asyncio

    from rocketmq_dedup import MemoryDedupStore

    async def pay(conn: Any, order: str) -> None:
        pass

    config = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    with pytest.raises(DedupConfigError, match=r"async def, PostgreSQL.*asyncmy.*Memory"):
        exactly_once(config, key=lambda order: order)(pay)
    client = redis.asyncio.Redis(port=1)  # never connected: refused before any I/O
    config = DedupConfig.enable_dedup_consume_config("app", client)
    with pytest.raises(DedupConfigError, match=r"asyncio SQL store.*AsyncRedisDedupStore"):
        exactly_once(config, key=lambda order: order)(pay)


# -- the event loop is never blocked ----------------------------------------------------------

DELAY = 0.1  # each way through the proxy
SLOW = 0.08  # asyncio's slow-callback threshold for these runs


@pytest.fixture
def slow_server(source: str) -> Iterator[Tuple[str, int]]:
    """The source's shared server behind a proxy that holds each chunk 100 ms: its address."""
    if source == "mariadb":
        target = (str(MYSQL["host"]), int(MYSQL["port"]))
    else:
        parts = urlsplit(PG_DSN)
        target = (parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy = DelayProxy(target, DELAY)
    yield "127.0.0.1", proxy.port
    proxy.close()


def slow_callbacks(
    workload: Callable[[DedupConfig, str], Awaitable[None]],
    source: str,
    where: Tuple[str, int],
    table: str,
    caplog: pytest.LogCaptureFixture,
) -> List[str]:
    """Run ``workload`` on a debug-mode loop, on a config of ``source`` at ``where``; the slow
    callbacks asyncio logged."""

    async def work() -> None:
        asyncio.get_running_loop().slow_callback_duration = SLOW
        async with configured(source, table, where=where) as config:
            await workload(config, f"order-{uuid.uuid4().hex[:12]}")

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(work, debug=True)
    return [r.getMessage() for r in caplog.records if "took" in r.getMessage()]


def test_exactly_once_calls_never_block_the_event_loop(
    source: str, slow_server: Tuple[str, int], table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On a server 100 ms away each way, asyncio's debug mode (slow callbacks over 80 ms
    logged) finds none in a run of fresh calls, duplicates, a failure and concurrent copies."""

    async def workload(config: DedupConfig, key: str) -> None:
        @exactly_once(config, key=lambda order, fail=False: order)
        async def pay(conn: Any, order: str, fail: bool = False) -> None:
            await write(conn, order)
            if fail:
                raise ValueError("declined")

        with pytest.raises(ValueError):
            await pay(key, fail=True)
        await pay(key)
        with pytest.raises(DuplicateConsumedError):
            await pay(key)
        answers = await asyncio.gather(
            *(pay(f"{key}-{i % 2}") for i in range(4)), return_exceptions=True
        )
        assert sum(answer is None for answer in answers) == 2

    assert slow_callbacks(workload, source, slow_server, table, caplog) == []


@pytest.mark.parametrize("source", ["postgres"])
def test_the_check_catches_a_call_that_blocks_the_event_loop(
    source: str, slow_server: Tuple[str, int], table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same check on a sync exactly_once call made on the loop (its transaction waits for
    the slow server by blocking) logs slow callbacks: the check above can fail."""
    parts = urlsplit(PG_DSN)
    netloc = f"{parts.username}:{parts.password}@{slow_server[0]}:{slow_server[1]}"
    slow_dsn = parts._replace(netloc=netloc).geturl()

    async def workload(config: DedupConfig, key: str) -> None:
        from rocketmq_dedup.stores.postgres import PostgresDedupStore
        from tests.support import pg_connect

        sync_config = DedupConfig.enable_dedup_consume_config(
            config.application_name, PostgresDedupStore(pg_connect(slow_dsn), table)
        )

        @exactly_once(sync_config, key=lambda order: order)
        def pay(conn: Any, order: str) -> None:
            conn.execute(f"INSERT INTO {EFFECTS} (k, v) VALUES (%s, 'blocking')", (order,))

        pay(key)
        sync_config.close()

    slow = slow_callbacks(workload, source, slow_server, table, caplog)
    assert slow, "a call that blocks the loop went unnoticed"
