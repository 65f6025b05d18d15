"""Dead letters made through the real broker, for tests/e2e/test_e2e_dlq.py: a 5.x push consumer
whose dedup listener rejects a reused key with another payload (``payload_mismatch="reject"``)
and fails one message, in a group that retries once, so both reach ``%DLQ%<group>``.

Only the 5.x client can make them on RocketMQ 5.3: the classic client's bundled librocketmq
1.0.1 sends back its last retry without the origin topic, the broker fails that send-back, and
librocketmq drops the message (test_e2e_dlq.py shows it). So in the classic environment the
test runs this module in the 5.x environment: ``python -m tests.e2e.dlq_maker '<json>'``,
printing the message ids as JSON.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Dict, List, Tuple

import redis

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, DedupStatus
from rocketmq_dedup.dlq import read_dead_letters
from rocketmq_dedup.message import message_body, message_id, message_keys
from rocketmq_dedup.remoting import RemotingClient
from tests.support import REDIS_URL, ROCKETMQ_NAMESRV, wait_for

FAIL = b"fail"


class OrderListener(DedupConcurrentListener):
    """Keyed by the order id (the message's key), payload checked; a body of ``fail`` fails
    while ``failing`` is set. Remembers what its handler ran and what came as a duplicate."""

    failing = True

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.lock = threading.Lock()
        self.handled: List[Tuple[str, str, bytes]] = []  # (key, message id, body)
        self.duplicates: List[Tuple[str, DedupStatus]] = []

    def dedup_message_key(self, msg: Any) -> Any:
        return message_keys(msg)[0]

    def payload_fingerprint(self, msg: Any) -> Any:
        return message_body(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        if self.failing and message_body(msg) == FAIL:
            return False
        with self.lock:
            self.handled.append((message_keys(msg)[0], message_id(msg) or "", message_body(msg)))
        return True

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:
        with self.lock:
            self.duplicates.append((message_id(msg) or "", status))


def listener(app: str) -> OrderListener:
    config = DedupConfig.enable_dedup_consume_config(
        app, redis.Redis.from_url(REDIS_URL), payload_mismatch="reject"
    )
    return OrderListener(config)


def make_dead_letters(topic: str, group: str, app: str) -> Dict[str, str]:
    """Through a 5.x consumer in ``group`` (which must retry once): order-1 handled with "10
    books", order-1 again with "12 books" (rejected: another payload), order-3 "fail" (its
    handler fails). Returns the three message ids once the two rejected ones are dead letters."""
    from tests.e2e.clients import Producer, start_push_consumer

    orders = listener(app)
    stop = start_push_consumer("grpc", group, topic, orders)
    producer = Producer("grpc", (topic,))
    try:
        first = producer.send_keyed(topic, b"10 books", "order-1", tag="TagD")
        wait_for(lambda: orders.handled, timeout=90)
        reused = producer.send_keyed(topic, b"12 books", "order-1", tag="TagD")
        failing = producer.send_keyed(topic, FAIL, "order-3", tag="TagD")
        with RemotingClient(ROCKETMQ_NAMESRV) as client:
            wait_for(lambda: len(read_dead_letters(client, group)) >= 2, timeout=120, interval=1)
    finally:
        producer.close()
        stop()
        orders.close()
    return {"first": first, "reused": reused, "failing": failing}


if __name__ == "__main__":
    topic, group, app = json.loads(sys.argv[1])
    print(json.dumps(make_dead_letters(topic, group, app)), flush=True)
