"""The redelivery horizon: how long after a message is consumed the broker may still deliver a
copy of it, and the warning given when CONSUMED records are kept for less.

A CONSUMED record that expires before the last redelivery of its message lets that redelivery
run the handler again. The longest path is a copy whose consumer failed: RocketMQ retries it
``max_reconsume_times`` times (16 by default, the group's ``retryMaxTimes``), the n-th retry
after delay level ``2 + n`` of the broker's ``messageDelayLevel`` (the classic consumers' send-back:
10 s, 30 s, 1 min, 2 min, ... 2 h; levels past the last one repeat it), then it goes to the
DLQ. 16 retries add up to 4 h 45 min 40 s. The 5.x consumers' default retry policy starts at
level 1 (1 s, 5 s, ...) and ends sooner, so the classic schedule bounds both. Delayed and timer
messages add their delay (the ``max_delivery_delay_minutes`` setting).

:func:`retention_shortfall` compares a config's retention with that horizon;
:func:`warn_if_retention_short` logs it, once per listener, when the listener is made.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

#: The broker's default ``messageDelayLevel``, in seconds: levels 1 to 18.
DEFAULT_DELAY_LEVELS_SECONDS: Tuple[int, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip

#: The delay level of the first retry of a classic consumer's message (RocketMQ: 3 +
#: reconsume times, the message's count of earlier retries).
FIRST_RETRY_LEVEL = 3

#: RocketMQ's default number of retries before the DLQ (``maxReconsumeTimes``,
#: ``retryMaxTimes``).
DEFAULT_MAX_RECONSUME_TIMES = 16


def retry_delays_seconds(
    max_reconsume_times: int, levels: Sequence[int] = DEFAULT_DELAY_LEVELS_SECONDS
) -> Tuple[int, ...]:
    """The delay before each retry of a message that keeps failing: level ``3 + n`` for the
    retry after ``n`` earlier ones, the last level for any past it."""
    last = len(levels)
    return tuple(
        levels[min(FIRST_RETRY_LEVEL + n, last) - 1] for n in range(max(0, max_reconsume_times))
    )


def redelivery_horizon_ms(
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    max_delivery_delay_ms: int = 0,
    levels: Sequence[int] = DEFAULT_DELAY_LEVELS_SECONDS,
) -> int:
    """How long after a copy of a message is consumed another copy may still be delivered: the
    sum of the retry delays, plus the longest delivery delay of delayed and timer messages."""
    return sum(retry_delays_seconds(max_reconsume_times, levels)) * 1000 + max_delivery_delay_ms


def spell(ms: int) -> str:
    """A duration in days, hours, minutes and seconds: ``4 h 45 min 40 s``."""
    seconds = round(ms / 1000)
    parts = []
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts) or f"{ms} ms"


def retention_shortfall(
    retention_ms: int, max_reconsume_times: int, max_delivery_delay_ms: int
) -> Optional[str]:
    """Why ``retention_ms`` is too short for the redelivery horizon, naming both; None when it
    is long enough."""
    horizon = redelivery_horizon_ms(max_reconsume_times, max_delivery_delay_ms)
    if retention_ms >= horizon:
        return None
    delay = (
        f" plus a delivery delay of {spell(max_delivery_delay_ms)}" if max_delivery_delay_ms else ""
    )
    return (
        f"dedup_record_reserve_minutes keeps CONSUMED records {spell(retention_ms)}, less than "
        f"the broker's redelivery horizon of {spell(horizon)} ({max_reconsume_times} retries "
        f"from delay level {FIRST_RETRY_LEVEL}{delay}): a record can expire before the last "
        "redelivery of its message, which then runs the handler again; keep records at least "
        f"{math.ceil(horizon / 60_000):,} minutes, or set max_reconsume_times to the consumer "
        "group's retryMaxTimes if it retries less"
    )


def warn_if_retention_short(
    application: str, retention_ms: int, max_reconsume_times: int, max_delivery_delay_ms: int
) -> Optional[str]:
    """Log :func:`retention_shortfall` as a warning (once: a listener calls it when it is
    made) and return it."""
    shortfall = retention_shortfall(retention_ms, max_reconsume_times, max_delivery_delay_ms)
    if shortfall is not None:
        logger.warning("application %r: %s", application, shortfall)
    return shortfall
