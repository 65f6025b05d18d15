"""Helpers of the misconfigured-store tests (no tests here): a listener that counts its
handler's runs, a metrics object that records the outcomes, and what every store that refuses
must do at run time."""

from __future__ import annotations

import logging
import uuid
from typing import Any, List

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig
from rocketmq_dedup.metrics import Decision, DedupMetrics
from rocketmq_dedup.testing import ClassicMessage, deliver

LATER = ConsumeStatus.RECONSUME_LATER
#: What the library logs for an outage: never for a refusal.
OUTAGE_LINES = ("WITHOUT dedup", "unavailable", "reconnecting", "connection lost")


class Counting(DedupConcurrentListener):
    """Counts its handler's runs."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs = 0

    def do_handle_msg(self, msg: Any) -> bool:
        self.runs += 1
        return True


class Outcomes(DedupMetrics):
    """Records each decision's outcome label."""

    def __init__(self) -> None:
        self.outcomes: List[str] = []

    def message(self, decision: Decision) -> None:
        self.outcomes.append(decision.outcome.value)


def assert_never_run_without_dedup(
    client: Any, caplog: pytest.LogCaptureFixture, **options: Any
) -> str:
    """A config on ``client`` without the start-up check, the default policy ("consume"):
    three deliveries of a key and a batch (the store's single and batch paths) are all
    RECONSUME_LATER, no handler runs, each decision is counted as ``store_misconfigured``, and
    nothing is logged as an outage. Returns the ERROR lines, joined."""
    metrics = Outcomes()
    config = DedupConfig.enable_dedup_consume_config(
        f"app-{uuid.uuid4().hex[:12]}", client, check_store=False, metrics=metrics, **options
    )
    listener = Counting(config)
    key = uuid.uuid4().hex
    batch = [ClassicMessage(f"b{n}", uniq_key=f"{key}-{n}") for n in (1, 2)]
    with caplog.at_level(logging.INFO, logger="rocketmq_dedup"):
        report = deliver(listener, ClassicMessage("m1", uniq_key=key), times=3)
        answered = listener.consume_message(batch)
    listener.close()
    assert report.answers == (LATER, LATER, LATER)
    assert answered.status is LATER and listener.runs == 0
    # a batch stops at its first failure: the messages after it are counted when they return
    assert metrics.outcomes == ["store_misconfigured"] * 4
    lines = [r.getMessage() for r in caplog.records]
    for outage in OUTAGE_LINES:
        assert not any(outage in line for line in lines), lines
    errors = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert "the dedup store refused the operation" in errors, lines
    return errors
