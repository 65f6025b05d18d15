"""The asyncio path's drivers and cancellation, without a broker: a cancelled message is never
acked and leaves no claim; the SimpleConsumer driver keeps at most max_in_flight messages on the
loop and acks only what its listener answered CONSUME_SUCCESS; the push bridge blocks its
client's threads beyond max_in_flight and answers RECONSUME_LATER when the loop is gone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, List, Optional

import pytest

from rocketmq_dedup import ConsumeStatus, DedupConfig, DedupElement, DedupStatus
from rocketmq_dedup.aio import AsyncDedupConcurrentListener, AsyncMemoryDedupStore
from rocketmq_dedup.aio.consumers import PushBridge, consume_simple
from rocketmq_dedup.testing import GrpcMessage
from tests.aio_support import LoopThread

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class Slow(AsyncDedupConcurrentListener):
    """Handlers that take ``seconds``; counts how many run at once."""

    def __init__(self, config: DedupConfig, seconds: float = 0.05, answer: Any = True) -> None:
        super().__init__(config)
        self.seconds = seconds
        self.answer = answer
        self.running = self.most = 0
        self.finished: List[str] = []

    async def do_handle_msg(self, msg: Any) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.running -= 1
        self.finished.append(msg.message_id)
        return self.answer(msg) if callable(self.answer) else self.answer


def memory_config(app: str = "app") -> DedupConfig:
    return DedupConfig.enable_dedup_consume_config(app, AsyncMemoryDedupStore())


class FakeSimpleConsumer:
    """A 5.x SimpleConsumer's receive_async/ack_async: concurrent futures completed from a
    thread of its own, as the client's are."""

    def __init__(self, messages: List[Any]) -> None:
        self.queue = list(messages)
        self.acked: List[str] = []
        self.asked: List[int] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(2)

    def receive_async(self, count: int, invisible_duration: int) -> Any:
        self.asked.append(count)

        def receive() -> List[Any]:
            time.sleep(0.01)
            batch, self.queue = self.queue[:count], self.queue[count:]
            return batch

        return self._pool.submit(receive)

    def ack_async(self, message: Any) -> Any:
        return self._pool.submit(self.acked.append, message.message_id)


def test_a_cancelled_message_is_not_acked_and_leaves_no_claim() -> None:
    """Cancelling a message's task in its handler: CancelledError reaches the caller (no
    answer, so nothing acks it) and its claim is released (a redelivery runs at once)."""
    config = memory_config()
    listener = Slow(config, seconds=10)

    async def run() -> Optional[DedupStatus]:
        task = asyncio.ensure_future(listener(GrpcMessage("m1")))
        while not listener.running:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert config.async_store is not None
        return await config.async_store.get_status(DedupElement("app", "TEST-TOPIC", "TagA", "m1"))

    assert asyncio.run(run()) is None
    assert listener.finished == []


def test_a_handler_that_finished_is_recorded_even_if_cancelled_while_marking() -> None:
    """Cancelled after its handler returned (while its CONSUMED mark is on its way): the mark
    is still written (shielded), the caller still sees CancelledError (never acked here: the
    redelivery is a duplicate, acked without the handler)."""
    config = memory_config()

    class Marking(AsyncMemoryDedupStore):
        async def do_mark_consumed(self, claim: Any, retention_ms: int) -> None:
            await asyncio.sleep(0.05)
            await super().do_mark_consumed(claim, retention_ms)

    config = DedupConfig.enable_dedup_consume_config("app", Marking())
    listener = Slow(config, seconds=0)

    async def run() -> ConsumeStatus:
        task = asyncio.ensure_future(listener(GrpcMessage("m1")))
        while not listener.finished:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await listener(GrpcMessage("m1"))

    assert asyncio.run(run()) is SUCCESS
    assert listener.finished == ["m1"]


def test_consume_simple_bounds_the_messages_in_flight_and_acks_only_successes() -> None:
    """40 messages, max_in_flight=8: at most 8 handlers at once, no receive asks for more than
    the free slots, the ones answered CONSUME_SUCCESS acked and the others not."""
    messages = [GrpcMessage(f"m{i}") for i in range(40)]
    consumer = FakeSimpleConsumer(messages)
    listener = Slow(memory_config(), seconds=0.02, answer=lambda m: m.message_id != "m7")

    async def run() -> Any:
        stop = asyncio.Event()

        async def stop_when_done() -> None:
            while len(listener.finished) < 40:
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.ensure_future(stop_when_done())
        stats = await consume_simple(consumer, listener, stop=stop, max_in_flight=8)
        await stopper
        return stats

    stats = asyncio.run(run())
    assert listener.most <= 8 and max(consumer.asked) <= 8
    assert sorted(consumer.acked) == sorted(m.message_id for m in messages if m.message_id != "m7")
    assert (stats.received, stats.acked, stats.left) == (40, 39, 1)


def test_cancelling_consume_simple_acks_nothing_in_flight() -> None:
    """Cancelled while handlers run: they are cancelled, none is acked, no claim is left."""
    consumer = FakeSimpleConsumer([GrpcMessage(f"m{i}") for i in range(4)])
    config = memory_config()
    listener = Slow(config, seconds=10)

    async def run() -> None:
        task = asyncio.ensure_future(consumer_task())
        while listener.running < 4:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def consumer_task() -> Any:
        return await consume_simple(consumer, listener, max_in_flight=4)

    asyncio.run(run())
    assert consumer.acked == [] and listener.finished == []
    assert config.async_store is not None and len(config.async_store) == 0  # type: ignore[arg-type]


def test_the_push_bridge_blocks_callback_threads_beyond_max_in_flight() -> None:
    """12 client threads call a bridge of max_in_flight=3: never more than 3 messages on the
    loop; every thread gets its own message's answer."""
    loop = LoopThread()
    try:
        listener = Slow(memory_config(), seconds=0.05)
        bridge = PushBridge(listener, loop.loop, max_in_flight=3)
        answers: List[ConsumeStatus] = []
        lock = threading.Lock()

        def deliver(i: int) -> None:
            answer = bridge(GrpcMessage(f"m{i}"))
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers == [SUCCESS] * 12
        assert listener.most <= 3 and len(listener.finished) == 12
    finally:
        loop.stop()


def test_the_push_bridge_answers_later_when_the_loop_is_gone() -> None:
    """A loop that stopped (or was never started): RECONSUME_LATER, never an exception into
    the client's callback."""
    loop = asyncio.new_event_loop()
    bridge = PushBridge(Slow(memory_config()), loop)
    loop.close()
    assert bridge(GrpcMessage("m1")) is LATER
