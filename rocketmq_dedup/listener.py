"""DedupConcurrentListener: subclass it, implement ``do_handle_msg``, subscribe it."""

from __future__ import annotations

import abc
import logging
from typing import Any, List, Optional, Sequence

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.message import message_id
from rocketmq_dedup.status import ConsumeStatus
from rocketmq_dedup.strategy import BatchResult, DedupStrategy

logger = logging.getLogger(__name__)


class DedupConcurrentListener(abc.ABC):
    """A message listener that runs :meth:`do_handle_msg` at most once per dedup key.

    ``listener(msg)`` is the callback for the classic client's
    ``PushConsumer.subscribe(topic, listener)``; it returns a :class:`ConsumeStatus` and never
    raises (an exception escaping a ctypes callback would ack the message). For the 5.x client
    use :mod:`rocketmq_dedup.adapters.grpc`.

    :param dedup_config: where and how to dedup; None disables dedup (as in the Java original).
    """

    def __init__(self, dedup_config: Optional[DedupConfig] = None) -> None:
        self.dedup_config = dedup_config
        self._strategy = DedupStrategy(dedup_config)
        if dedup_config is None:
            logger.info("%s has no DedupConfig: dedup is disabled", type(self).__name__)

    @abc.abstractmethod
    def do_handle_msg(self, msg: Any) -> bool:
        """The business logic. Return True when the message is handled; return False or raise
        to have the broker redeliver it later. Receives the client's own message object."""

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        """The dedup key of ``msg``: the ``UNIQ_KEY`` property, else the message id.

        Override to dedup on a business key (recommended when producers may resend). Return
        None to consume the message without dedup.
        """
        return message_id(msg)

    def __call__(self, msg: Any) -> ConsumeStatus:
        """Consume one message; never raises."""
        try:
            return self._strategy.consume(msg, self.dedup_message_key, self.do_handle_msg)
        except Exception:  # a bug in this library must not ack the message
            logger.exception("unexpected error in the dedup listener; consume later")
            return ConsumeStatus.RECONSUME_LATER

    consume = __call__

    def consume_message(self, msgs: Sequence[Any]) -> BatchResult:
        """Consume a batch in order, stopping at the first message that is not consumed.

        Returns ``BatchResult(status, ack_index)``: ``status`` is CONSUME_SUCCESS when every
        message was handled or was an already-consumed duplicate, and ``ack_index`` is the last
        index of the consumed prefix (-1 if none). Never raises.
        """
        try:
            return self._strategy.consume_batch(msgs, self.dedup_message_key, self.do_handle_msg)
        except Exception:
            logger.exception("unexpected error in the dedup listener; consume the batch later")
            return BatchResult(ConsumeStatus.RECONSUME_LATER, -1)

    def consume_each(self, msgs: Sequence[Any]) -> List[ConsumeStatus]:
        """Consume every message of ``msgs`` independently (a failure does not stop the
        others) and return each one's status; the store is called once per phase for the
        whole batch. For consumers that ack message by message (5.x ``SimpleConsumer``)."""
        try:
            return self._strategy.consume_each(msgs, self.dedup_message_key, self.do_handle_msg)
        except Exception:
            logger.exception("unexpected error in the dedup listener; consume the batch later")
            return [ConsumeStatus.RECONSUME_LATER] * len(msgs)
