"""Synthetic messages shaped like the classic client's ``RecvMessage``, the counting handler
every case shares, and the timed loop."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from bench.settings import TAG, TOPIC

UNIQ_KEY = "UNIQ_KEY"


class BenchMessage:
    """Like rocketmq-client-python's ``RecvMessage``: ``topic`` str, bytes ``tags``/``keys``/
    ``body``, ``id`` str and bytes properties (``UNIQ_KEY`` = the id, as producers set it)."""

    __slots__ = ("body", "id", "keys", "reconsume_times", "tags", "topic")

    def __init__(self, msg_id: str) -> None:
        self.id = msg_id
        self.topic = TOPIC
        self.tags = TAG.encode()
        self.keys = b""
        self.body = b'{"order": 1}'
        self.reconsume_times = 0

    def get_property(self, name: str) -> bytes:
        return self.id.encode() if name == UNIQ_KEY else b""


def make_messages(prefix: str, n: int) -> list[BenchMessage]:
    """``n`` messages with ids unique to ``prefix`` (run id, case and rep)."""
    return [BenchMessage(f"{prefix}-{i}") for i in range(n)]


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
