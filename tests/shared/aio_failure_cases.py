"""Messages that can never succeed, on the asyncio listener (through the classic push bridge)
and every asyncio store: a PermanentFailure raised or returned is recorded FAILED with its
reason and answered as ``permanent_failure`` says, its copies too, without the handler; a
message whose claims lapsed ``max_lapsed_claims`` times is parked. The sync listener's cases
are in tests/shared/decision_cases.py."""

from __future__ import annotations

from typing import Any

from rocketmq_dedup import ConsumeStatus, DedupStatus, PermanentFailure
from rocketmq_dedup.message import DedupElement, message_tag, message_topic
from rocketmq_dedup.stores.base import Claim, DedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.aio_support import BridgedListener
from tests.shared.listener_cases import RecordingListener, config_for
from tests.support import wait_for

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


def _element(app: str, key: str) -> DedupElement:
    msg = ClassicMessage(key)
    return DedupElement(app, message_topic(msg), message_tag(msg), key)


def test_an_async_permanent_failure_is_recorded_failed_and_its_copies_skip_the_handler(
    store: DedupStore, app_name: str
) -> None:
    """Raised: RECONSUME_LATER ('dlq'), the record FAILED with the reason; a copy answered
    the same without the handler; returned with permanent_failure='ack': CONSUME_SUCCESS."""

    def refuse(msg: Any) -> Any:
        if msg.id == "raised":
            raise PermanentFailure("order total is negative")
        return PermanentFailure("unknown currency")

    listener = RecordingListener(config_for(store, app_name), refuse)
    assert isinstance(listener, BridgedListener)  # the asyncio listener, not the sync one
    assert listener(ClassicMessage("raised")) is LATER
    record = store.read(_element(app_name, "raised"))
    assert record is not None and record.status is DedupStatus.FAILED
    assert record.reason == "order total is negative"
    assert listener(ClassicMessage("raised")) is LATER
    assert len(listener.handled) == 1
    acking = RecordingListener(config_for(store, app_name, permanent_failure="ack"), refuse)
    assert acking.consume_each([ClassicMessage("returned")]) == [SUCCESS]
    assert acking(ClassicMessage("returned")) is SUCCESS
    assert len(acking.handled) == 1
    record = store.read(_element(app_name, "returned"))
    assert record is not None and record.status is DedupStatus.FAILED
    assert record.reason == "unknown currency"


def test_an_async_message_whose_claims_lapsed_is_parked(store: DedupStore, app_name: str) -> None:
    """max_lapsed_claims=1: a claim that takes over one lapsed claim (a consumer killed in the
    handler) parks the message: FAILED, the handler not run, RECONSUME_LATER."""
    listener = RecordingListener(config_for(store, app_name, max_lapsed_claims=1))
    element = _element(app_name, "poison")
    assert store.claim(Claim(element, "killed-consumer"), 50).claimed
    wait_for(lambda: store.read(element) is None, 10)  # its lease lapsed, never settled
    assert listener(ClassicMessage("poison")) is LATER
    assert listener.handled == []
    record = store.read(element)
    assert record is not None and record.status is DedupStatus.FAILED
    assert "ended 1 consumers" in (record.reason or "")
