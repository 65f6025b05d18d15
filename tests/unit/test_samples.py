"""The SampleListener port: TEST-TOPIC dedups on the body; other topics on the message id."""

from __future__ import annotations

from rocketmq_dedup import ConsumeStatus, DedupConfig, MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage
from samples.sample_listener import SampleListener


def test_sample_listener_dedups_test_topic_on_the_body() -> None:
    """Two TEST-TOPIC messages with one body are one; other topics use the message id."""
    listener = SampleListener(DedupConfig.enable_dedup_consume_config("s", MemoryDedupStore()))
    listener.handle_seconds = 0.0
    assert listener.dedup_message_key(ClassicMessage("id-1", body=b"order-1")) == "order-1"
    other = ClassicMessage("id-2", topic="OTHER", body=b"order-1")
    assert listener.dedup_message_key(other) == "id-2"
    assert listener(ClassicMessage("id-3", body=b"order-9")) is ConsumeStatus.CONSUME_SUCCESS
