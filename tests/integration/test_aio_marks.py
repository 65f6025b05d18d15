"""The asyncio Redis store's deferred CONSUMED marks, on the real server: the listener answers
before the mark is written, the mark rides the next round trip (a copy handled right after is
a duplicate), a read or ``aclose()`` sends it, and ``defer_marks_ms=0`` writes it first."""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

import redis.asyncio

from rocketmq_dedup import ConsumeStatus, DedupConfig
from rocketmq_dedup.aio import AsyncDedupConcurrentListener
from rocketmq_dedup.message import DedupElement, message_topic_tag
from rocketmq_dedup.testing import GrpcMessage
from tests.support import REDIS_URL

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
#: A mark waits up to this long for a round trip (the longest allowed): the tests see it wait.
LONG_DEFER = {"defer_marks_ms": 1000, "dedup_processing_expire_milli_seconds": 120_000}


class Counting(AsyncDedupConcurrentListener):
    """Counts the handler's runs per message id."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.runs: List[str] = []

    async def do_handle_msg(self, msg: Any) -> bool:
        self.runs.append(msg.message_id)
        return True


def element_of(listener: Counting, msg: GrpcMessage) -> DedupElement:
    """The record's element for ``msg`` (its id the key, the listener's default)."""
    topic, tag = message_topic_tag(msg)
    return DedupElement(listener.dedup_config.application_name, topic, tag, msg.message_id)


async def raw_status(client: Any, listener: Counting, msg: GrpcMessage) -> Optional[bytes]:
    """The record's value as Redis holds it now (no flush): its status prefix."""
    store = listener.dedup_config.async_store
    assert store is not None
    element = element_of(listener, msg)
    value = await client.get(store.record_key(element))  # type: ignore[attr-defined]
    return None if value is None else bytes(value).split(b":", 1)[0]


def run_with(app_name: str, options: Any, scenario: Any) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        config = DedupConfig.enable_dedup_consume_config(app_name, client, **options)
        listener = Counting(config)
        try:
            await scenario(client, listener)
        finally:
            await listener.aclose()
            await client.aclose()

    asyncio.run(main())


def test_a_mark_waits_for_the_next_round_trip_which_a_copy_then_finds_consumed(
    app_name: str,
) -> None:
    """The listener answers while the record is still CONSUMING (the mark deferred); a copy
    handled right after goes in the round trip that carries the mark, after it: acked as a
    duplicate, its handler not run; the record is CONSUMED."""

    async def scenario(client: Any, listener: Counting) -> None:
        msg = GrpcMessage("m-1")
        assert await listener(msg) is SUCCESS
        assert await raw_status(client, listener, msg) == b"CONSUMING"
        assert await listener(GrpcMessage("m-1")) is SUCCESS
        assert listener.runs == ["m-1"]
        assert await raw_status(client, listener, msg) == b"CONSUMED"

    run_with(app_name, LONG_DEFER, scenario)


def test_a_read_and_aclose_send_the_deferred_marks(app_name: str) -> None:
    """A read through the store sees the mark (it is sent first); a mark still deferred when
    the listener closes is written by ``aclose()``."""

    async def scenario(client: Any, listener: Counting) -> None:
        store = listener.dedup_config.async_store
        assert store is not None
        first, second = GrpcMessage("m-1"), GrpcMessage("m-2")
        assert await listener(first) is SUCCESS
        record = await store.read(element_of(listener, first))
        assert record is not None and record.status.name == "CONSUMED"
        assert await listener(second) is SUCCESS
        assert await raw_status(client, listener, second) == b"CONSUMING"
        await listener.aclose()
        assert await raw_status(client, listener, second) == b"CONSUMED"

    run_with(app_name, LONG_DEFER, scenario)


def test_with_defer_marks_ms_0_the_mark_is_written_before_the_answer(app_name: str) -> None:
    """``defer_marks_ms=0``: the record is CONSUMED when the listener answers."""

    async def scenario(client: Any, listener: Counting) -> None:
        msg = GrpcMessage("m-1")
        assert await listener(msg) is SUCCESS
        assert await raw_status(client, listener, msg) == b"CONSUMED"

    run_with(app_name, {"defer_marks_ms": 0}, scenario)
