"""The listener's methods a strategy calls, wired one way: a :class:`Hooks` value built once,
when the listener is made, and handed to its strategy."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from rocketmq_dedup.status import DedupStatus

#: ``dedup_message_key(msg)``: the key (None: no dedup for this message).
KeyOf = Callable[[Any], Any]
#: ``on_duplicate(msg, status)``.
OnDuplicate = Callable[[Any, DedupStatus], None]


class Hooks(NamedTuple):
    """The listener's methods: the handler looked up on the listener at each message (a
    handler set on the instance, a test's mock say, is the one called), the others bound when
    the listener is made (overridden in its class). An optional hook the listener does not
    override is None: the strategy then skips its work entirely."""

    listener: Any
    """The listener: ``listener.do_handle_msg`` is the handler."""
    key_of: KeyOf
    """``dedup_message_key``."""
    on_duplicate: Optional[OnDuplicate] = None
    """``on_duplicate``, if overridden."""
    payload_of: Optional[Callable[[Any], Any]] = None
    """``payload_fingerprint``, if overridden: what identifies a message's payload."""
    sequence_of: Optional[Callable[[Any], Any]] = None
    """``sequence_key`` of the exactly-once listener, if overridden: ``(entity, seq)``."""
