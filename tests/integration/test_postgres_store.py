"""PostgreSQL specifics, against the shared server: the table and its readable columns, the
server's clock, one statement per decision (and the read after the claim statement's snapshot
missed a row), the purge, how make_store tells a PostgreSQL source, bad input, a wrong address,
a missing table, and connections handed back as they were found. Outages and exhausted pools:
test_postgres_outages.py (a private server)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List

import psycopg
import psycopg_pool
import pytest
import sqlalchemy

from rocketmq_dedup import (
    DedupConfig,
    DedupConfigError,
    DedupElement,
    DedupStatus,
    MySQLDedupStore,
    PostgresDedupStore,
)
from rocketmq_dedup.errors import (
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
)
from rocketmq_dedup.stores import make_store
from rocketmq_dedup.stores.base import ALREADY_CONSUMED, CLAIMED, HELD_BY_OTHER, Claim, ClaimResult
from rocketmq_dedup.stores.postgres.connections import LibpqRunner, Runner
from tests.conftest import PG_KINDS, make_pg_store
from tests.support import PG_DSN, claims, mysql_connect, outcome, pg_connect, pg_query, wait_for

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[2]
LEASE = 60_000


def element(app: str, key: str = "k", tag: str = "tag") -> DedupElement:
    return DedupElement(app, "T", tag, key)


@pytest.fixture
def pg_store(pg_table: str) -> Iterator[PostgresDedupStore]:
    store = PostgresDedupStore(pg_connect(), pg_table)
    yield store
    store.close()


def row_of(table: str, e: DedupElement, columns: str) -> Any:
    rows = pg_query(f"SELECT {columns} FROM {table} WHERE dedup_key = %s", e.digest())
    return rows[0] if rows else None


# -- the table --------------------------------------------------------------------------------


def test_create_table_is_idempotent_and_has_one_index(pg_store: PostgresDedupStore) -> None:
    """create_table() twice is fine; the table's one index is the primary key on dedup_key."""
    pg_store.create_table()
    pg_store.create_table()
    indexes = pg_query("SELECT indexdef FROM pg_indexes WHERE tablename = %s", pg_store.table_name)
    assert len(indexes) == 1 and "(dedup_key)" in indexes[0][0]


def test_lease_uses_the_database_clock(pg_store: PostgresDedupStore, app_name: str) -> None:
    """expire_time is the server's time plus the lease, whatever the client's clock says."""
    e = element(app_name)
    pg_store.claim(Claim(e, "o"), 60_000)
    (left,) = row_of(
        pg_store.table_name, e, "extract(epoch FROM expire_time - statement_timestamp())"
    )
    assert 59 <= float(left) <= 60


def test_readable_columns_for_operators(pg_store: PostgresDedupStore, app_name: str) -> None:
    """The row shows application, topic, tag, key (first 255 characters), status, owner and
    deliveries, the claims since the record was last settled: a refused duplicate leaves it, the
    takeover of a lapsed claim adds one."""
    e = DedupElement(app_name, "TOPIC", "标签", "k" * 300)
    pg_store.claim(Claim(e, "owner-1"), LEASE)
    columns = "application_name, topic, tag, msg_uniq_key, status, owner_token, deliveries"
    assert row_of(pg_store.table_name, e, columns) == (
        app_name, "TOPIC", "标签", "k" * 255, "CONSUMING", "owner-1", 1,
    )  # fmt: skip
    assert not pg_store.claim(Claim(e, "owner-2"), LEASE).claimed
    assert row_of(pg_store.table_name, e, "owner_token, deliveries") == ("owner-1", 1)
    stale = element(app_name, "stale")
    pg_store.claim(Claim(stale, "owner-1"), 1)
    wait_for(lambda: pg_store.read(stale) is None)
    assert pg_store.claim(Claim(stale, "owner-2"), LEASE) == ClaimResult(True, None, 1)
    assert row_of(pg_store.table_name, stale, "owner_token, deliveries") == ("owner-2", 2)


def test_a_nul_or_a_lone_surrogate_in_a_key_is_stored_and_shown_replaced(
    pg_store: PostgresDedupStore, app_name: str
) -> None:
    """A PostgreSQL text holds no NUL (shown as U+FFFD) and no unpaired surrogate (shown as
    ?); the record's identity is the whole key, so keys differing only there never collide."""
    a, b = element(app_name, "a\x00b"), element(app_name, "a\x01b")
    c = element(app_name, "\udcff中")
    for e in (a, b, c):
        assert pg_store.claim(Claim(e, "o"), LEASE) == CLAIMED
    assert row_of(pg_store.table_name, a, "msg_uniq_key") == ("a\ufffdb",)
    assert row_of(pg_store.table_name, c, "msg_uniq_key") == ("?中",)
    pg_store.mark_consumed(Claim(a, "o"), LEASE)
    assert pg_store.get_status(b) is DedupStatus.CONSUMING


def test_a_schema_qualified_mixed_case_name_is_used_as_written(app_name: str) -> None:
    """table_name "public.T_Mixed$1" is quoted: the table has exactly that name."""
    pg_query('DROP TABLE IF EXISTS public."T_Mixed$1"')
    store = PostgresDedupStore(pg_connect(), "public.T_Mixed$1")
    try:
        store.create_table()
        assert store.claim(Claim(element(app_name), "o"), LEASE) == CLAIMED
        assert pg_query('SELECT count(*) FROM public."T_Mixed$1"') == [(1,)]
    finally:
        store.close()
        pg_query('DROP TABLE IF EXISTS public."T_Mixed$1"')


# -- one statement per decision ---------------------------------------------------------------


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """The statements the store runs (each one round trip), recorded: through the cursor, or
    through libpq's calls (the claim and the mark on the store's own connections)."""
    seen: List[Any] = []
    for kind, name in ((Runner, "rows"), (Runner, "count"), (LibpqRunner, "_run")):
        original = getattr(kind, name)

        def recording(self: Any, sql: Any, *args: Any, _run: Any = original) -> Any:
            seen.append(sql)
            return _run(self, sql, *args)

        monkeypatch.setattr(kind, name, recording)
    return seen


@pytest.mark.parametrize("kind", PG_KINDS)
def test_every_decision_is_one_statement(
    kind: str, app_name: str, statements: List[Any], request: pytest.FixtureRequest
) -> None:
    """A fresh claim, a duplicate's (CONSUMING or CONSUMED), a takeover, a mark, a release and
    a batch of 32 mixed claims each cost one statement: one round trip."""
    store = make_pg_store(kind, request)
    store.check()
    fresh, held, done, stale = (element(app_name, k) for k in ("fresh", "held", "done", "stale"))
    store.claim(Claim(held, "h"), LEASE)
    store.claim(Claim(done, "d"), LEASE)
    store.mark_consumed(Claim(done, "d"), LEASE)
    store.claim(Claim(stale, "s"), 1)
    wait_for(lambda: store.read(stale) is None)
    statements.clear()
    decided = [
        store.claim(Claim(fresh, "o"), LEASE),
        store.claim(Claim(held, "o"), LEASE),
        store.claim(Claim(done, "o"), LEASE),
        store.claim(Claim(stale, "o"), LEASE),
    ]
    assert [outcome(r) for r in decided] == [
        outcome(r) for r in (CLAIMED, HELD_BY_OTHER, ALREADY_CONSUMED, CLAIMED)
    ]
    assert len(statements) == 4
    store.mark_consumed(Claim(fresh, "o"), LEASE)
    assert store.release(Claim(stale, "o"))
    batch = [element(app_name, f"b{i}") for i in range(29)] + [held, done, fresh]
    results = store.claim_many(claims(batch, ["o"] * 32), LEASE)
    assert [r.claimed for r in results] == [True] * 29 + [False] * 3
    assert len(statements) == 7


@pytest.mark.parametrize(
    ("kind", "runner"),
    [
        ("postgres", "LibpqRunner"),
        ("postgres_factory", "LibpqRunner"),
        ("postgres_sqlalchemy", "LibpqRunner"),
        ("postgres_pool", "Runner"),
    ],
)
def test_hot_statements_use_libpq_on_the_stores_own_connections(
    kind: str, runner: str, app_name: str, request: pytest.FixtureRequest
) -> None:
    """The store's own connections run the claim and the mark through libpq (prepared once
    under the store's names, or unnamed when the connection's prepare_threshold is None); an
    application's pool's connections go through psycopg's cursor."""
    store = make_pg_store(kind, request)
    seen: List[str] = []
    assert isinstance(store, PostgresDedupStore)

    def claim(runner: Runner, c: Claim) -> Any:
        seen.append(type(runner).__name__)
        return store._claim(runner, c, LEASE)

    e = element(app_name, "k'\\%s")
    assert store._run(claim, Claim(e, "o1")) == CLAIMED
    store.mark_consumed(Claim(e, "o1"), LEASE)
    assert seen == [runner]
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(ALREADY_CONSUMED)
    names = store._run(Runner.rows, "SELECT name FROM pg_prepared_statements ORDER BY 1", ())
    named = kind in ("postgres", "postgres_sqlalchemy")  # prepare_threshold None: unnamed
    expected = [("rocketmq_dedup_claim",), ("rocketmq_dedup_mark",)] if named else []
    assert [n for n in names if n[0].startswith("rocketmq_dedup")] == expected


def begin_insert(table: str, e: DedupElement, owner: str) -> Any:
    """Another session's transaction that has inserted a live claim of ``e`` and not yet
    committed."""
    conn = psycopg.connect(PG_DSN)
    conn.execute(
        f"INSERT INTO {table} (dedup_key, application_name, topic, tag, msg_uniq_key, status, "
        "owner_token, expire_time) VALUES (%s, %s, 'T', 'tag', 'k', 'CONSUMING', %s, "
        "now() + interval '1 minute')",
        (e.digest(), e.application, owner),
    )
    return conn


def blocked_on_a_lock(pid: int) -> bool:
    rows = pg_query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid)
    return bool(rows) and rows[0][0] == "Lock"


@pytest.mark.parametrize("batch", [False, True])
def test_a_row_committed_while_the_claim_waits_refuses_it_in_the_same_statement(
    pg_store: PostgresDedupStore, app_name: str, statements: List[Any], batch: bool
) -> None:
    """A claim that meets a row another session is inserting waits for it, and once it is
    committed (after the claim statement's snapshot was taken) reports it: refused, with its
    owner, never claimed, in that one statement."""
    e = element(app_name, "raced")
    other = begin_insert(pg_store.table_name, e, "first-owner")
    pg_store.check()
    ((backend,),) = pg_store._run(Runner.rows, "SELECT pg_backend_pid()", ())
    statements.clear()
    results: List[Any] = []

    def claim() -> None:
        if batch:
            results.extend(pg_store.claim_many(claims([e, element(app_name)], ["o", "o"]), LEASE))
        else:
            results.append(pg_store.claim(Claim(e, "o"), LEASE))

    claimer = threading.Thread(target=claim)
    claimer.start()
    try:
        wait_for(lambda: blocked_on_a_lock(backend))
    finally:
        other.commit()
        other.close()
    claimer.join(30)
    assert outcome(results[0]) == outcome(HELD_BY_OTHER)
    assert results[0].holder == "first-owner"
    assert len(statements) == 1


# -- purge ----------------------------------------------------------------------------------------


def app_rows(store: PostgresDedupStore, app: str) -> int:
    table = store.table_name
    return int(pg_query(f"SELECT count(*) FROM {table} WHERE application_name = %s", app)[0][0])


def test_purge_expired_deletes_in_batches(pg_store: PostgresDedupStore, app_name: str) -> None:
    """purge_expired removes every expired row, batch by batch, and keeps live ones; a dry run
    counts them first and deletes nothing."""
    expired = [element(app_name, f"old{i}") for i in range(10)]
    live = element(app_name, "live")
    pg_store.mark_consumed_many(claims(expired, ["o"] * 10), 1)
    pg_store.mark_consumed(Claim(live, "o"), 600_000)
    wait_for(lambda: all(pg_store.get_status(e) is None for e in expired))
    assert pg_store.purge_expired(batch_size=3, dry_run=True) >= 10
    assert app_rows(pg_store, app_name) == 11
    steps: List[tuple[int, int]] = []
    assert pg_store.purge_expired(batch_size=3, progress=lambda *s: steps.append(s)) >= 10
    assert app_rows(pg_store, app_name) == 1
    assert len(steps) >= 4 and steps[-1][1] >= 10


def test_purge_walks_past_batches_with_nothing_expired(
    pg_store: PostgresDedupStore, app_name: str
) -> None:
    """A batch of live rows does not end the purge: it walks the whole table."""
    live = [element(app_name, f"live{i}") for i in range(20)]
    expired = [element(app_name, f"old{i}") for i in range(5)]
    pg_store.mark_consumed_many(claims(live, ["o"] * 20), 600_000)
    pg_store.mark_consumed_many(claims(expired, ["o"] * 5), 1)
    wait_for(lambda: all(pg_store.get_status(e) is None for e in expired))
    assert pg_store.purge_expired(batch_size=2) >= 5
    assert app_rows(pg_store, app_name) == 20


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_purge_rejects_a_bad_batch_size(pg_store: PostgresDedupStore, batch_size: Any) -> None:
    """A batch size that is not a positive int is a DedupConfigError."""
    with pytest.raises(DedupConfigError, match="batch_size"):
        pg_store.purge_expired(batch_size=batch_size)


# -- which store make_store builds -----------------------------------------------------------


def test_make_store_recognises_each_postgresql_source(
    pg_table: str, pg_pool: Any, pg_engine: Any
) -> None:
    """A partial of psycopg.connect (or of Connection.connect), a psycopg_pool pool and a
    postgresql engine give the PostgreSQL store; a mysql engine and a plain function stay
    MySQL's, as before."""
    sources: Dict[str, Any] = {
        "partial": pg_connect(),
        "classmethod": functools.partial(psycopg.Connection.connect, PG_DSN),
        "pool": pg_pool,
        "engine": pg_engine,
    }
    for name, source in sources.items():
        store = make_store(source, table_name=pg_table)
        assert isinstance(store, PostgresDedupStore), name
        store.check()
        store.close()
    mysql_engine = sqlalchemy.create_engine("mysql+mysqldb://dedup:dedup@127.0.0.1:1/x")
    assert isinstance(make_store(mysql_engine), MySQLDedupStore)
    assert isinstance(make_store(lambda: None), MySQLDedupStore)


def test_a_plain_function_returning_psycopg_connections_is_named_at_start_up(
    pg_table: str,
) -> None:
    """A factory make_store cannot tell from a MySQL one goes to the MySQL store, whose check
    says it returned a PostgreSQL connection and how to pass it; built explicitly as
    PostgresDedupStore it works."""

    def connect() -> Any:
        return psycopg.connect(PG_DSN)

    with pytest.raises(DedupConfigError, match="PostgresDedupStore"):
        DedupConfig.enable_dedup_consume_config("app", connect)
    store = PostgresDedupStore(connect, pg_table)
    store.check()
    store.close()


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (psycopg.Connection, "got the class"),
        ("postgresql://dedup@127.0.0.1/x", "zero-argument callable"),
        (None, "zero-argument callable"),
    ],
)
def test_a_source_that_makes_no_connection_is_refused(source: Any, message: str) -> None:
    """A class, a URL string or None is a DedupConfigError at construction."""
    with pytest.raises(DedupConfigError, match=message):
        PostgresDedupStore(source)


def test_one_connection_is_refused_by_make_store_and_the_store() -> None:
    """One psycopg connection (the store uses several) is refused, naming what to pass."""
    conn = psycopg.connect(PG_DSN)
    try:
        for build in (make_store, PostgresDedupStore):
            with pytest.raises(DedupConfigError, match=r"psycopg_pool\.ConnectionPool"):
                build(conn)
    finally:
        conn.close()


def test_an_engine_of_another_database_is_refused() -> None:
    """PostgresDedupStore on a mysql engine is a DedupConfigError naming postgresql+psycopg."""
    engine = sqlalchemy.create_engine("mysql+mysqldb://dedup:dedup@127.0.0.1:1/x")
    with pytest.raises(DedupConfigError, match=r"postgresql\+psycopg"):
        PostgresDedupStore(engine)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table_name": "bad name"}, "table_name"),
        ({"table_name": "a" * 64}, "table_name"),
        ({"table_name": "x; DROP TABLE y"}, "table_name"),
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": "8"}, "pool_size"),
        ({"pool_size": True}, "pool_size"),
        ({"pool_timeout": 0}, "pool_timeout"),
        ({"pool_timeout": True}, "pool_timeout"),
        ({"key_prefix": "x"}, "do not apply"),
    ],
)
def test_bad_options_are_refused_at_construction(options: Dict[str, Any], message: str) -> None:
    """Bad table names, pool sizes and timeouts, and another store's option, are
    DedupConfigErrors before any connection."""
    with pytest.raises(DedupConfigError, match=message):
        make_store(pg_connect(), **options)


def test_pool_options_do_not_apply_to_a_psycopg_pool(pg_pool: Any) -> None:
    """pool_size/pool_timeout with a psycopg_pool pool are refused: its own settings apply."""
    with pytest.raises(DedupConfigError, match="psycopg_pool"):
        make_store(pg_pool, pool_size=4)


def test_a_factory_returning_another_drivers_connection_is_a_store_error(
    pg_table: str,
) -> None:
    """A factory that returns a MySQL connection fails the start-up check clearly."""
    store = PostgresDedupStore(mysql_connect(), pg_table)
    with pytest.raises(StoreError, match="psycopg 3 connections") as caught:
        store.check()
    assert not isinstance(caught.value, StoreUnavailableError)


# -- wrong address, missing table ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://dedup:dedup@127.0.0.1:1/dedup_test", "127.0.0.1:1"),
        ("postgresql://dedup:dedup@127.0.0.1:15432/no_such_db", "no_such_db"),
    ],
)
def test_a_wrong_address_fails_at_start_up_naming_it(dsn: str, shown: str, app_name: str) -> None:
    """A refused port, a wrong database: DedupConfigError at construction, naming the address
    and never the password; without the check, the first claim is an outage."""
    dsn = dsn.replace("15432", PG_DSN.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(DedupConfigError, match="not usable") as caught:
        DedupConfig.enable_dedup_consume_config(app_name, pg_connect(dsn, connect_timeout=3))
    assert shown in str(caught.value) and "wrong-pw" not in str(caught.value)
    config = DedupConfig.enable_dedup_consume_config(
        app_name, pg_connect(dsn, connect_timeout=3), check_store=False
    )
    assert config.persist is not None
    with pytest.raises(StoreUnavailableError):
        config.persist.claim(Claim(element(app_name), "o"), LEASE)


def test_a_wrong_password_is_refused_at_start_up_naming_the_login(app_name: str) -> None:
    """A wrong password (the server's 28P01, which libpq reports without a sqlstate): a
    refusal a person must fix, not an unreachable store: DedupConfigError naming the user
    whose login was refused, never the password; without the check, the first claim is
    StoreMisconfiguredError, never an outage (no handler runs without dedup for it)."""
    dsn = PG_DSN.replace("dedup:dedup@", "dedup:wrong-pw@")
    with pytest.raises(DedupConfigError, match="refused the start-up check") as caught:
        DedupConfig.enable_dedup_consume_config(app_name, pg_connect(dsn, connect_timeout=3))
    assert "the PostgreSQL server refused the login of dedup" in str(caught.value)
    assert "wrong-pw" not in str(caught.value)
    config = DedupConfig.enable_dedup_consume_config(
        app_name, pg_connect(dsn, connect_timeout=3), check_store=False
    )
    assert config.persist is not None
    with pytest.raises(StoreMisconfiguredError, match="refused the login of dedup"):
        config.persist.claim(Claim(element(app_name), "o"), LEASE)


def test_missing_table_is_a_store_error_naming_it(app_name: str) -> None:
    """A table that does not exist is a StoreError (not an outage) that says so; the start-up
    check passes before create_table()."""
    store = PostgresDedupStore(pg_connect(), "t_not_created_yet")
    store.check()
    with pytest.raises(StoreError, match="does not exist") as caught:
        store.claim(Claim(element(app_name), "o"), LEASE)
    assert not isinstance(caught.value, StoreUnavailableError)
    store.close()


# -- connections handed back as they were found ------------------------------------------------


def test_an_applications_pool_gets_its_connections_back_unchanged(
    pg_table: str, app_name: str
) -> None:
    """A psycopg_pool pool whose connections are not in autocommit gets them back that way,
    idle, after claims and after a failed statement (no transaction, aborted or open, leaks
    into the application's next use)."""
    pool = psycopg_pool.ConnectionPool(PG_DSN, min_size=1, max_size=1, open=True)
    try:
        good = make_store(pool, table_name=pg_table)
        bad = make_store(pool, table_name="t_not_created_yet")
        assert good.claim(Claim(element(app_name), "o"), LEASE) == CLAIMED
        with pytest.raises(StoreError):
            bad.claim(Claim(element(app_name), "o"), LEASE)
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_a_connection_in_a_failed_transaction_is_rolled_back_first(
    pg_table: str, app_name: str
) -> None:
    """A factory whose connection comes in an aborted transaction (a failed statement not
    rolled back) still gives a working store."""

    def connect_after_an_error() -> Any:
        conn = psycopg.connect(PG_DSN)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        return conn

    store = PostgresDedupStore(connect_after_an_error, pg_table)
    assert store.claim(Claim(element(app_name), "o"), LEASE) == CLAIMED
    store.close()


def test_the_engines_pool_never_gets_an_autocommit_connection(
    pg_engine: Any, pg_table: str, app_name: str
) -> None:
    """On an engine the store keeps its connections out of the engine's pool: the
    application's next connection is in a transaction as SQLAlchemy expects."""
    store = make_store(pg_engine, table_name=pg_table)
    store.claim(Claim(element(app_name), "o"), LEASE)
    assert pg_engine.pool.checkedout() == 0
    with pg_engine.connect() as conn:
        assert conn.connection.driver_connection.autocommit is False
        conn.exec_driver_sql("SELECT 1")
        assert conn.in_transaction()
    store.close()


def test_describe_names_server_database_and_table_never_the_password(
    pg_table: str, pg_pool: Any, pg_engine: Any
) -> None:
    """describe() shows user@host:port/database and the table for each source."""
    port = PG_DSN.rsplit(":", 1)[1].split("/")[0]
    expected = f"dedup@127.0.0.1:{port}/dedup_test"
    for source in (pg_connect(password="s3cret"), pg_pool, pg_engine):
        text = make_store(source, table_name=pg_table).describe()
        assert expected.split("@")[1] in text and pg_table in text, text
        assert "s3cret" not in text and ":dedup@" not in text


# -- fork ----------------------------------------------------------------------------------------

FORK_AND_EXIT_NORMALLY = """
import gc, os, sys
from rocketmq_dedup import DedupElement, PostgresDedupStore
from rocketmq_dedup.stores.base import Claim
from tests.support import pg_connect

table, app = sys.argv[1:3]
connect = pg_connect()
calls = []
store = PostgresDedupStore(lambda: calls.append(1) or connect(), table)
assert store.claim(Claim(DedupElement(app, "T", "", "parent-1"), "p"), 60000).claimed
pid = os.fork()
if pid == 0:
    ok = store.claim(Claim(DedupElement(app, "T", "", "child"), "c"), 60000).claimed
    store.close()
    del store
    gc.collect()
    sys.exit(0 if ok and len(calls) == 2 else 1)  # a normal exit: everything is finalized
_, status = os.waitpid(pid, 0)
ok = store.claim(Claim(DedupElement(app, "T", "", "parent-2"), "p"), 60000).claimed
print(os.WEXITSTATUS(status), ok, len(calls))
"""


def test_a_forked_child_never_ends_the_parents_session(pg_table: str, app_name: str) -> None:
    """A forked child opens its own connection, closes the store and exits normally; the
    parent's connection survives (libpq's Terminate was never sent on it) and is reused."""
    result = subprocess.run(
        [sys.executable, "-c", FORK_AND_EXIT_NORMALLY, pg_table, app_name],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True", "1"], result.stderr


# -- lock waits are not outages ---------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout", ["lock_timeout=200", "statement_timeout=200"], ids=["lock", "statement"]
)
def test_a_lock_wait_that_times_out_never_runs_a_duplicate_without_dedup(
    pg_table: str, app_name: str, timeout: str
) -> None:
    """A claim waiting on a row another transaction holds, until the session's lock_timeout
    (55P03) or statement_timeout (57014) ends it: a StoreError, not an outage, so under the
    "consume" policy the duplicate is answered RECONSUME_LATER and its handler does not run."""
    from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener
    from rocketmq_dedup.testing import ClassicMessage

    runs: List[str] = []

    class Recording(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            runs.append(msg.id)
            return True

    store = PostgresDedupStore(pg_connect(options=f"-c {timeout}"), pg_table)
    listener = Recording(DedupConfig.enable_dedup_consume_config(app_name, store))
    assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
    ((app, topic, tag, key),) = pg_query(
        f"SELECT application_name, topic, tag, msg_uniq_key FROM {pg_table} "
        "WHERE application_name = %s",
        app_name,
    )
    e = DedupElement(app, topic, tag, key)
    holder = psycopg.connect(PG_DSN)
    try:
        holder.execute(f"SELECT 1 FROM {pg_table} WHERE dedup_key = %s FOR UPDATE", (e.digest(),))
        with pytest.raises(StoreLockConflictError):
            store.claim(Claim(e, "o"), LEASE)
        assert listener(ClassicMessage("m1")) is ConsumeStatus.RECONSUME_LATER
    finally:
        holder.rollback()
        holder.close()
        listener.close()
    assert runs == ["m1"]
