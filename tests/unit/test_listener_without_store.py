"""Listener cases that need no store of a kind: dedup disabled, a broken store object."""

from __future__ import annotations

from typing import Any

import pytest

from rocketmq_dedup import BatchResult, DedupConfig
from rocketmq_dedup.testing import ClassicMessage
from tests.shared.listener_cases import LATER, SUCCESS, RecordingListener


def test_disabled_config_handles_everything(app_name: str) -> None:
    """Case 12: dedup disabled (or no config) -> every delivery runs the handler."""
    for config in (DedupConfig.disable_dedup_consume_config(app_name), None):
        listener = RecordingListener(config)
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert listener(ClassicMessage("m1")) is SUCCESS
        assert listener.consume_message([ClassicMessage("m1")]) == BatchResult(SUCCESS, 0)
        assert len(listener.handled) == 3


@pytest.mark.parametrize("policy", ["consume", "reconsume_later"])
def test_broken_store_object_is_a_defect_not_an_outage(app_name: str, policy: str) -> None:
    """A user store that returns garbage is a defect, not an outage: under either policy the
    message is retried (never consumed without dedup) and no exception reaches the client's
    callback."""

    class GarbageStore:
        def claim(self, *a: Any) -> Any:
            return object()  # not a (claimed, status) pair

        mark_consumed = release = claim

    config = DedupConfig.enable_dedup_consume_config(
        app_name, GarbageStore(), store_failure_policy=policy
    )
    listener = RecordingListener(config)
    assert listener(ClassicMessage("m1")) is LATER
    assert listener.consume_message([ClassicMessage("m1")]).status is LATER
    assert listener.handled == []
