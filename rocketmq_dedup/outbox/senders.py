"""How a relay sends a row with each client, and what a failed send means.

:func:`sender_for` wraps the producer you give a relay: the classic client's
``rocketmq.client.Producer`` (started, name server set) or the 5.x client's
``rocketmq.Producer`` (started). Each message goes out with its message key as its first key
and as the property :data:`~.message.MESSAGE_KEY_PROPERTY`; a message with a sharding key with
the classic client's ``send_orderly_with_sharding_key`` (the key's queue), or with the 5.x
client's message group (a FIFO topic's, ``+message.type=FIFO``: the 5.x client refuses a message
group on a NORMAL topic, and a message without one on a FIFO topic).

A send that fails raises :class:`SendFailure` with its :class:`FailureKind`, decided from what
each client reports (measured against RocketMQ 5.3 with rocketmq-client-python 0.5.0rc2 and
rocketmq-python-client 5.1.2):

* ``REFUSED``, the message itself: classic "the message body size over max value" (the
  producer's ``max_message_size``, 128 KiB by default); 5.x ``IllegalArgumentException`` (a
  body over 4 MiB, a message group on a NORMAL topic or none on a FIFO one),
  ``BadRequestException`` (a property the broker keeps for itself), ``PayloadTooLarge``,
  ``PayloadEmpty``, ``Forbidden``, ``Unauthorized``.
* ``UNROUTABLE``, no route for the topic: classic "No route info of this topic" (the client
  says this when the topic does not exist, when its broker refused the message, e.g. for
  oversized properties, and while the cluster restarts); 5.x ``NotFoundException`` and "failed
  to fetch topic ... route" (the topic does not exist, or the proxy could not be asked).
* ``OUTAGE``: any other error of the client (connection, timeout, busy, a gRPC error).
* ``UNKNOWN``: an error that is not the client's (a bug).
"""

from __future__ import annotations

import abc
import concurrent.futures
import enum
from typing import Any

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.outbox.message import MESSAGE_KEY_PROPERTY, OutboxMessage


class FailureKind(enum.StrEnum):
    """What a failed send means for its row (module docstring)."""

    REFUSED = "refused"
    """The broker or the client refuses this message for good: parked at once."""
    UNROUTABLE = "unroutable"
    """No route for its topic: retried with backoff; parked once the cluster has proved to be
    up meanwhile (another send succeeded), or after the relay's ``give_up_after_s``."""
    OUTAGE = "outage"
    """The broker could not be reached or answered busy: the row waits (backoff) and the relay
    pauses; never parked."""
    UNKNOWN = "unknown"
    """An error the relay cannot place: retried with backoff, parked after
    ``give_up_after_s``."""


class SendFailure(Exception):
    """A send failed; ``kind`` says what that means, ``reason`` what the client said."""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(f"{kind.value}: {reason}")
        self.kind = kind
        self.reason = reason


class Sender(abc.ABC):
    """Sends one message and waits for the broker's answer."""

    #: Which client, for logs ("classic", "5.x").
    client: str = ""

    @abc.abstractmethod
    def send(self, message: OutboxMessage) -> str:
        """Send ``message``; the broker's message id. Raises :class:`SendFailure`."""


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class ClassicSender(Sender):
    """The classic client's ``Producer`` (``send_sync``, ``send_orderly_with_sharding_key``)."""

    client = "classic"

    def __init__(self, producer: Any) -> None:
        from rocketmq.client import Message

        self.producer = producer
        self._message = Message

    def send(self, message: OutboxMessage) -> str:
        msg = self._message(message.topic)
        msg.set_keys(" ".join(message.keys))
        if message.tag is not None:
            msg.set_tags(message.tag)
        msg.set_body(message.body)
        for name, value in message.properties:
            msg.set_property(name, value)
        msg.set_property(MESSAGE_KEY_PROPERTY, message.message_key)
        try:
            if message.sharding_key is not None:
                result = self.producer.send_orderly_with_sharding_key(msg, message.sharding_key)
            else:
                result = self.producer.send_sync(msg)
        except Exception as exc:
            raise SendFailure(classify_classic(exc), _reason(exc)) from exc
        # any SendResult means the broker stored it (FLUSH_*_TIMEOUT, SLAVE_NOT_AVAILABLE: not
        # yet flushed or replicated, as the Java producer also counts it)
        return str(result.msg_id)


def classify_classic(exc: BaseException) -> FailureKind:
    """What the classic client's exception means (module docstring)."""
    if type(exc).__module__.split(".")[0] != "rocketmq":
        return FailureKind.UNKNOWN
    text = str(exc)
    if "body size over max value" in text:
        return FailureKind.REFUSED
    if "No route info" in text:
        return FailureKind.UNROUTABLE
    return FailureKind.OUTAGE


class GrpcSender(Sender):
    """The 5.x client's ``Producer`` (``send``; a sharding key as the message group)."""

    client = "5.x"

    def __init__(self, producer: Any) -> None:
        from rocketmq import Message

        self.producer = producer
        self._message = Message

    def send(self, message: OutboxMessage) -> str:
        try:
            msg = self._message()
            msg.topic = message.topic
            msg.body = message.body
            for key in message.keys:  # the setter adds to the message's set of keys
                msg.keys = key
            if message.tag is not None:
                msg.tag = message.tag
            for name, value in message.properties:
                msg.add_property(name, value)
            msg.add_property(MESSAGE_KEY_PROPERTY, message.message_key)
            if message.sharding_key is not None:
                msg.message_group = message.sharding_key
            receipt = self.producer.send(msg)
        except Exception as exc:
            raise SendFailure(classify_grpc(exc), _reason(exc)) from exc
        return str(receipt.message_id)


#: The 5.x client's exceptions that refuse the message itself.
_GRPC_REFUSED = frozenset(
    {
        "IllegalArgumentException",
        "BadRequestException",
        "PayloadTooLargeException",
        "PayloadEmptyException",
        "ForbiddenException",
        "UnauthorizedException",
        "PaymentRequiredException",
        "UnsupportedException",
        "RequestHeaderFieldsTooLargeException",
    }
)


def classify_grpc(exc: BaseException) -> FailureKind:
    """What the 5.x client's exception means (module docstring)."""
    name = type(exc).__name__
    module = type(exc).__module__
    if name in _GRPC_REFUSED:
        return FailureKind.REFUSED
    if name == "NotFoundException" or "failed to fetch topic" in str(exc):
        return FailureKind.UNROUTABLE
    if (
        module.startswith(("rocketmq.", "grpc"))
        or isinstance(exc, (TimeoutError, ConnectionError, concurrent.futures.TimeoutError))
        or "route" in str(exc)
    ):
        return FailureKind.OUTAGE
    return FailureKind.UNKNOWN


def sender_for(producer: Any) -> Sender:
    """The :class:`Sender` of ``producer``: a classic ``rocketmq.client.Producer``, a 5.x
    ``rocketmq.Producer``, or a :class:`Sender` already."""
    if isinstance(producer, Sender):
        return producer
    module = type(producer).__module__
    if hasattr(producer, "send_orderly_with_sharding_key") and hasattr(producer, "send_sync"):
        return ClassicSender(producer)
    if module.startswith("rocketmq.v5") and hasattr(producer, "send"):
        return GrpcSender(producer)
    raise DedupConfigError(
        "a relay sends through the classic client's rocketmq.client.Producer or the 5.x "
        f"client's rocketmq.Producer (started); got {type(producer).__module__}."
        f"{type(producer).__qualname__}"
    )


__all__ = [
    "ClassicSender",
    "FailureKind",
    "GrpcSender",
    "SendFailure",
    "Sender",
    "classify_classic",
    "classify_grpc",
    "sender_for",
]
