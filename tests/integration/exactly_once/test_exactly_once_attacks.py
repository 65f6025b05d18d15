"""The attacks on the exactly-once mode that broke it (issue 31, items 1-5), on every driver of
MySQL and PostgreSQL: session state a handler leaves behind, a session swapped or lost under the
handler, the ``before_handler`` claim's order (lock first, then read; no snapshot before a
wait), and lock waits told apart from outages. Where an attack is MySQL's own (autocommit as
session state, a reconnecting ping, a driver that reconnects by itself), PostgreSQL gets its
counterpart (a transaction ended by SQL text, a backend terminated, a connection closed behind
the proxy)."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Any, Dict, List

import prometheus_client
import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupStatus, TransactionMisuseError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import PrometheusMetrics
from rocketmq_dedup.stores.transaction import Entity
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    MYSQL_DRIVERS,
    PG_DRIVERS,
    Database,
    EffectListener,
    EffectTable,
    SequencedListener,
    dispose,
    execute,
    make_client,
    make_config,
    one_connection,
    raw_connection,
    unique,
)
from tests.support import PG_DSN, mysql_connect, prometheus_value

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


def element(config: DedupConfig, msg_id: str) -> DedupElement:
    return DedupElement(config.application_name, "TEST-TOPIC", "TagA", msg_id)


def status_of(config: DedupConfig, msg_id: str) -> Any:
    assert config.persist is not None
    return config.persist.get_status(element(config, msg_id))


# -- item 1: a session left in autocommit never serves another message -------------------------


#: SQL text that leaves the session unfit for the next message: MySQL's autocommit (session
#: state), PostgreSQL's end of the transaction (the session then autocommits).
LEAVE = {"mysql": "SET autocommit = 1", "postgres": "COMMIT"}
LEFT = {"mysql": "autocommit", "postgres": "ended its transaction"}


def test_a_session_left_in_autocommit_never_serves_the_next_message(
    driver: str, db: Database, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """One connection for every transaction. Message a's handler sends ``SET autocommit = 1``
    (PostgreSQL: ``COMMIT``) and returns True: detected, rolled back, RECONSUME_LATER (its
    writes after the SET were committed by the server: they stay, as the README says).
    Message b then writes a row and asks for a retry: its row is rolled back, so its retry
    applies it once (before the fix the session stayed in autocommit and b's row was applied
    twice), on another session than a's."""
    client = one_connection(driver)
    config = make_config(client, table, pool_size=1)
    sessions = {}
    try:
        config.persist.create_table()  # type: ignore[union-attr]

        def behaviour(msg: Any, conn: Any) -> bool:
            sessions.setdefault(msg.id, db.session_of(conn))
            if msg.id == "a":
                execute(conn, LEAVE[db.name])
                return True
            return msg.body == b"retry"

        listener = EffectListener(config, effects, behaviour)
        with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("a")) is LATER
        assert any(LEFT[db.name] in r.getMessage() for r in caplog.records)
        assert status_of(config, "a") is None
        assert listener(ClassicMessage("b", body=b"first")) is LATER
        assert effects.count("b") == 0  # rolled back: not a session in autocommit
        assert listener(ClassicMessage("b", body=b"retry")) is SUCCESS
        assert effects.count("b") == 1
        assert status_of(config, "b") is DedupStatus.CONSUMED
        assert sessions["b"] != sessions["a"]
        listener.close()
    finally:
        config.close()
        dispose(client)


# -- item 2: a message commits only on the session it began -----------------------------------


@pytest.mark.parametrize("driver", MYSQL_DRIVERS)
def test_a_reconnecting_ping_is_refused_and_nothing_of_the_message_commits(
    driver: str,
    db: Database,
    client: Any,
    table: str,
    effects: EffectTable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The handler writes w1, its session is lost (KILL), it asks for a reconnecting ping, then
    writes w2 and returns True. The ping is refused (DB-API) or the lost session found
    (SQLAlchemy): RECONSUME_LATER, no record, neither write committed; the retry applies both
    once. Before the fix: w1 lost, w2 applied, the message acked."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    attempts: List[int] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        attempts.append(1)
        if len(attempts) > 1:
            effects.insert(conn, "w2")
            return True
        db.kill_own_session(conn)
        try:
            if hasattr(conn, "exec_driver_sql"):
                raw_connection(conn).ping(True)  # SQLAlchemy: only the raw connection pings
            else:
                conn.ping(True)
        except Exception:  # a handler that swallows the refusal still fails
            pass
        with contextlib.suppress(Exception):
            effects.insert(conn, "w2")
        return True

    listener = EffectListener(config, effects, behaviour)  # writes w1 = the message id
    try:
        with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("w1")) is LATER
        assert status_of(config, "w1") is None
        assert effects.counts().get("w1", 0) == 0
        assert any(
            "ping(reconnect=True)" in r.getMessage() or "reconnect" in r.getMessage()
            for r in caplog.records
        )
        assert listener(ClassicMessage("w1")) is SUCCESS
        assert effects.count("w1") == 1
        assert effects.count("w2") <= 2  # w2 of the first attempt only if autocommitted
        assert status_of(config, "w1") is DedupStatus.CONSUMED
    finally:
        listener.close()


@pytest.mark.parametrize("driver", PG_DRIVERS)
def test_a_terminated_backend_commits_nothing_of_the_message(
    driver: str,
    db: Database,
    client: Any,
    table: str,
    effects: EffectTable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL (a psycopg connection never reconnects): the handler writes w1, its backend
    is terminated (``pg_terminate_backend``), it writes w2 (refused: the connection is lost,
    the handler swallows it) and returns True: the lost session is found before the record:
    RECONSUME_LATER, no record, neither write committed; the retry applies w1 once."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    attempts: List[int] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        attempts.append(1)
        if len(attempts) == 1:
            db.kill_own_session(conn)
            with contextlib.suppress(Exception):
                effects.insert(conn, "w2")
        return True

    listener = EffectListener(config, effects, behaviour)  # writes w1 = the message id
    try:
        with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("w1")) is LATER
        assert status_of(config, "w1") is None
        assert effects.counts() == {}
        assert any("lost the session" in r.getMessage() for r in caplog.records)
        assert listener(ClassicMessage("w1")) is SUCCESS
        assert effects.counts() == {"w1": 1}
        assert status_of(config, "w1") is DedupStatus.CONSUMED
    finally:
        listener.close()


@pytest.mark.parametrize("driver", MYSQL_DRIVERS)
def test_a_session_swapped_behind_the_proxy_is_never_committed_on(
    driver: str, db: Database, client: Any, table: str, effects: EffectTable
) -> None:
    """The handler reaches its raw connection, loses its session (KILL) and reconnects there
    (``ping(True)``), writes w2 on the new session and returns True: the changed session is
    found before the record is written: RECONSUME_LATER, no record, and the connection is not
    reused."""
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    swapped: List[int] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        if swapped:
            return True
        db.kill_own_session(conn)
        raw = raw_connection(conn)
        if hasattr(raw, "reconnect") and not hasattr(raw, "thread_id"):
            raw.reconnect()  # mysql-connector-python
        else:
            raw.ping(True)
        swapped.append(1)
        return True

    listener = EffectListener(config, effects, behaviour)
    try:
        assert listener(ClassicMessage("m1")) is LATER
        assert status_of(config, "m1") is None
        assert effects.count("m1") == 0  # w1 went with the lost session
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert effects.count("m1") == 1
    finally:
        listener.close()


@pytest.mark.parametrize("driver", PG_DRIVERS)
def test_a_connection_closed_behind_the_proxy_is_never_committed_on_nor_reused(
    driver: str, db: Database, table: str, effects: EffectTable
) -> None:
    """PostgreSQL, one connection for every transaction: the handler reaches its psycopg
    connection and closes it (the server rolls back what it wrote) and returns True: found
    before the record: RECONSUME_LATER, no record; the next message runs on another session
    and commits once."""
    client = one_connection(driver)
    config = make_config(client, table, pool_size=1)
    sessions: List[int] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        sessions.append(db.session_of(conn))
        if len(sessions) == 1:
            raw_connection(conn).close()
        return True

    listener = EffectListener(config, effects, behaviour)
    try:
        assert listener(ClassicMessage("m1")) is LATER
        assert status_of(config, "m1") is None and effects.count("m1") == 0
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert effects.count("m1") == 1 and sessions[1] != sessions[0]
    finally:
        listener.close()
        config.close()
        dispose(client)


@pytest.mark.parametrize("driver", ["mysqlclient", "sqlalchemy+mysqlclient"])
def test_a_driver_that_reconnects_by_itself_never_commits_on_a_new_session(
    driver: str, db: Database, table: str, effects: EffectTable
) -> None:
    """mysqlclient only (the one driver that reconnects by itself): the handler turns its raw
    connection's reconnect option on (``ping(True)`` on a live session), writes w1, its session
    is killed, and it returns True. The record and COMMIT are not run on a reconnected session
    (the client library does not reconnect inside a transaction): the commit fails as a lost
    connection, RECONSUME_LATER, no record; the retry applies w1 once on a new connection."""
    client = make_client(driver)
    config = make_config(client, table)
    config.persist.create_table()  # type: ignore[union-attr]
    first: List[int] = []

    def behaviour(msg: Any, conn: Any) -> bool:
        if not first:
            first.append(1)
            raw_connection(conn).ping(True)  # sets MYSQL_OPT_RECONNECT on the raw connection
            db.kill_own_session(conn)
        return True

    listener = EffectListener(config, effects, behaviour)
    try:
        assert listener(ClassicMessage("m1")) is LATER
        assert status_of(config, "m1") is None
        assert effects.count("m1") == 0
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert effects.count("m1") == 1
        assert status_of(config, "m1") is DedupStatus.CONSUMED
    finally:
        listener.close()
        config.close()
        dispose(client)


def test_a_conn_kept_after_its_message_refuses_every_use_and_the_next_message_is_untouched(
    driver: str, db: Database, table: str, effects: EffectTable
) -> None:
    """One connection for every transaction. Message a's handler keeps its ``conn``; after a
    ended, a write through the kept ``conn`` (outside any handler, then inside message b's)
    raises a clear error and reaches no session: b commits its own row and its record, and
    nothing of the stray writes (before the fix the kept DB-API proxy still reached the pooled
    connection: the first stray write opened a transaction there that b then committed as its
    own)."""
    client = one_connection(driver)
    config = make_config(client, table, pool_size=1)
    kept: List[Any] = []
    errors: List[BaseException] = []

    def stray_write() -> None:
        try:
            effects.insert(kept[0], "stray")
        except Exception as exc:
            errors.append(exc)

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.id == "a":
            kept.append(conn)
        else:
            assert conn is not kept[0]
            stray_write()
        return True

    listener = EffectListener(config, effects, behaviour)
    try:
        config.persist.create_table()  # type: ignore[union-attr]
        assert listener(ClassicMessage("a")) is SUCCESS
        stray_write()
        assert listener(ClassicMessage("b")) is SUCCESS
        assert len(errors) == 2
        for error in errors:
            if driver.startswith("sqlalchemy"):  # the Connection itself, closed at the end
                assert "closed" in str(error)
            else:
                assert isinstance(error, TransactionMisuseError)
                assert "transaction has ended" in str(error)
        assert effects.counts() == {"a": 1, "b": 1}
        assert status_of(config, "b") is DedupStatus.CONSUMED
    finally:
        listener.close()
        config.close()
        dispose(client)


# -- item 3: no snapshot before the sequence guard's wait -----------------------------------------


class Counter:
    """A business row the steps read, then write (read-modify-write, the way that loses an
    update when the read comes from a snapshot taken before the wait)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.name = unique("t_eo_counter")
        db.sql(db.counter_table_sql.format(name=self.name))
        db.sql(f"INSERT INTO {self.name} VALUES ('acct', 0)")

    def increment(self, conn: Any) -> None:
        (value,) = execute(conn, f"SELECT v FROM {self.name} WHERE k = 'acct'").fetchall()[0]
        execute(conn, f"UPDATE {self.name} SET v = %s WHERE k = 'acct'", (int(value) + 1,))

    def value(self) -> int:
        return int(self.db.sql(f"SELECT v FROM {self.name} WHERE k = 'acct'")[0][0])

    def drop(self) -> None:
        self.db.drop(self.name)


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
def test_an_entitys_steps_read_what_the_previous_step_wrote(
    claim: str, db: Database, client: Any, table: str, effects: EffectTable
) -> None:
    """Steps 1 and 2 of one entity each read a counter and write it back plus one. Step 2
    arrives while step 1 is in its handler and waits for the entity's row; when it runs, it
    reads step 1's write: the counter ends at 2 (before the fix, before_handler read from a
    snapshot taken before the wait: 1)."""
    config = make_config(client, table, exactly_once_claim=claim)
    config.persist.create_table()  # type: ignore[union-attr]
    counter = Counter(db)
    step1_in_handler, step1_may_commit = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        counter.increment(conn)
        if msg.id == "step-1":
            step1_in_handler.set()
            assert step1_may_commit.wait(20)
        return True

    listener = SequencedListener(
        config, effects, lambda msg: ("acct", int(msg.id.rpartition("-")[2])), behaviour
    )
    answers: Dict[str, ConsumeStatus] = {}
    first = threading.Thread(
        target=lambda: answers.update({"1": listener(ClassicMessage("step-1"))})
    )
    second = threading.Thread(
        target=lambda: answers.update({"2": listener(ClassicMessage("step-2"))})
    )
    try:
        first.start()
        assert step1_in_handler.wait(20)
        second.start()
        sequence_table = f"{table}_seq"
        deadline = time.monotonic() + 20
        while not db.waiting_on(sequence_table):  # step 2 waits for the entity's row
            assert time.monotonic() < deadline, "step 2 never waited for step 1"
            time.sleep(0.01)
    finally:
        step1_may_commit.set()
        first.join(20)
        second.join(20)
        listener.close()
    try:
        assert answers == {"1": SUCCESS, "2": SUCCESS}
        assert counter.value() == 2
    finally:
        counter.drop()


# -- item 4: before_handler never runs a duplicate's handler --------------------------------------


def race_two_consumers(
    config: DedupConfig, other: DedupConfig, effects: EffectTable, keys: int
) -> Dict[str, int]:
    """Every key delivered at once to two consumers (their own stores, as two processes), each
    with 3 threads redelivering on RECONSUME_LATER, with a handler that takes no time; returns
    how many times each key's handler ran, over both."""
    runs: Dict[str, int] = collections.Counter()
    lock = threading.Lock()

    def behaviour(msg: Any, conn: Any) -> bool:
        with lock:
            runs[msg.id] += 1  # a side effect outside the database
        return True

    def drive(listener: EffectListener) -> None:
        queue = collections.deque(f"k{i}" for i in range(keys))
        queue_lock = threading.Lock()
        deadline = time.monotonic() + 120

        def worker() -> None:
            while time.monotonic() < deadline:
                with queue_lock:
                    if not queue:
                        return
                    key = queue.popleft()
                if listener(ClassicMessage(key)) is LATER:
                    with queue_lock:
                        queue.append(key)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(130)
        assert not queue, f"{len(queue)} key(s) never acked"

    consumers = [
        EffectListener(config, effects, behaviour),
        EffectListener(other, effects, behaviour),
    ]
    drivers = [threading.Thread(target=drive, args=(listener,)) for listener in consumers]
    try:
        for thread in drivers:
            thread.start()
        for thread in drivers:
            thread.join(140)
    finally:
        for listener in consumers:
            listener.close()
    return dict(runs)


def test_before_handler_never_runs_a_committed_messages_handler(
    client: Any, table: str, effects: EffectTable
) -> None:
    """Two consumers racing over 1,500 keys with before_handler: each key's handler runs once
    over both (lock first, then read: a copy whose twin committed and freed the lock between a
    look-up and a lock can no longer run; before the fix a few keys of thousands ran twice)."""
    options: Dict[str, Any] = {"exactly_once_claim": "before_handler", "pool_size": 8}
    config = make_config(client, table, **options)
    config.persist.create_table()  # type: ignore[union-attr]
    other = make_config(client, table, config.application_name, **options)
    try:
        runs = race_two_consumers(config, other, effects, keys=1500)
    finally:
        other.close()
    twice = {key: n for key, n in runs.items() if n != 1}
    assert len(runs) == 1500 and not twice, twice


# -- item 5: lock waits are lock conflicts, not outages ------------------------------------------


def test_a_lock_wait_on_the_guards_row_is_a_lock_conflict_not_an_outage(
    driver: str, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """innodb_lock_wait_timeout = 1 s: step 2 of an entity waits for its row while step 1 holds
    it in its handler, and times out (1205) in the guard's own statement: RECONSUME_LATER,
    logged as a lock wait (not "the business database is unavailable"), outcome
    lock_conflict in the metrics, store_error outcomes untouched."""
    client = lock_timeout_client(driver)
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    config = make_config(client, table, metrics=metrics)
    config.persist.create_table()  # type: ignore[union-attr]
    holding, release = threading.Event(), threading.Event()

    def behaviour(msg: Any, conn: Any) -> bool:
        if msg.id == "s1":
            holding.set()
            release.wait(20)
        return True

    listener = SequencedListener(config, effects, lambda msg: ("e", int(msg.id[1:])), behaviour)
    first = threading.Thread(target=lambda: listener(ClassicMessage("s1")))
    first.start()
    try:
        assert holding.wait(20)
        with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("s2")) is LATER
    finally:
        release.set()
        first.join(20)
        listener.close()
        config.close()
        dispose(client)
    messages = [r.getMessage() for r in caplog.records]
    assert any("lock wait" in m for m in messages), messages
    assert not any("unavailable" in m for m in messages), messages
    labels = {"app": config.application_name, "topic": "TEST-TOPIC"}
    counted = prometheus_value(
        registry, "rocketmq_dedup_messages_total", outcome="lock_conflict", **labels
    )
    assert counted == 1
    later = prometheus_value(
        registry, "rocketmq_dedup_messages_total", outcome="store_error_later", **labels
    )
    assert not later


@pytest.mark.parametrize("driver", PG_DRIVERS)
def test_a_deadlock_in_the_guards_statement_is_a_lock_conflict_not_an_outage(
    driver: str, client: Any, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL, before_handler with a sequence key: the copy holds the key's advisory lock
    and waits for its entity's row, which another transaction holds; that transaction then
    waits for the key's lock: a deadlock. The server breaks it in the copy's statement (it
    waited first): RECONSUME_LATER before the handler, logged as a deadlock (not as the
    database being unavailable), outcome lock_conflict; the other transaction goes on, and the
    redelivery applies the step once."""
    registry = prometheus_client.CollectorRegistry()
    config = make_config(
        client, table, exactly_once_claim="before_handler", metrics=PrometheusMetrics(registry)
    )
    config.persist.create_table()  # type: ignore[union-attr]
    listener = SequencedListener(config, effects, lambda msg: ("acct", int(msg.id[1:])))
    import psycopg

    from rocketmq_dedup.stores.postgres.transaction import lock_key

    assert listener(ClassicMessage("s1")) is SUCCESS  # the entity's row exists
    entity = Entity(config.application_name, "acct").digest()
    other = psycopg.connect(PG_DSN)
    answers: List[ConsumeStatus] = []
    try:
        other.execute(f"SELECT 1 FROM {table}_seq WHERE entity_key = %s FOR UPDATE", (entity,))
        copy = threading.Thread(target=lambda: answers.append(listener(ClassicMessage("s2"))))
        with caplog.at_level(logging.WARNING, logger="rocketmq_dedup"):
            copy.start()
            deadline = time.monotonic() + 20
            while not effects.db.waiting_on(f"{table}_seq"):
                assert time.monotonic() < deadline, "the copy never waited for the entity"
                time.sleep(0.01)
            key = lock_key(element(config, "s2").digest())
            other.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # the deadlock
            copy.join(20)
        other.commit()
    finally:
        other.close()
    assert answers == [LATER] and listener.calls == {"s1": 1}
    messages = [r.getMessage() for r in caplog.records]
    assert any("deadlock" in m for m in messages), messages
    assert not any("unavailable" in m for m in messages), messages
    labels = {"app": config.application_name, "topic": "TEST-TOPIC"}
    counted = prometheus_value(
        registry, "rocketmq_dedup_messages_total", outcome="lock_conflict", **labels
    )
    assert counted == 1
    assert listener(ClassicMessage("s2")) is SUCCESS
    assert effects.counts() == {"s1": 1, "s2": 1}
    listener.close()


def lock_timeout_client(driver: str) -> Any:
    """A client whose sessions give up a lock wait after 1 s (MySQL's
    ``innodb_lock_wait_timeout``, PostgreSQL's ``lock_timeout``)."""
    if driver in PG_DRIVERS:
        options = {"options": "-c lock_timeout=1000"}
        if driver == "psycopg_pool":
            return make_client(driver, kwargs=options)
        if driver.startswith("sqlalchemy"):
            return make_client(driver, connect_args=options)
        return make_client(driver, **options)
    statement = "SET SESSION innodb_lock_wait_timeout = 1"
    if driver.startswith("sqlalchemy"):
        return make_client(driver, connect_args={"init_command": statement})
    return mysql_connect(driver, init_command=statement)
