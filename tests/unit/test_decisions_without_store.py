"""The decision rules that need no store: return values without dedup, refused keys."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rocketmq_dedup import MemoryDedupStore
from rocketmq_dedup.testing import ClassicMessage
from tests.shared.decision_cases import (
    LATER,
    SUCCESS,
    ClassicConsumeStatus,
    ConsumeResult,
    Listener,
    Opaque,
    config_for,
)


@pytest.mark.parametrize("result", [1, 0, "ok", "", 1.0, [True], object()], ids=repr)
def test_other_return_values_are_an_error_and_a_retry(
    result: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Any other return value is logged as an error naming it, and the message is retried."""

    listener = Listener(config_for(MemoryDedupStore(), "app"), result)
    with caplog.at_level(logging.ERROR, logger="rocketmq_dedup"):
        assert listener(ClassicMessage("m1")) is LATER
    assert any("do_handle_msg returned" in r.getMessage() for r in caplog.records)


def test_return_values_apply_without_dedup_too() -> None:
    """With dedup disabled the same rule applies: RECONSUME_LATER is a retry, not an ack."""
    listener = Listener(None, ClassicConsumeStatus.RECONSUME_LATER)
    assert listener(ClassicMessage("m1")) is LATER
    listener.result = ConsumeResult.SUCCESS
    assert listener(ClassicMessage("m1")) is SUCCESS


def test_distinct_opaque_keys_never_share_a_record(app_name: str) -> None:
    """100 messages keyed by fresh objects: none is acked without its handler (the old code
    keyed them by reused addresses)."""

    listener = Listener(config_for(MemoryDedupStore(), app_name), key=lambda msg: Opaque())
    statuses = [listener(ClassicMessage(f"m{i}")) for i in range(100)]
    assert SUCCESS not in statuses  # never acked without the handler
