"""The attacks on the exactly-once mode that broke it (issue 31, items 1-5), on every driver:
session state a handler leaves behind, a session swapped under the handler, the
``before_handler`` claim's order (lock first, then read; no snapshot before a wait), and lock
waits told apart from outages."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Any, Dict, List

import prometheus_client
import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupStatus
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import PrometheusMetrics
from rocketmq_dedup.testing import ClassicMessage
from tests.integration.exactly_once.support import (
    EffectListener,
    EffectTable,
    SequencedListener,
    dispose,
    execute,
    make_client,
    make_config,
    sql,
    unique,
)
from tests.support import mysql_connect, prometheus_value

pytestmark = pytest.mark.mysql

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


def element(config: DedupConfig, msg_id: str) -> DedupElement:
    return DedupElement(config.application_name, "TEST-TOPIC", "TagA", msg_id)


def status_of(config: DedupConfig, msg_id: str) -> Any:
    assert config.persist is not None
    return config.persist.get_status(element(config, msg_id))


def one_connection(driver: str) -> Any:
    """A client whose transactions all share one connection (a pool of 1)."""
    if driver.startswith("sqlalchemy"):
        return make_client(driver, pool_size=1, max_overflow=0)
    return make_client(driver)


def raw_connection(conn: Any) -> Any:
    """The DB-API connection behind a handler's ``conn`` (what a handler can reach)."""
    if hasattr(conn, "exec_driver_sql"):
        return conn.connection.dbapi_connection
    return object.__getattribute__(conn, "_conn")


def session_of(conn: Any) -> int:
    return int(execute(conn, "SELECT CONNECTION_ID()").fetchall()[0][0])


# -- item 1: a session left in autocommit never serves another message -------------------------


def test_a_session_left_in_autocommit_never_serves_the_next_message(
    driver: str, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
) -> None:
    """One connection for every transaction. Message a's handler sends ``SET autocommit = 1``
    and returns True: detected, rolled back, RECONSUME_LATER (its writes after the SET were
    committed by the server: they stay, as the README says). Message b then writes a row and
    asks for a retry: its row is rolled back, so its retry applies it once (before the fix the
    session stayed in autocommit and b's row was applied twice)."""
    client = one_connection(driver)
    config = make_config(client, table, pool_size=1)
    try:
        config.persist.create_table()  # type: ignore[union-attr]

        def behaviour(msg: Any, conn: Any) -> bool:
            if msg.id == "a":
                execute(conn, "SET autocommit = 1")
                return True
            return msg.body == b"retry"

        listener = EffectListener(config, effects, behaviour)
        with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
            assert listener(ClassicMessage("a")) is LATER
        assert any("autocommit" in r.getMessage() for r in caplog.records)
        assert status_of(config, "a") is None
        assert listener(ClassicMessage("b", body=b"first")) is LATER
        assert effects.count("b") == 0  # rolled back: not a session in autocommit
        assert listener(ClassicMessage("b", body=b"retry")) is SUCCESS
        assert effects.count("b") == 1
        assert status_of(config, "b") is DedupStatus.CONSUMED
        listener.close()
    finally:
        config.close()
        dispose(client)


# -- item 2: a message commits only on the session it began -----------------------------------


def kill_own_session(conn: Any) -> None:
    """End the handler's session from another connection (as the server's idle timeout or an
    operator's KILL would), and wait until it is gone."""
    session = session_of(conn)
    sql(f"KILL {session}")
    deadline = time.monotonic() + 10
    while sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (session,))[0][
        0
    ]:
        assert time.monotonic() < deadline, "the killed session did not end"
        time.sleep(0.02)


def test_a_reconnecting_ping_is_refused_and_nothing_of_the_message_commits(
    driver: str, client: Any, table: str, effects: EffectTable, caplog: pytest.LogCaptureFixture
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
        kill_own_session(conn)
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


def test_a_session_swapped_behind_the_proxy_is_never_committed_on(
    driver: str, client: Any, table: str, effects: EffectTable
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
        kill_own_session(conn)
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


@pytest.mark.parametrize("driver", ["mysqlclient", "sqlalchemy+mysqlclient"])
def test_a_driver_that_reconnects_by_itself_never_commits_on_a_new_session(
    driver: str, table: str, effects: EffectTable
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
            kill_own_session(conn)
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


# -- item 3: no snapshot before the sequence guard's wait -----------------------------------------


class Counter:
    """A business row the steps read, then write (read-modify-write, the way that loses an
    update when the read comes from a snapshot taken before the wait)."""

    def __init__(self) -> None:
        self.name = unique("t_eo_counter")
        sql(f"CREATE TABLE {self.name} (k VARCHAR(64) PRIMARY KEY, v BIGINT NOT NULL)")
        sql(f"INSERT INTO {self.name} VALUES ('acct', 0)")

    def increment(self, conn: Any) -> None:
        (value,) = execute(conn, f"SELECT v FROM {self.name} WHERE k = 'acct'").fetchall()[0]
        execute(conn, f"UPDATE {self.name} SET v = %s WHERE k = 'acct'", (int(value) + 1,))

    def value(self) -> int:
        return int(sql(f"SELECT v FROM {self.name} WHERE k = 'acct'")[0][0])

    def drop(self) -> None:
        sql(f"DROP TABLE IF EXISTS {self.name}")


def waiting_on(table: str) -> bool:
    """Whether a session is running a statement on ``table`` (a lock wait, here)."""
    rows = sql(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s AND ID <> "
        "CONNECTION_ID()",
        (f"%{table}%",),
    )
    return bool(rows[0][0])


@pytest.mark.parametrize("claim", ["at_commit", "before_handler"])
def test_an_entitys_steps_read_what_the_previous_step_wrote(
    claim: str, client: Any, table: str, effects: EffectTable
) -> None:
    """Steps 1 and 2 of one entity each read a counter and write it back plus one. Step 2
    arrives while step 1 is in its handler and waits for the entity's row; when it runs, it
    reads step 1's write: the counter ends at 2 (before the fix, before_handler read from a
    snapshot taken before the wait: 1)."""
    config = make_config(client, table, exactly_once_claim=claim)
    config.persist.create_table()  # type: ignore[union-attr]
    counter = Counter()
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
        while not waiting_on(sequence_table):  # step 2 waits for the entity's row
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


def lock_timeout_client(driver: str) -> Any:
    """A client whose sessions give up a lock wait after 1 s."""
    statement = "SET SESSION innodb_lock_wait_timeout = 1"
    if driver.startswith("sqlalchemy"):
        return make_client(driver, connect_args={"init_command": statement})
    return mysql_connect(driver, init_command=statement)
