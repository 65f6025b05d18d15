"""The demo: the SampleListener behind a real classic PushConsumer, deduping on Redis.

Sends orders to TEST-TOPIC, each twice at once (the second copy arrives while the first is in
its 3 s handler, so it goes back through the retry topic) and some a third time later (acked
at once as a duplicate); then prints what happened. Run it through scripts/demo.sh, which
starts Redis and the broker first.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import uuid
from collections import Counter
from typing import Any, Dict, List, Set

import redis
from prometheus_client import CollectorRegistry

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.message import message_id, reconsume_times, to_text
from rocketmq_dedup.metrics import PrometheusMetrics
from samples.rocketmq_clients import Producer, start_push_consumer
from samples.sample_listener import TEST_TOPIC, SampleListener

GROUP = "dedup-demo"


class DemoListener(SampleListener):
    """The sample listener, counting what happens to each delivery."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.acked: Set[str] = set()
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
        body = to_text(msg.body)
        if body.startswith("warmup"):
            self.warm.set()
            return status
        with self.lock:
            self.counts["delivered"] += 1
            if reconsume_times(msg) > 0:
                self.counts["redelivered through the retry topic"] += 1
            if self._local.handled:
                self.counts["handled (business logic ran)"] += 1
            elif status is ConsumeStatus.CONSUME_SUCCESS:
                self.counts["acked as duplicates"] += 1
            else:
                self.counts["answered RECONSUME_LATER (copy still in its handler)"] += 1
            if status is ConsumeStatus.CONSUME_SUCCESS:
                self.acked.add(message_id(msg) or "")
        return status


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
        wait(lambda: listener.counts["handled (business logic ran)"] >= len(orders), 120)
        print("re-sending every other order after it was handled ...", flush=True)
        for order in orders[::2]:
            sent.append(producer.send(TEST_TOPIC, order.encode(), {}))
        wait(lambda: set(sent) <= listener.acked, 120)
    finally:
        stop()
        producer.close()
    report(len(sent), len(orders), listener.counts, registry)


def wait(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("demo timed out waiting for the consumer")
        time.sleep(0.1)


def report(sent: int, orders: int, counts: Dict[str, int], registry: CollectorRegistry) -> None:
    rows = [("messages sent", sent)] + [
        (name, counts.get(name, 0))
        for name in (
            "delivered",
            "handled (business logic ran)",
            "acked as duplicates",
            "answered RECONSUME_LATER (copy still in its handler)",
            "redelivered through the retry topic",
        )
    ]
    print("\n=== rocketmq-dedup demo report ===")
    for name, value in rows:
        print(f"  {name:<55} {value:>4}")
    handled = counts.get("handled (business logic ran)", 0)
    verdict = "exactly once" if handled == orders else f"{handled} times for {orders} orders"
    print(f"every message acked; the business logic ran {verdict}")
    print("metrics (rocketmq_dedup_messages_total by outcome, warm-up messages included):")
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "rocketmq_dedup_messages_total":
                print(f"  {sample.labels['outcome']:<55} {int(sample.value):>4}")
    print()
    if handled != orders:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
