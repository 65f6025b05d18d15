"""The e2e session's last check (the conftest runs it after every other e2e test)."""

from __future__ import annotations

from typing import List

import pytest

from tests.e2e.harness import rocketmq_script

pytestmark = pytest.mark.e2e


def test_no_message_reached_a_dead_letter_queue(used_groups: List[str]) -> None:
    """Every message of this session was acked: no %DLQ% topic exists for its groups."""
    assert used_groups
    topics = rocketmq_script("admin", "topicList", capture=True) or ""
    assert "DEDUP-PROBE" in topics  # the listing itself worked
    dlq = [g for g in used_groups if f"%DLQ%{g}" in topics]
    assert dlq == []
