"""AsyncDedupConcurrentListener: subclass it, write ``async def do_handle_msg``, run it on your
event loop through a consumer driver (:mod:`rocketmq_dedup.aio.consumers`)."""

from __future__ import annotations

import abc
import asyncio
import inspect
import logging
from typing import Any, Iterable, List, Optional, TypeVar

from rocketmq_dedup.aio.strategy import (
    AsyncClaimStrategy,
    AsyncPassThroughStrategy,
    AsyncStrategy,
)
from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.horizon import warn_if_retention_short
from rocketmq_dedup.message import message_id
from rocketmq_dedup.status import ConsumeStatus, DedupStatus
from rocketmq_dedup.strategy.base import BatchResult

logger = logging.getLogger(__name__)

A = TypeVar("A", bound="AsyncDedupConcurrentListener")
_UNEXPECTED = "unexpected error in the dedup listener; %s will be consumed later"

#: The methods a user writes that are called on the event loop without being awaited: they
#: must be plain functions (a key and a fingerprint are computed, not waited for).
PLAIN_METHODS = ("dedup_message_key", "payload_fingerprint", "on_duplicate")


class AsyncDedupConcurrentListener(abc.ABC):
    """A message listener whose ``async def do_handle_msg`` runs at most once per dedup key, on
    an asyncio store (a config built on ``redis.asyncio``, psycopg's async API or an asyncio
    MySQL driver: :func:`~rocketmq_dedup.stores.aio.make_async_store`). The decisions are
    :class:`~rocketmq_dedup.DedupConcurrentListener`'s ("What each case returns"), the same
    records: a sync and an asyncio consumer of one application dedup against each other.

    ``await listener(msg)`` consumes one message and returns a :class:`ConsumeStatus`; it never
    raises, but for ``CancelledError``: a cancelled message is never acked (its claim is
    released; a handler that finished is still recorded). ``consume_message(msgs)`` and
    ``consume_each(msgs)`` as the sync listener's. The drivers in
    :mod:`rocketmq_dedup.aio.consumers` feed it from either RocketMQ client.

    ``dedup_message_key``, ``payload_fingerprint`` and ``on_duplicate`` are plain ``def`` (they
    run on the loop and must not wait); an ``async def`` among them, or a ``def
    do_handle_msg``, is refused when the listener is made (:class:`DedupConfigError`).

    ``async with listener:`` (or ``await listener.start()``) runs the store's start-up check
    (``check_store=True``) and, at exit, stops lease renewal and closes the store's own
    connections.
    """

    def __init__(self, dedup_config: Optional[DedupConfig] = None) -> None:
        self._check_methods()
        self.dedup_config = dedup_config
        hooks = self._hooks()
        self._strategy: AsyncStrategy
        if dedup_config is None or not dedup_config.enabled:
            self._strategy = AsyncPassThroughStrategy(hooks, dedup_config)
        elif dedup_config.async_store is None:
            raise DedupConfigError(
                f"{type(self).__name__} needs a config of an asyncio store (redis.asyncio, "
                "psycopg's async API, asyncmy); this one's is "
                f"{dedup_config.store.describe() if dedup_config.store else None}: use "
                "DedupConcurrentListener for it"
            )
        else:
            self._strategy = AsyncClaimStrategy(dedup_config, hooks)
            snap = dedup_config.snapshot()
            warn_if_retention_short(
                snap.application_name,
                snap.retention_ms,
                snap.max_reconsume_times,
                snap.max_delivery_delay_ms,
            )

    def _check_methods(self) -> None:
        handler = getattr(self, "do_handle_msg", None)
        if not inspect.iscoroutinefunction(handler):
            raise DedupConfigError(
                f"{type(self).__qualname__}.do_handle_msg must be an async def: the asyncio "
                "listener awaits it on the event loop (a def would block the loop; use "
                "DedupConcurrentListener for a sync handler)"
            )
        for name in PLAIN_METHODS:
            method = getattr(self, name, None)
            if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
                raise DedupConfigError(
                    f"{type(self).__qualname__}.{name} is an async def: the listener calls it "
                    "on the event loop without awaiting it; define it with def (compute the "
                    "key or fingerprint from the message, without I/O)"
                )

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(AsyncDedupConcurrentListener, name)

    def _hooks(self) -> Hooks:
        return Hooks(
            listener=self,
            key_of=self.dedup_message_key if self._overrides("dedup_message_key") else message_id,
            on_duplicate=self.on_duplicate if self._overrides("on_duplicate") else None,
            payload_of=(
                self.payload_fingerprint if self._overrides("payload_fingerprint") else None
            ),
        )

    # -- what a user writes ----------------------------------------------------------------

    @abc.abstractmethod
    async def do_handle_msg(self, msg: Any) -> Any:
        """The business logic, awaited on the event loop. Return values as
        :meth:`DedupConcurrentListener.do_handle_msg <rocketmq_dedup.DedupConcurrentListener.
        do_handle_msg>`'s: True (or a client's success value) when handled; False, None, a
        retry value or an exception to have the broker redeliver it."""

    def dedup_message_key(self, msg: Any) -> Any:
        """The dedup key of ``msg`` (the sync listener's rules); by default the ``UNIQ_KEY``
        property, else the message id."""
        return message_id(msg)

    def payload_fingerprint(self, msg: Any) -> Any:
        """What identifies the payload of ``msg`` (bytes or str), for the payload check; None
        (the default) checks nothing."""
        return None

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:  # noqa: B027 - optional
        """Called for every message answered without its handler because of its record."""

    # -- entry points ----------------------------------------------------------------------

    async def __call__(self, msg: Any) -> ConsumeStatus:
        """Consume one message: a :class:`ConsumeStatus`; never raises but CancelledError."""
        try:
            return await self._strategy.consume_one(msg)
        except Exception:
            logger.exception(
                "unexpected error in the dedup listener; the message will be consumed later"
            )
            return ConsumeStatus.RECONSUME_LATER

    consume = __call__

    async def consume_message(self, msgs: Iterable[Any]) -> BatchResult:
        """A batch in order, stopping at the first message not consumed (the Java listener's
        ``ackIndex``). Never raises but CancelledError."""
        try:
            return await self._strategy.consume_batch(list(msgs))
        except Exception:
            logger.exception(
                "unexpected error in the dedup listener; the batch will be consumed later"
            )
            return BatchResult(ConsumeStatus.RECONSUME_LATER, -1)

    async def consume_each(self, msgs: Iterable[Any]) -> List[ConsumeStatus]:
        """Every message of ``msgs`` on its own (one store call per phase); each one's status.
        Never raises but CancelledError (then nothing is acked)."""
        batch: List[Any] = []
        try:
            batch = list(msgs)
            return await self._strategy.consume(batch)
        except Exception:
            logger.exception(
                "unexpected error in the dedup listener; the batch will be consumed later"
            )
            return [ConsumeStatus.RECONSUME_LATER] * len(batch)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """The store's start-up check, if its config still owes it (``check_store=True``):
        :class:`DedupConfigError` naming the address, privilege or ACL rule."""
        if self.dedup_config is not None:
            await self.dedup_config.check_async_store()

    async def aclose(self) -> None:
        """Stop lease renewal and close the connections the store opened (never the user's
        client)."""
        await self._strategy.aclose()
        if self.dedup_config is not None:
            await self.dedup_config.aclose()

    async def __aenter__(self: A) -> A:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self.aclose())


__all__ = ["AsyncDedupConcurrentListener"]
