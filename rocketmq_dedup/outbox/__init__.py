"""Exactly once for what a handler sends: a consumer outbox relayed to RocketMQ.

A :class:`~rocketmq_dedup.TransactionalDedupListener`'s handler publishes through its
transaction: ``outbox.send(conn, topic, body, keys=..., sharding_key=...)`` writes the message as
a row of ``<table>_outbox``, which commits with the handler's writes and the message's dedup
record, or never. An :class:`OutboxRelay` (in the consumer process, or ``rocketmq-dedup relay``
apart) sends the committed rows after the commit, with the classic or the 5.x producer, and marks
each one sent after the broker's acknowledgement. A relay killed between the send and the mark
sends it again with the same message key, so a listener downstream that dedups on that key
(:func:`outbox_message_key`) applies it once: exactly one effect downstream when the downstream
consumer dedups on the key; at least once on the wire.

* :mod:`.message`: the message and its validation, the message key.
* :mod:`.outbox`: :class:`Outbox` (``send``).
* :mod:`.relay`: :class:`OutboxRelay`, and what it does on each fault.
* :mod:`.senders`: the two clients, and what their errors mean.
* the database's side: the port :mod:`rocketmq_dedup.stores.outbox`, what the SQL databases
  share :mod:`rocketmq_dedup.stores.sql_outbox`, on MySQL/MariaDB
  :mod:`rocketmq_dedup.stores.mysql.outbox`, on PostgreSQL
  :mod:`rocketmq_dedup.stores.postgres.outbox`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocketmq_dedup.errors import OutboxMessageError
from rocketmq_dedup.outbox.message import (
    MAX_BODY_BYTES,
    MESSAGE_KEY_PROPERTY,
    OutboxMessage,
    outbox_message_key,
)
from rocketmq_dedup.status import OutboxStatus

if TYPE_CHECKING:  # loaded on first use: the store's port imports .message, and this package
    from rocketmq_dedup.outbox.outbox import Outbox, OutboxReceipt
    from rocketmq_dedup.outbox.relay import OutboxRelay
    from rocketmq_dedup.outbox.senders import FailureKind, Sender, SendFailure

_LAZY = {
    "Outbox": "rocketmq_dedup.outbox.outbox",
    "OutboxReceipt": "rocketmq_dedup.outbox.outbox",
    "OutboxRelay": "rocketmq_dedup.outbox.relay",
    "FailureKind": "rocketmq_dedup.outbox.senders",
    "SendFailure": "rocketmq_dedup.outbox.senders",
    "Sender": "rocketmq_dedup.outbox.senders",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "MAX_BODY_BYTES",
    "MESSAGE_KEY_PROPERTY",
    "FailureKind",
    "Outbox",
    "OutboxMessage",
    "OutboxMessageError",
    "OutboxReceipt",
    "OutboxRelay",
    "OutboxStatus",
    "SendFailure",
    "Sender",
    "outbox_message_key",
]
