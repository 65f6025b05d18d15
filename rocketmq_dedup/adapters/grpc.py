"""Adapters for the 5.x gRPC client ``rocketmq-python-client`` (the ``[rocketmq5]`` extra).

* :func:`message_listener` wraps a dedup listener (any
  :class:`~rocketmq_dedup.BaseDedupListener`) as the client's ``MessageListener`` for
  ``PushConsumer`` (SUCCESS / FAILURE).
* :func:`consume_simple` runs one receive-dedup-ack round on a ``SimpleConsumer``.
"""

from __future__ import annotations

import logging
from typing import Any, List, NamedTuple

from rocketmq_dedup.adapters.clients import check_one_client
from rocketmq_dedup.errors import MissingExtraError
from rocketmq_dedup.listener import BaseDedupListener
from rocketmq_dedup.status import ConsumeStatus

logger = logging.getLogger(__name__)


def _client_module() -> Any:
    check_one_client()  # both clients installed: the rocketmq package is neither whole
    try:
        import rocketmq
    except ImportError as exc:
        raise MissingExtraError("rocketmq-python-client", "rocketmq5") from exc
    if not hasattr(rocketmq, "MessageListener"):
        raise MissingExtraError("rocketmq-python-client (found the classic client)", "rocketmq5")
    return rocketmq


def message_listener(listener: BaseDedupListener) -> Any:
    """A ``rocketmq.MessageListener`` that consumes through ``listener``: CONSUME_SUCCESS ->
    ``ConsumeResult.SUCCESS``, RECONSUME_LATER -> ``ConsumeResult.FAILURE`` (the broker
    redelivers after the group's retry backoff)."""
    rocketmq = _client_module()

    class DedupMessageListener(rocketmq.MessageListener):  # type: ignore[misc,name-defined]
        """Consumes 5.x messages through a dedup listener."""

        def __init__(self) -> None:
            self.listener = listener

        def consume(self, message: Any) -> Any:
            if listener(message) is ConsumeStatus.CONSUME_SUCCESS:
                return rocketmq.ConsumeResult.SUCCESS
            return rocketmq.ConsumeResult.FAILURE

    return DedupMessageListener()


class SimpleRound(NamedTuple):
    """What one :func:`consume_simple` round did."""

    received: int
    acked: int
    """Handled now, or already consumed (duplicates)."""
    left: int
    """Not acked: they become visible again after the invisible duration."""


def consume_simple(
    consumer: Any,
    listener: BaseDedupListener,
    max_message_num: int = 16,
    invisible_duration: int = 30,
) -> SimpleRound:
    """Receive up to ``max_message_num`` messages, dedup and handle them (one store round trip
    per phase for the whole batch), ack the handled and the already-consumed, and leave the
    rest to become visible again after ``invisible_duration`` seconds (the proxy's minimum is
    10). Choose ``invisible_duration`` longer than the handlers of a batch take.

    A failed ack is logged; the message is redelivered and acked then as a duplicate. Raises
    :class:`~rocketmq_dedup.errors.ClientConflictError` when both clients are installed.
    """
    check_one_client()  # read once per process, then a cached answer
    messages = consumer.receive(max_message_num, invisible_duration)
    if not messages:
        return SimpleRound(0, 0, 0)
    statuses = listener.consume_each(messages)
    acked = 0
    for message, status in zip(messages, statuses, strict=True):
        if status is not ConsumeStatus.CONSUME_SUCCESS:
            continue
        try:
            consumer.ack(message)
            acked += 1
        except Exception:
            logger.warning("ack failed; the message will be redelivered", exc_info=True)
    return SimpleRound(len(messages), acked, len(messages) - acked)


__all__: List[str] = ["SimpleRound", "consume_simple", "message_listener"]
