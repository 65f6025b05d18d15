"""A message of the outbox: what :meth:`Outbox.send <rocketmq_dedup.outbox.Outbox.send>` writes
and a relay sends, validated once, when it is written.

Every message carries a **message key** fixed when its row is written: the first of the keys the
handler gave, or one generated then (32 hex digits). A relay sends it as the message's (first)
key on every attempt, and as the property :data:`MESSAGE_KEY_PROPERTY`, so a copy sent again after
a relay crash has the same key, and a listener downstream that dedups on it
(``dedup_message_key``: :func:`outbox_message_key`) drops the copy.
The message id (UNIQ_KEY) cannot serve: both clients make a new one at every send (the classic
client overwrites a UNIQ_KEY set before the send, the 5.x client refuses it as a property).

The limits are what the brokers and both clients accept, so that a message the outbox takes is
one a relay can send (the topic, tag, key and property rules of RocketMQ 5 and of the two Python
clients; a body of at most 4 MiB, the broker's default ``maxMessageSize`` and the 5.x client's
limit). What a broker still refuses (a smaller ``maxMessageSize``, the classic client's 128 KiB
default ``max_message_size``, a topic that does not exist) is parked by the relay, with the
reason.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, Iterable, NamedTuple, Optional, Tuple

from rocketmq_dedup.errors import OutboxMessageError
from rocketmq_dedup.message import get_property, message_keys

#: The property a relay sets to the message key (a 5.x consumer gets a message's keys as a set,
#: so with several keys the first one is not known from them).
MESSAGE_KEY_PROPERTY = "OUTBOX_KEY"

#: The largest body :meth:`Outbox.send` takes by default: 4 MiB, the broker's default
#: ``maxMessageSize`` and the 5.x client's limit.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: A topic: what both clients and the broker accept (the 5.x client's pattern, RocketMQ's
#: 127-character limit), without ``%`` (the broker's own retry and dead-letter topics).
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,127}")
MAX_KEY_CHARS = 128
MAX_KEYS = 16
MAX_TAG_CHARS = 128
#: A sharding key becomes the 5.x client's message group, which the proxy limits to 64.
MAX_SHARDING_KEY_CHARS = 64
MAX_PROPERTY_NAME_CHARS = 64
#: The user properties' text, names and values together: well under the broker's 32 KiB for
#: all of a message's properties, its own included.
MAX_PROPERTIES_CHARS = 16 * 1024
#: Property names the broker or a client uses itself (RocketMQ's ``MessageConst``); names
#: starting with ``__`` are refused too.
RESERVED_PROPERTIES = frozenset(
    {
        "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
        "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG",
        "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY",
        "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID",
        "CORRELATION_ID", "REPLY_TO_CLIENT", "REPLY_TO", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME",
        "CLUSTER", "MSG_TYPE", "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET",
        "TRACE_CONTEXT", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_OUT_MS", "BORNHOST",
        "BORNTIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", MESSAGE_KEY_PROPERTY,
    }
)  # fmt: skip
_FORBIDDEN_IN_TEXT = re.compile(r"[\x00-\x1f\x7f]")  # control characters (a NUL cuts C strings)
_WHITESPACE = re.compile(r"\s")


class OutboxMessage(NamedTuple):
    """One message of the outbox, as written and as sent."""

    topic: str
    body: bytes
    message_key: str
    """Sent as the message's first key on every attempt (the user's first key, or generated)."""
    other_keys: Tuple[str, ...] = ()
    """The further keys given, sent after the message key."""
    tag: Optional[str] = None
    properties: Tuple[Tuple[str, str], ...] = ()
    """User properties, in the order given."""
    sharding_key: Optional[str] = None
    """Messages of one sharding key are sent in commit order, to one queue (classic
    ``send_orderly_with_sharding_key``; 5.x: the message group, on a FIFO topic)."""

    @property
    def keys(self) -> Tuple[str, ...]:
        """Every key, the message key first."""
        return (self.message_key, *self.other_keys)

    def properties_json(self) -> Optional[str]:
        """The properties as stored (a JSON object), None when there are none."""
        return json.dumps(dict(self.properties), ensure_ascii=False) if self.properties else None


def new_message_key() -> str:
    """A generated message key: 32 hex digits, unique."""
    return uuid.uuid4().hex


def make_message(
    topic: Any,
    body: Any,
    keys: Any = None,
    tag: Any = None,
    properties: Any = None,
    sharding_key: Any = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> OutboxMessage:
    """The validated message; raises :class:`OutboxMessageError` naming what is wrong.

    :param body: bytes (or a bytearray/memoryview), or str (sent as UTF-8); not empty.
    :param keys: a key or an iterable of keys (the first is the message key); None: a message
        key is generated.
    """
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        raise OutboxMessageError(
            f"topic {topic!r}: 1 to 127 letters, digits, '_' or '-' (what RocketMQ accepts)"
        )
    data = _body(body, max_body_bytes)
    all_keys = _keys(keys)
    return OutboxMessage(
        topic=topic,
        body=data,
        message_key=all_keys[0] if all_keys else new_message_key(),
        other_keys=all_keys[1:],
        tag=None if tag is None else _tag(tag),
        properties=_properties(properties),
        sharding_key=None if sharding_key is None else _sharding_key(sharding_key),
    )


def _body(body: Any, limit: int) -> bytes:
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body)
    else:
        raise OutboxMessageError(f"body must be bytes or str, not {type(body).__name__}")
    if not data:
        raise OutboxMessageError("body is empty (the brokers refuse an empty body)")
    if len(data) > limit:
        raise OutboxMessageError(f"body is {len(data):,} bytes; at most {limit:,} are taken")
    return data


def _text(what: str, value: Any, limit: int, spaces: bool = False) -> str:
    """A text field: a str, not blank, no control characters (nor whitespace unless
    ``spaces``), at most ``limit`` characters."""
    if not isinstance(value, str):
        raise OutboxMessageError(f"{what} must be a str, not {type(value).__name__}")
    if not value.strip():
        raise OutboxMessageError(f"{what} is blank")
    if len(value) > limit:
        raise OutboxMessageError(f"{what} {value[:40]!r}... is longer than {limit} characters")
    if _FORBIDDEN_IN_TEXT.search(value) or (not spaces and _WHITESPACE.search(value)):
        allowed = "control characters" if spaces else "whitespace or control characters"
        raise OutboxMessageError(f"{what} {value!r} contains {allowed}")
    return value


def _keys(keys: Any) -> Tuple[str, ...]:
    if keys is None:
        return ()
    items: Iterable[Any] = (keys,) if isinstance(keys, (str, bytes)) else keys
    try:
        listed = list(items)
    except TypeError:
        raise OutboxMessageError(
            f"keys must be a str or an iterable of str, not {type(keys).__name__}"
        ) from None
    # (whitespace is refused: the classic client sends keys as one space-separated text)
    found = [_text("a key", key, MAX_KEY_CHARS) for key in listed]
    if len(found) > MAX_KEYS:
        raise OutboxMessageError(f"{len(found)} keys; at most {MAX_KEYS}")
    if len(set(found)) != len(found):
        raise OutboxMessageError(f"keys {found!r} repeat one")
    return tuple(found)


def _tag(tag: Any) -> str:
    value = _text("tag", tag, MAX_TAG_CHARS)
    if "|" in value:
        raise OutboxMessageError(f"tag {value!r} contains '|' (a tag expression's separator)")
    return value


def _sharding_key(sharding_key: Any) -> str:
    return _text("sharding_key", sharding_key, MAX_SHARDING_KEY_CHARS, spaces=True)


def _properties(properties: Any) -> Tuple[Tuple[str, str], ...]:
    if properties is None:
        return ()
    if not isinstance(properties, dict):
        raise OutboxMessageError(
            f"properties must be a dict of str to str, not {type(properties).__name__}"
        )
    pairs = []
    size = 0
    for name, value in properties.items():
        name = _text("a property name", name, MAX_PROPERTY_NAME_CHARS)
        if name.upper() in RESERVED_PROPERTIES or name.startswith("__"):
            raise OutboxMessageError(f"property {name!r} is one the broker or a client sets")
        value = _text(f"property {name!r}", value, MAX_PROPERTIES_CHARS, spaces=True)
        size += len(name) + len(value)
        pairs.append((name, value))
    if size > MAX_PROPERTIES_CHARS:
        raise OutboxMessageError(
            f"the properties take {size:,} characters; at most {MAX_PROPERTIES_CHARS:,}"
        )
    return tuple(pairs)


def properties_from_json(text: Any) -> Tuple[Tuple[str, str], ...]:
    """The stored properties (:meth:`OutboxMessage.properties_json`), back as pairs."""
    if not text:
        return ()
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    loaded: Dict[str, str] = json.loads(text)
    return tuple(loaded.items())


def outbox_message_key(msg: Any) -> Optional[str]:
    """The message key a relay sent ``msg`` with (a message of either client, received
    downstream): its :data:`MESSAGE_KEY_PROPERTY`, else its first key; None for a message no
    relay sent. Use it as ``dedup_message_key`` of the listener that consumes what an outbox
    sent, so a copy sent again after a relay crash is dropped. (With one key per message,
    ``message_keys(msg)[0]`` is the same key.)"""
    key = get_property(msg, MESSAGE_KEY_PROPERTY)
    if key:
        return key
    keys = message_keys(msg)
    return keys[0] if keys else None


__all__ = [
    "MAX_BODY_BYTES",
    "MESSAGE_KEY_PROPERTY",
    "OutboxMessage",
    "make_message",
    "new_message_key",
    "outbox_message_key",
    "properties_from_json",
]
