"""Dead letters: the messages RocketMQ moved to a consumer group's dead-letter queue
(``%DLQ%<group>``) after its last retry, with the dedup record their key has, and their resend
to the topic they came from. What ``rocketmq-dedup dlq`` shows and does.

* Reading (:func:`read_dead_letters`): a browse of every queue of ``%DLQ%<group>`` through the
  remoting protocol (:mod:`rocketmq_dedup.remoting`: why not a client), which consumes nothing.
  The topic exists from the group's first dead letter on; RocketMQ 5 creates it readable
  (perm 6), older brokers write-only (perm 2), which is reported with the command that fixes it.
* Where a dead letter came from (:func:`origin_topic`): the broker keeps no field for it. It
  is the ``DLQ_ORIGIN_TOPIC`` property on brokers that write it; else ``RETRY_TOPIC``, which
  holds the original topic when a classic consumer's send-back moved the message, and
  ``%RETRY%<group>+<topic>`` when a 5.x consumer's retries did (RocketMQ 5.x with
  ``enableRetryTopicV2``); else unknown, and a resend needs the topic named.
* The record (:func:`element_of`): looked up by the element the listener would use: the
  application name, the original topic, the tag, and the key by a :class:`KeyRule` (the tool
  cannot run the user's ``dedup_message_key``): the message id (``UNIQ_KEY``, the default
  key), the first of the message's keys, or a user property.
* Resending (:func:`resend_properties`): the same body and properties (``UNIQ_KEY``, ``KEYS``,
  ``TAGS`` and the user's), without those the broker added on the way (retry, pop, delay and
  timer bookkeeping: :data:`BROKER_PROPERTIES`). The same ``UNIQ_KEY`` means the same dedup
  key: a CONSUMED record answers the resent copy as a duplicate unless it is released first.
"""

from __future__ import annotations

import enum
from typing import Dict, List, NamedTuple, Optional

from rocketmq_dedup.errors import BrokerError
from rocketmq_dedup.message import UNIQ_KEY_PROPERTY, DedupElement, message_keys
from rocketmq_dedup.remoting import PERM_READ, RemotingClient, Route, StoredMessage

DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
RETRY_TOPIC = "RETRY_TOPIC"

#: Properties the broker adds to a message on its way to the DLQ (retries, pops, delay and
#: timer bookkeeping, tracing, the region): not the producer's, so not resent.
BROKER_PROPERTIES = frozenset(
    {
        "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "REAL_TOPIC", "REAL_QID", "DELAY", "WAIT",
        "MSG_REGION", "CLUSTER", "TRACE_ON", "1ST_POP_TIME", "PGROUP", "RECONSUME_TIME",
        "__BORNHOST", "BORN_TIMESTAMP", "MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME",
        "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "POP_CK", "POP_CK_OFFSET", "INNER_NUM",
        "INNER_BASE", "TRAN_MSG", "TRAN_PREPARED_QUEUE_OFFSET", "PROPERTY_FORWARD_QUEUE_ID",
        "__STARTDELIVERTIME", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
        "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
        "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "MAX_RECONSUME_TIMES",
    }
)  # fmt: skip
#: Properties that are the message itself rather than the user's (shown apart).
SYSTEM_PROPERTIES = frozenset({UNIQ_KEY_PROPERTY, "KEYS", "TAGS"}) | BROKER_PROPERTIES


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group."""
    return DLQ_PREFIX + group


def origin_topic(properties: Dict[str, str]) -> Optional[str]:
    """The topic a dead letter came from (module docstring), or None when it cannot be told."""
    origin = properties.get(DLQ_ORIGIN_TOPIC)
    if origin:
        return origin
    retry = properties.get(RETRY_TOPIC, "")
    if not retry.startswith(RETRY_PREFIX):
        return retry or None
    _, plus, topic = retry.partition("+")  # %RETRY%<group>+<topic>: '+' is in no name
    return topic if plus and topic else None


class DeadLetter(NamedTuple):
    """A message of a DLQ, shaped like a 5.x message (``topic``, ``tag``, ``keys``,
    ``message_id``, ``properties``, ``body``) so :mod:`rocketmq_dedup.message` reads it; its
    ``topic`` is the topic it came from (the DLQ's when unknown)."""

    stored: StoredMessage
    origin: Optional[str]

    @property
    def topic(self) -> str:
        return self.origin or self.stored.topic

    @property
    def tag(self) -> str:
        return self.stored.properties.get("TAGS", "")

    @property
    def keys(self) -> List[str]:
        """The keys in the order they were stored (what a classic listener's
        ``message_keys`` gives; a 5.x listener sorts them)."""
        return [k for k in self.stored.properties.get("KEYS", "").split(" ") if k]

    @property
    def message_id(self) -> str:
        """``UNIQ_KEY`` (the client's message id), else the broker's offset id."""
        return self.stored.properties.get(UNIQ_KEY_PROPERTY) or self.stored.offset_msg_id

    @property
    def properties(self) -> Dict[str, str]:
        return self.stored.properties

    @property
    def body(self) -> bytes:
        return self.stored.body

    @property
    def user_properties(self) -> Dict[str, str]:
        """The producer's own properties."""
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}


class KeyBy(enum.StrEnum):
    """Which part of a message is its dedup key (the CLI's ``--key``)."""

    MESSAGE_ID = "message-id"
    """``UNIQ_KEY``, else the message id: the listener's default ``dedup_message_key``."""
    FIRST_KEY = "first-key"
    """The first of the message's keys, as stored (``message_keys(msg)[0]``)."""
    PROPERTY = "property"
    """A user property (named by ``--key-property``)."""


class KeyRule(NamedTuple):
    """How the listener keys messages, as far as the tool can tell (it cannot run the user's
    ``dedup_message_key``)."""

    by: KeyBy = KeyBy.MESSAGE_ID
    name: str = ""
    """The property's name (``KeyBy.PROPERTY``)."""

    def key_of(self, letter: DeadLetter) -> Optional[str]:
        """The dedup key of ``letter`` by this rule, or None when it has none."""
        if self.by is KeyBy.FIRST_KEY:
            keys = message_keys(letter)
            return keys[0] if keys else None
        if self.by is KeyBy.PROPERTY:
            return letter.properties.get(self.name) or None
        return letter.message_id

    def describe(self) -> str:
        if self.by is KeyBy.PROPERTY:
            return f"the property {self.name}"
        return {KeyBy.MESSAGE_ID: "the message id", KeyBy.FIRST_KEY: "the first key"}[self.by]


def element_of(letter: DeadLetter, application: str, rule: KeyRule) -> Optional[DedupElement]:
    """The dedup element the listener of ``application`` gives ``letter`` under ``rule``; None
    when it has no such key or no known topic."""
    key = rule.key_of(letter)
    if key is None or letter.origin is None:
        return None
    return DedupElement(application, letter.origin, letter.tag, key)


def readable_route(client: RemotingClient, group: str) -> Optional[Route]:
    """The route of the group's DLQ, or None when it does not exist (no dead letter yet).
    Raises :class:`BrokerError` when a queue of it is not readable."""
    topic = dlq_topic(group)
    route = client.route(topic)
    if route is None:
        return None
    for queue in route.queues:
        if not queue.perm & PERM_READ:
            raise BrokerError(
                f"{topic} is not readable on {queue.broker} (perm={queue.perm}; older brokers "
                f"create dead-letter topics write-only): mqadmin updateTopicPerm -t '{topic}' "
                f"-p 6 -b <broker address> -n <name server>"
            )
    return route


def read_dead_letters(client: RemotingClient, group: str) -> List[DeadLetter]:
    """Every dead letter of ``group``, oldest first; [] when the group has none (its DLQ topic
    does not exist). Read with the group's own name, committing nothing."""
    route = readable_route(client, group)
    if route is None:
        return []
    stored = client.browse(dlq_topic(group), group, route)
    stored.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
    return [DeadLetter(m, origin_topic(m.properties)) for m in stored]


def resend_properties(letter: DeadLetter) -> Dict[str, str]:
    """The properties a resent copy carries: the producer's (``UNIQ_KEY``, ``KEYS``,
    ``TAGS``, the user's), none the broker added; stored before the send is answered."""
    props = {k: v for k, v in letter.properties.items() if k not in BROKER_PROPERTIES}
    props["WAIT"] = "true"
    return props
