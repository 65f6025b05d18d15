"""The PostgreSQL store when the server fails, on a private server this module starts, stops
and kills (never the shared one), for each kind of connection source; and when a pool has no
connection to give (not an outage: never a handler run without dedup)."""

from __future__ import annotations

import functools
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List

import psycopg
import psycopg_pool
import pytest
import sqlalchemy

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    DedupElement,
    PostgresDedupStore,
)
from rocketmq_dedup.errors import StorePoolExhaustedError, StoreUnavailableError
from rocketmq_dedup.stores import make_store
from rocketmq_dedup.stores.base import CLAIMED, Claim
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.test_redis_pool import Counting
from tests.support import PrivatePostgres, pg_connect, wait_for

pytestmark = pytest.mark.postgres
SUCCESS, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
TABLE = "t_rocketmq_dedup_outage"
SOURCES = ["factory", "pool", "sqlalchemy"]


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL server for this module, with the dedup table."""
    server = PrivatePostgres("outages").create()
    store = PostgresDedupStore(pg_connect(server.dsn), TABLE)
    store.create_table()
    store.close()
    yield server
    server.destroy()


@pytest.fixture
def running(server: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """The private server, started again after a test that stopped or killed it."""
    if server.pid is None:
        server.start()
    yield server
    if server.pid is None:
        server.start()


def source_of(kind: str, dsn: str, request: pytest.FixtureRequest) -> Any:
    """A connection source of ``kind`` on ``dsn``, closed at the end of the test."""
    if kind == "factory":
        return pg_connect(dsn, connect_timeout=3)
    if kind == "pool":
        pool = psycopg_pool.ConnectionPool(dsn, min_size=2, max_size=4, timeout=3, open=True)
        request.addfinalizer(pool.close)
        return pool
    engine = sqlalchemy.create_engine(
        dsn.replace("postgresql://", "postgresql+psycopg://"), connect_args={"connect_timeout": 3}
    )
    request.addfinalizer(engine.dispose)
    return engine


def listener_on(store: Any, app: str, **options: Any) -> Counting:
    config = DedupConfig.enable_dedup_consume_config(app, store, check_store=False, **options)
    return Counting(config)


def element(app: str, key: str) -> DedupElement:
    return DedupElement(app, "T", "", key)


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("stop", ["stop", "kill"])
def test_messages_after_a_server_restart_are_deduped_as_before(
    running: PrivatePostgres, kind: str, stop: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """The server stopped (or SIGKILLed) and started again between two messages: the next
    message reconnects without an error (the lost connections are replaced), and a duplicate
    from before the restart is still acked without its handler."""
    store = make_store(source_of(kind, running.dsn, request), table_name=TABLE)
    request.addfinalizer(store.close)
    listener = listener_on(store, app_name, store_failure_policy="reconsume_later")
    assert listener(ClassicMessage("before")) is SUCCESS
    getattr(running, stop)()
    running.start()
    assert listener(ClassicMessage("after")) is SUCCESS
    assert listener(ClassicMessage("before")) is SUCCESS
    assert listener.runs == {"before": 1, "after": 1}


@pytest.mark.parametrize("kind", ["factory", "sqlalchemy"])
@pytest.mark.parametrize("policy", ["consume", "reconsume_later"])
def test_a_stopped_server_is_an_outage_under_the_policy(
    running: PrivatePostgres, kind: str, policy: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """With the server down a claim raises StoreUnavailableError; the listener answers as
    store_failure_policy says (consume: the handler runs without dedup; reconsume_later: it
    does not), and dedups again once the server is back."""
    store = make_store(source_of(kind, running.dsn, request), table_name=TABLE)
    request.addfinalizer(store.close)
    listener = listener_on(store, app_name, store_failure_policy=policy)
    assert listener(ClassicMessage("m1")) is SUCCESS
    running.stop()
    with pytest.raises(StoreUnavailableError):
        store.claim(Claim(element(app_name, "x"), "o"), 60_000)
    during = listener(ClassicMessage("m2"))
    assert (during, listener.runs["m2"]) == ((SUCCESS, 1) if policy == "consume" else (LATER, 0))
    running.start()
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.runs["m1"] == 1


def test_a_pool_that_cannot_reach_the_server_is_consumed_later_whatever_the_policy(
    running: PrivatePostgres, app_name: str, request: pytest.FixtureRequest
) -> None:
    """A psycopg_pool pool whose server is down answers with its timeout (it hides the
    connection error): StorePoolExhaustedError, not an outage, so even under the "consume"
    policy no handler runs without dedup."""
    pool = source_of("pool", running.dsn, request)
    store = make_store(pool, table_name=TABLE)
    listener = listener_on(store, app_name)
    running.stop()
    pool.check()  # the pool drops the connections the server closed
    assert listener(ClassicMessage("m1")) is LATER
    assert listener.runs["m1"] == 0


# -- exhausted pools ------------------------------------------------------------------------


def exhausts(store: PostgresDedupStore, app: str, seconds: float) -> None:
    """A claim fails with StorePoolExhaustedError, not an outage, after about ``seconds``."""
    begin = time.monotonic()
    with pytest.raises(StorePoolExhaustedError) as caught:
        store.claim(Claim(element(app, "a"), "o"), 60_000)
    assert not isinstance(caught.value, StoreUnavailableError)
    assert time.monotonic() - begin >= seconds * 0.8


def test_the_stores_own_pool_waits_then_fails_as_exhausted(
    running: PrivatePostgres, app_name: str
) -> None:
    """With its one connection busy, a claim waits pool_timeout, then StorePoolExhaustedError;
    a connection given back goes to a waiting caller."""
    store = PostgresDedupStore(pg_connect(running.dsn), TABLE, pool_size=1, pool_timeout=0.3)
    try:
        held = store.pool.take()
        exhausts(store, app_name, 0.3)
        results: List[Any] = []
        store.pool.timeout = 30.0
        waiter = threading.Thread(
            target=lambda: results.append(store.claim(Claim(element(app_name, "b"), "o"), 60_000))
        )
        waiter.start()
        wait_for(lambda: store.pool.waiting == 1)
        store.pool.give(held)
        waiter.join(30)
        assert results == [CLAIMED]
    finally:
        store.close()


def test_an_applications_pool_without_a_free_connection_is_exhausted(
    running: PrivatePostgres, app_name: str
) -> None:
    """A psycopg_pool pool whose one connection the application holds: its timeout, then
    StorePoolExhaustedError; once given back the store claims."""
    pool = psycopg_pool.ConnectionPool(running.dsn, min_size=1, max_size=1, timeout=0.3, open=True)
    try:
        store = make_store(pool, table_name=TABLE)
        assert isinstance(store, PostgresDedupStore)
        conn = pool.getconn()
        exhausts(store, app_name, 0.3)
        pool.putconn(conn)
        assert store.claim(Claim(element(app_name, "a"), "o"), 60_000) == CLAIMED
    finally:
        pool.close()


def test_an_exhausted_pool_never_runs_handlers_without_dedup(
    running: PrivatePostgres, app_name: str
) -> None:
    """All pool_size connections busy is not an outage: under the default "consume" policy
    the messages are answered RECONSUME_LATER and no handler runs; once a connection is free
    each runs once."""
    store = PostgresDedupStore(pg_connect(running.dsn), TABLE, pool_size=1, pool_timeout=0.2)
    listener = listener_on(store, app_name)
    run = uuid.uuid4().hex[:8]
    batch = [ClassicMessage(f"{run}-{i}") for i in range(6)]
    try:
        held = store.pool.take()
        try:
            assert listener(ClassicMessage(f"{run}-single")) is LATER
            assert listener.consume_message(batch).status is LATER
            assert sum(listener.runs.values()) == 0
        finally:
            store.pool.give(held)
        assert listener(ClassicMessage(f"{run}-single")) is SUCCESS
        assert listener.consume_message(batch).status is SUCCESS
        assert set(listener.runs.values()) == {1} and len(listener.runs) == 7
    finally:
        listener.close()


# -- what check reports ------------------------------------------------------------------------


def test_check_reports_a_user_without_privileges_on_the_table(running: PrivatePostgres) -> None:
    """rocketmq-dedup check's diagnosis: a user who may connect but not write the table
    fails the privileges check (the table itself is fine)."""
    with psycopg.connect(running.dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS reader")
        admin.execute("CREATE ROLE reader LOGIN")
        admin.execute(f"GRANT SELECT ON {TABLE} TO reader")
    dsn = running.dsn.replace("postgres@", "reader@")
    store = PostgresDedupStore(functools.partial(psycopg.connect, dsn), TABLE)
    checks: Dict[str, Any] = {c.name: c for c in store.diagnose()}
    store.close()
    assert checks["table"].ok and checks["server"].ok and checks["encoding"].ok
    assert not checks["privileges"].ok and "GRANT" in checks["privileges"].detail
