"""The rules every strategy applies the same way: what a handler's return value means
(:func:`handler_status`), which dedup keys are accepted (:func:`key_text`), and running a
handler with them (:func:`run_handler`): its answer, or the
:class:`~rocketmq_dedup.errors.PermanentFailure` it raised or returned (:data:`HandlerResult`)."""

from __future__ import annotations

import enum
import inspect
import logging
from typing import Any, Callable, Optional, Union

from rocketmq_dedup.errors import PermanentFailure
from rocketmq_dedup.message import to_text
from rocketmq_dedup.status import ConsumeStatus

logger = logging.getLogger(__name__)

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER

#: Enum members of the clients that mean success or retry, by (enum class name, member name):
#: this library's and the classic client's ConsumeStatus, the 5.x client's ConsumeResult.
_CLIENT_STATUSES = {
    ("ConsumeStatus", "CONSUME_SUCCESS"): SUCCESS,
    ("ConsumeResult", "SUCCESS"): SUCCESS,
    ("ConsumeStatus", "RECONSUME_LATER"): LATER,
    ("ConsumeResult", "FAILURE"): LATER,
}


def handler_status(result: Any) -> Optional[ConsumeStatus]:
    """What a handler's return value means: ``True`` and every client's success value
    (``ConsumeStatus.CONSUME_SUCCESS``, 5.x ``ConsumeResult.SUCCESS``) -> CONSUME_SUCCESS;
    ``False``, ``None`` and every client's retry value -> RECONSUME_LATER; anything else -> None
    (the caller logs an error and retries). No truthiness: ``ConsumeStatus.RECONSUME_LATER``
    is 1, and ``CONSUME_SUCCESS`` is 0."""
    if result is True:
        return SUCCESS
    if result is False or result is None:
        return LATER
    if isinstance(result, enum.Enum):
        return _CLIENT_STATUSES.get((type(result).__name__, result.name))
    return None


def answer(result: Any, commit: bool = False) -> ConsumeStatus:
    """A handler's return value as the answer to the broker; a value of no meaning is logged
    as an error and retried (:func:`handler_status`)."""
    if result is True:  # the common case, before the general rule
        return SUCCESS
    status = handler_status(result)
    if status is None and inspect.isawaitable(result):
        _discard(result)
        logger.error(
            "do_handle_msg returned an awaitable, %r: the listener runs on the client's threads "
            "with no event loop and cannot await it (is do_handle_msg a def that returns a "
            "coroutine?); run it to completion inside (asyncio.run(...)) and return its result; "
            "the message will be consumed later",
            result,
        )
        return LATER
    if status is None:
        ok, retry = ("commit", "roll back") if commit else ("success", "retry")
        logger.error(
            "do_handle_msg returned %r (%s); return True on %s and False to %s (or a "
            "client's ConsumeStatus/ConsumeResult); the message will be consumed later",
            result,
            type(result).__name__,
            ok,
            retry,
        )
        return LATER
    return status


def _discard(awaitable: Any) -> None:
    """Close an awaitable a handler or hook returned, if it is a coroutine: the listener has
    no event loop to run it, and a closed coroutine never runs nor warns that it was never
    awaited. (Another awaitable, e.g. a Future, belongs to its loop and is left alone.)"""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


#: What a handler's run means: its answer, or the permanent failure it declared.
HandlerResult = Union[ConsumeStatus, PermanentFailure]


def run_handler(handler: Callable[[Any], Any], msg: Any) -> HandlerResult:
    """Call the user's handler and map its result (:func:`answer`). A
    :class:`~rocketmq_dedup.errors.PermanentFailure` it raises or returns is given back (the
    strategy records it); another ``Exception`` is logged and means RECONSUME_LATER; anything
    else a handler raises propagates."""
    try:
        result = handler(msg)
    except PermanentFailure as failure:
        return failure
    except Exception:
        logger.exception("do_handle_msg raised; the message will be consumed later")
        return LATER
    if result is True:
        return SUCCESS
    if isinstance(result, PermanentFailure):
        return result
    return answer(result)


def failure_reason(failure: PermanentFailure) -> str:
    """The reason a permanent failure gives (its class name when it gives none)."""
    return failure.reason.strip() or type(failure).__name__


class KeyRefused(TypeError):
    """A dedup key whose text would not identify the message (e.g. ``object()``'s address)."""


_PLAIN_KEY_TYPES = (bool, int, float)


def key_text(raw: Any) -> str:
    """The text a dedup key is stored under.

    ``str`` as it is (any code point); ``bytes`` decoded as UTF-8 with ``surrogateescape`` (so
    ``b"k"`` and ``"k"`` are the same key); ``int``, ``float`` and ``bool`` as ``str()`` gives
    them; tuples and lists of keys as their ``str()``; other objects by their ``str()`` only
    when their class defines ``__str__`` or ``__repr__``. Raises :class:`KeyRefused` for a value
    whose text is its identity (the default ``object`` repr, a memory address that another
    message may reuse) and for sets and dicts (their text order is not stable across
    processes)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return to_text(raw)
    _check_value_based(raw)
    return str(raw)


def _check_value_based(value: Any) -> None:
    if isinstance(value, (str, bytes, bytearray, memoryview, *_PLAIN_KEY_TYPES)):
        return
    if isinstance(value, (tuple, list)):
        for item in value:
            _check_value_based(item)
        return
    if inspect.isawaitable(value):
        _discard(value)
        raise KeyRefused(
            f"a {type(value).__name__} is not a dedup key: dedup_message_key returned an "
            "awaitable, which the listener cannot await (no event loop on the client's "
            "threads); return the key itself"
        )
    if isinstance(value, (set, frozenset, dict)):
        raise KeyRefused(
            f"a {type(value).__name__} is not a dedup key: its text order differs between "
            "processes; return one element, or a sorted tuple of them"
        )
    kind = type(value)
    own_text = any("__str__" in vars(c) or "__repr__" in vars(c) for c in kind.__mro__[:-1])
    if not own_text:
        raise KeyRefused(
            f"a {kind.__module__}.{kind.__qualname__} is not a dedup key: its text is its memory "
            "address, which another message may reuse; return a str, bytes or int, or define "
            "__str__ on the class"
        )
