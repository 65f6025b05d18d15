"""Enumerations shared by the listener, the strategy and the stores."""

from __future__ import annotations

import enum


class ConsumeStatus(enum.IntEnum):
    """What a listener answers the broker; values equal rocketmq-client-python's."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


class DedupStatus(enum.StrEnum):
    """The state of a dedup record in a store."""

    CONSUMING = "CONSUMING"
    """A consumer holds a lease on the message and is running its handler."""
    CONSUMED = "CONSUMED"
    """The handler succeeded; duplicates are acknowledged without running it."""


class StoreFailurePolicy(enum.StrEnum):
    """What to do with a message when the store cannot be reached to claim it."""

    CONSUME = "consume"
    """Run the handler without dedup (at-least-once; a warning is logged). The default."""
    RECONSUME_LATER = "reconsume_later"
    """Answer RECONSUME_LATER and leave the message to the broker's retry."""
