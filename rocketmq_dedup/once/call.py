"""A deduplicated call as the strategies see it: a "message" (:class:`Call`) whose element is
(application, topic, tag, key), so a call goes through the listener's own steps and stores.

A call's key follows the listener's rules (:func:`~rocketmq_dedup.strategy.rules.key_text`): a
str, bytes or int (a float, bool, tuple, or an object with its own ``__str__``); None or ``""``
runs the call without dedup (``""`` with a warning); a refused key raises
:class:`~rocketmq_dedup.errors.DedupKeyError` before anything is claimed. Its payload (for the
payload check) is bytes or str.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Optional, Tuple

from rocketmq_dedup.errors import DedupKeyError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.strategy.rules import KeyRefused, key_text

#: The topic of ``config.once(key)`` when none is given (a step inside a handler): give each
#: kind of step keys of its own (``f"{order_id}:charge"``), or a topic of its own.
DEFAULT_ONCE_TOPIC = "once"


def checked_key(raw: Any) -> Optional[str]:
    """A call's key as the stores keep it (:func:`key_text`); None stays None (no dedup)."""
    if raw is None or type(raw) is str:
        return raw
    try:
        return key_text(raw)
    except KeyRefused as exc:
        raise DedupKeyError(f"dedup key refused: {exc}") from exc


def checked_payload(payload: Any) -> Any:
    """A call's payload for the payload check: bytes (or a bytes-like value), str or None."""
    if payload is None or isinstance(payload, (bytes, bytearray, memoryview, str)):
        return payload
    raise TypeError(
        f"a deduplicated call's payload must be bytes or str (what identifies its data, e.g. "
        f"json.dumps(order, sort_keys=True)); got {type(payload).__qualname__}"
    )


class Call:
    """One deduplicated call: its element's fields (``topic``, ``tag``, ``key``), its payload,
    and, for a function the library runs (:func:`~rocketmq_dedup.exactly_once`), the function
    with its arguments and, once run, what it returned or raised."""

    __slots__ = ("args", "error", "fn", "id", "key", "kwargs", "payload", "tag", "topic", "value")

    def __init__(self, key: Any, topic: str, tag: str = "", payload: Any = None) -> None:
        self.key = checked_key(key)
        self.id = self.key  # what message_id() reads (traces)
        self.topic = topic
        self.tag = tag
        self.payload = checked_payload(payload)
        self.fn: Optional[Callable[..., Any]] = None
        self.args: Tuple[Any, ...] = ()
        self.kwargs: Dict[str, Any] = {}
        self.value: Any = None
        self.error: Optional[Exception] = None

    def bind(self, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Call:
        """The function the library runs for this call, with its arguments."""
        self.fn, self.args, self.kwargs = fn, args, kwargs
        return self

    def __repr__(self) -> str:
        return f"Call(topic={self.topic!r}, tag={self.tag!r}, key={self.key!r})"


class CallRunner:
    """The "listener" of a call's strategy: its ``do_handle_msg(call, conn)`` runs the bound
    function with the transaction's connection first (:func:`~rocketmq_dedup.exactly_once`).
    What the function returns is kept on the call, and the transaction commits; an exception is
    kept on the call, and the transaction rolls back (False, which the strategy answers without
    logging: the caller gets the exception). Anything else it raises (KeyboardInterrupt,
    CancelledError) propagates through the strategy, which rolls back."""

    @staticmethod
    def do_handle_msg(call: Call, conn: Any) -> bool:
        assert call.fn is not None
        try:
            call.value = call.fn(conn, *call.args, **call.kwargs)
        except Exception as exc:
            call.error = exc
            return False
        call.error = None
        return True


class AsyncCallRunner:
    """:class:`CallRunner` for an ``async def``: the function is awaited on the event loop."""

    @staticmethod
    async def do_handle_msg(call: Call, conn: Any) -> bool:
        assert call.fn is not None
        try:
            call.value = await call.fn(conn, *call.args, **call.kwargs)
        except Exception as exc:
            call.error = exc
            return False
        call.error = None
        return True


#: The hooks of every call: the key and payload are the call's own (checked when it is made).
CALL_HOOKS = Hooks(
    listener=CallRunner(),
    key_of=operator.attrgetter("key"),
    payload_of=operator.attrgetter("payload"),
)
#: The hooks of an ``async def`` call (:class:`AsyncCallRunner`).
ASYNC_CALL_HOOKS = CALL_HOOKS._replace(listener=AsyncCallRunner())
