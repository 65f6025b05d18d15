"""The demo: the SampleListener behind a real classic PushConsumer, deduping on Redis.

Sends orders to TEST-TOPIC, each twice at once (the second copy arrives while the first is in
its 3 s handler, so it goes back through the retry topic) and some a third time later (acked
at once as a duplicate); then prints what happened to each copy. Run it through
scripts/demo.sh, which starts Redis and the broker first.

The report counts copies (sent messages), not deliveries, so it is the same on every run: how
many times a copy is answered RECONSUME_LATER depends on timing (it comes back after the 1 s
retry backoff, and is answered again while its twin is still in the 3 s handler: 1-2 times on
the development machine), so only "at least once" is reported. The metrics lines that follow
count answers: their ``duplicate_in_progress`` is that timing-dependent total.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Set

import redis
from prometheus_client import CollectorRegistry

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.message import message_id, to_text
from rocketmq_dedup.metrics import PrometheusMetrics
from samples.rocketmq_clients import Producer, start_push_consumer
from samples.sample_listener import TEST_TOPIC, SampleListener

GROUP = "dedup-demo"


@dataclass
class Copy:
    """What happened to one sent message (its deliveries share its UNIQ_KEY)."""

    handled: bool = False  # the business logic ran on this copy
    answered_later: int = 0  # RECONSUME_LATER answers (its twin was in its handler)
    acked: bool = False  # finally answered CONSUME_SUCCESS


class DemoListener(SampleListener):
    """The sample listener, recording what happens to each copy."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.lock = threading.Lock()
        self.copies: Dict[str, Copy] = {}  # by message id
        self.warm = threading.Event()
        self._local = threading.local()

    def do_handle_msg(self, msg: Any) -> bool:
        self._local.handled = True
        if to_text(msg.body).startswith("warmup"):
            return True
        return super().do_handle_msg(msg)

    def __call__(self, msg: Any) -> ConsumeStatus:
        self._local.handled = False
        status = super().__call__(msg)
        if to_text(msg.body).startswith("warmup"):
            self.warm.set()
            return status
        with self.lock:
            copy = self.copies.setdefault(message_id(msg) or "", Copy())
            copy.handled |= self._local.handled
            if status is ConsumeStatus.CONSUME_SUCCESS:
                copy.acked = True
            else:
                copy.answered_later += 1
        return status

    def handled(self) -> int:
        with self.lock:
            return sum(copy.handled for copy in self.copies.values())

    def acked(self) -> Set[str]:
        with self.lock:
            return {msg_id for msg_id, copy in self.copies.items() if copy.acked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=5)
    parser.add_argument(
        "--redis", default=os.environ.get("DEDUP_REDIS_URL", "redis://127.0.0.1:16379/0")
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    registry = CollectorRegistry()
    config = DedupConfig.enable_dedup_consume_config(
        "dedup-demo", redis.Redis.from_url(args.redis), metrics=PrometheusMetrics(registry)
    )
    listener = DemoListener(config)
    stop = start_push_consumer("classic", GROUP, TEST_TOPIC, listener, threads=8)
    producer = Producer("classic", (TEST_TOPIC,))
    run = uuid.uuid4().hex[:6]
    sent: List[str] = []
    try:
        deadline = time.monotonic() + 60
        while not listener.warm.wait(1.0):  # until the consumer owns its queues
            assert time.monotonic() < deadline, "the consumer received nothing"
            producer.send(TEST_TOPIC, f"warmup-{run}".encode(), {})
        orders = [f"order-{run}-{i}" for i in range(args.orders)]
        print(f"\nsending {len(orders)} orders, each twice at once ...", flush=True)
        for order in orders:
            sent += [producer.send(TEST_TOPIC, order.encode(), {}) for _ in range(2)]
        wait(lambda: listener.handled() >= len(orders), 120)
        print("re-sending every other order after it was handled ...", flush=True)
        for order in orders[::2]:
            sent.append(producer.send(TEST_TOPIC, order.encode(), {}))
        wait(lambda: set(sent) <= listener.acked(), 120)
    finally:
        stop()
        producer.close()
    report([listener.copies[msg_id] for msg_id in sent], len(orders), registry)


def wait(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("demo timed out waiting for the consumer")
        time.sleep(0.1)


def report(copies: List[Copy], orders: int, registry: CollectorRegistry) -> None:
    """Facts per copy, the same on every run (see the module's docstring)."""
    handled = sum(copy.handled for copy in copies)
    duplicates = [copy for copy in copies if copy.acked and not copy.handled]
    later = sum(copy.answered_later > 0 for copy in duplicates)
    rows = [
        ("messages sent", len(copies)),
        ("handled (business logic ran)", handled),
        ("acked as duplicates", len(duplicates)),
        ("  at once (sent after its order was handled)", len(duplicates) - later),
        ("  after RECONSUME_LATER (its twin was in its handler)", later),
    ]
    print("\n=== rocketmq-dedup demo report ===")
    for name, value in rows:
        print(f"  {name:<55} {value:>4}")
    verdict = "exactly once" if handled == orders else f"{handled} times for {orders} orders"
    print(f"every message acked; the business logic ran {verdict}")
    print("metrics (rocketmq_dedup_messages_total by outcome, warm-up messages included):")
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "rocketmq_dedup_messages_total" and sample.value:  # not the 0s
                print(f"  {sample.labels['outcome']:<55} {int(sample.value):>4}")
    print()
    if handled != orders:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
