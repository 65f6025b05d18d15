"""Rate-limited log lines: a message repeated for every message of an outage is logged once per
interval, with how many times it happened since the last line."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Tuple

DEFAULT_INTERVAL_S = 10.0


class RateLimitedLog:
    """Logs each distinct (level, template) at most once per ``interval`` seconds.

    The first occurrence is logged at once (with its traceback if ``exc_info`` is given); the
    ones within the interval are counted, and the next line that gets through says how many
    were suppressed. Thread-safe; costs a dict lookup when suppressed.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        # (level, template, about) -> (next line at, count)
        self._state: Dict[Tuple[int, str, str], Tuple[float, int]] = {}

    def log(
        self, level: int, template: str, *args: Any, exc_info: Any = None, about: str = ""
    ) -> None:
        """Log ``template % args`` at ``level`` unless the same template was logged less than
        ``interval`` seconds ago (per ``about``, e.g. the store a line is about: two stores'
        lines are limited apart)."""
        if not self.logger.isEnabledFor(level):
            return
        now = self._clock()
        key = (level, template, about)
        with self._lock:
            due, suppressed = self._state.get(key, (0.0, 0))
            if now < due:
                self._state[key] = (due, suppressed + 1)
                return
            self._state[key] = (now + self.interval, 0)
        if suppressed:
            template += " (and %d more time(s) in the last %.0f s, not logged)"
            args = (*args, suppressed, self.interval)
        self.logger.log(level, template, *args, exc_info=exc_info)
