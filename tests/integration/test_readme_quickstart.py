"""The README's 15-line quick start, run: its code as written, against the real Redis on the
port it names (scripts/services.sh's), with only the broker client stood in for (a
PushConsumer that records the subscription); the subscribed listener then handles an order's
first copy and acks its second without the handler."""

from __future__ import annotations

import re
import sys
import types
import uuid
from typing import Any, ClassVar, Dict, List

import pytest

from rocketmq_dedup.testing import ClassicMessage, deliver
from tests.unit.test_readme import QUICK_START, README


class RecordingPushConsumer:
    """rocketmq.client.PushConsumer's calls the quick start makes."""

    made: ClassVar[List[RecordingPushConsumer]] = []

    def __init__(self, group: str) -> None:
        self.group, self.subscribed, self.started, self.namesrv = group, {}, False, None
        self.made.append(self)

    def set_namesrv_addr(self, address: str) -> None:  # 0.5.0rc2's name
        self.namesrv = address

    def subscribe(self, topic: str, listener: Any) -> None:
        self.subscribed[topic] = listener

    def start(self) -> None:
        self.started = True


def test_the_readme_quick_start_runs_and_handles_an_order_once(
    monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    [code] = QUICK_START.findall(README.read_text())
    RecordingPushConsumer.made.clear()
    client = types.ModuleType("rocketmq.client")
    client.PushConsumer = RecordingPushConsumer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rocketmq", types.ModuleType("rocketmq"))
    monkeypatch.setitem(sys.modules, "rocketmq.client", client)
    applied: List[bytes] = []
    namespace: Dict[str, Any] = {"apply_order": lambda body: applied.append(body) or True}
    exec(compile(code, "README.md quick start", "exec"), namespace)
    [consumer] = RecordingPushConsumer.made
    assert (consumer.group, consumer.namesrv, consumer.started) == (
        "order-consumer-group",
        "127.0.0.1:9876",
        True,
    )
    listener = consumer.subscribed["ORDER-TOPIC"]
    order = f"order-{uuid.uuid4().hex[:8]}"  # records stay in the shared Redis for a day
    msg = ClassicMessage("m1", topic="ORDER-TOPIC", keys=order.encode(), body=b"2 books")
    report = deliver(listener, msg, times=2)
    assert (report.handler_runs, report.acked, applied) == (1, 2, [b"2 books"])
    assert redis_client.exists(*redis_client.keys(f"MSGDEDUP:*{re.escape(order)}*")) == 1
