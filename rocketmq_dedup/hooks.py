"""The listener's methods a strategy calls, wired one way: a :class:`Hooks` value built once,
when the listener is made, and handed to its strategy."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from rocketmq_dedup.status import DedupStatus

#: ``dedup_message_key(msg)``: the key (None: no dedup for this message).
KeyOf = Callable[[Any], Any]
#: ``do_handle_msg(msg)``, or ``do_handle_msg(msg, conn)`` in the exactly-once mode.
Handle = Callable[..., Any]
#: ``on_duplicate(msg, status)``.
OnDuplicate = Callable[[Any, DedupStatus], None]


class Hooks(NamedTuple):
    """The listener's methods, bound when it is made (so the listener class, not the
    instance, is where they are overridden). An optional hook the listener does not override
    is None: the strategy then skips its work entirely."""

    key_of: KeyOf
    """``dedup_message_key``."""
    handle: Handle
    """``do_handle_msg``."""
    on_duplicate: Optional[OnDuplicate] = None
    """``on_duplicate``, if overridden."""
    payload_of: Optional[Callable[[Any], Any]] = None
    """``payload_fingerprint``, if overridden: what identifies a message's payload."""
    sequence_of: Optional[Callable[[Any], Any]] = None
    """``sequence_key`` of the exactly-once listener, if overridden: ``(entity, seq)``."""
