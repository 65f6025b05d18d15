"""TransactionalDedupListener against MariaDB (mysqlclient, PyMySQL, mysql-connector-python,
SQLAlchemy over the first two) and PostgreSQL (a psycopg factory, a psycopg_pool pool,
SQLAlchemy over psycopg): issue 11, requirements 1, 2, 5, 7 and 8 (3, 4 and 6 are in
test_exactly_once_*.py), and issue 34's on PostgreSQL."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any, Callable, List, Tuple

import pytest

from rocketmq_dedup import (
    ConsumeStatus,
    DedupConfig,
    DedupConfigError,
    DedupStatus,
    MemoryDedupStore,
    TransactionalDedupListener,
)
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.postgres import PostgresDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    POSTGRES_DB,
    SQL_STORES,
    Database,
    EffectListener,
    EffectTable,
    SequencedListener,
    dispose,
    execute,
    make_client,
    make_config,
    unique,
)
from tests.support import MYSQL, mysql_connect

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


def element(config: DedupConfig, msg_id: str) -> DedupElement:
    return DedupElement(config.application_name, "TEST-TOPIC", "TagA", msg_id)


def status_of(config: DedupConfig, msg_id: str) -> Any:
    assert config.persist is not None
    return config.persist.get_status(element(config, msg_id))


# -- requirement 1: commit together or not at all -------------------------------------------------


def test_success_commits_the_writes_and_the_record(
    config: DedupConfig, effects: EffectTable
) -> None:
    """True: the handler's row and the CONSUMED record are both committed."""
    listener = EffectListener(config, effects)
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert effects.count("m1") == 1
    assert status_of(config, "m1") is DedupStatus.CONSUMED


@pytest.mark.parametrize(
    "answer",
    [False, None, ConsumeStatus.RECONSUME_LATER, "ok", RuntimeError("boom")],
    ids=["false", "none", "retry-value", "other-value", "raises"],
)
def test_failure_rolls_back_everything(
    config: DedupConfig, effects: EffectTable, answer: Any
) -> None:
    """False, None, a retry value, another value or an exception: nothing committed, the claim
    released, RECONSUME_LATER; the retry runs and commits."""
    failing = [True]

    def behaviour(msg: Any, conn: Any) -> Any:
        if not failing[0]:
            return True
        if isinstance(answer, Exception):
            raise answer
        return answer

    listener = EffectListener(config, effects, behaviour)
    assert listener(ClassicMessage("m1")) is LATER
    assert effects.count("m1") == 0
    assert status_of(config, "m1") is None  # released: the retry may run at once
    failing[0] = False
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert effects.count("m1") == 1 and listener.calls["m1"] == 2


def test_a_dedup_statement_error_rolls_back(
    client: Any, db: Database, effects: EffectTable
) -> None:
    """A failing statement of the dedup layer (a missing sequence table) rolls back and
    answers RECONSUME_LATER, claim released, the handler not run."""
    name = unique("t_eo_noseq")
    config = make_config(client, name)
    assert isinstance(config.persist, SQL_STORES)
    config.persist.create_table()
    db.sql(f"DROP TABLE {name}_seq")
    try:
        listener = SequencedListener(config, effects, lambda msg: ("e", 1))
        assert listener(ClassicMessage("m1")) is LATER
        assert listener.calls == {} and effects.count("m1") == 0
        assert status_of(config, "m1") is None
    finally:
        config.close()
        db.drop(name, f"{name}_outbox", f"{name}_outbox_lane")


def test_batches_are_one_transaction_per_message(config: DedupConfig, effects: EffectTable) -> None:
    """consume_each and consume_message: each message commits or rolls back on its own."""
    listener = EffectListener(
        config, effects, lambda msg, conn: msg.id != "bad"
    )  # "bad" rolls back
    msgs = [ClassicMessage("a"), ClassicMessage("bad"), ClassicMessage("c")]
    assert listener.consume_each(msgs) == [SUCCESS, LATER, SUCCESS]
    assert effects.counts() == {"a": 1, "c": 1}
    result = listener.consume_message([ClassicMessage("d"), ClassicMessage("bad")])
    assert (result.status, result.ack_index) == (LATER, 0)
    assert effects.counts() == {"a": 1, "c": 1, "d": 1}
    assert status_of(config, "bad") is None


def test_the_handler_gets_the_transactions_connection(
    config: DedupConfig, effects: EffectTable
) -> None:
    """A SQLAlchemy Connection with an engine; else the DB-API proxy, whose cursor works."""
    seen = []

    def behaviour(msg: Any, conn: Any) -> bool:
        seen.append(conn)
        return True

    assert EffectListener(config, effects, behaviour)(ClassicMessage("m1")) is SUCCESS
    assert config.persist is not None
    if getattr(config.persist, "engine", None) is not None:
        assert type(seen[0]).__name__ == "Connection"
    else:
        assert type(seen[0]).__name__ == "HandlerConnection"


# -- requirement 2: a duplicate is answered at once -----------------------------------------------


def hold_row_locks_in_the_first_copy(
    effects: EffectTable,
) -> Tuple[Callable[[Any, Any], bool], threading.Event, threading.Event]:
    """A handler whose copy with body ``first`` takes a row lock and holds it (``holding``
    set) until ``finish``; other copies just succeed. Returns it and the two events."""
    effects.db.sql(f"INSERT INTO {effects.name} (k, v) VALUES ('lock-me', '0')")
    holding, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.body == b"first":
            execute(conn, f"UPDATE {effects.name} SET v = 'x' WHERE k = 'lock-me'")
            holding.set()
            finish.wait(10)
        return True

    return behaviour, holding, finish


def twins_answered_while_the_first_holds(
    first: EffectListener, twin: EffectListener, holding: threading.Event, finish: threading.Event
) -> List[ConsumeStatus]:
    """Copy ``first`` of m1 runs on ``first`` and holds its row lock; meanwhile three copies
    on ``twin`` are each answered RECONSUME_LATER within 1 s. Then the first may finish;
    returns its answer(s)."""
    answers: List[ConsumeStatus] = []
    thread = threading.Thread(
        target=lambda: answers.append(first(ClassicMessage("m1", body=b"first")))
    )
    thread.start()
    try:
        assert holding.wait(10)
        for _ in range(3):
            begin = time.monotonic()
            assert twin(ClassicMessage("m1", body=b"dup")) is LATER
            assert time.monotonic() - begin < 1.0
    finally:
        finish.set()
        thread.join(10)
    return answers


def test_a_duplicate_is_answered_at_once_whatever_locks_the_first_holds(
    config: DedupConfig, effects: EffectTable
) -> None:
    """While the first copy holds row locks and sleeps, its duplicate gets RECONSUME_LATER
    within 1 s without running; after the commit a duplicate is acked without the handler."""
    behaviour, holding, finish = hold_row_locks_in_the_first_copy(effects)
    listener = EffectListener(config, effects, behaviour)
    assert twins_answered_while_the_first_holds(listener, listener, holding, finish) == [SUCCESS]
    assert listener.calls["m1"] == 1
    assert listener(ClassicMessage("m1", body=b"dup")) is SUCCESS
    assert listener.calls["m1"] == 1 and effects.count("m1") == 1


# -- requirement 5: the committed record is the final word ----------------------------------------


def test_a_duplicate_after_the_commit_is_acked_without_the_handler(
    config: DedupConfig, effects: EffectTable
) -> None:
    """The record committed with the handler's writes answers every later copy."""
    listener = EffectListener(config, effects)
    for _ in range(3):
        assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.calls == {"m1": 1} and effects.count("m1") == 1


def _delete_record(config: DedupConfig, msg_id: str) -> None:
    assert isinstance(config.persist, SQL_STORES)
    config.persist.delete(element(config, msg_id), force=True)


def test_a_copy_committed_by_another_consumer_rolls_the_first_back(
    client: Any, table: str, config: DedupConfig, effects: EffectTable
) -> None:
    """claim="at_commit": while the first copy is in its handler, a copy in another consumer
    (its own store, as another process has) runs and commits; the first's record INSERT is
    refused by the key: it rolls back and is acked as a duplicate. Applied once."""
    running, finish = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.body == b"first":
            running.set()
            finish.wait(10)
        return True

    listener = EffectListener(config, effects, behaviour)
    other = EffectListener(make_config(client, table, config.application_name), effects)
    answers = []
    first = threading.Thread(
        target=lambda: answers.append(listener(ClassicMessage("m1", body=b"first")))
    )
    first.start()
    try:
        assert running.wait(10)
        assert other(ClassicMessage("m1", body=b"second")) is SUCCESS  # commits first
        assert effects.count("m1") == 1
    finally:
        finish.set()
        first.join(10)
        other.close()
    assert answers == [SUCCESS]  # rolled back, acked as a duplicate of the other's commit
    assert listener.calls["m1"] == 1 and other.calls["m1"] == 1
    assert effects.count("m1") == 1
    assert status_of(config, "m1") is DedupStatus.CONSUMED


def test_before_handler_answers_a_copy_in_another_consumer_at_once(
    client: Any, table: str, effects: EffectTable
) -> None:
    """claim="before_handler": while the first copy holds row locks in its handler, a copy in
    another consumer (its own store) is answered RECONSUME_LATER within 1 s, its handler not
    run; after the commit it is acked without its handler."""
    config = make_config(client, table, exactly_once_claim="before_handler")
    behaviour, holding, finish = hold_row_locks_in_the_first_copy(effects)
    listener = EffectListener(config, effects, behaviour)
    other_config = make_config(
        client, table, config.application_name, exactly_once_claim="before_handler"
    )
    other = EffectListener(other_config, effects, behaviour)
    try:
        answers = twins_answered_while_the_first_holds(listener, other, holding, finish)
        assert other.calls == {}
        assert answers == [SUCCESS]
        assert other(ClassicMessage("m1", body=b"dup")) is SUCCESS
        assert other.calls == {} and listener.calls == {"m1": 1}
        assert effects.count("m1") == 1
    finally:
        other.close()
        config.close()


def test_a_record_deleted_mid_handler_still_commits_once(
    config: DedupConfig, effects: EffectTable
) -> None:
    """An operator deletes the key's record while the handler runs (``release --force``; there
    is none yet): the commit writes the record, so the redelivery is a duplicate."""

    def behaviour(msg: Any, conn: Any) -> bool:
        _delete_record(config, msg.id)
        return True

    listener = EffectListener(config, effects, behaviour)
    assert listener(ClassicMessage("m1")) is SUCCESS
    listener.behaviour = None
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert listener.calls["m1"] == 1 and effects.count("m1") == 1


# -- requirement 7: bad input and misuse ----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "o-1",
        ("o-1",),
        ("o-1", "1"),
        ("o-1", True),
        ("", 1),
        (1, 1),
        ("o-1", 2**63),
        ("o-1", 1.0),
        RuntimeError("no sequence"),
    ],
    ids=["str", "1-tuple", "seq-str", "seq-bool", "empty", "int-entity", "big", "float", "raises"],
)
def test_a_bad_sequence_key_is_retried_later(
    config: DedupConfig, effects: EffectTable, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """sequence_key raising or returning a non-(str, int) pair: an error logged,
    RECONSUME_LATER, the handler not run, the claim released."""

    def sequence(msg: Any) -> Any:
        if isinstance(value, Exception):
            raise value
        return value

    listener = SequencedListener(config, effects, sequence)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    assert listener.calls == {} and effects.count("m1") == 0
    assert status_of(config, "m1") is None
    assert any("sequence_key" in r.getMessage() for r in caplog.records)


def _misuse(call: str) -> Any:
    def behaviour(msg: Any, conn: Any) -> bool:
        try:
            if call == "autocommit" and hasattr(conn, "execution_options"):  # SQLAlchemy's way
                conn.execution_options(isolation_level="AUTOCOMMIT")
            elif call == "autocommit" and hasattr(conn, "pgconn"):  # psycopg's: a property
                conn.autocommit = True
            elif call == "autocommit":
                conn.autocommit(True)
            else:
                getattr(conn, call)()
        except Exception:  # a handler that swallows the refusal still fails
            pass
        return True

    return behaviour


@pytest.mark.parametrize("call", ["commit", "rollback", "close", "autocommit"])
def test_a_handler_cannot_end_its_transaction(
    config: DedupConfig,
    effects: EffectTable,
    call: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """conn.commit()/rollback()/close()/autocommit(True) in the handler: refused or detected,
    an error logged, nothing committed, RECONSUME_LATER; the retry commits once."""
    assert config.persist is not None
    listener = EffectListener(config, effects, _misuse(call))
    if call == "autocommit" and getattr(config.persist, "engine", None) is not None:
        # SQLAlchemy has no autocommit() on a Connection; its isolation level option applies
        # from the next transaction on, so this one still commits whole, record included.
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert effects.count("m1") == 1
        assert status_of(config, "m1") is DedupStatus.CONSUMED
        return
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    assert effects.count("m1") == 0
    assert status_of(config, "m1") is None
    assert any("do_handle_msg called" in r.getMessage() for r in caplog.records)
    listener.behaviour = None
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert effects.count("m1") == 1


def test_a_handler_returning_a_coroutine_rolls_back_and_closes_it(
    config: DedupConfig, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain def handler that returns a coroutine (an async call not awaited): its writes
    rolled back, nothing recorded, an error naming the awaitable, RECONSUME_LATER; the
    coroutine closed unrun. The retry, returning True, commits once."""
    returned: List[Any] = []

    async def forgotten() -> bool:
        raise AssertionError("the coroutine must never run")

    def behaviour(msg: Any, conn: Any) -> Any:
        returned.append(forgotten())
        return returned[-1]

    listener = EffectListener(config, effects, behaviour)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    assert effects.count("m1") == 0 and status_of(config, "m1") is None
    assert inspect.getcoroutinestate(returned[0]) == "CORO_CLOSED"
    assert any("returned an awaitable, <coroutine" in r.getMessage() for r in caplog.records)
    listener.behaviour = None
    assert listener(ClassicMessage("m1")) is SUCCESS
    assert effects.count("m1") == 1


@pytest.mark.parametrize("driver", ["mysqlclient", "pymysql"])
def test_a_factory_in_autocommit_mode_still_rolls_back(
    driver: str, table: str, effects: EffectTable
) -> None:
    """Connections the factory opens in autocommit mode: the store switches its transaction
    connections to autocommit off, so a failed handler's writes are still rolled back."""
    config = make_config(mysql_connect(driver, autocommit=True), table)
    try:
        listener = EffectListener(config, effects, lambda msg, conn: msg.id == "ok")
        assert listener(ClassicMessage("no")) is LATER
        assert listener(ClassicMessage("ok")) is SUCCESS
        assert effects.counts() == {"ok": 1}
    finally:
        config.close()


@pytest.mark.parametrize("driver", ["sqlalchemy+mysqlclient", "sqlalchemy+pymysql"])
def test_an_engine_in_autocommit_mode_is_refused_per_message(
    driver: str, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """isolation_level="AUTOCOMMIT": engine.begin() would open no transaction, so every
    message gets an error and RECONSUME_LATER, and the handler never runs."""
    engine = make_client(driver, isolation_level="AUTOCOMMIT")
    config = make_config(engine, table)
    try:
        listener = EffectListener(config, effects)
        with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("m1")) is LATER
        assert listener.calls == {} and effects.count("m1") == 0
        assert status_of(config, "m1") is None
        assert any("autocommit" in r.getMessage() for r in caplog.records)
    finally:
        config.close()
        dispose(engine)


@pytest.mark.parametrize(
    ("driver", "options"),
    [("psycopg", {"autocommit": True}), ("psycopg_pool", {"kwargs": {"autocommit": True}})],
)
def test_postgres_connections_in_autocommit_mode_still_roll_back(
    driver: str, options: Any, table: str, effects: EffectTable
) -> None:
    """PostgreSQL: connections that come in autocommit mode (a factory's, a pool's): the
    transaction is BEGIN ... COMMIT sent by the library, so a failed handler's writes are
    still rolled back, and a pool's connection is given back in autocommit mode as found."""
    client = make_client(driver, **options)
    config = make_config(client, table)
    try:
        listener = EffectListener(config, effects, lambda msg, conn: msg.id == "ok")
        assert listener(ClassicMessage("no")) is LATER
        assert listener(ClassicMessage("ok")) is SUCCESS
        assert effects.counts() == {"ok": 1}
        if driver == "psycopg_pool":
            with client.connection() as conn:
                assert conn.autocommit is True
    finally:
        config.close()
        dispose(client)


@pytest.mark.parametrize("driver", ["sqlalchemy+psycopg"])
def test_a_postgres_engine_in_autocommit_mode_still_rolls_back(
    driver: str, table: str, effects: EffectTable
) -> None:
    """isolation_level="AUTOCOMMIT" on PostgreSQL: engine.begin() opens no transaction there,
    but the library sends its own BEGIN, so a failed handler's writes are rolled back and a
    successful one commits with its record (MySQL refuses such an engine per message)."""
    engine = make_client(driver, isolation_level="AUTOCOMMIT")
    config = make_config(engine, table)
    try:
        listener = EffectListener(config, effects, lambda msg, conn: msg.body == b"ok")
        assert listener(ClassicMessage("m1", body=b"no")) is LATER
        assert effects.count("m1") == 0 and status_of(config, "m1") is None
        assert listener(ClassicMessage("m1", body=b"ok")) is SUCCESS
        assert effects.count("m1") == 1
        assert status_of(config, "m1") is DedupStatus.CONSUMED
    finally:
        config.close()
        dispose(engine)


def test_a_config_without_a_sql_store_is_refused() -> None:
    """Memory store, no config, dedup disabled: DedupConfigError at construction."""

    class Listener(TransactionalDedupListener):
        def do_handle_msg(self, msg: Any, conn: Any) -> bool:
            return True

    memory = DedupConfig.enable_dedup_consume_config("app", MemoryDedupStore())
    for config in (memory, None, DedupConfig.disable_dedup_consume_config("app")):
        with pytest.raises(DedupConfigError, match="the MySQL or PostgreSQL store"):
            Listener(config)  # type: ignore[arg-type]


@pytest.mark.parametrize("driver", ["mysqlclient", "psycopg"])
def test_a_store_outage_is_reconsume_later_whatever_the_policy(
    driver: str, effects: EffectTable
) -> None:
    """An unreachable database: RECONSUME_LATER even with store_failure_policy="consume"."""
    config = DedupConfig.enable_dedup_consume_config(
        unique("eo-app"),
        make_client(driver, port=1, connect_timeout=1),
        check_store=False,
        store_failure_policy="consume",
    )
    listener = EffectListener(config, effects)
    assert listener(ClassicMessage("m1")) is LATER
    assert listener.calls == {}


def test_a_message_without_a_key_still_runs_in_a_transaction(
    config: DedupConfig, effects: EffectTable
) -> None:
    """Dedup key None: no record, but the handler's writes still commit or roll back whole."""

    class NoKey(EffectListener):
        def dedup_message_key(self, msg: Any) -> Any:
            return None

    listener = NoKey(config, effects, lambda msg, conn: msg.body == b"ok")
    assert listener(ClassicMessage("m1", body=b"no")) is LATER
    assert listener(ClassicMessage("m1", body=b"ok")) is SUCCESS
    assert effects.count("m1") == 1


# -- requirement 8: tables ------------------------------------------------------------------------


def test_create_table_creates_every_table_idempotently(client: Any, db: Database) -> None:
    """create_table() twice: the dedup, the sequence and the outbox's two tables exist, nothing
    fails."""
    name = unique("t_eo_tables")
    config = make_config(client, name)
    query = (
        "SELECT tablename FROM pg_tables WHERE tablename LIKE %s"
        if db is POSTGRES_DB
        else "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = DATABASE() AND table_name LIKE %s"
    )
    try:
        assert isinstance(config.persist, SQL_STORES)
        config.persist.create_table()
        config.persist.create_table()
        tables = {str(t) for (t,) in db.sql(query, (name + "%",))}
        assert tables == {name, name + "_seq", name + "_outbox", name + "_outbox_lane"}
    finally:
        config.close()
        db.drop(name, f"{name}_seq", f"{name}_outbox", f"{name}_outbox_lane")


def test_schema_mysql_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's schema mysql prints the dedup table, its sequence table and the outbox's."""
    from rocketmq_dedup.cli import main

    assert main(["schema", "mysql", "--table", "t_x"]) == 0
    out = capsys.readouterr().out
    for table in ("t_x", "t_x_seq", "t_x_outbox", "t_x_outbox_lane"):
        assert f"CREATE TABLE IF NOT EXISTS `{table}` (" in out


def test_schema_postgres_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's schema postgres prints the dedup table, its sequence table and the outbox's
    two, with their column comments; the statements run as printed create them all (on a table
    of its own)."""
    from rocketmq_dedup.cli import main

    name = unique("t_eo_printed")
    assert main(["schema", "postgres", "--table", name]) == 0
    out = capsys.readouterr().out
    assert f'CREATE TABLE IF NOT EXISTS "{name}" (' in out
    assert f'CREATE TABLE IF NOT EXISTS "{name}_seq" (' in out
    assert f'COMMENT ON COLUMN "{name}_seq".last_seq IS' in out
    assert f'CREATE TABLE IF NOT EXISTS "{name}_outbox" (' in out
    assert f'CREATE TABLE IF NOT EXISTS "{name}_outbox_lane" (' in out
    assert f'COMMENT ON COLUMN "{name}_outbox".due_at IS' in out
    try:
        for statement in out.split(";\n"):
            if statement.strip():
                POSTGRES_DB.sql(statement)
        rows = POSTGRES_DB.sql(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (name + "%",)
        )
        outbox = {name + "_outbox", name + "_outbox_lane"}
        assert {str(t) for (t,) in rows} == {name, name + "_seq", *outbox}
    finally:
        POSTGRES_DB.drop(name, f"{name}_seq", f"{name}_outbox", f"{name}_outbox_lane")


def test_an_engine_makes_the_mysql_store() -> None:
    """make_store takes a SQLAlchemy Engine: a MySQL store on it (no password in its
    description); an engine of another dialect is refused."""
    import sqlalchemy

    from rocketmq_dedup.stores import make_store

    engine = make_client("sqlalchemy+pymysql")
    try:
        store = make_store(engine, table_name="t_x", pool_size=2)
        assert isinstance(store, MySQLDedupStore) and store.engine is engine
        assert "SQLAlchemy" in store.describe()
        assert f":{MYSQL['password']}@" not in store.describe()
    finally:
        dispose(engine)
    with pytest.raises(DedupConfigError, match="dialect"):
        make_store(sqlalchemy.create_engine("sqlite://"))


def test_a_postgres_engine_makes_the_postgres_store_with_transactions() -> None:
    """make_store takes a postgresql+psycopg engine: a PostgreSQL store whose transactions run
    on the engine (no password in its description)."""
    from rocketmq_dedup.stores import make_store

    engine = make_client("sqlalchemy+psycopg")
    try:
        store = make_store(engine, table_name="t_x", pool_size=2)
        assert isinstance(store, PostgresDedupStore) and store.engine is engine
        assert store.transactions.engine is engine
        assert "SQLAlchemy" in store.describe() and ":dedup@" not in store.describe()
    finally:
        dispose(engine)


@pytest.mark.parametrize("driver", ["sqlalchemy+mysqlclient", "sqlalchemy+pymysql"])
def test_the_applications_engine_outlives_the_lowered_idle_timeout(
    driver: str, table: str, effects: EffectTable
) -> None:
    """SQLAlchemy: a transaction's connection goes back to the engine's pool with the session
    idle timeout this mode set (the hold: 2 s here). Left idle there past it, the server ends
    that session; the application's next ``engine.connect()`` (no ``pool_pre_ping``) gets a
    new one with the server's default timeout, never "server has gone away"."""
    engine = make_client(driver, pool_size=1, max_overflow=0)
    try:
        config = make_config(
            engine, table, dedup_processing_expire_milli_seconds=2000, lease_renewal=False
        )
        config.persist.create_table()  # type: ignore[union-attr]
        listener = EffectListener(config, effects)
        try:
            assert listener(ClassicMessage("m1")) is ConsumeStatus.CONSUME_SUCCESS
        finally:
            listener.close()
        time.sleep(3.5)  # what is under test: 2 s of idleness, and the server's ending of it
        with engine.connect() as conn:  # the pool's one connection, the one the mode used
            timeout = conn.exec_driver_sql("SELECT @@session.wait_timeout").scalar()
        assert timeout is not None and int(timeout) > 2
    finally:
        dispose(engine)


@pytest.mark.parametrize("driver", ["psycopg_pool", "sqlalchemy+psycopg"])
def test_the_applications_postgres_connections_come_back_as_they_were(
    driver: str, table: str, effects: EffectTable
) -> None:
    """PostgreSQL, an application's pool or engine of one connection: after a committed and a
    rolled-back message, that connection is as the application left it: autocommit off, the
    idle timeout the server's (the hold was SET LOCAL), no transaction open, no prepared
    statement of the library's."""
    client = one_connection_client(driver)
    default = POSTGRES_DB.sql("SHOW idle_in_transaction_session_timeout")[0][0]
    config = make_config(client, table, dedup_processing_expire_milli_seconds=2000)
    try:
        listener = EffectListener(config, effects, lambda msg, conn: msg.body != b"no")
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert listener(ClassicMessage("m2", body=b"no")) is LATER
        if driver == "psycopg_pool":
            with client.connection() as conn:
                found = (conn.autocommit, conn.info.transaction_status)
                rows = conn.execute(PREPARED_AND_TIMEOUT).fetchall()
                conn.rollback()
        else:
            with client.connect() as sa:
                raw = sa.connection.dbapi_connection
                found = (raw.autocommit, raw.info.transaction_status)
                rows = sa.exec_driver_sql(PREPARED_AND_TIMEOUT).fetchall()
        assert found == (False, 0)  # TransactionStatus.IDLE before the statement
        assert rows == [(0, default)]
    finally:
        config.close()
        dispose(client)


PREPARED_AND_TIMEOUT = (
    "SELECT (SELECT count(*) FROM pg_prepared_statements), "
    "current_setting('idle_in_transaction_session_timeout')"
)


def one_connection_client(driver: str) -> Any:
    if driver == "psycopg_pool":
        return make_client(driver, min_size=1, max_size=1)
    return make_client(driver, pool_size=1, max_overflow=0)


def savepoint(conn: Any) -> Any:
    """A savepoint of the handler's transaction: psycopg's ``conn.transaction()``, or
    SQLAlchemy's ``conn.begin_nested()``."""
    return conn.begin_nested() if hasattr(conn, "begin_nested") else conn.transaction()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg_pool", "sqlalchemy+psycopg"])
@pytest.mark.parametrize("in_savepoint", [True, False], ids=["savepoint", "bare"])
def test_a_failed_statement_of_the_handler_on_postgres(
    driver: str,
    in_savepoint: bool,
    config: DedupConfig,
    effects: EffectTable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL aborts a transaction at a failed statement. Inside a savepoint
    (``conn.transaction()``; SQLAlchemy's ``begin_nested()``) the handler goes on after it,
    returns True, and its writes commit with the record. Outside one, catching the error and
    returning True commits nothing: rolled back, logged as what it is, RECONSUME_LATER; the
    connection serves the next message."""

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.body == b"fail":
            try:
                if in_savepoint:
                    with savepoint(conn):
                        execute(conn, "SELECT 1 / 0")
                else:
                    execute(conn, "SELECT 1 / 0")
            except Exception:
                pass
        return True

    listener = EffectListener(config, effects, behaviour)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        answer = listener(ClassicMessage("m1", body=b"fail"))
    if in_savepoint:
        assert answer is SUCCESS and effects.count("m1") == 1
        assert status_of(config, "m1") is DedupStatus.CONSUMED
    else:
        assert answer is LATER and effects.count("m1") == 0
        assert status_of(config, "m1") is None
        assert any("left its transaction aborted" in r.getMessage() for r in caplog.records)
        assert listener(ClassicMessage("m2")) is SUCCESS  # the same pool serves on
        assert effects.count("m2") == 1
