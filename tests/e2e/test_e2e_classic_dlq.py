"""A transport defect the DLQ documentation depends on (issue 36.4), shown through the real
broker: with the classic client's bundled librocketmq 1.0.1 (rocketmq-client-python 0.5.0rc2)
on RocketMQ 5.3, a message past its last retry never reaches ``%DLQ%<group>``. Its last
send-back carries no origin topic, the broker fails it (a NullPointerException in its DLQ
path), and librocketmq drops the message. So ``payload_mismatch="reject"`` and every retried
failure of a classic consumer end lost, not in the DLQ, on this broker. When this test fails,
the transport was fixed: update the README's DLQ section."""

from __future__ import annotations

import time
import uuid
from typing import Any, List

import pytest

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, MemoryDedupStore
from rocketmq_dedup.message import reconsume_times
from rocketmq_dedup.remoting import RemotingClient
from tests.e2e.clients import Producer, start_push_consumer
from tests.e2e.harness import rocketmq_script
from tests.support import ROCKETMQ_NAMESRV, wait_for

pytestmark = pytest.mark.e2e

#: How long after the last retry a dead letter would have appeared (the send-back to the DLQ
#: is immediate; the 1 s delay levels of the test broker make retries come back in ~1 s).
WINDOW_S = 8


class AlwaysFails(DedupConcurrentListener):
    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.attempts: List[int] = []

    def do_handle_msg(self, msg: Any) -> bool:
        self.attempts.append(reconsume_times(msg))
        return False


def test_a_classic_consumers_last_retry_is_lost_not_dead_lettered(
    client: str, broker: None, session_id: str
) -> None:
    """A group that retries once: the message is delivered twice (reconsume 0 and 1), then
    neither delivered again nor found in %DLQ%<group>."""
    assert client == "classic"
    topic, group = f"E2E-CDLQ-{session_id}", f"e2e-cdlq-{session_id}"
    rocketmq_script("both", topic, group, env={"ROCKETMQ_DEDUP_RETRY_MAX": "1"})
    config = DedupConfig.enable_dedup_consume_config(f"cdlq-{uuid.uuid4().hex}", MemoryDedupStore())
    fails = AlwaysFails(config)
    stop = start_push_consumer("classic", group, topic, fails)
    producer = Producer("classic", (topic,))
    try:
        deadline = time.monotonic() + 90
        while not fails.attempts:  # warm-up: the consumer may start after the first sends
            assert time.monotonic() < deadline, "no delivery"
            producer.send_keyed(topic, b"doomed", f"k-{uuid.uuid4().hex}")
            time.sleep(2)
        attempts = fails.attempts
        wait_for(lambda: attempts.count(1) == attempts.count(0), timeout=60)  # retried once
        time.sleep(WINDOW_S)
        assert attempts.count(1) == attempts.count(0) and max(attempts) == 1  # and never again
        with RemotingClient(ROCKETMQ_NAMESRV) as remoting:
            assert remoting.route(f"%DLQ%{group}") is None
    finally:
        producer.close()
        stop()
        fails.close()
