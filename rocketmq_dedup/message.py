"""Duck-typed access to the messages of both RocketMQ Python clients, and the dedup element.

Supported message shapes:

* classic ``rocketmq-client-python`` (0.5.0rc2 ``RecvMessage``, 2.x ``ReceivedMessage``):
  ``topic``, ``tags``, ``keys`` (one string, keys separated by spaces), ``id``, ``body``,
  ``reconsume_times``, ``get_property(name)``; values may be ``str`` or ``bytes`` (``b''`` when
  a property is missing).
* 5.x ``rocketmq-python-client`` (``Message``): ``topic``, ``tag``, ``keys`` (a set),
  ``message_id``, ``body``, ``delivery_attempt``, ``properties`` (a dict).

One view of both, so one listener serves either client unchanged:

* :func:`message_topic`: the topic (``str``);
* :func:`message_tag`: the tag, ``""`` when none;
* :func:`message_keys`: the keys, a ``List[str]`` (classic: split on spaces; 5.x: sorted);
* :func:`message_id`: the unique id, ``UNIQ_KEY`` else the client's message id;
* :func:`message_body`: the body as ``bytes`` (``b""`` when none);
* :func:`message_properties`: the user properties, ``Dict[str, str]``;
* :func:`get_property`: one property, ``None`` when absent;
* :func:`reconsume_times`: how many times the broker redelivered it (0 the first time).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

UNIQ_KEY_PROPERTY = "UNIQ_KEY"
#: What separates the keys of a classic message (RocketMQ's ``MessageConst.KEY_SEPARATOR``).
KEY_SEPARATOR = " "

Text = Union[str, bytes]


def to_text(value: object) -> str:
    """Return ``value`` as ``str``; bytes are decoded as UTF-8 with ``surrogateescape``.

    The mapping is injective: distinct byte strings stay distinct.
    """
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if kind is bytes:
        return value.decode("utf-8", "surrogateescape")  # type: ignore[attr-defined,no-any-return]
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def get_property(msg: Any, name: str) -> Optional[str]:
    """Return the user property ``name`` of a message of either client, or None when absent."""
    getter = getattr(msg, "get_property", None)
    if callable(getter):
        value = getter(name)
    else:
        props = getattr(msg, "properties", None)
        value = props.get(name) if isinstance(props, dict) else None
    text = to_text(value)
    return text or None


def message_topic(msg: Any) -> str:
    """The topic of a message of either client."""
    return to_text(getattr(msg, "topic", ""))


def message_tag(msg: Any) -> str:
    """The tag of a message (``tags`` in the classic client, ``tag`` in 5.x); "" when none."""
    tag = getattr(msg, "tags", None)
    if tag is None:
        tag = getattr(msg, "tag", None)
    return to_text(tag)


def message_topic_tag(msg: Any) -> Tuple[str, str]:
    """:func:`message_topic` and :func:`message_tag` in one call (every message's element)."""
    topic = getattr(msg, "topic", "")
    tag = getattr(msg, "tags", None)
    if tag is None:
        tag = getattr(msg, "tag", None)
    return (
        topic if type(topic) is str else to_text(topic),
        tag.decode("utf-8", "surrogateescape") if type(tag) is bytes else to_text(tag),
    )


def message_id(msg: Any) -> Optional[str]:
    """The unique id: the ``UNIQ_KEY`` property, else ``message_id`` (5.x), else ``id``."""
    getter = getattr(msg, "get_property", None)
    if callable(getter):  # the classic clients (get_property inlined: every message's key)
        value = getter(UNIQ_KEY_PROPERTY)
        if type(value) is bytes:  # to_text, inlined for the classic client's bytes
            uniq: Optional[str] = value.decode("utf-8", "surrogateescape")
        else:
            uniq = to_text(value) if value is not None else None
    else:
        uniq = get_property(msg, UNIQ_KEY_PROPERTY)
    if uniq:
        return uniq
    for attr in ("message_id", "id", "msg_id"):
        value = getattr(msg, attr, None)
        if value:
            return to_text(value)
    return None


def message_keys(msg: Any) -> List[str]:
    """The keys of a message of either client, as a list of non-empty ``str``.

    Classic client: ``keys`` is one string (``str`` or ``bytes``) holding the keys separated by
    spaces, as RocketMQ stores them (``Message.set_keys("a b")`` sets two keys); they are
    returned in that order. 5.x client: ``keys`` is a set; they are returned sorted, so the
    first key is the same on every delivery. ``[]`` when the message has no key.
    """
    keys = getattr(msg, "keys", None)
    if keys is None:
        return []
    if isinstance(keys, (set, frozenset)):
        return sorted(text for text in map(to_text, keys) if text)
    if isinstance(keys, (list, tuple)):
        return [text for text in map(to_text, keys) if text]
    return [key for key in to_text(keys).split(KEY_SEPARATOR) if key]


def message_body(msg: Any) -> bytes:
    """The body of a message of either client as ``bytes`` (``b""`` when it has none); a
    ``str`` body is encoded as UTF-8 (see :func:`encode_text`)."""
    body = getattr(msg, "body", None)
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    return encode_text(to_text(body))


def message_properties(msg: Any, names: Iterable[str] = ()) -> Dict[str, str]:
    """The user properties of a message of either client, as ``{name: value}`` text.

    5.x: every user property (only those in ``names`` when it is given). The classic clients
    cannot list a message's properties (librocketmq reads them one name at a time), so there
    the result holds the properties in ``names`` that the message has, and is ``{}`` without
    ``names``. Absent and empty properties are left out on both clients.
    """
    wanted = list(names)
    props = getattr(msg, "properties", None)
    if isinstance(props, Mapping):
        found = {to_text(name): to_text(value) for name, value in props.items()}
        if wanted:
            found = {name: found[name] for name in wanted if name in found}
        return {name: value for name, value in found.items() if value}
    result: Dict[str, str] = {}
    for name in wanted:
        value = get_property(msg, name)
        if value is not None:
            result[name] = value
    return result


def reconsume_times(msg: Any) -> int:
    """How many times the broker redelivered the message (0 on the first delivery)."""
    times = getattr(msg, "reconsume_times", None)
    if times is not None:
        return int(times)
    attempt = getattr(msg, "delivery_attempt", None)
    return max(int(attempt) - 1, 0) if attempt is not None else 0


def encode_text(text: str) -> bytes:
    """``text`` as bytes, for record keys and digests: UTF-8, any code point included.

    Bytes keys reach this as ``surrogateescape`` text (see :func:`to_text`) and come back as
    the same bytes. A lone surrogate outside that range (e.g. from ``json.loads`` of a broken
    ``"\\ud83d"``) is written as its 3-byte sequence (``surrogatepass``). The mapping is
    injective on text, so distinct keys never share a record.
    """
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


class DedupElement(NamedTuple):
    """What identifies a message for dedup: (application, topic, tag, key).

    Two messages are duplicates exactly when all four fields are equal (case-sensitive).
    """

    application: str
    topic: str
    tag: str
    key: str

    def digest(self) -> bytes:
        """SHA-256 over the length-prefixed UTF-8 fields: 32 bytes, collision-free in practice."""
        return fields_digest(self)


def fields_digest(fields: Iterable[str]) -> bytes:
    """SHA-256 over the length-prefixed UTF-8 ``fields`` (:func:`encode_text`): a record's key
    (:meth:`DedupElement.digest`), an entity's in the sequence table."""
    parts = []
    for field in fields:
        data = encode_text(field)
        parts.append(len(data).to_bytes(8, "big"))
        parts.append(data)
    return hashlib.sha256(b"".join(parts)).digest()


#: Elements longer than this (all fields, in characters) are never cached: the caches hold
#: at most 256 of them, so they stay under a few hundred KiB whatever the keys are.
CACHEABLE_ELEMENT_CHARS = 1024


@functools.lru_cache(maxsize=256)
def _cached_digest(element: DedupElement) -> bytes:
    return element.digest()


def element_digest(element: DedupElement) -> bytes:
    """``element.digest()``, cached for small elements: a message's claim and its mark need the
    same digest."""
    if sum(map(len, element)) > CACHEABLE_ELEMENT_CHARS:
        return element.digest()
    return _cached_digest(element)


_ESCAPES = {ord("%"): "%25", ord(":"): "%3A", ord("{"): "%7B", ord("}"): "%7D"}


def escape_segment(text: str) -> str:
    """Percent-escape ``%``, ``:`` and braces so ``:``-joined segments never collide.

    Braces are escaped too, so a key never forms an accidental Redis Cluster hash tag.
    """
    if "%" in text or ":" in text or "{" in text or "}" in text:
        return text.translate(_ESCAPES)
    return text
