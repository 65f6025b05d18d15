"""The MySQL store's connection pool, against the real MariaDB: bounded by concurrent callers
(not by threads ever seen), safe across fork(), broken connections dropped, close().

Connections are counted twice: by the factory (how many the store asked for) and by the
server (which of those connection ids are still in PROCESSLIST)."""

from __future__ import annotations

import collections
import os
import threading
import time
import timeit
import uuid
from typing import Any, Callable, List

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConcurrentListener,
    DedupConfig,
    DedupElement,
    DedupStatus,
    StoreFailurePolicy,
)
from rocketmq_dedup.errors import StoreError, StorePoolExhaustedError, StoreUnavailableError
from rocketmq_dedup.stores.base import CLAIMED, Claim
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.native import run_callbacks
from tests.support import fresh_python, mysql_connect, wait_for

DEFAULT_POOL_SIZE = 8  # MySQLDedupStore's documented default


class CountingConnect:
    """A connection factory that records the server's id of every connection it made."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.ids: List[int] = []
        self.conns: List[Any] = []
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        conn = self._connect()
        cursor = conn.cursor()
        cursor.execute("SELECT CONNECTION_ID()")
        (connection_id,) = cursor.fetchone()
        cursor.close()
        with self._lock:
            self.ids.append(int(connection_id))
            self.conns.append(conn)
        return conn

    @property
    def calls(self) -> int:
        return len(self.ids)

    def open_on_server(self) -> int:
        """How many of this factory's connections the server still has."""
        if not self.ids:
            return 0
        marks = ", ".join(["%s"] * len(self.ids))
        conn = mysql_connect()()
        try:
            cursor = conn.cursor()
            cursor.execute(
                f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({marks})",
                self.ids,
            )
            return int(cursor.fetchone()[0])
        finally:
            conn.close()


def element(app: str, key: str = "k") -> DedupElement:
    return DedupElement(app, "T", "tag", key)


@pytest.fixture
def counting() -> CountingConnect:
    return CountingConnect(mysql_connect())


@pytest.fixture
def store(mysql_table: str, counting: CountingConnect) -> Any:
    store = MySQLDedupStore(counting, mysql_table)
    yield store
    store.close()


# -- 1. a bounded pool, not thread-locals ----------------------------------------------------


def test_short_lived_threads_share_a_bounded_pool(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """50 short-lived threads, each doing one claim, open at most pool_size connections."""
    barrier = threading.Barrier(50)
    results: List[Any] = []

    def worker(i: int) -> None:
        barrier.wait(30)
        results.append(store.claim(Claim(element(app_name, f"k{i}"), "o"), 60_000))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [CLAIMED] * 50
    assert 1 <= counting.calls <= DEFAULT_POOL_SIZE
    assert counting.open_on_server() == counting.calls  # idle in the pool, none leaked


def test_sequential_threads_reuse_one_connection(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """Threads that come and go one after another all use the same single connection."""
    for i in range(20):
        t = threading.Thread(
            target=store.claim, args=(Claim(element(app_name, f"k{i}"), "o"), 60_000)
        )
        t.start()
        t.join(30)
    assert counting.calls == 1
    assert store.get_status(element(app_name, "k19")) is DedupStatus.CONSUMING


@pytest.mark.parametrize(("threads", "calls"), [(1, 200), (4, 50)])
def test_native_callback_threads_are_bounded_by_concurrency(
    store: MySQLDedupStore,
    counting: CountingConnect,
    native_lib: Any,
    app_name: str,
    threads: int,
    calls: int,
) -> None:
    """Callbacks from native threads (a fresh Python thread state each time, as librocketmq
    calls a listener) open at most one connection per native thread."""

    def callback(index: int) -> int:
        try:
            return (
                0 if store.claim(Claim(element(app_name, f"k{index}"), "o"), 60_000).claimed else 1
            )
        except BaseException:  # an exception must not cross into C
            return 2

    successes, statuses = run_callbacks(native_lib, callback, threads, calls)
    assert successes == threads * calls, statuses
    assert 1 <= counting.calls <= threads


def test_busy_pool_waits_then_fails_as_a_store_error_not_an_outage(
    mysql_table: str, counting: CountingConnect, app_name: str
) -> None:
    """With every connection busy a caller waits for one; past pool_timeout it gets
    StorePoolExhaustedError, a StoreError that is not an outage (no server failed); a
    connection given back goes to the waiting caller."""
    store = MySQLDedupStore(counting, mysql_table, pool_size=1, pool_timeout=0.3)
    try:
        held = store.pool.take()
        begin = time.monotonic()
        with pytest.raises(StorePoolExhaustedError, match="busy") as caught:
            store.claim(Claim(element(app_name, "a"), "o"), 60_000)
        assert not isinstance(caught.value, StoreUnavailableError)
        assert time.monotonic() - begin >= 0.25
        results: List[Any] = []
        waiter = threading.Thread(
            target=lambda: results.append(store.claim(Claim(element(app_name, "b"), "o"), 60_000))
        )
        store.pool.timeout = 30.0
        waiter.start()
        wait_for(lambda: store.pool.waiting == 1)
        store.pool.give(held)
        waiter.join(30)
        assert results == [CLAIMED]
        assert counting.calls == 1
    finally:
        store.close()


def test_an_exhausted_pool_never_runs_handlers_without_dedup(
    mysql_table: str, counting: CountingConnect, app_name: str
) -> None:
    """Issue 21: all pool_size connections busy (here held by a stuck operation) is not an
    outage: with the default store_failure_policy="consume" the messages are answered
    RECONSUME_LATER and no handler runs (it ran them without dedup, and the redelivery ran
    them again); once a connection is free each runs once and its duplicates are acked."""
    store = MySQLDedupStore(counting, mysql_table, pool_size=1, pool_timeout=0.2)
    runs: collections.Counter[str] = collections.Counter()

    class Counting(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            runs[msg.id] += 1
            return True

    listener = Counting(DedupConfig.enable_dedup_consume_config(app_name, store))
    assert listener.dedup_config is not None
    assert listener.dedup_config.store_failure_policy is StoreFailurePolicy.CONSUME
    run = uuid.uuid4().hex[:8]
    batch = [ClassicMessage(f"{run}-{i}") for i in range(12)]
    later = ConsumeStatus.RECONSUME_LATER
    try:
        held = store.pool.take()
        try:
            assert listener(ClassicMessage(f"{run}-single")) is later
            assert listener.consume_message(batch).status is later
            assert listener.consume_each(batch) == [later] * 12
            assert sum(runs.values()) == 0
        finally:
            store.pool.give(held)
        assert listener(ClassicMessage(f"{run}-single")) is ConsumeStatus.CONSUME_SUCCESS
        assert listener.consume_message(batch).status is ConsumeStatus.CONSUME_SUCCESS
        assert listener.consume_each(batch) == [ConsumeStatus.CONSUME_SUCCESS] * 12
        assert set(runs.values()) == {1} and len(runs) == 13
    finally:
        listener.close()


def test_taking_and_giving_back_a_connection_is_cheap(store: MySQLDedupStore) -> None:
    """A pooled connection is taken and given back in a few hundred nanoseconds (a lock and a
    list pop/append; the bound is generous for slow CI machines)."""
    store.check()
    pool = store.pool

    def take_and_give() -> None:
        pool.give(pool.take())

    seconds = min(timeit.repeat(take_and_give, number=20_000, repeat=5)) / 20_000
    assert seconds < 3e-6, f"{seconds * 1e9:.0f} ns"


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "8", 100_000])
def test_pool_size_is_validated(mysql_table: str, size: Any) -> None:
    """pool_size must be a positive int (bounded); anything else fails at construction."""
    from rocketmq_dedup import DedupConfigError

    with pytest.raises(DedupConfigError, match="pool_size"):
        MySQLDedupStore(mysql_connect(), mysql_table, pool_size=size)


# -- 2. fork, and connections that raised ----------------------------------------------------


def _in_child(body: Callable[[], int], meanwhile: Callable[[], None] = lambda: None) -> int:
    """Fork; the child runs ``body`` and exits with its status (3 if it raised) while the
    parent runs ``meanwhile``. Returns the child's exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 3
        try:
            code = body()
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    try:
        meanwhile()
    finally:
        _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1


def test_forked_child_never_uses_the_parents_connection(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """After the parent used the store, a forked child opens its own connection, claims, and
    closes the store; the parent's session survives (no reconnect) and keeps working."""
    store.create_table()
    assert store.claim(Claim(element(app_name, "parent-1"), "p"), 60_000) == CLAIMED
    parent_calls = counting.calls

    def child() -> int:
        if store.claim(Claim(element(app_name, "child"), "c"), 60_000) != CLAIMED:
            return 1
        if store.get_status(element(app_name, "child")) is not DedupStatus.CONSUMING:
            return 1
        if counting.calls != parent_calls + 1:  # the child's own connection
            return 2
        store.close()  # must not close (COM_QUIT) the parent's connection
        return 0

    assert _in_child(child) == 0
    assert store.get_status(element(app_name, "child")) is DedupStatus.CONSUMING
    assert store.claim(Claim(element(app_name, "parent-2"), "p"), 60_000) == CLAIMED
    assert counting.calls == parent_calls  # the parent's connection was never disturbed
    assert counting.open_on_server() == 1


def test_fork_while_the_parent_keeps_working(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """Parent and child reading at the same time after a fork never share one socket (the
    old "Commands out of sync", or one side reading the other's answer): each side sees its
    own record's status for half a second, and the parent keeps its connection."""
    mine, theirs = element(app_name, "parent"), element(app_name, "child")
    assert store.claim(Claim(mine, "p"), 60_000) == CLAIMED
    store.mark_consumed(Claim(theirs, "c"), 60_000)
    # The mark is deferred: this read waits for it to land (the flusher's round trip on a
    # second connection could otherwise still hold one when the parent reads, and the parent
    # would open another), so the parent forks with one idle connection.
    assert store.get_status(theirs) is DedupStatus.CONSUMED
    parent_seen: List[Any] = []

    def read_for_half_a_second(e: DedupElement, seen: List[Any]) -> None:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            seen.append(store.get_status(e))

    def child() -> int:
        seen: List[Any] = []
        read_for_half_a_second(theirs, seen)
        return 0 if seen and set(seen) == {DedupStatus.CONSUMED} else 1

    assert _in_child(child, lambda: read_for_half_a_second(mine, parent_seen)) == 0
    assert parent_seen and set(parent_seen) == {DedupStatus.CONSUMING}
    assert counting.calls == 1  # the parent never lost its connection (nor opened another)
    assert counting.open_on_server() == 1


FORK_AND_EXIT_NORMALLY = """
import gc, os, sys
from rocketmq_dedup import DedupElement
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from tests.support import mysql_connect
from tests.integration.test_mysql_pool import CountingConnect
from rocketmq_dedup.stores.base import Claim

driver, table, app = sys.argv[1:4]
counting = CountingConnect(mysql_connect(driver))
store = MySQLDedupStore(counting, table)
assert store.claim(Claim(DedupElement(app, "T", "", "parent-1"), "p"), 60000).claimed
pid = os.fork()
if pid == 0:
    ok = store.claim(Claim(DedupElement(app, "T", "", "child"), "c"), 60000).claimed
    del store, counting
    gc.collect()
    sys.exit(0 if ok else 1)  # a normal exit: the interpreter finalizes everything
_, status = os.waitpid(pid, 0)
ok = store.claim(Claim(DedupElement(app, "T", "", "parent-2"), "p"), 60000).claimed
print(os.WEXITSTATUS(status), ok, counting.calls)
"""


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql", "mysql-connector"])
def test_a_child_that_exits_normally_leaves_the_parents_session_alone(
    mysql_table: str, app_name: str, driver: str
) -> None:
    """A forked child that drops the store and exits normally never closes the parent's
    connection (mysqlclient's dealloc sends COM_QUIT, mysql-connector's shuts the socket
    down): the parent carries on without reconnecting."""
    result = fresh_python("-c", FORK_AND_EXIT_NORMALLY, driver, mysql_table, app_name)
    assert result.stdout.split() == ["0", "True", "1"], result.stderr


def test_a_connection_that_raised_is_discarded(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """A connection left out of sync fails its operation once; it is closed, not pooled, and
    the next operation runs on a new connection (dedup is not off for good)."""
    assert store.claim(Claim(element(app_name, "first"), "o"), 60_000) == CLAIMED
    counting.conns[0].query(b"SELECT 1")  # a result never read: the next command is out of sync
    with pytest.raises(StoreError):
        store.claim(Claim(element(app_name), "o"), 60_000)
    assert store.claim(Claim(element(app_name), "o"), 60_000) == CLAIMED
    assert counting.calls == 2
    wait_for(lambda: counting.open_on_server() == 1)


def test_a_missing_table_never_keeps_the_connection(
    counting: CountingConnect, app_name: str
) -> None:
    """Every operation that raised closes its connection: none is left open or pooled."""
    store = MySQLDedupStore(counting, f"t_missing_{uuid.uuid4().hex[:8]}")
    for _ in range(3):
        with pytest.raises(StoreError):
            store.claim(Claim(element(app_name), "o"), 60_000)
    assert counting.calls == 3
    wait_for(lambda: counting.open_on_server() == 0)


def kill(connection_ids: List[int]) -> None:
    """KILL connections from another session, as a server restart would drop them."""
    conn = mysql_connect()()
    try:
        cursor = conn.cursor()
        for connection_id in connection_ids:
            cursor.execute(f"KILL {int(connection_id)}")
    finally:
        conn.close()


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql", "mysql-connector"])
def test_lost_connections_are_replaced_and_the_operation_retried(
    mysql_table: str, app_name: str, driver: str
) -> None:
    """When the server drops every pooled connection (a restart), the next operations
    reconnect and succeed: a failed connection is replaced, the idle ones are dropped with
    it, and the operation runs once more."""
    counting = CountingConnect(mysql_connect(driver))
    store = MySQLDedupStore(counting, mysql_table)
    try:
        for i in range(4):
            store.claim(Claim(element(app_name, f"k{i}"), "o"), 60_000)
        busy = [store.pool.take() for _ in range(3)]  # three connections, all idle after
        for runner in busy:
            store.pool.give(runner)
        before = counting.calls
        assert before == 3
        kill(counting.ids)
        wait_for(lambda: counting.open_on_server() == 0)
        for i in range(4):
            assert store.get_status(element(app_name, f"k{i}")) is DedupStatus.CONSUMING
        assert store.claim(Claim(element(app_name, "after"), "o"), 60_000) == CLAIMED
        assert counting.calls == before + 1  # one new connection serves everything after
    finally:
        store.close()


# -- 6. close() ------------------------------------------------------------------------------


def test_close_closes_every_connection_and_the_store_is_reusable(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """close() closes every pooled connection; the next operation reconnects."""
    barrier = threading.Barrier(4)

    def worker(i: int) -> None:
        barrier.wait(30)
        store.claim(Claim(element(app_name, f"k{i}"), "o"), 60_000)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    opened = counting.calls
    assert counting.open_on_server() == opened >= 1
    store.close()
    wait_for(lambda: counting.open_on_server() == 0)
    assert store.get_status(element(app_name, "k0")) is DedupStatus.CONSUMING
    assert counting.calls == opened + 1
    assert counting.open_on_server() == 1


def test_close_closes_a_busy_connection_when_it_comes_back(
    store: MySQLDedupStore, counting: CountingConnect, app_name: str
) -> None:
    """A connection busy in an operation during close() is not pulled from under it; it is
    closed when the operation gives it back, not pooled again."""
    busy = store.pool.take()
    store.close()
    assert busy.run("SELECT 1", (), True) == ((1,),)  # still usable by its operation
    store.pool.give(busy)
    wait_for(lambda: counting.open_on_server() == 0)
    assert store.pool.open_count == 0
    assert store.claim(Claim(element(app_name), "o"), 60_000) == CLAIMED
    assert counting.calls == 2
