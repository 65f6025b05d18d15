"""The outbox end to end (issue 35): a real broker, the client of this environment (classic in
.venv-classic, 5.x in .venv-grpc) for every consumer, producer and relay, each test on MariaDB
and on PostgreSQL (``db``). Processes of tests/e2e/outbox_app.py: ``upstream`` consumes A and
sends B through the outbox in A's transaction, a relay sends B, ``downstream`` consumes B deduped
on the outbox's message key.

Every A applied once; every B delivered at least once and applied downstream once; no B for a
rolled-back attempt; a relay killed between the broker's acknowledgement and its mark sends B
again with the same key, and downstream drops the copy; a message the broker refuses is parked
and the others go on."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from rocketmq_dedup.outbox import Outbox, OutboxRelay
from rocketmq_dedup.outbox.senders import sender_for
from tests.e2e.clients import Producer
from tests.e2e.consumer_app import BIZ_KEY
from tests.e2e.harness import STATE, ConsumerProcess, rocketmq_script
from tests.e2e.outbox_app import DATABASES, SCHEMA, connect, database, store
from tests.support import MYSQL, PG_DSN, ROCKETMQ_NAMESRV, ROCKETMQ_PROXY, wait_for

pytestmark = pytest.mark.e2e

#: The test whose B topic is a FIFO one with the 5.x client (it sends with a sharding key).
ORDERED_TEST = "test_each_a_is_applied_once_and_its_b_once_downstream"
TESTS = 4 * len(DATABASES)  # (A, B) channel pairs this module creates: one per test


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest) -> str:
    """Every database the outbox runs on."""
    return str(request.param)


@pytest.fixture(scope="module")
def obx_channels(
    client: str, broker: None, session_id: str
) -> Dict[bool, List[Tuple[str, str, str, str]]]:
    """(A topic, A group, B topic, B group) per test, created in one go, by whether they are
    :data:`ORDERED_TEST`'s (one per database); the tables on every database. With the 5.x
    client those tests' B is a FIFO topic (``+message.type=FIFO``: the 5.x client sends a
    sharding key as a message group, which only a FIFO topic takes) consumed by a FIFO group
    (``consumeMessageOrderly``), so its consumer receives each group in order."""
    names = [
        (
            f"E2E-OBX-A-{session_id}-{i}",
            f"e2e-obx-a-{session_id}-{i}",
            f"E2E-OBX-B-{session_id}-{i}",
            f"e2e-obx-b-{session_id}-{i}",
        )
        for i in range(TESTS)
    ]
    ordered = names[: len(DATABASES)]
    fifo = client == "grpc"
    topics = [t for a, _, b, _ in names for t in (a, b)]
    if fifo:
        for pair in ordered:
            topics.remove(pair[2])
    groups = " ".join(g for _, ga, _, gb in names for g in (ga, gb))
    rocketmq_script("both", " ".join(topics), groups)
    for _, _, b_topic, b_group in ordered if fifo else ():
        rocketmq_script(
            "admin", "updateTopic", "-c", "DefaultCluster", "-t", b_topic,
            "-a", "+message.type=FIFO", "-r", "4", "-w", "4",
        )  # fmt: skip
        rocketmq_script("admin", "updateSubGroup", "-c", "DefaultCluster", "-g", b_group,
                        "-o", "true")  # fmt: skip
    for db in DATABASES:
        for statement in SCHEMA[db]:
            database(db).sql(statement)
    return {True: ordered, False: names[len(DATABASES) :]}


@pytest.fixture
def channel(
    obx_channels: Dict[bool, List[Tuple[str, str, str, str]]],
    used_groups: List[str],
    request: pytest.FixtureRequest,
) -> Tuple[str, str, str, str]:
    pair = obx_channels[request.function.__name__ == ORDERED_TEST].pop(0)
    used_groups += [pair[1], pair[3]]  # checked for dead letters by test_dead_letters
    return pair


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def table(db: str, run_id: str) -> Iterator[str]:
    """The run's dedup tables (upstream's and downstream's, with the outbox) on ``db``."""
    name = f"t_obx_e2e_{run_id}"
    made = store(db, name)
    made.create_table()
    made.close()
    yield name
    database(db).drop(*(f"{name}{suffix}" for suffix in ("", "_seq", "_outbox", "_outbox_lane")))


class Flow:
    """The processes of one test, and what they recorded."""

    def __init__(
        self, client: str, db: str, run_id: str, table: str, channel: Tuple[str, str, str, str]
    ) -> None:
        self.client, self.db, self.run_id, self.table = client, db, run_id, table
        self.a_topic, self.a_group, self.b_topic, self.b_group = channel
        self.procs: List[ConsumerProcess] = []
        self.producer = Producer(client, (self.a_topic,))

    def start(self, role: str, **settings: Any) -> ConsumerProcess:
        base = {
            "role": role,
            "client": self.client,
            "db": self.db,
            "run_id": self.run_id,
            "table": self.table,
            "topic": self.b_topic if role == "downstream" else self.a_topic,
            "group": self.b_group if role == "downstream" else self.a_group,
            "out_topic": self.b_topic,
        }
        proc = ConsumerProcess({**base, **settings}, module="tests.e2e.outbox_app")
        self.procs.append(proc)
        return proc

    def sql(self, statement: str, *params: Any) -> List[Tuple[Any, ...]]:
        """Rows of one statement on the test's database."""
        return database(self.db).sql(statement, params)

    def send_a(self, key: str) -> None:
        self.producer.send(self.a_topic, key.encode(), {BIZ_KEY: key, "run_id": self.run_id})

    def a_applied(self) -> Counter[str]:
        rows = self.sql("SELECT a_key FROM e2e_obx_a WHERE run_id = %s", self.run_id)
        return Counter(r[0] for r in rows if not r[0].startswith("probe"))

    def b_applied(self) -> Counter[str]:
        rows = self.sql("SELECT b_key FROM e2e_obx_b WHERE run_id = %s", self.run_id)
        return Counter(r[0] for r in rows if not r[0].startswith("probe"))

    def b_bodies(self) -> List[str]:
        rows = self.sql("SELECT body FROM e2e_obx_b WHERE run_id = %s ORDER BY id", self.run_id)
        return [r[0] for r in rows if not r[0].startswith("probe")]

    def b_deliveries(self) -> Counter[str]:
        rows = self.sql("SELECT b_key FROM e2e_obx_b_deliveries WHERE run_id = %s", self.run_id)
        return Counter(r[0] for r in rows if not r[0].startswith("probe"))

    def outbox_rows(self) -> List[Tuple[str, str, int]]:
        """The outbox's rows but the handshake's: (message key, status, attempts)."""
        rows = self.sql(f"SELECT message_key, status, attempts FROM {self.table}_outbox")
        return [(str(k), str(s), int(a)) for k, s, a in rows if not str(k).startswith("probe")]

    def outbox(self) -> Dict[str, Tuple[str, int]]:
        return {k: (s, a) for k, s, a in self.outbox_rows()}

    def handshake(self) -> None:
        """Probes A until one went all the way (upstream, relay, broker, downstream)."""
        n = 0

        def through() -> bool:
            nonlocal n
            self.send_a(f"probe{n}:1")
            n += 1
            rows = self.sql("SELECT 1 FROM e2e_obx_b WHERE run_id = %s LIMIT 1", self.run_id)
            return bool(rows)

        wait_for(through, timeout=120, interval=1.0)

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.producer.close()


@pytest.fixture
def flow(
    client: str, db: str, run_id: str, table: str, channel: Tuple[str, str, str, str]
) -> Iterator[Flow]:
    flow = Flow(client, db, run_id, table, channel)
    yield flow
    flow.close()


def test_each_a_is_applied_once_and_its_b_once_downstream(flow: Flow) -> None:
    """10 orders of 3 steps (A), a third of them sent twice, one failing its first attempt
    (rolled back: its B row with it), B sent by the upstream's in-process relay with the order
    as sharding key: each A applied once, each B applied downstream once and received at least
    once, the outbox's rows all SENT, one per A; each order's B arrive downstream in the order
    their A committed (classic: the orderly consumer; 5.x: a FIFO topic and group)."""
    flow.start("downstream", orderly=flow.client == "classic")
    flow.start("upstream", relay=True, sharding=True, fail_first=["o4:2"])
    flow.handshake()
    keys = [f"o{i}:{step}" for i in range(10) for step in (1, 2, 3)]
    for n, key in enumerate(keys):
        flow.send_a(key)
        if n % 3 == 0:
            flow.send_a(key)  # a duplicate
    wait_for(lambda: len(flow.b_applied()) == len(keys), timeout=120, interval=0.5)
    assert flow.a_applied() == {key: 1 for key in keys}
    assert flow.b_applied() == {f"{key}:B": 1 for key in keys}
    delivered = flow.b_deliveries()
    assert set(delivered) == {f"{key}:B" for key in keys} and min(delivered.values()) >= 1
    # every row SENT, one per A; a send the broker refused for a moment is tried again (the
    # classic producer's "No route info of this topic" while the route refreshes: attempts 2)
    rows = flow.outbox_rows()
    assert sorted((key, status) for key, status, _ in rows) == sorted(
        (f"{key}:B", "SENT") for key in keys
    )
    assert all(attempts >= 1 for _, _, attempts in rows)
    bodies = flow.b_bodies()
    for i in range(10):
        steps = [body for body in bodies if body.startswith(f"o{i}:")]
        assert steps == [f"o{i}:1", f"o{i}:2", f"o{i}:3"], steps


def test_a_relay_killed_between_send_and_mark_sends_again_with_the_same_key(
    flow: Flow, run_id: str
) -> None:
    """The relay is SIGKILLed after the broker acknowledged B and before its mark: a second
    relay sends it again once the claim's lease (3 s) ended, with the same message key;
    downstream receives both copies and applies one."""
    gate = STATE / f"e2e-obx-gate-{run_id}"
    gate.touch()
    try:
        flow.start("downstream")
        flow.start("upstream")
        victim = flow.start("relay", gate_key="x:1:B", gate=str(gate), lease_s=3.0)
        flow.handshake()
        flow.send_a("x:1")
        wait_for(
            lambda: flow.sql(
                "SELECT 1 FROM e2e_obx_events WHERE run_id = %s AND what = 'relay-sent'", run_id
            ),
            timeout=60,
            interval=0.2,
        )
        victim.kill()
        assert flow.outbox()["x:1:B"] == ("PENDING", 0)  # claimed, never marked
        gate.unlink()
        flow.start("relay", lease_s=3.0)
        wait_for(lambda: flow.b_deliveries()["x:1:B"] >= 2, timeout=90, interval=0.5)
        wait_for(lambda: flow.outbox()["x:1:B"][0] == "SENT", timeout=30, interval=0.2)
    finally:
        gate.unlink(missing_ok=True)
    assert flow.a_applied() == {"x:1": 1}
    assert flow.b_applied() == {"x:1:B": 1}  # the copy was dropped downstream


def test_a_message_the_broker_refuses_is_parked_and_the_others_go(flow: Flow, table: str) -> None:
    """Classic: a 200 KiB body (the producer's default limit is 128 KiB); 5.x: a sharding key
    (a message group) on a NORMAL topic. Parked at once with the client's reason; a message of
    another sharding key and one without are sent."""
    outbox = Outbox(store(flow.db, table))
    conn = connect(flow.db)()
    if flow.db == "mysql":
        conn.autocommit(False)  # (a psycopg connection has it off already)
    try:
        if flow.client == "classic":
            outbox.send(conn, flow.b_topic, b"x" * 200 * 1024, keys="refused")
        else:
            outbox.send(conn, flow.b_topic, b"grouped", keys="refused", sharding_key="order-9")
        outbox.send(conn, flow.b_topic, b"plain", keys="plain")
        conn.commit()
    finally:
        conn.close()
    producer = Producer(flow.client, (flow.b_topic,))
    try:
        with OutboxRelay(outbox, sender_for(producer._producer), poll_interval_s=0.2):
            wait_for(
                lambda: (
                    {k: s for k, (s, _) in flow.outbox().items()}
                    == {"refused": "PARKED", "plain": "SENT"}
                ),
                timeout=60,
                interval=0.2,
            )
    finally:
        producer.close()
    [parked] = [row for row in outbox.tables.rows(None, 10) if row.message_key == "refused"]
    expected = "body size over max value" if flow.client == "classic" else "message type"
    assert parked.last_error is not None and expected in parked.last_error
    assert parked.last_error.startswith("refused:")


def test_the_relay_command_sends_the_due_rows_once_and_exits(flow: Flow, table: str) -> None:
    """``rocketmq-dedup relay --mysql URL|--postgres URL --table T --namesrv|--proxy ADDR
    --once`` (a process of its own, the client of this environment): the committed rows are
    sent, marked SENT with the broker's message id, and the command says how many and exits 0;
    a second run finds nothing to send."""
    outbox = Outbox(store(flow.db, table))
    conn = connect(flow.db)()
    if flow.db == "mysql":
        conn.autocommit(False)
    try:
        for key in ("c1", "c2"):
            outbox.send(conn, flow.b_topic, key.encode(), keys=key)
        conn.commit()
    finally:
        conn.close()
    options = ["--postgres", PG_DSN]
    if flow.db == "mysql":
        options = ["--mysql", "mysql://{user}:{password}@{host}:{port}/{database}".format(**MYSQL)]
    broker = ["--namesrv", ROCKETMQ_NAMESRV]
    if flow.client == "grpc":
        broker = ["--proxy", ROCKETMQ_PROXY]
    command = [sys.executable, "-m", "rocketmq_dedup", "relay", *options, "--table", table, *broker]
    for expected in ("relayed 2 row(s)", "relayed 0 row(s)"):
        done = subprocess.run([*command, "--once"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert expected in done.stdout
    rows = flow.sql(f"SELECT message_key, status, broker_msg_id FROM {table}_outbox")
    assert {str(k): str(s) for k, s, _ in rows} == {"c1": "SENT", "c2": "SENT"}
    assert all(msg_id for _, _, msg_id in rows)
