"""The exactly-once listener (TransactionalDedupListener, issues 11 and 34) end to end, on MySQL
and on PostgreSQL: a real broker, the client of this environment (classic PushConsumer, also
its orderly consumer; the 5.x PushConsumer through ``adapters.grpc.message_listener``), consumer
processes started by the harness (tests/e2e/consumer_app.py, ``"mode": "exactly_once"``).

The handler's business writes (``e2e_eo_effects``, ``e2e_eo_orders``, in the store's database)
go through the transaction's connection only, so a row there means the message's transaction
committed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from rocketmq_dedup import MySQLDedupStore, PostgresDedupStore
from tests.e2e.clients import Producer, installed_client
from tests.e2e.consumer_app import PG_EO_SCHEMA
from tests.e2e.harness import (
    STATE,
    ConsumerProcess,
    Run,
    create_tables,
    rocketmq_script,
    settings_for,
    sql,
)
from tests.support import mysql_connect, pg_connect, pg_query

pytestmark = pytest.mark.e2e

SUCCESS, LATER = 0, 1
TABLE = "t_rocketmq_dedup_e2e"
LEASE_MS = 2000  # the SIGKILL test's lease: its redelivery waits for it to lapse
CHANNELS = 8  # (topic, group) pairs this module creates: one per test


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``consumer``: the push consumer, and with the classic client its orderly one too;
    ``database``: the store's (and the business tables'), MySQL and PostgreSQL."""
    if "consumer" in metafunc.fixturenames:
        kinds = ["push", "orderly"] if installed_client() == "classic" else ["push"]
        metafunc.parametrize("consumer", kinds)
    if "database" in metafunc.fixturenames:
        metafunc.parametrize("database", ["mysql", "postgres"])


@pytest.fixture(scope="module")
def eo_channels(broker: None, session_id: str) -> List[Tuple[str, str]]:
    """This module's fresh (topic, group) pairs (1 s retry backoff), created in one go; the
    tables (the session's producer fixture makes them too, this module has its own)."""
    topics = [f"E2E-EO-{session_id}-{i}" for i in range(CHANNELS)]
    groups = [f"e2e-eo-{session_id}-{i}" for i in range(CHANNELS)]
    rocketmq_script("both", " ".join(topics), " ".join(groups))
    create_tables()
    MySQLDedupStore(mysql_connect(), TABLE).create_table()  # and its _seq table
    PostgresDedupStore(pg_connect(), TABLE).create_table()
    for statement in PG_EO_SCHEMA:
        pg_query(statement)
    return list(zip(topics, groups, strict=False))


@pytest.fixture(scope="module")
def eo_producer(client: str, eo_channels: List[Tuple[str, str]]) -> Iterator[Producer]:
    p = Producer(client, tuple(t for t, _ in eo_channels))
    yield p
    p.close()


@pytest.fixture
def channel(eo_channels: List[Tuple[str, str]], used_groups: List[str]) -> Tuple[str, str]:
    assert eo_channels, f"more tests in this module than CHANNELS={CHANNELS}"
    pair = eo_channels.pop(0)
    used_groups.append(pair[1])  # checked for dead letters by test_dead_letters
    return pair


@pytest.fixture
def run(eo_producer: Producer, channel: Tuple[str, str]) -> Run:
    return Run(uuid.uuid4().hex[:12], eo_producer, channel[0])


def start(
    client: str, database: str, run: Run, channel: Tuple[str, str], **kw: Any
) -> ConsumerProcess:
    topic, group = channel
    settings = settings_for(client, database, run.run_id, topic, group, mode="exactly_once", **kw)
    return ConsumerProcess(settings)


def query(database: str, statement: str, *params: Any) -> List[Any]:
    """One statement on the database of the store (and of the business tables)."""
    return pg_query(statement, *params) if database == "postgres" else sql(statement, *params)


def committed(run: Run, database: str) -> Counter[str]:
    """biz_key -> effect rows committed (written through ``conn`` only)."""
    rows = query(database, "SELECT biz_key FROM e2e_eo_effects WHERE run_id = %s", run.run_id)
    return Counter(r[0] for r in rows if not r[0].startswith("warmup-"))


def handler_runs(run: Run) -> Counter[str]:
    """biz_key -> deliveries whose handler ran (whatever then happened to its transaction)."""
    return Counter(d["biz_key"] for d in run.deliveries() if d["handled"])


def dedup_status(run: Run, database: str, key: str) -> List[str]:
    rows = query(
        database,
        f"SELECT status FROM {TABLE} WHERE application_name = %s AND msg_uniq_key = %s",
        f"e2e-{run.run_id}",
        key,
    )
    return [r[0] for r in rows]


def test_concurrent_duplicates_commit_once(
    client: str, database: str, consumer: str, run: Run, channel: Tuple[str, str]
) -> None:
    """12 keys, each message sent twice back to back (its copies consumed at the same time by
    the consumer's 4 threads; orderly: both on the key's queue): every key's effect row is
    committed exactly once, its handler ran exactly once (a copy arriving during the first's
    transaction is answered RECONSUME_LATER without it, a later one acked as a duplicate),
    and every sent message is eventually acked."""
    orderly = consumer == "orderly"
    proc = start(client, database, run, channel, handler_ms=200, orderly=orderly)
    try:
        run.warm_up()
        keys = [f"eo-dup-{i}" for i in range(12)]
        for key in keys:
            shard = key if orderly else None
            run.send(key, sharding_key=shard)
            run.send(key, sharding_key=shard)
        run.wait_all_acked(timeout=60)
        assert committed(run, database) == {key: 1 for key in keys}
        assert handler_runs(run) == {key: 1 for key in keys}
        assert len(run.sent) == 24
        assert all(dedup_status(run, database, key) == ["CONSUMED"] for key in keys)
    finally:
        proc.stop()


def test_sigkill_inside_the_transaction_commits_nothing(
    client: str, database: str, run: Run, channel: Tuple[str, str]
) -> None:
    """The consumer is SIGKILLed while its handler, having written its effect row through
    ``conn``, waits on a file the test holds: that row was never visible and is not
    committed, and no dedup record or claim is left (the record is written with the COMMIT;
    the server rolled the dead session back). A restarted consumer gets the redelivery and
    commits it once: one effect row, two handler starts."""
    gate = STATE / f"e2e-eo-gate-{run.run_id}"
    gate.touch()
    survivor = None
    try:
        victim = start(
            client, database, run, channel, block=["eo-crash"], gate=str(gate), lease_ms=LEASE_MS
        )
        try:
            run.warm_up()
            run.send("eo-crash")
            run.wait_for_phase("eo-crash", "blocked", timeout=30)
            assert committed(run, database)["eo-crash"] == 0  # inside the open transaction
        finally:
            victim.kill()
        assert committed(run, database)["eo-crash"] == 0
        assert dedup_status(run, database, "eo-crash") == []
        gate.unlink()
        survivor = start(client, database, run, channel, lease_ms=LEASE_MS)
        # the 5.x client: the proxy brings a dead consumer's message back after its channel
        # expired (about a minute here); the classic client: within seconds
        run.wait_all_acked(timeout=120)
        assert committed(run, database) == {"eo-crash": 1}
        assert run.effects("start")["eo-crash"] == 2  # the killed attempt and the rerun
        assert dedup_status(run, database, "eo-crash") == ["CONSUMED"]
        reruns = [d for d in run.deliveries() if d["biz_key"] == "eo-crash" and d["handled"]]
        assert [(d["status"], d["pid"]) for d in reruns] == [(SUCCESS, survivor.pid)]
    finally:
        if survivor is not None:
            survivor.stop()
        gate.unlink(missing_ok=True)


def order_rows(run: Run, database: str) -> Dict[str, Tuple[Any, ...]]:
    rows = query(
        database,
        "SELECT order_id, status, created_times, paid_times, shipped_times FROM e2e_eo_orders "
        "WHERE run_id = %s",
        run.run_id,
    )
    return {r[0]: tuple(r[1:]) for r in rows}


def test_out_of_order_steps_are_applied_once_in_order(
    client: str, database: str, run: Run, channel: Tuple[str, str]
) -> None:
    """4 orders, each sent as ship(3), create(1), pay(2), then all three again (strict
    sequence guard, ``sequence_key`` = (order, step)): every order ends shipped with each step
    applied exactly once; a step that came before its predecessor was answered
    RECONSUME_LATER without its handler and came back through the broker's retry.

    The classic client gets one message at a time (each sent once the one before was
    delivered): librocketmq hands the listener a whole pull and sends the rest of it back unrun
    after a RECONSUME_LATER, so a burst could keep a predecessor behind its successor's gap
    until both are dead-lettered (README, "It does not guarantee that a message answered
    RECONSUME_LATER comes back"); the 5.x client delivers one message per call and gets the
    burst."""
    proc = start(client, database, run, channel, sequence=True, handler_ms=20)
    try:
        run.warm_up()
        orders = [f"eo-order-{i}" for i in range(4)]
        for order in orders:
            for step in (3, 1, 2, 3, 1, 2):
                msg_id = run.send(f"{order}:{step}")
                if client == "classic":
                    run.wait_delivered(msg_id)
        run.wait_all_acked(timeout=75)
        assert order_rows(run, database) == {order: ("shipped", 1, 1, 1) for order in orders}
        steps = {f"{order}:{step}": 1 for order in orders for step in (1, 2, 3)}
        assert committed(run, database) == steps
        assert handler_runs(run) == steps  # gaps and repeats never reached the handler
        early = [d for d in run.deliveries() if d["status"] == LATER and not d["handled"]]
        assert early, "no step arrived ahead of its predecessor"
    finally:
        proc.stop()
