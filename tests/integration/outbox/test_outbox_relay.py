"""The relays against real MariaDB and PostgreSQL, with a sender that records what it would have
sent (the broker's side: tests/e2e/test_e2e_outbox.py): several relays share the work and send
each row once; a sharding key's rows go out in commit order; each fault does what the relay
module says; metrics; the purge."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any, Dict, Iterator, List, Optional

import pytest

from rocketmq_dedup.outbox import FailureKind, Outbox, OutboxMessage, OutboxRelay, SendFailure
from rocketmq_dedup.outbox import relay as relay_module
from tests.integration.outbox.support import Backend, RecordingSender, backend_of, outbox_rows
from tests.support import wait_for


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoffs and pauses in tens of milliseconds, so a test sees several attempts."""
    monkeypatch.setattr(relay_module, "BACKOFF_S", (0.05, 0.2))
    monkeypatch.setattr(relay_module, "PAUSE_S", (0.05, 0.2))


def write(
    outbox: Outbox,
    key: str,
    topic: str = "OUT",
    sharding_key: Optional[str] = None,
    body: Optional[bytes] = None,
) -> None:
    """One row, committed."""
    conn = backend_of(outbox).connect()
    try:
        outbox.send(conn, topic, body or key.encode(), keys=key, sharding_key=sharding_key)
        conn.commit()
    finally:
        conn.close()


def writers(outbox: Outbox, plan: List[Dict[str, Any]], threads: int = 8) -> None:
    """Write ``plan`` (send() keywords per row) from ``threads`` threads, one transaction a row."""
    todo = list(plan)
    lock = threading.Lock()

    def work() -> None:
        conn = backend_of(outbox).connect()
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    item = todo.pop(0)
                outbox.send(conn, **item)
                conn.commit()
        finally:
            conn.close()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)


# -- sharing the work, order ---------------------------------------------------------------------


def test_several_relays_send_every_row_once(outbox: Outbox, table: str) -> None:
    """Three relays (each sending four at a time) and eight writers at once, 1,200 rows over 20
    sharding keys and none: every row is sent exactly once and ends SENT."""
    sender = RecordingSender(delay_s=0.001)
    relays = [OutboxRelay(outbox, sender, batch_size=32, poll_interval_s=0.05) for _ in range(3)]
    plan = [
        {
            "topic": "OUT",
            "body": f"b{i}",
            "keys": f"k{i}",
            "sharding_key": f"s{i % 20}" if i % 3 else None,
        }
        for i in range(1200)
    ]
    for relay in relays:
        relay.start()
    try:
        writers(outbox, plan)
        wait_for(lambda: len(sender.sent) >= 1200, timeout=60, interval=0.1)
        time.sleep(0.3)  # (a row sent twice would show by now)
    finally:
        for relay in relays:
            relay.close()
    counts = Counter(sender.message_keys())
    assert len(counts) == 1200 and set(counts.values()) == {1}
    assert Counter(status for status, _ in outbox_rows(outbox).values()) == {"SENT": 1200}


def test_a_sharding_keys_rows_go_out_in_commit_order(
    backend: Backend, outbox: Outbox, table: str
) -> None:
    """Writers send first and only then take a business row lock (after a random pause), so
    without the sharding key's lock the rows' ids would often disagree with the commit order
    the business lock gives; three relays send. Per sharding key, the messages go out in the
    order their transactions committed (the business counter's order), each once."""
    counters = f"{table}_ctr"
    backend.db.sql(backend.db.counter_table_sql.format(name=counters))
    keys = [f"order-{i}" for i in range(4)]
    for key in keys:
        backend.db.sql(f"INSERT INTO {counters} VALUES (%s, 0)", (key,))
    committed: Dict[str, List[str]] = defaultdict(list)  # sharding key -> tx ids, commit order
    lock = threading.Lock()
    rng = random.Random(7)

    def writer(count: int) -> None:
        conn = backend.connect()
        try:
            for _ in range(count):
                key = rng.choice(keys)
                tx = uuid.uuid4().hex[:12]
                outbox.send(conn, "OUT", tx, keys=tx, sharding_key=key)
                time.sleep(rng.uniform(0, 0.004))
                cur = conn.cursor()
                cur.execute(f"UPDATE {counters} SET v = v + 1 WHERE k = %s", (key,))
                cur.execute(f"SELECT v FROM {counters} WHERE k = %s", (key,))
                (n,) = cur.fetchone()
                conn.commit()
                with lock:  # n follows the commit order of the key's transactions
                    committed[key].append((n, tx))  # type: ignore[arg-type]
        finally:
            conn.close()

    sender = RecordingSender(delay_s=0.0005)
    relays = [
        OutboxRelay(outbox, sender, batch_size=16, run=4, poll_interval_s=0.05) for _ in range(3)
    ]
    for relay in relays:
        relay.start()
    try:
        threads = [threading.Thread(target=writer, args=(60,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        wait_for(lambda: len(sender.sent) >= 480, timeout=60, interval=0.1)
    finally:
        for relay in relays:
            relay.close()
        backend.db.drop(counters)
    sent: Dict[str, List[str]] = defaultdict(list)
    for message, _ in sender.sent:
        assert message.sharding_key is not None
        sent[message.sharding_key].append(message.message_key)
    for key in keys:
        in_commit_order = [tx for _, tx in sorted(committed[key])]  # type: ignore[misc]
        assert sent[key] == in_commit_order, key


# -- faults ----------------------------------------------------------------------------------------


def refuse_topic(topic: str, kind: FailureKind = FailureKind.REFUSED) -> Any:
    def behaviour(message: OutboxMessage) -> None:
        if message.topic == topic:
            raise SendFailure(kind, f"the broker does not take {topic}")

    return behaviour


def test_a_refused_message_is_parked_and_holds_back_only_its_sharding_key(
    outbox: Outbox, table: str
) -> None:
    """The broker refuses topic BAD for good: that row is PARKED at once with the reason; the
    later rows of its sharding key wait; another key and rows without one go on. Dropping the
    parked row lets its key's rows go, in order; retrying it sends it again."""
    sender = RecordingSender(refuse_topic("BAD"))
    write(outbox, "a1", "BAD", "A")
    write(outbox, "a2", sharding_key="A")
    write(outbox, "a3", sharding_key="A")
    write(outbox, "b1", sharding_key="B")
    write(outbox, "free")
    relay = OutboxRelay(outbox, sender, poll_interval_s=0.05).start()
    try:
        wait_for(lambda: sorted(sender.message_keys()) == ["b1", "free"], timeout=10)
        time.sleep(0.3)
        rows = outbox_rows(outbox)
        assert rows["a1"] == ("PARKED", 1)
        assert rows["a2"] == ("PENDING", 0) and rows["a3"] == ("PENDING", 0)
        [parked] = outbox.tables.rows(None, 1)
        assert parked.last_error is not None and "does not take BAD" in parked.last_error
        assert outbox.tables.backlog().parked == 1
        assert outbox.tables.drop([parked.id]) == 1
        relay.wake()
        wait_for(lambda: sender.message_keys()[2:] == ["a2", "a3"], timeout=10)
        assert outbox.tables.retry([parked.id]) == 0  # a DROPPED row stays dropped
    finally:
        relay.close()
    assert outbox_rows(outbox)["a1"] == ("DROPPED", 1)


def test_a_broker_outage_holds_the_rows_and_loses_none(outbox: Outbox, table: str) -> None:
    """Every send fails as an outage for 1.5 s: nothing is parked, the relay pauses (a few
    attempts, not one per row and millisecond), and once the broker is back every row is sent,
    once."""
    back_at = time.monotonic() + 1.5

    def down(message: OutboxMessage) -> None:
        if time.monotonic() < back_at:
            raise SendFailure(FailureKind.OUTAGE, "connect to 127.0.0.1:10911 failed")

    sender = RecordingSender(down)
    for i in range(40):
        write(outbox, f"k{i}", sharding_key=f"s{i % 4}" if i % 2 else None)
    with OutboxRelay(outbox, sender, poll_interval_s=0.05):
        wait_for(lambda: len(sender.sent) >= 40, timeout=20)
    assert Counter(sender.message_keys()) == {f"k{i}": 1 for i in range(40)}
    failed = len(sender.attempts) - len(sender.sent)
    assert 1 <= failed < 40, failed  # paused: the rest of each batch was not tried
    assert {status for status, _ in outbox_rows(outbox).values()} == {"SENT"}


def test_an_unroutable_topic_is_parked_once_other_sends_succeed(outbox: Outbox, table: str) -> None:
    """No route for topic GONE while other topics send: PARKED after three attempts at the
    soonest, once a send succeeded after its first failure (the cluster is up, the topic is
    the problem); the others were sent meanwhile."""
    sender = RecordingSender(refuse_topic("GONE", FailureKind.UNROUTABLE))
    write(outbox, "gone", "GONE")
    with OutboxRelay(outbox, sender, poll_interval_s=0.05) as relay:
        for i in range(6):
            write(outbox, f"ok{i}")
            relay.wake()
            time.sleep(0.15)
        wait_for(lambda: outbox_rows(outbox)["gone"][0] == "PARKED", timeout=10)
    status, attempts = outbox_rows(outbox)["gone"]
    assert status == "PARKED" and 3 <= attempts <= 8  # not before the third (timing: a few more)
    assert sorted(sender.message_keys()) == [f"ok{i}" for i in range(6)]


def test_a_row_failing_for_too_long_is_parked(outbox: Outbox, table: str) -> None:
    """An error the relay cannot place (or no route, with nothing else sent): retried with
    backoff, PARKED once it has failed for give_up_after_s."""
    sender = RecordingSender(refuse_topic("ODD", FailureKind.UNKNOWN))
    write(outbox, "odd", "ODD")
    with OutboxRelay(outbox, sender, poll_interval_s=0.05, give_up_after_s=1.0):
        wait_for(lambda: outbox_rows(outbox)["odd"][0] == "PARKED", timeout=10)
    _, attempts = outbox_rows(outbox)["odd"]
    assert attempts >= 3  # retried with backoff (50-200 ms here) for a second first
    [row] = outbox.tables.rows(None, 1)
    assert row.last_error is not None and "failing for" in row.last_error


def test_rows_of_a_dead_relay_are_sent_again_after_its_lease_with_the_same_keys(
    outbox: Outbox, table: str
) -> None:
    """A relay claimed rows (and maybe sent them) and died without settling: another relay sends
    them once the claim's lease ends, with the same message keys; the dead claim can no longer
    mark them."""
    for i in range(5):
        write(outbox, f"k{i}")
    dead = outbox.tables.claim("dead-relay", 10, 1, 1000)
    assert [row.message.message_key for row in dead] == [f"k{i}" for i in range(5)]
    sender = RecordingSender()
    began = time.monotonic()
    with OutboxRelay(outbox, sender, poll_interval_s=0.1):
        wait_for(lambda: len(sender.sent) == 5, timeout=10)
    assert time.monotonic() - began >= 0.8  # not before the lease ended
    assert sorted(sender.message_keys()) == [f"k{i}" for i in range(5)]
    outbox.tables.settle("dead-relay", [(dead[0].id, "LATE")], [], [])
    rows = outbox.tables.rows(None, 10)
    assert all(row.status.value == "SENT" for row in rows)
    late = f"SELECT COUNT(*) FROM {outbox.name} WHERE broker_msg_id = 'LATE'"
    assert backend_of(outbox).db.sql(late) == [(0,)]


def test_a_relay_stops_a_batch_its_lease_cannot_cover(outbox: Outbox, table: str) -> None:
    """Sends of 0.3 s and a lease of 1 s: the relay sends what the lease covers and releases the
    rest at once (no other relay may take a row it still sends); every row is sent once."""
    sender = RecordingSender(delay_s=0.3)
    for i in range(8):
        write(outbox, f"k{i}")
    with OutboxRelay(outbox, sender, concurrency=1, lease_s=1.0, poll_interval_s=0.05):
        wait_for(lambda: len(sender.sent) == 8, timeout=20)
    assert Counter(sender.message_keys()) == {f"k{i}": 1 for i in range(8)}
    assert len(sender.attempts) == 8


# -- the database failing under the relay ------------------------------------------------------


class Switch:
    """A connection factory that connects to the database, or (``down``) to a closed port: a
    real refused connection, as when the server is away."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.down = False
        self.real = backend.client()

    def __call__(self) -> Any:
        if self.down:
            return self.backend.refused()
        return self.real()


@pytest.fixture
def switched(backend: Backend, table: str) -> Iterator[tuple[Switch, Outbox]]:
    switch = Switch(backend)
    store = backend.store(table, switch)
    yield switch, Outbox(store)
    store.close()


def test_the_database_going_away_pauses_the_relay_and_loses_nothing(
    backend: Backend,
    switched: tuple[Switch, Outbox],
    table: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The relay's sessions are killed and no new connection is taken for 1.5 s: the relay
    logs it, pauses and goes on; rows written meanwhile (another connection) are all sent once
    it reconnects."""
    switch, outbox = switched
    sender = RecordingSender()
    writer = Outbox(backend.store(table))
    with OutboxRelay(outbox, sender, poll_interval_s=0.05):
        write(writer, "before")
        wait_for(lambda: sender.message_keys() == ["before"], timeout=10)
        switch.down = True
        backend.kill_relay_sessions(outbox)
        for i in range(5):
            write(writer, f"during{i}")
        time.sleep(1.5)
        assert sender.message_keys() == ["before"]
        switch.down = False
        wait_for(lambda: len(sender.sent) == 6, timeout=20)
    assert sorted(sender.message_keys()) == ["before", *[f"during{i}" for i in range(5)]]
    assert any("failed" in r.getMessage() and "relay" in r.getMessage() for r in caplog.records)


def test_rows_sent_when_the_mark_cannot_be_written_go_again_with_their_keys(
    backend: Backend, switched: tuple[Switch, Outbox], table: str
) -> None:
    """The database goes away between the broker's acknowledgement and the mark, for longer
    than the lease: the rows stay claimed, and once the lease ended they are sent again with
    the same keys (at least once on the wire); they end SENT once."""
    switch, outbox = switched
    cut_once = threading.Event()

    def cut(message: OutboxMessage) -> None:
        if message.message_key == "k1" and not cut_once.is_set():
            cut_once.set()
            switch.down = True
            backend.kill_relay_sessions(outbox)
            threading.Timer(1.6, lambda: setattr(switch, "down", False)).start()

    sender = RecordingSender(cut)
    for i in range(3):
        write(Outbox(backend.store(table)), f"k{i}")
    with OutboxRelay(outbox, sender, concurrency=1, lease_s=1.0, poll_interval_s=0.05):
        wait_for(
            lambda: (
                outbox_rows(outbox)
                and all(status == "SENT" for status, _ in outbox_rows(outbox).values())
            ),
            timeout=30,
        )
    counts = Counter(sender.message_keys())
    assert set(counts) == {"k0", "k1", "k2"}
    assert counts["k0"] == 2 and counts["k1"] == 2  # sent, mark lost, sent again: same key
    assert counts["k2"] >= 1


# -- metrics, the purge ----------------------------------------------------------------------------


def test_the_relay_reports_sent_failed_parked_and_the_backlog(outbox: Outbox, table: str) -> None:
    """PrometheusMetrics: sent, failed (to retry) and parked per topic, the backlog gauges."""
    from prometheus_client import CollectorRegistry

    from rocketmq_dedup.metrics import PrometheusMetrics

    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    attempts: Counter[str] = Counter()

    def behaviour(message: OutboxMessage) -> None:
        attempts[message.message_key] += 1
        if message.topic == "BAD":
            raise SendFailure(FailureKind.REFUSED, "too large")
        if message.message_key == "flaky" and attempts["flaky"] == 1:
            raise SendFailure(FailureKind.UNKNOWN, "hiccup")

    for key, topic in (("a", "OUT"), ("b", "OUT"), ("flaky", "OUT"), ("big", "BAD")):
        write(outbox, key, topic)
    backlog = outbox.tables.backlog()
    assert (backlog.pending, backlog.parked) == (4, 0) and backlog.oldest_pending_ms is not None
    relay = OutboxRelay(outbox, RecordingSender(behaviour), metrics=metrics, poll_interval_s=0.05)
    with relay:
        wait_for(lambda: outbox.tables.backlog().pending == 0, timeout=10)
        relay._next_backlog = 0.0  # report the backlog at the next round
        relay.wake()
        wait_for(
            lambda: (
                registry.get_sample_value(
                    "rocketmq_dedup_outbox_parked_rows", {"outbox": outbox.name}
                )
                == 1
            ),
            timeout=10,
        )
    labels = {"outbox": outbox.name, "topic": "OUT"}
    assert registry.get_sample_value("rocketmq_dedup_outbox_sent_total", labels) == 3
    assert registry.get_sample_value("rocketmq_dedup_outbox_failed_total", labels) == 1
    bad = {"outbox": outbox.name, "topic": "BAD"}
    assert registry.get_sample_value("rocketmq_dedup_outbox_parked_total", bad) == 1
    assert registry.get_sample_value("rocketmq_dedup_outbox_parked_total", labels) == 0
    gauge = {"outbox": outbox.name}
    assert registry.get_sample_value("rocketmq_dedup_outbox_backlog", gauge) == 0
    assert registry.get_sample_value("rocketmq_dedup_outbox_oldest_pending_seconds", gauge) == 0


def test_purge_deletes_sent_and_dropped_rows_past_the_retention(outbox: Outbox, table: str) -> None:
    """SENT and DROPPED rows past the retention go, PENDING and PARKED rows stay, and so do
    the sharding-key locks with an unsent row; a long retention deletes nothing."""
    sender = RecordingSender(refuse_topic("BAD"))
    write(outbox, "sent", sharding_key="done")
    write(outbox, "parked", "BAD", "stuck")
    with OutboxRelay(outbox, sender, poll_interval_s=0.05):
        wait_for(
            lambda: outbox.tables.backlog().parked == 1 and sender.message_keys() == ["sent"], 10
        )
    write(outbox, "pending")
    assert outbox.tables.purge(3_600_000) == 0
    time.sleep(0.01)
    assert outbox.tables.purge(0, batch_size=1) == 1
    assert set(outbox_rows(outbox)) == {"parked", "pending"}
    lane_rows = backend_of(outbox).db.sql(f"SELECT lane FROM {table}_outbox_lane")
    lanes = {str(lane) for (lane,) in lane_rows}
    assert lanes == {"stuck"}
