"""The redelivery horizon (issue 36.3): RocketMQ's retry schedule for a group's retries, and the
warning a listener gives at start when CONSUMED records would expire before it ends."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, DedupConfigError, MemoryDedupStore
from rocketmq_dedup.horizon import (
    DEFAULT_DELAY_LEVELS_SECONDS,
    redelivery_horizon_ms,
    retention_shortfall,
    retry_delays_seconds,
    spell,
)
from rocketmq_dedup.testing import ManualClock

HORIZON_16_S = 4 * 3600 + 45 * 60 + 40  # 10 s + 30 s + 1..10 min + 20 min + 30 min + 1 h + 2 h


class Listener(DedupConcurrentListener):
    def do_handle_msg(self, msg: Any) -> bool:
        return True


def config(**settings: Any) -> DedupConfig:
    store = MemoryDedupStore(clock=ManualClock())
    return DedupConfig.enable_dedup_consume_config("orders", store, **settings)


def horizon_warnings(caplog: pytest.LogCaptureFixture, **settings: Any) -> list[str]:
    """The horizon warnings logged while a listener is made with these settings."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rocketmq_dedup.horizon"):
        Listener(config(**settings)).close()
    return [r.getMessage() for r in caplog.records if r.name == "rocketmq_dedup.horizon"]


def test_sixteen_retries_span_the_delay_levels_from_the_third() -> None:
    """16 retries wait levels 3 to 18 (10 s ... 2 h): 4 h 45 min 40 s in all."""
    delays = retry_delays_seconds(16)
    assert delays == DEFAULT_DELAY_LEVELS_SECONDS[2:]
    assert redelivery_horizon_ms(16) == HORIZON_16_S * 1000
    assert spell(redelivery_horizon_ms(16)) == "4 h 45 min 40 s"


def test_retries_past_the_last_level_wait_the_last_level_each() -> None:
    """A group retrying 18 times waits 2 h for each retry past level 18."""
    assert redelivery_horizon_ms(18) == (HORIZON_16_S + 2 * 7200) * 1000
    assert retry_delays_seconds(18)[-3:] == (7200, 7200, 7200)


def test_fewer_retries_and_a_delivery_delay() -> None:
    """Two retries: 10 s + 30 s; none: nothing; a delivery delay is added as it is."""
    assert redelivery_horizon_ms(2) == 40_000
    assert redelivery_horizon_ms(0) == 0
    assert redelivery_horizon_ms(2, max_delivery_delay_ms=90_000) == 130_000


def test_a_retention_at_least_the_horizon_is_enough() -> None:
    """No shortfall at or above the horizon; one naming both durations below it."""
    assert retention_shortfall(HORIZON_16_S * 1000, 16, 0) is None
    text = retention_shortfall(HORIZON_16_S * 1000 - 1, 16, 0)
    assert text is not None and "4 h 45 min 40 s" in text and "286 minutes" in text


def test_a_listener_warns_at_start_naming_retention_and_horizon(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records kept 60 minutes against 16 retries: one warning with both numbers."""
    [warning] = horizon_warnings(caplog, dedup_record_reserve_minutes=60)
    assert "keeps CONSUMED records 1 h" in warning
    assert "redelivery horizon of 4 h 45 min 40 s (16 retries" in warning
    assert "'orders'" in warning


def test_the_default_retention_gives_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """1440 minutes is longer than 16 retries: silence."""
    assert horizon_warnings(caplog) == []


def test_max_reconsume_times_moves_the_horizon(caplog: pytest.LogCaptureFixture) -> None:
    """A group that retries twice (40 s) is covered by a 1-minute retention; one that retries
    30 times (over a day) is not covered by the default retention."""
    assert horizon_warnings(caplog, dedup_record_reserve_minutes=1, max_reconsume_times=2) == []
    [warning] = horizon_warnings(caplog, max_reconsume_times=30)
    assert "1 d" in warning and "(30 retries" in warning


def test_a_delivery_delay_is_part_of_the_horizon(caplog: pytest.LogCaptureFixture) -> None:
    """Timer messages delayed up to a day need records kept longer than a day."""
    [warning] = horizon_warnings(caplog, max_delivery_delay_minutes=1440)
    assert "plus a delivery delay of 1 d" in warning


def test_a_disabled_config_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    """Dedup off: no records, nothing to compare."""
    caplog.set_level(logging.WARNING, logger="rocketmq_dedup.horizon")
    Listener(DedupConfig.disable_dedup_consume_config("orders")).close()
    assert not [r for r in caplog.records if r.name == "rocketmq_dedup.horizon"]


def test_the_config_reports_its_horizon() -> None:
    """DedupConfig.redelivery_horizon_ms follows its two settings."""
    settings = config(max_reconsume_times=2, max_delivery_delay_minutes=1.5)
    assert settings.redelivery_horizon_ms == 40_000 + 90_000
    settings.max_reconsume_times = 16
    assert settings.redelivery_horizon_ms == HORIZON_16_S * 1000 + 90_000


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_reconsume_times", -1),
        ("max_reconsume_times", 1.5),
        ("max_reconsume_times", True),
        ("max_reconsume_times", 70_000),
        ("max_delivery_delay_minutes", -1),
        ("max_delivery_delay_minutes", float("nan")),
    ],
)
def test_bad_horizon_settings_are_refused(name: str, value: Any) -> None:
    """Retries are an int from 0 to 65,535; the delay zero or more minutes."""
    with pytest.raises(DedupConfigError, match=name):
        config(**{name: value})
