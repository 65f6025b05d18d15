"""The README's outbox sample (samples/outbox_payments.py, classic client), run as a user runs it:
each order's payment recorded once and its "ship it" message sent, with its key, after the
commit (collected in .venv-classic only)."""

from __future__ import annotations

import signal
import threading
import uuid
from collections import Counter
from typing import Any, List

import pytest

from tests.e2e.clients import Producer, start_push_consumer
from tests.e2e.harness import rocketmq_script, sql
from tests.e2e.test_e2e_quickstarts import SampleProcess
from tests.support import wait_for

pytestmark = pytest.mark.e2e

PAID = " INFO order {} paid; ship it queued"


def test_the_outbox_sample_pays_each_order_once_and_ships_it(
    client: str, broker: None, used_groups: List[str]
) -> None:
    """4 orders sent twice each: each is paid once (one log line, one payment row), its "ship
    it" message reaches SHIP_TOPIC with the key "<order>:ship" and its outbox row ends SENT;
    SIGTERM stops the sample cleanly."""
    assert client == "classic"
    run = uuid.uuid4().hex[:8]
    topic, group, ship = f"OBX-S-{run}", f"obx-s-{run}", f"OBX-SHIP-{run}"
    rocketmq_script("both", f"{topic} {ship}", f"{group} {group}-ship")
    used_groups += [group, f"{group}-ship"]
    shipped: Counter[str] = Counter()
    lock = threading.Lock()

    def on_ship(msg: Any) -> int:
        with lock:
            shipped[msg.keys.decode()] += 1
        return 0  # CONSUME_SUCCESS

    stop_ship = start_push_consumer(client, f"{group}-ship", ship, on_ship)
    producer = Producer(client, (topic,))
    process = SampleProcess("outbox_payments", topic, group, extra_env={"SHIP_TOPIC": ship})
    try:
        warm_up(process, producer, topic, run)
        orders = [f"order-{run}-{i}" for i in range(4)]
        for copy in range(2):
            for order in orders:
                producer.send_keyed(topic, f"{order} copy {copy}".encode(), order)
        wait_for(
            lambda: process.alive() and all(shipped[f"{o}:ship"] for o in orders),
            timeout=120,
            interval=0.2,
        )
        paid = Counter(line for line in process.lines() for o in orders if PAID.format(o) in line)
        assert len(paid) == 4 and set(paid.values()) == {1}
        rows = sql("SELECT order_id, COUNT(*) FROM t_payment WHERE order_id LIKE %s "
                   "GROUP BY order_id", f"order-{run}-%")  # fmt: skip
        assert dict(rows) == {order: 1 for order in orders}
        statuses = sql("SELECT message_key, status FROM t_rocketmq_dedup_outbox "
                       "WHERE message_key LIKE %s", f"order-{run}-%")  # fmt: skip
        assert dict(statuses) == {f"{order}:ship": "SENT" for order in orders}
        process.proc.send_signal(signal.SIGTERM)
        assert process.proc.wait(60) == 0, process.tail()
        assert process.lines()[-1].endswith(" INFO stopped"), process.tail()
        assert not [line for line in process.lines() if "Traceback" in line or " ERROR " in line]
    finally:
        process.kill()
        producer.close()
        stop_ship()


def warm_up(process: SampleProcess, producer: Producer, topic: str, run: str) -> None:
    """A warm-up order a second until the sample pays one: its consumer pulls its queues."""
    sent = 0

    def paid() -> bool:
        nonlocal sent
        process.alive()
        producer.send_keyed(topic, b"warm-up", f"warmup-{run}-{sent}")
        sent += 1
        return any(" INFO order warmup-" in line and "paid" in line for line in process.lines())

    wait_for(paid, timeout=90, interval=1.0)
