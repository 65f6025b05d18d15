"""Where the event loop meets each RocketMQ client's threads.

* **The classic push client** (``rocketmq-client-python``) calls its listener from librocketmq's
  native threads and acks when the callback returns. :class:`PushBridge` is that callback for
  an asyncio listener: each call hands its message to a running event loop
  (``run_coroutine_threadsafe``) and blocks its native thread until the message's answer (never
  acking early); at most ``max_in_flight`` messages are on the loop at once, and a callback
  thread beyond that waits for a slot before handing its message over (the loop's
  back-pressure reaches the client, whose threads stop taking messages). It never raises into
  the ctypes callback (an exception there acks the message): a loop that is gone, a cancelled
  message or anything unexpected answers RECONSUME_LATER.
* **The 5.x PushConsumer** calls its ``MessageListener`` from its own thread pool:
  :func:`message_listener` is the same bridge behind that interface.
* **The 5.x SimpleConsumer**: :func:`consume_simple` runs on the loop itself, over the client's
  ``receive_async`` future (long polling runs in the client's threads, the loop awaits it) and
  ``ack_async``: each message is its own task, at most ``max_in_flight`` at once (a receive asks
  for no more than the free slots), acked only after the listener answered CONSUME_SUCCESS.
  Cancelling it cancels the messages in flight: their handlers stop, nothing of them is acked,
  and the broker redelivers them after their invisible duration (their claims released).

Nothing here blocks the loop: the clients' threads wait for it, never the reverse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from typing import Any, NamedTuple, Optional, Set

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.adapters.classic import callback_thread, first_call_on_thread
from rocketmq_dedup.aio.listener import AsyncDedupConcurrentListener
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.status import ConsumeStatus
from rocketmq_dedup.stores.aio import running_loop

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)

LATER = ConsumeStatus.RECONSUME_LATER
SUCCESS = ConsumeStatus.CONSUME_SUCCESS

#: Messages on the loop at once, by default (each a task awaiting its handler).
DEFAULT_MAX_IN_FLIGHT = 64
#: How often a callback thread waiting for its answer checks that the loop still runs (s).
LOOP_CHECK_S = 1.0


def _check_max_in_flight(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= 100_000:
        raise DedupConfigError(f"max_in_flight must be an int from 1 to 100000; got {value!r}")
    return value


class PushBridge:
    """A push client's callback (a thread of the client's) for an asyncio listener on
    ``loop`` (module docstring). ``bridge(msg)`` returns the listener's
    :class:`ConsumeStatus`; ``max_in_flight`` bounds the messages on the loop at once."""

    def __init__(
        self,
        listener: AsyncDedupConcurrentListener,
        loop: asyncio.AbstractEventLoop,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if not isinstance(listener, AsyncDedupConcurrentListener):
            raise DedupConfigError(
                f"PushBridge needs an AsyncDedupConcurrentListener; got {type(listener).__name__}"
            )
        self.listener = listener
        self.loop = loop
        self.max_in_flight = _check_max_in_flight(max_in_flight)
        self._slots = threading.BoundedSemaphore(self.max_in_flight)

    def __call__(self, msg: Any) -> ConsumeStatus:
        """Consume ``msg`` on the loop and wait for its answer; never raises."""
        if not callback_thread.seen:  # a native thread's first call (see adapters.classic)
            first_call_on_thread()
        try:
            return self._consume(msg)
        except BaseException as exc:  # never into a ctypes callback (it would ack)
            _log.log(
                logging.ERROR,
                "the asyncio listener could not answer (%s: %s); the message will be consumed "
                "later",
                type(exc).__name__,
                exc,
            )
            return LATER

    consume = __call__

    def _consume(self, msg: Any) -> ConsumeStatus:
        loop = self.loop
        if running_loop() is loop:
            raise RuntimeError("a PushBridge was called on its own event loop's thread")
        self._slots.acquire()  # back-pressure: the client's thread waits for a slot
        try:
            consuming = self.listener(msg)
            try:
                answer = asyncio.run_coroutine_threadsafe(consuming, loop)
            except BaseException:  # the loop is closed: the message never started
                consuming.close()
                raise
            return _wait_for(answer, loop)
        finally:
            self._slots.release()


def _wait_for(answer: concurrent.futures.Future[ConsumeStatus], loop: Any) -> ConsumeStatus:
    """The answer of a message handed to ``loop``; RECONSUME_LATER if the loop stops first
    (its message is cancelled there, never acked)."""
    while True:
        try:
            return answer.result(timeout=LOOP_CHECK_S)
        except concurrent.futures.TimeoutError:
            if loop.is_closed() or not loop.is_running():
                answer.cancel()
                raise RuntimeError(
                    "the event loop stopped before the message was answered"
                ) from None
        except concurrent.futures.CancelledError:
            return LATER


def message_listener(
    listener: AsyncDedupConcurrentListener,
    loop: asyncio.AbstractEventLoop,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> Any:
    """A 5.x ``rocketmq.MessageListener`` (for its ``PushConsumer``) that consumes through an
    asyncio listener on ``loop`` (:class:`PushBridge`): CONSUME_SUCCESS -> SUCCESS, else
    FAILURE."""
    from rocketmq_dedup.adapters.grpc import _client_module

    rocketmq = _client_module()
    bridge = PushBridge(listener, loop, max_in_flight)

    class AsyncDedupMessageListener(rocketmq.MessageListener):  # type: ignore[misc,name-defined]
        """Consumes 5.x messages through an asyncio dedup listener."""

        def __init__(self) -> None:
            self.bridge = bridge

        def consume(self, message: Any) -> Any:
            if bridge(message) is SUCCESS:
                return rocketmq.ConsumeResult.SUCCESS
            return rocketmq.ConsumeResult.FAILURE

    return AsyncDedupMessageListener()


class SimpleStats(NamedTuple):
    """What a :func:`consume_simple` run did."""

    received: int
    acked: int
    """Answered CONSUME_SUCCESS (handled, or a duplicate of a consumed message) and acked."""
    left: int
    """Not acked (retried later, or cancelled): visible again after the invisible duration."""


async def consume_simple(
    consumer: Any,
    listener: AsyncDedupConcurrentListener,
    *,
    stop: Optional[asyncio.Event] = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    max_message_num: int = 16,
    invisible_duration: int = 30,
    receive_error_pause: float = 1.0,
) -> SimpleStats:
    """Consume from a started 5.x ``SimpleConsumer`` until ``stop`` is set (then the messages
    in flight finish and are acked) or the task is cancelled (then they are cancelled, none
    acked): each message is a task awaiting ``listener`` and, on CONSUME_SUCCESS,
    ``ack_async``; at most ``max_in_flight`` at once, a receive asking for no more than the
    free slots. A receive that fails (the proxy not ready, a network error) is logged and tried
    again after ``receive_error_pause`` seconds. ``invisible_duration`` must outlast a handler
    (the proxy's minimum is 10 s). Returns what it received, acked and left."""
    _check_max_in_flight(max_in_flight)
    from rocketmq_dedup.adapters.clients import check_one_client

    check_one_client()
    stop = stop if stop is not None else asyncio.Event()
    in_flight: Set[asyncio.Task[None]] = set()
    counts = [0, 0]  # received, acked

    async def handle(message: Any) -> None:
        if await listener(message) is SUCCESS and await _ack(consumer, message):
            counts[1] += 1

    try:
        while not stop.is_set():
            free = max_in_flight - len(in_flight)
            if free <= 0:  # back-pressure: no receive until a message is done
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            messages = await _receive(
                consumer, min(max_message_num, free), invisible_duration, stop, receive_error_pause
            )
            counts[0] += len(messages)
            for message in messages:
                task = asyncio.ensure_future(handle(message))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        if in_flight:  # stopping: the messages in flight finish (and are acked)
            await asyncio.wait(set(in_flight))
    except asyncio.CancelledError:  # cancelled: so are they, none acked
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.wait(set(in_flight))
        raise
    return SimpleStats(counts[0], counts[1], counts[0] - counts[1])


async def _receive(
    consumer: Any, count: int, invisible_duration: int, stop: asyncio.Event, pause: float
) -> Any:
    """One ``receive_async`` (long polling in the client's threads), awaited; [] after a failed
    one (logged, then a pause that ``stop`` ends early)."""
    try:
        return await asyncio.wrap_future(consumer.receive_async(count, invisible_duration))
    except Exception as exc:  # e.g. the proxy has not synced this consumer's settings yet
        _log.log(logging.WARNING, "receive failed, retrying in %.1f s: %s", pause, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)
        return []


async def _ack(consumer: Any, message: Any) -> bool:
    """``ack_async``, awaited when the client returns its future (rocketmq-python-client
    5.1.2's returns None: it sends the ack and reports a failure itself). A failed ack is
    logged: the message is redelivered and acked then as a duplicate."""
    try:
        future = consumer.ack_async(message)
        if isinstance(future, concurrent.futures.Future):
            await asyncio.wrap_future(future)
    except Exception:
        _log.log(logging.WARNING, "ack failed; the message will be redelivered", exc_info=True)
        return False
    return True


__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "PushBridge",
    "SimpleStats",
    "consume_simple",
    "message_listener",
]
