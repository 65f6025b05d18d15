"""Test your listener without a broker or a server.

* :class:`ClassicMessage` and :class:`GrpcMessage`: messages shaped like those of
  ``rocketmq-client-python`` (classic) and ``rocketmq-python-client`` (5.x), so one test
  covers the listener on either client (``rocketmq_dedup.message`` reads both alike);
* :class:`ManualClock`: a clock the test moves; give it to
  ``MemoryDedupStore(clock=...)`` and a lease or a retention lapses when the test says so;
* :func:`deliver`: delivers one message (once by default, or N times) to a listener, one after
  another or concurrently, and returns a :class:`Delivered` report: what the handler saw and
  what the broker was answered;
* :func:`plant_crashed_claim`: the claim a consumer that crashed in its handler leaves behind
  (CONSUMING, another owner, renewed by nobody), to test what the next delivery gets before
  and after its lease lapses.

The pytest plugin (:mod:`rocketmq_dedup.pytest_plugin`, registered when the package is
installed) gives these as fixtures: ``dedup_clock``, ``dedup_store`` (a memory store on that
clock) and ``make_dedup_listener`` (your listener class on that store, closed after the test).

A test::

    def test_a_redelivered_order_runs_once(make_dedup_listener):
        listener = make_dedup_listener(OrderListener)
        report = deliver(listener, ClassicMessage("m1", keys=b"order-1"), times=2)
        assert report.handler_runs == 1 and report.acked == 2

Lease renewal runs on real time: a listener renews the leases of running handlers from a
thread, every third of a lease of wall-clock time, and ``ManualClock.advance`` does not wake
it. Moving the clock past a lease while a handler is still running (from inside
``do_handle_msg``, or a thread) lapses that claim at once, where in production renewal would
have kept it; test a stalled handler with ``lease_renewal=False`` to say so.

This module imports no optional dependency and starts no thread unless
``deliver(..., concurrently=True)`` asks for it (the listener's own lease renewal starts one
per claim held, ended by ``listener.close()`` or a renewal interval after the last claim).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union

from rocketmq_dedup.listener import BaseDedupListener, DedupConcurrentListener
from rocketmq_dedup.message import UNIQ_KEY_PROPERTY, DedupElement, message_topic_tag
from rocketmq_dedup.owner import new_owner_token
from rocketmq_dedup.status import ConsumeStatus
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.strategy.rules import key_text

__all__ = [
    "ClassicMessage",
    "Delivered",
    "GrpcMessage",
    "ManualClock",
    "deliver",
    "plant_crashed_claim",
]

Text = Union[str, bytes]


class ClassicMessage:
    """A message shaped like the classic client's (``rocketmq-client-python`` 0.5.0rc2
    ``RecvMessage``): ``id``, ``topic``, bytes ``tags``, ``keys`` and ``body``,
    ``reconsume_times`` and ``get_property(name)`` (bytes, ``b""`` when absent).

    :param msg_id: the broker's message id (``id``).
    :param keys: the keys in one value, separated by spaces, as the client returns them
        (``b"order-1 order-2"``).
    :param uniq_key: the ``UNIQ_KEY`` property (the producer's id; the default dedup key).
    :param properties: user properties, as ``get_property`` returns them.

    Values are kept as given: pass bytes, as the classic client does, or ``str`` to see how
    your listener takes it.
    """

    __slots__ = ("_props", "body", "id", "keys", "reconsume_times", "tags", "topic")

    def __init__(
        self,
        msg_id: str,
        topic: str = "TEST-TOPIC",
        tags: Optional[Text] = b"TagA",
        body: Text = b"",
        uniq_key: Optional[str] = None,
        reconsume_times: int = 0,
        keys: Optional[Text] = b"",
        properties: Optional[Mapping[str, Text]] = None,
    ) -> None:
        self.id = msg_id
        self.topic = topic
        self.tags = tags
        self.keys = keys
        self.body = body
        self.reconsume_times = reconsume_times
        self._props: Dict[str, Text] = dict(properties or {})
        if uniq_key:
            self._props[UNIQ_KEY_PROPERTY] = uniq_key.encode()

    def get_property(self, name: str) -> Text:
        """The property ``name``; ``b""`` when the message has none (as librocketmq answers)."""
        return self._props.get(name, b"")

    def __repr__(self) -> str:
        return f"ClassicMessage({self.id!r}, topic={self.topic!r}, keys={self.keys!r})"


class GrpcMessage:
    """A message shaped like the 5.x client's (``rocketmq-python-client`` ``Message``):
    ``message_id``, ``topic``, ``tag`` (None when untagged), ``keys`` as a set, ``body``,
    ``delivery_attempt`` (1 the first time) and a ``properties`` dict."""

    __slots__ = ("body", "delivery_attempt", "keys", "message_id", "properties", "tag", "topic")

    def __init__(
        self,
        message_id: str,
        topic: str = "TEST-TOPIC",
        tag: Optional[str] = "TagA",
        body: bytes = b"",
        keys: Optional[Set[str]] = None,
        delivery_attempt: int = 1,
        properties: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.message_id = message_id
        self.topic = topic
        self.tag = tag
        self.keys: Set[str] = set(keys or ())
        self.body = body
        self.delivery_attempt = delivery_attempt
        self.properties: Dict[str, str] = dict(properties or {})

    def __repr__(self) -> str:
        return f"GrpcMessage({self.message_id!r}, topic={self.topic!r}, keys={self.keys!r})"


class ManualClock:
    """A monotonic clock in seconds that moves only when the test calls :meth:`advance`.

    ``MemoryDedupStore(clock=clock)`` reads its leases and retentions from it: a CONSUMING
    claim lapses after ``clock.advance(lease_ms / 1000)``, a CONSUMED record after
    ``clock.advance(retention_minutes * 60)``. Thread-safe.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward (never back); return the new time."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward: advance({seconds!r})")
        with self._lock:
            self._now += seconds
            return self._now


@dataclass(frozen=True)
class Delivered:
    """What :func:`deliver` saw: the broker's answer to each delivery, in delivery order,
    and the messages the handler was called with, in the order it was called."""

    answers: Tuple[ConsumeStatus, ...]
    """What each delivery was answered (``ConsumeStatus.CONSUME_SUCCESS`` acks it;
    ``ConsumeStatus.RECONSUME_LATER`` sends it back to the broker's retry)."""
    handled: Tuple[Any, ...]
    """The messages ``do_handle_msg`` was called with (its business logic ran)."""

    @property
    def handler_runs(self) -> int:
        """How many times the handler ran."""
        return len(self.handled)

    @property
    def acked(self) -> int:
        """Deliveries answered CONSUME_SUCCESS."""
        return sum(answer is ConsumeStatus.CONSUME_SUCCESS for answer in self.answers)

    @property
    def retried(self) -> int:
        """Deliveries answered RECONSUME_LATER (the broker delivers them again later)."""
        return sum(answer is ConsumeStatus.RECONSUME_LATER for answer in self.answers)


def deliver(
    listener: BaseDedupListener,
    msg: Any,
    times: int = 1,
    *,
    concurrently: bool = False,
    timeout: float = 10.0,
) -> Delivered:
    """Deliver ``msg`` to ``listener`` ``times`` times (once by default), as the broker calls
    the classic consumer's callback (``listener(msg)``), and report what happened.

    ``concurrently=False``: one delivery after the other, as redeliveries arrive.
    ``concurrently=True``: every delivery on its own thread, and the first copy whose handler
    runs is held there until each other copy has been answered: the duplicates arrive while
    their twin is still in its handler, every time (no sleep, no luck). ``timeout`` bounds that
    hold, in seconds; a delivery still running ``2 * timeout`` seconds after the start raises
    ``TimeoutError``.

    The handler is observed through the listener's ``do_handle_msg`` (either listener kind:
    ``do_handle_msg(msg)`` or ``do_handle_msg(msg, conn)``), restored afterwards.
    """
    if times < 1:
        raise ValueError(f"times must be at least 1: {times!r}")
    handler = listener.do_handle_msg
    own = vars(listener).get("do_handle_msg")  # a handler set on the instance, if any
    handled: List[Any] = []
    answers: List[Optional[ConsumeStatus]] = [None] * times
    state = threading.Condition()
    pending = [times]  # deliveries not answered yet
    holding = [concurrently]  # the next handler call is held

    def observed(message: Any, *args: Any) -> Any:
        with state:
            handled.append(message)
            hold, holding[0] = holding[0], False
            if hold:  # until every other copy is answered
                state.wait_for(lambda: pending[0] <= 1, timeout)
        return handler(message, *args)

    def run(index: int) -> None:
        try:
            answers[index] = listener(msg)
        finally:
            with state:
                pending[0] -= 1
                state.notify_all()

    listener.do_handle_msg = observed  # an instance attribute shadows the method
    try:
        if not concurrently:
            for index in range(times):
                run(index)
        else:
            threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(times)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 2 * timeout
            for thread in threads:
                thread.join(max(deadline - time.monotonic(), 0.0))
            if any(thread.is_alive() for thread in threads):
                raise TimeoutError(f"a delivery of {msg!r} still ran after {2 * timeout} s")
    finally:
        if own is None:
            del listener.do_handle_msg
        else:
            listener.do_handle_msg = own
    answered = [answer for answer in answers if answer is not None]
    if len(answered) < times:  # a listener never raises; one that did is not one to test
        raise RuntimeError(f"{times - len(answered)} delivery(ies) of {msg!r} got no answer")
    return Delivered(tuple(answered), tuple(handled))


def plant_crashed_claim(
    listener: DedupConcurrentListener, msg: Any, lease_ms: Optional[int] = None
) -> Claim:
    """Leave the claim a consumer that crashed in the handler of ``msg`` would leave: its key
    CONSUMING under another owner, for ``lease_ms`` (the listener's lease by default), renewed
    by nobody. Until it lapses on the store's clock a delivery of ``msg`` is answered
    RECONSUME_LATER without the handler (another consumer seems to be on it); after
    ``clock.advance(lease_ms / 1000)`` (a :class:`ManualClock` given to
    ``MemoryDedupStore(clock=...)``) the next delivery runs the handler. Returns the planted
    claim (its ``owner`` is the dead consumer's token).

    Raises ``ValueError`` when there is nothing to claim: dedup disabled, or a key of None or
    ``""`` (such a message runs without dedup), or a key that already has a live record; and
    ``TypeError`` for the exactly-once listener, whose crashed consumer leaves no claim (its
    transaction rolls back and the redelivery runs at once).
    """
    if not isinstance(listener, DedupConcurrentListener):
        raise TypeError(
            f"{type(listener).__name__} is not a DedupConcurrentListener: an exactly-once "
            "consumer that crashes leaves no claim (its transaction is rolled back)"
        )
    config = listener.dedup_config
    store = config.persist if config is not None else None
    if config is None or store is None:
        raise ValueError("dedup is disabled on this listener: a crash leaves no claim")
    raw = listener.dedup_message_key(msg)
    key = key_text(raw) if raw is not None else ""
    if not key:
        raise ValueError(f"{msg!r} has no dedup key ({raw!r}): it runs without dedup")
    topic, tag = message_topic_tag(msg)
    claim = Claim(
        DedupElement(config.application_name, topic, tag, key), f"crashed.{new_owner_token()}"
    )
    if not store.claim(claim, config.lease_ms if lease_ms is None else lease_ms).claimed:
        raise ValueError(f"the key {key!r} already has a live record: nothing planted")
    return claim
