"""Helpers of the outbox's integration tests (no tests here): a sender that records what it
would have sent (the broker's side is the e2e tests'), a listener whose handler writes an effect
row and sends through the outbox, and the tables."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from rocketmq_dedup import DedupConfig, TransactionalDedupListener
from rocketmq_dedup.outbox import Outbox, OutboxMessage
from rocketmq_dedup.outbox.senders import Sender
from tests.integration.exactly_once.support import EffectTable, sql

#: What a fake send does with a message: None (acknowledged) or raise a SendFailure.
Behaviour = Callable[[OutboxMessage], None]


class RecordingSender(Sender):
    """A broker that acknowledges every message (or does what ``behaviour`` says), after
    ``delay_s``; records each acknowledged message with the time, in order, and counts every
    attempt."""

    client = "fake"

    def __init__(self, behaviour: Optional[Behaviour] = None, delay_s: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.sent: List[Tuple[OutboxMessage, float]] = []
        self.attempts: List[OutboxMessage] = []
        self.lock = threading.Lock()
        self._ids = 0

    def send(self, message: OutboxMessage) -> str:
        with self.lock:
            self.attempts.append(message)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.behaviour is not None:
            self.behaviour(message)
        with self.lock:
            self._ids += 1
            self.sent.append((message, time.monotonic()))
            return f"FAKE{self._ids:08d}"

    def message_keys(self) -> List[str]:
        with self.lock:
            return [message.message_key for message, _ in self.sent]

    def bodies(self) -> List[bytes]:
        with self.lock:
            return [message.body for message, _ in self.sent]


class SendingListener(TransactionalDedupListener):
    """Writes an effect row keyed by the message id and sends one message through ``outbox``
    (topic ``OUT``, body and key ``<id>:B``; the sharding key ``sharding(msg)``), then answers
    what ``answer(msg)`` says (True by default)."""

    def __init__(
        self,
        config: DedupConfig,
        effects: EffectTable,
        outbox: Outbox,
        answer: Optional[Callable[[Any], Any]] = None,
        sharding: Optional[Callable[[Any], Optional[str]]] = None,
    ) -> None:
        self.effects = effects
        self.outbox = outbox
        self.answer = answer
        self.sharding = sharding
        super().__init__(config)

    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        self.effects.insert(conn, msg.id)
        sharding_key = self.sharding(msg) if self.sharding is not None else None
        self.outbox.send(conn, "OUT", f"{msg.id}:B", keys=f"{msg.id}:B", sharding_key=sharding_key)
        return True if self.answer is None else self.answer(msg)


def outbox_rows(table: str) -> Dict[str, Tuple[str, int]]:
    """message key -> (status, attempts) of every row of ``<table>_outbox``."""
    rows = sql(f"SELECT message_key, status, attempts FROM {table}_outbox")
    return {str(k): (str(s), int(a)) for k, s, a in rows}


def drop_tables(table: str) -> None:
    for suffix in ("", "_seq", "_outbox", "_outbox_lane"):
        sql(f"DROP TABLE IF EXISTS {table}{suffix}")


__all__ = ["RecordingSender", "SendingListener", "drop_tables", "outbox_rows"]
