"""Synthetic messages (rocketmq_dedup.testing's, shaped like the classic client's
``RecvMessage``), the counting handler every case shares, and the timed loop."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from bench.settings import TAG, TOPIC
from rocketmq_dedup.testing import ClassicMessage


def make_messages(prefix: str, n: int) -> list[ClassicMessage]:
    """``n`` classic-client messages with ids unique to ``prefix`` (run id, case and rep), the
    id also their ``UNIQ_KEY`` (as producers set it: the default dedup key)."""
    body, tags = b'{"order": 1}', TAG.encode()
    return [
        ClassicMessage(f"{prefix}-{i}", TOPIC, tags, body, uniq_key=f"{prefix}-{i}")
        for i in range(n)
    ]


class CountingHandler:
    """The business handler of every case: counts its calls and succeeds. Thread-safe
    (``bytearray.append`` is atomic), so the threaded and broker cases can share it; a
    bytearray holds no references, so the cyclic GC never walks it (noop calls it 10M times)."""

    def __init__(self) -> None:
        self._calls = bytearray()

    def __call__(self, msg: Any) -> bool:
        self._calls.append(1)
        return True

    @property
    def calls(self) -> int:
        return len(self._calls)

    def reset(self) -> None:
        self._calls = bytearray()


def consume_all(consume: Callable[[Any], Any], items: Sequence[Any], ok: Any) -> int:
    """The timed loop: feed every item to ``consume``; return how many answers were not
    ``ok`` (compared by identity: ``True`` or a ``ConsumeStatus`` member)."""
    failures = 0
    for item in items:
        if consume(item) is not ok:
            failures += 1
    return failures
