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


def test_the_deduplicated_calls_sample_charges_and_emails_each_order_once() -> None:
    """samples/deduplicated_calls.py: an order charged twice is charged once (the second call
    told "already charged"), and its receipt e-mailed once."""
    import logging

    from samples.deduplicated_calls import payment_steps

    config = DedupConfig.enable_dedup_consume_config("order-service", MemoryDedupStore())
    charge_once, email_receipt = payment_steps(config)
    records: list = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("payments")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert charge_once("order-1", 10) == "receipt-order-1"
        assert charge_once("order-1", 10) == "already charged"
        email_receipt("order-1")
        email_receipt("order-1")
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert lines.count("order order-1 charged 10") == 1
    assert lines.count("order order-1: receipt e-mailed") == 1
