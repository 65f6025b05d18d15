"""The fault classics on the asyncio path, on private servers these tests start (never the
shared ones): the store killed, frozen and restarted while 32 messages at a time flow through
the asyncio listener. During a fault every message is answered RECONSUME_LATER (policy
"reconsume_later": never a handler without dedup), nothing raises, and the event loop keeps
running (a ticker task on it keeps ticking); after it, the store reconnects by itself and every
key is applied once."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Awaitable, Callable, Dict, Iterator, List

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.testing import GrpcMessage
from tests.integration.private_servers import DATABASE, PrivateMariaDB, PrivateRedis
from tests.support import PrivatePostgres

SUCCESS, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
IN_FLIGHT = 32
#: A claim sent before a fault whose answer never came (a frozen server runs it when it thaws)
#: holds its key for one lease, then the broker's retry runs it: a short one keeps the test
#: short.
SHORT_LEASE = {"dedup_processing_expire_milli_seconds": 2000}


class Applying(AsyncDedupConcurrentListener):
    """Applies each key (counted), 20 ms a message."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.applied: Dict[str, int] = {}

    async def do_handle_msg(self, msg: Any) -> bool:
        await asyncio.sleep(0.02)
        self.applied[msg.message_id] = self.applied.get(msg.message_id, 0) + 1
        return True


async def deliver_all(listener: Applying, keys: List[str]) -> Dict[str, ConsumeStatus]:
    """Each key once, at most :data:`IN_FLIGHT` at a time; the answers."""
    slots = asyncio.Semaphore(IN_FLIGHT)
    answers: Dict[str, ConsumeStatus] = {}

    async def one(key: str) -> None:
        async with slots:
            answers[key] = await listener(GrpcMessage(key))

    await asyncio.gather(*(one(key) for key in keys))
    return answers


async def redeliver_until_acked(listener: Applying, keys: List[str], seconds: float) -> None:
    """The broker's retries: the keys answered RECONSUME_LATER again, until all are acked."""
    deadline = time.monotonic() + seconds
    pending = list(keys)
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} keys never acked"
        answers = await deliver_all(listener, pending)
        pending = [key for key, answer in answers.items() if answer is not SUCCESS]
        if pending:
            await asyncio.sleep(0.2)


class Ticker:
    """A task on the loop that counts ticks of 10 ms: it keeps ticking unless the loop is
    blocked."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1


async def fault_run(
    make_config: Callable[[], Awaitable[Any]],
    fault: Callable[[], Any],
    repair: Callable[[], Any],
    fault_seconds: float,
) -> None:
    """The classic: keys flow, the fault, keys answered LATER while the loop keeps ticking,
    the repair, every key applied once."""
    config, close = await make_config()
    try:
        async with Applying(config) as listener:
            before = [f"before-{i}" for i in range(64)]
            assert set((await deliver_all(listener, before)).values()) == {SUCCESS}
            ticker = Ticker()
            await asyncio.to_thread(fault)
            during = [f"during-{i}" for i in range(64)]
            begin, ticks = time.monotonic(), ticker.ticks
            answers = await deliver_all(listener, during)
            assert set(answers.values()) == {LATER}, "a message was acked during the fault"
            await asyncio.sleep(max(0.0, fault_seconds - (time.monotonic() - begin)))
            elapsed, ticked = time.monotonic() - begin, ticker.ticks - ticks
            assert ticked >= elapsed / 0.01 * 0.3, "the loop stopped ticking during the fault"
            assert not any(key in listener.applied for key in during)
            await asyncio.to_thread(repair)
            await redeliver_until_acked(listener, during, 60)
            ticker.task.cancel()
            assert all(listener.applied[key] == 1 for key in before + during)
    finally:
        await close()


@pytest.fixture
def redis_server() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.stop()


def redis_config(server: PrivateRedis, app_name: str) -> Callable[[], Awaitable[Any]]:
    async def make() -> Any:
        client = redis.asyncio.Redis(
            port=server.port,
            socket_timeout=1,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        config = DedupConfig.enable_dedup_consume_config(
            app_name, client, store_failure_policy="reconsume_later", **SHORT_LEASE
        )

        async def close() -> None:
            await config.aclose()
            await client.aclose()

        return config, close

    return make


def test_redis_killed_and_restarted_under_concurrency(
    redis_server: PrivateRedis, app_name: str
) -> None:
    """Redis SIGKILLed while messages flow: each answered RECONSUME_LATER, the loop ticking;
    a new server on the port: the store reconnects and every key is applied once."""
    asyncio.run(
        fault_run(redis_config(redis_server, app_name), redis_server.kill, redis_server.start, 1.0)
    )


def test_redis_frozen_under_concurrency(redis_server: PrivateRedis, app_name: str) -> None:
    """Redis SIGSTOPped (a frozen server: connections open, no answer): the claims time out
    (socket_timeout 1 s) and are answered RECONSUME_LATER, the loop ticking throughout;
    SIGCONT: the server runs the claims it had queued, which hold their keys one lease (no
    caller took them), then every key is applied once."""
    asyncio.run(
        fault_run(redis_config(redis_server, app_name), redis_server.freeze, redis_server.thaw, 2.0)
    )


def sql_config(connect: Callable[[], Any], app_name: str) -> Callable[[], Awaitable[Any]]:
    """An asyncio SQL store on ``connect`` (its table made; no start-up check: the faults
    come later), a store failure answered RECONSUME_LATER."""

    async def make() -> Any:
        config = DedupConfig.enable_dedup_consume_config(
            app_name,
            connect,
            store_failure_policy="reconsume_later",
            check_store=False,
            **SHORT_LEASE,
        )
        await config.async_store.create_table()  # type: ignore[union-attr]
        return config, config.aclose

    return make


@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres("aio-faults").create()
    yield server
    server.destroy()


def test_postgres_killed_and_restarted_under_concurrency(
    postgres: PrivatePostgres, app_name: str
) -> None:
    """The asyncio PostgreSQL store: the server SIGKILLed while messages flow (RECONSUME_LATER,
    the loop ticking), started again: the lost connections replaced and every key applied
    once."""
    import psycopg

    connect = functools.partial(psycopg.AsyncConnection.connect, postgres.dsn, connect_timeout=2)
    asyncio.run(fault_run(sql_config(connect, app_name), postgres.kill, postgres.start, 1.0))


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateMariaDB]:
    server = PrivateMariaDB(tmp_path_factory.mktemp("aio-faults-mariadb"))
    yield server
    server.stop()


def mysql_config(server: PrivateMariaDB, app_name: str) -> Callable[[], Awaitable[Any]]:
    """The asyncio MySQL store (asyncmy) on ``server``, its socket and statements timing out
    after 1 s (a frozen server)."""
    import asyncmy

    connect = functools.partial(
        asyncmy.connect,
        unix_socket=server.socket,
        user="root",
        db=DATABASE,
        connect_timeout=1,
        read_timeout=1,
    )
    return sql_config(connect, app_name)


def test_mysql_killed_and_restarted_under_concurrency(
    mariadb: PrivateMariaDB, app_name: str
) -> None:
    """The asyncio MySQL store (asyncmy): MariaDB SIGKILLed while messages flow
    (RECONSUME_LATER, the loop ticking), started again (InnoDB recovers): the lost connections
    replaced and every key applied once."""
    asyncio.run(fault_run(mysql_config(mariadb, app_name), mariadb.kill, mariadb.start, 1.0))


def test_mysql_frozen_under_concurrency(mariadb: PrivateMariaDB, app_name: str) -> None:
    """The asyncio MySQL store: MariaDB SIGSTOPped (connections open, no answer): the claims
    time out and are answered RECONSUME_LATER, the loop ticking throughout; SIGCONT: the claims
    it ran late hold their keys one lease, then every key is applied once."""
    asyncio.run(fault_run(mysql_config(mariadb, app_name), mariadb.freeze, mariadb.thaw, 2.0))
