"""The in-process purger (issue 36.5) on the real MariaDB and PostgreSQL: one runner per table
across purgers (a lock held by its own session: MySQL's GET_LOCK, PostgreSQL's
pg_try_advisory_lock), a standby that takes over, paced batches, a prompt stop, live rows never
deleted, a batch that gives way to a consumer's lock, and the lag metric."""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from typing import Any, Iterator, List, Tuple, Union

import pytest
from prometheus_client import CollectorRegistry

from rocketmq_dedup import DedupElement, DedupStatus, MySQLDedupStore, PostgresDedupStore, Purger
from rocketmq_dedup.metrics import DedupMetrics, PrometheusMetrics
from rocketmq_dedup.owner import new_owner_token
from rocketmq_dedup.stores.base import Claim
from tests.support import PG_DSN, mysql_connect, pg_connect, pg_query, sql, wait_for

SqlStore = Union[MySQLDedupStore, PostgresDedupStore]


class Batches(DedupMetrics):
    """Records every purge batch: (monotonic time, table, deleted, lag seconds)."""

    def __init__(self) -> None:
        self.seen: List[Tuple[float, str, int, float]] = []

    def purge(self, table: str, deleted: int, lag_seconds: float) -> None:
        self.seen.append((time.monotonic(), table, deleted, lag_seconds))


def new_store(kind: str, table: str) -> SqlStore:
    if kind == "postgres":
        return PostgresDedupStore(pg_connect(), table)
    return MySQLDedupStore(mysql_connect(), table)


def query(store: SqlStore, statement: str, *params: Any) -> List[Any]:
    """One statement on the store's database (a connection of its own); its rows."""
    if isinstance(store, PostgresDedupStore):
        return pg_query(statement, *params)
    return sql(statement, *params)


@pytest.fixture(
    params=[
        pytest.param("mysql", marks=pytest.mark.mysql),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[SqlStore]:
    """A store on a table of its own (a purge deletes every expired row of its table)."""
    table = f"t_purge_{uuid.uuid4().hex[:10]}"
    store = new_store(str(request.param), table)
    store.create_table()
    yield store
    store.close()
    for name in (table, f"{table}_seq"):
        query(store, f"DROP TABLE IF EXISTS {name}")


def rows(store: SqlStore) -> int:
    return int(query(store, f"SELECT COUNT(*) FROM {store.table_name}")[0][0])


def add(store: SqlStore, count: int, expired_ago_s: float = 0, live: bool = False) -> None:
    """``count`` records: live ones (a 10-minute lease), or ones that expired ``expired_ago_s``
    seconds ago on the server's clock."""
    tag = uuid.uuid4().hex[:8]
    claims = [Claim(DedupElement("app", "T", tag, str(i)), new_owner_token()) for i in range(count)]
    store.claim_many(claims, 600_000)
    if live:
        return
    ago_ms = int(expired_ago_s * 1000) + 1
    if isinstance(store, PostgresDedupStore):
        query(
            store,
            f"UPDATE {store.table_name} SET expire_time = "
            "statement_timestamp() - %s * interval '1 millisecond' WHERE tag = %s",
            ago_ms,
            tag,
        )
    else:
        query(
            store,
            f"UPDATE {store.table_name} SET expire_time = "
            "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - %s WHERE tag = %s",
            ago_ms,
            tag,
        )


def test_one_purger_runs_and_a_standby_takes_over_when_it_stops(store: SqlStore) -> None:
    """Two purgers on one table: one holds the lock and purges, the other never runs a pass;
    once the runner is closed, the standby takes the lock and purges what expires next."""
    first = Purger(store, interval_seconds=0.2).start()
    kind = "postgres" if isinstance(store, PostgresDedupStore) else "mysql"
    second = Purger(new_store(kind, store.table_name), interval_seconds=0.2)
    second.start()
    try:
        wait_for(lambda: first.passes + second.passes >= 2, timeout=20)
        runner, standby = (first, second) if first.running else (second, first)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # both keep trying meanwhile; one runs
            assert runner.running and not standby.running
            assert standby.passes == 0
            time.sleep(0.05)
        runner.close()
        add(store, 3)
        wait_for(lambda: standby.running and rows(store) == 0, timeout=20)
        assert standby.passes >= 1 and standby.deleted == 3
    finally:
        first.close()
        second.close()


def test_expired_rows_go_in_paced_batches_and_live_rows_stay(store: SqlStore) -> None:
    """25 expired and 5 live rows, 10 rows a batch, 0.3 s between batches: 4 batches (the last
    reads nothing), at most 10 deleted each, at least 0.3 s apart; the 5 live rows stay."""
    add(store, 25)
    add(store, 5, live=True)
    batches = Batches()
    with Purger(store, batch_size=10, pause_seconds=0.3, interval_seconds=60, metrics=batches):
        wait_for(lambda: len(batches.seen) >= 4, timeout=20)
    first_pass = batches.seen[:4]
    assert all(deleted <= 10 for _, _, deleted, _ in first_pass)
    assert sum(deleted for _, _, deleted, _ in first_pass) == 25
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(first_pass)]
    assert min(gaps) >= 0.3, gaps
    assert {table for _, table, _, _ in first_pass} == {store.table_name}
    assert rows(store) == 5


def test_close_stops_a_purger_in_its_pause_and_frees_the_lock(store: SqlStore) -> None:
    """A purger pausing 30 s between batches stops within seconds of close(), mid-pass, and its
    lock is free at once for any other session."""
    add(store, 10)
    batches = Batches()
    purger = Purger(store, batch_size=2, pause_seconds=30, metrics=batches).start()
    wait_for(lambda: len(batches.seen) >= 1, timeout=20)
    began = time.monotonic()
    purger.close()
    assert time.monotonic() - began < 5
    assert purger._thread is not None and not purger._thread.is_alive()
    assert rows(store) == 8  # one batch of the pass ran
    session = store.purge_session()
    try:
        assert session.try_lock()
    finally:
        session.close()


def test_a_row_taken_over_after_the_scan_is_not_deleted(store: SqlStore) -> None:
    """A consumer claims an expired record between the batch's read and its DELETE: the
    DELETE checks the expiry again and leaves the live claim alone."""
    element = DedupElement("app", "T", "", "taken-over")
    store.claim(Claim(element, new_owner_token()), 1)
    wait_for(lambda: store.get_status(element) is None, timeout=5)
    session, owner = store.purge_session(), new_owner_token()
    runner: Any = session._runner

    def take_over() -> None:
        assert store.claim(Claim(element, owner), 60_000).claimed

    class ClaimAfterTheScan:
        """The session's connection, with a consumer's claim right after the batch's read."""

        def run(self, query: str, params: Any, fetch: bool) -> Any:  # MySQL's runner
            result = runner.run(query, params, fetch)
            if query.startswith("SELECT dedup_key"):
                take_over()
            return result

        def rows(self, query: str, params: Any) -> Any:  # PostgreSQL's runner
            result = runner.rows(query, params)
            if query.startswith("SELECT dedup_key"):
                take_over()
            return result

        def count(self, query: str, params: Any) -> int:
            return int(runner.count(query, params))

        def close(self) -> None:
            runner.close()

    session._runner = ClaimAfterTheScan()  # type: ignore[assignment]
    try:
        batch = session.purge_batch(b"", 100)
    finally:
        session.close()
    assert (batch.scanned, batch.deleted) == (1, 0)
    record = store.read(element)
    assert record is not None and record.owner == owner
    assert record.status is DedupStatus.CONSUMING


def test_a_batch_gives_way_to_a_consumers_row_lock(store: SqlStore) -> None:
    """An expired row locked by another transaction: the batch waits at most the purge's
    short lock wait, deletes nothing and raises nothing; the next batch deletes it."""
    add(store, 1)
    if isinstance(store, PostgresDedupStore):
        import psycopg

        holder: Any = psycopg.connect(PG_DSN)
        holder.execute(f"SELECT * FROM {store.table_name} FOR UPDATE")
    else:
        holder = mysql_connect()()
        holder.autocommit(False)
        holder.cursor().execute(f"SELECT * FROM {store.table_name} FOR UPDATE")
    session = store.purge_session()
    try:
        began = time.monotonic()
        assert session.purge_batch(b"", 100).deleted == 0
        assert time.monotonic() - began < 10
        holder.rollback()
        assert session.purge_batch(b"", 100).deleted == 1
    finally:
        holder.close()
        session.close()


def test_the_lag_is_how_long_the_longest_expired_row_had_been_expired(
    store: SqlStore,
) -> None:
    """Rows expired 120 s and 30 s ago: the pass reports a lag of 120 s, exported by
    PrometheusMetrics with the rows deleted."""
    add(store, 2, expired_ago_s=120)
    add(store, 3, expired_ago_s=30)
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    with Purger(store, interval_seconds=60, metrics=metrics) as purger:
        wait_for(lambda: purger.passes >= 1, timeout=20)
    labels = {"table": store.table_name}
    lag = registry.get_sample_value("rocketmq_dedup_purge_lag_seconds", labels)
    assert lag is not None and 120 <= lag < 130
    assert registry.get_sample_value("rocketmq_dedup_purge_deleted_total", labels) == 5


def test_a_runner_whose_session_is_killed_takes_the_lock_again(store: SqlStore) -> None:
    """The server ends the runner's session (KILL, pg_terminate_backend): the lock goes with
    it; the purger logs the failure, opens a new session, takes the lock again and goes on
    purging."""
    with Purger(store, interval_seconds=0.2) as purger:
        wait_for(lambda: purger.passes >= 1, timeout=20)
        session: Any = purger._session
        if isinstance(store, PostgresDedupStore):
            [(pid,)] = session._runner.rows("SELECT pg_backend_pid()", ())
            query(store, "SELECT pg_terminate_backend(%s)", int(pid))
        else:
            [(connection_id,)] = session._runner.run("SELECT CONNECTION_ID()", (), True)
            with contextlib.suppress(Exception):
                sql(f"KILL CONNECTION {int(connection_id)}")
        add(store, 2)
        wait_for(lambda: purger.running and rows(store) == 0, timeout=20)
        assert purger._session is not session


def test_a_postgres_purge_lock_is_one_per_table_whatever_the_search_path(
    request: pytest.FixtureRequest,
) -> None:
    """PostgreSQL: the purge lock's key is the table's oid, so two sessions on the same table
    (one naming it with its schema) exclude each other, and another table's session does not;
    a standby names the backend that holds it."""
    table = f"t_purge_{uuid.uuid4().hex[:10]}"
    stores = [new_store("postgres", table), new_store("postgres", f"public.{table}")]
    other = new_store("postgres", f"{table}_other")
    for store in (stores[0], other):
        store.create_table()
    sessions = [s.purge_session() for s in (*stores, other)]
    try:
        assert sessions[0].try_lock() and not sessions[1].try_lock() and sessions[2].try_lock()
        assert sessions[1].lock_holder().startswith("backend ")
    finally:
        for session in sessions:
            session.close()
        for name in (table, f"{table}_seq", f"{table}_other", f"{table}_other_seq"):
            pg_query(f"DROP TABLE IF EXISTS {name}")
