"""DedupConcurrentListener: subclass it, implement ``do_handle_msg``, subscribe it."""

from __future__ import annotations

import abc
import inspect
import logging
import threading
from typing import Any, Callable, Iterable, List, Optional, TypeVar

from rocketmq_dedup.adapters.classic import callback_thread, first_call_on_thread
from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.horizon import warn_if_retention_short
from rocketmq_dedup.message import message_id
from rocketmq_dedup.status import ConsumeStatus, DedupStatus
from rocketmq_dedup.strategy import BatchResult, Strategy, make_strategy

logger = logging.getLogger(__name__)

L = TypeVar("L", bound="BaseDedupListener")

#: The methods a user writes that the listener calls (``sequence_key``: the exactly-once
#: listener's); none may be ``async def`` (:meth:`BaseDedupListener._refuse_async`).
USER_METHODS = (
    "do_handle_msg",
    "dedup_message_key",
    "payload_fingerprint",
    "on_duplicate",
    "sequence_key",
)


class BaseDedupListener(abc.ABC):
    """What every dedup listener shares: the entry points, the key, the hooks, the lifecycle.
    Subclass :class:`DedupConcurrentListener` (``do_handle_msg(msg)``) or
    :class:`~rocketmq_dedup.TransactionalDedupListener` (``do_handle_msg(msg, conn)``).

    ``listener(msg)`` is the callback for the classic client's
    ``PushConsumer.subscribe(topic, listener)``; it returns a :class:`ConsumeStatus` and never
    raises (an exception escaping a ctypes callback would ack the message). For the 5.x client
    use :mod:`rocketmq_dedup.adapters.grpc`.

    ``do_handle_msg`` is looked up at each message; ``dedup_message_key`` and the optional
    hooks are read once, when the listener is made: override them in the subclass. They are
    called from the client's callback threads, with no event loop: an ``async def`` among them
    is refused when the listener is made (:class:`DedupConfigError`), since its coroutine would
    never run.

    :param dedup_config: where and how to dedup; None disables dedup (as in the Java original).
        A warning is logged when its ``dedup_record_reserve_minutes`` is shorter than the
        broker's redelivery horizon (:mod:`rocketmq_dedup.horizon`).
    """

    #: The business logic; each kind of listener declares its own signature.
    do_handle_msg: Callable[..., Any]

    def __init__(self, dedup_config: Optional[DedupConfig] = None) -> None:
        self._refuse_async()
        self.dedup_config = dedup_config
        self._strategy = self._make_strategy(dedup_config, self._hooks())
        if dedup_config is None:
            logger.info("%s has no DedupConfig: dedup is disabled", type(self).__name__)
        elif dedup_config.enabled:  # at start: records kept shorter than the retries last
            snap = dedup_config.snapshot()
            warn_if_retention_short(
                snap.application_name,
                snap.retention_ms,
                snap.max_reconsume_times,
                snap.max_delivery_delay_ms,
            )

    def _hooks(self) -> Hooks:
        """This listener's methods for its strategy, bound once: the optional ones only when
        the listener's class overrides them (else the strategy skips their work)."""
        return Hooks(
            listener=self,
            # the default key read directly: one Python call less for every message
            key_of=self.dedup_message_key if self._overrides("dedup_message_key") else message_id,
            on_duplicate=self.on_duplicate if self._overrides("on_duplicate") else None,
            payload_of=(
                self.payload_fingerprint if self._overrides("payload_fingerprint") else None
            ),
        )

    def _refuse_async(self) -> None:
        """Raise :class:`DedupConfigError` for an ``async def`` handler or hook: the listener
        runs on the client's threads with no event loop, so its coroutine would never be
        awaited and the message would be retried until the DLQ."""
        for name in USER_METHODS:
            method = getattr(self, name, None)
            if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
                raise DedupConfigError(
                    f"{type(self).__qualname__}.{name} is an async def: the listener calls it "
                    "from the RocketMQ client's threads, which run no event loop, so its "
                    "coroutine would never run and every message would be retried until the "
                    f"DLQ. Define {name} with def; to call async code from it, run the "
                    "coroutine to completion there (asyncio.run(...), or "
                    "asyncio.run_coroutine_threadsafe(coro, loop).result() on a loop your "
                    "application runs). asyncio listeners are not supported yet."
                )

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(BaseDedupListener, name, None)

    def _make_strategy(self, dedup_config: Optional[DedupConfig], hooks: Hooks) -> Strategy:
        """The strategy the entry points run (a hook for listeners with another mode, e.g.
        :class:`~rocketmq_dedup.transactional.TransactionalDedupListener`)."""
        return make_strategy(dedup_config, hooks)

    def dedup_message_key(self, msg: Any) -> Any:
        """The dedup key of ``msg``: the ``UNIQ_KEY`` property, else the message id.

        Override to dedup on a business key (recommended when producers may resend): a str,
        bytes or int (or a float, bool, tuple, or an object with its own ``__str__``). Return
        None to consume the message without dedup. A value whose text is its memory address
        (a plain ``object()``), a set or a dict is refused: the message is retried later and an
        error is logged.
        """
        return message_id(msg)

    def payload_fingerprint(self, msg: Any) -> Any:
        """What identifies the payload of ``msg`` (bytes or str), e.g. ``msg.body``; None (the
        default) checks nothing. When overridden, its SHA-256 travels with the claim, and a
        duplicate key whose payload differs from the first copy's (a producer reusing a key) is
        logged and counted (outcome ``payload_mismatch``); with the config's
        ``payload_mismatch="reject"`` it is also answered RECONSUME_LATER, so it ends in the DLQ
        for a human to look at. Raising means RECONSUME_LATER."""
        return None

    def on_duplicate(self, msg: Any, status: DedupStatus) -> None:  # noqa: B027 - optional hook
        """Called for every message answered without running the handler because of its
        record: ``DedupStatus.CONSUMED`` (acked as a duplicate) or ``DedupStatus.CONSUMING``
        (still in another consumer's handler: RECONSUME_LATER). Does nothing by default;
        override it to count or log replays. An exception raised here is logged and changes
        nothing."""

    def __call__(self, msg: Any) -> ConsumeStatus:
        """Consume one message; never raises into a client's callback (see :meth:`close`).

        The classic client calls this from librocketmq's native threads: on a thread state's
        first call, a thread Python did not start keeps its Python thread state from then on
        (:mod:`rocketmq_dedup.adapters.classic`); threads Python started are left alone."""
        if not callback_thread.seen:  # this thread state's first call
            first_call_on_thread()
        try:
            return self._strategy.consume_one(msg)
        except BaseException as exc:
            _contain(exc, "the message")
            return ConsumeStatus.RECONSUME_LATER

    consume = __call__

    def consume_message(self, msgs: Iterable[Any]) -> BatchResult:
        """Consume a batch in order, stopping at the first message that is not consumed.

        Returns ``BatchResult(status, ack_index)``: ``status`` is CONSUME_SUCCESS when every
        message was handled or was an already-consumed duplicate, and ``ack_index`` is the last
        index of the consumed prefix (-1 if none). Never raises.
        """
        try:
            return self._strategy.consume_batch(msgs)
        except BaseException as exc:
            _contain(exc, "the batch")
            return BatchResult(ConsumeStatus.RECONSUME_LATER, -1)

    def consume_each(self, msgs: Iterable[Any]) -> List[ConsumeStatus]:
        """Consume every message of ``msgs`` independently (a failure does not stop the
        others) and return each one's status; the store is called once per phase for the
        whole batch. For consumers that ack message by message (5.x ``SimpleConsumer``).

        ``msgs`` may be any iterable; it is read once, before anything is claimed. If reading
        it fails, nothing is claimed and the result is empty (nothing is acked). Never raises.
        """
        batch: List[Any] = []
        try:
            batch = list(msgs)
            return self._strategy.consume(batch)
        except BaseException as exc:
            _contain(exc, "the batch")
            return [ConsumeStatus.RECONSUME_LATER] * len(batch)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop this listener's lease renewal and close the connections its config's store
        opened (never the user's client; the store reconnects if used again). Also on
        ``with listener:`` exit. A listener that is only dropped leaves no thread either."""
        self._strategy.close()
        if self.dedup_config is not None:
            self.dedup_config.close()

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class DedupConcurrentListener(BaseDedupListener):
    """A message listener that runs :meth:`do_handle_msg` at most once per dedup key (the Java
    original's name). Entry points, key and hooks: :class:`BaseDedupListener`."""

    @abc.abstractmethod
    def do_handle_msg(self, msg: Any) -> Any:
        """The business logic. Receives the client's own message object.

        Return ``True`` (or a client's success value: ``ConsumeStatus.CONSUME_SUCCESS``,
        5.x ``ConsumeResult.SUCCESS``) when the message is handled. Return ``False``, ``None``
        (or ``ConsumeStatus.RECONSUME_LATER`` / ``ConsumeResult.FAILURE``) or raise to have the
        broker redeliver it later. Any other value is logged as an error and retried.
        """


def _contain(exc: BaseException, what: str) -> None:
    """Decide what an exception that reached a listener entry point does. Claims were already
    released and their renewal stopped (the strategy cleans up in ``finally``).

    A client calls the listener from its own threads (the classic client from native threads
    through ctypes, where an escaping exception acks the message), so the exception is logged
    and the message answered RECONSUME_LATER. The one exception: ``KeyboardInterrupt`` and
    ``SystemExit`` on the main thread, where Python delivers Ctrl-C and where no client runs
    callbacks, are re-raised so the program can stop."""
    if isinstance(exc, Exception):
        logger.exception("unexpected error in the dedup listener; %s will be consumed later", what)
        return
    if (
        isinstance(exc, (KeyboardInterrupt, SystemExit))
        and threading.current_thread() is threading.main_thread()
    ):
        raise exc
    logger.error("do_handle_msg raised %s; %s will be consumed later", type(exc).__name__, what)
