"""The dedup decisions, for a batch of messages (one message is a batch of one). Stores only do
I/O; this module decides.

Per message::

    key None/""          -> run the handler, no dedup ("" also logs a warning)
    key refused/raised   -> RECONSUME_LATER, an ERROR logged (never keyed by accident)
    claim taken          -> run the handler -> success: mark CONSUMED, CONSUME_SUCCESS
                                            -> retry/raises: release the claim, RECONSUME_LATER
    CONSUMED record      -> CONSUME_SUCCESS without the handler (a duplicate)
    CONSUMING record     -> RECONSUME_LATER (the broker redelivers it later)
    store unavailable    -> the store_failure_policy: run without dedup, or RECONSUME_LATER
    store error (a bug)  -> RECONSUME_LATER, an ERROR logged

What a handler's return value means is :func:`handler_status`; which keys are accepted is
:func:`key_text`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import weakref
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, TypeVar

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import StoreError, StoreUnavailableError
from rocketmq_dedup.lease import LeaseKeeper, RenewalCallback
from rocketmq_dedup.message import DedupElement, message_tag, message_topic, to_text
from rocketmq_dedup.metrics import Decision, DedupMetrics, Outcome, StoreOp
from rocketmq_dedup.owner import (
    fingerprint,
    new_owner_token,
    payload_fingerprint,
    with_fingerprint,
)
from rocketmq_dedup.status import ConsumeStatus, DedupStatus, StoreFailurePolicy
from rocketmq_dedup.stores.base import ClaimResult, DedupStore

logger = logging.getLogger(__name__)

KeyFunction = Callable[[Any], Any]
Handler = Callable[[Any], Any]
DuplicateHook = Callable[[Any, DedupStatus], None]
T = TypeVar("T")
_new_tuple = tuple.__new__

SUCCESS = ConsumeStatus.CONSUME_SUCCESS
LATER = ConsumeStatus.RECONSUME_LATER


class BatchResult(NamedTuple):
    """The outcome of a batch, as the Java listener reports it through ``ackIndex``."""

    status: ConsumeStatus
    """CONSUME_SUCCESS when every message was handled or was a consumed duplicate."""
    ack_index: int
    """Index of the last message of the consumed prefix; -1 when none was consumed."""

    @property
    def consumed(self) -> int:
        """How many messages, from the start of the batch, were consumed."""
        return self.ack_index + 1


# -- what handlers return and what keys are ----------------------------------------------------

#: Enum members of the clients that mean success or retry, by (enum class name, member name):
#: this library's and the classic client's ConsumeStatus, the 5.x client's ConsumeResult.
_CLIENT_STATUSES = {
    ("ConsumeStatus", "CONSUME_SUCCESS"): SUCCESS,
    ("ConsumeResult", "SUCCESS"): SUCCESS,
    ("ConsumeStatus", "RECONSUME_LATER"): LATER,
    ("ConsumeResult", "FAILURE"): LATER,
}


def handler_status(result: Any) -> Optional[ConsumeStatus]:
    """What a handler's return value means: ``True`` and every client's success value
    (``ConsumeStatus.CONSUME_SUCCESS``, 5.x ``ConsumeResult.SUCCESS``) -> CONSUME_SUCCESS;
    ``False``, ``None`` and every client's retry value -> RECONSUME_LATER; anything else -> None
    (the caller logs an error and retries). No truthiness: ``ConsumeStatus.RECONSUME_LATER``
    is 1, and ``CONSUME_SUCCESS`` is 0."""
    if result is True:
        return SUCCESS
    if result is False or result is None:
        return LATER
    if isinstance(result, enum.Enum):
        return _CLIENT_STATUSES.get((type(result).__name__, result.name))
    return None


class KeyRefused(TypeError):
    """A dedup key whose text would not identify the message (e.g. ``object()``'s address)."""


_PLAIN_KEY_TYPES = (bool, int, float)


def key_text(raw: Any) -> str:
    """The text a dedup key is stored under.

    ``str`` as it is (any code point); ``bytes`` decoded as UTF-8 with ``surrogateescape`` (so
    ``b"k"`` and ``"k"`` are the same key); ``int``, ``float`` and ``bool`` as ``str()`` gives
    them; tuples and lists of keys as their ``str()``; other objects by their ``str()`` only
    when their class defines ``__str__`` or ``__repr__``. Raises :class:`KeyRefused` for a value
    whose text is its identity (the default ``object`` repr, a memory address that another
    message may reuse) and for sets and dicts (their text order is not stable across
    processes)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return to_text(raw)
    _check_value_based(raw)
    return str(raw)


def _check_value_based(value: Any) -> None:
    if isinstance(value, (str, bytes, bytearray, memoryview, *_PLAIN_KEY_TYPES)):
        return
    if isinstance(value, (tuple, list)):
        for item in value:
            _check_value_based(item)
        return
    if isinstance(value, (set, frozenset, dict)):
        raise KeyRefused(
            f"a {type(value).__name__} is not a dedup key: its text order differs between "
            "processes; return one element, or a sorted tuple of them"
        )
    kind = type(value)
    own_text = any("__str__" in vars(c) or "__repr__" in vars(c) for c in kind.__mro__[:-1])
    if not own_text:
        raise KeyRefused(
            f"a {kind.__module__}.{kind.__qualname__} is not a dedup key: its text is its memory "
            "address, which another message may reuse; return a str, bytes or int, or define "
            "__str__ on the class"
        )


# -- strategies ----------------------------------------------------------------------------------


class Strategy:
    """How a listener consumes messages. :meth:`consume_each` is the one decision path; a
    single message and a stop-at-first-failure batch are its special cases."""

    def consume_each(
        self,
        msgs: Iterable[Any],
        key_function: KeyFunction,
        handler: Handler,
        stop_at_failure: bool = False,
    ) -> List[ConsumeStatus]:
        """Consume ``msgs`` (any iterable; read once, before anything else happens) and return
        each one's status. With ``stop_at_failure``, messages after the first one not consumed
        are not handled (RECONSUME_LATER). Raises only what a handler raised that is not an
        ``Exception`` (KeyboardInterrupt, SystemExit, CancelledError), after cleaning up."""
        return run_handlers(list(msgs), handler, stop_at_failure)

    def consume_batch(
        self, msgs: Iterable[Any], key_function: KeyFunction, handler: Handler
    ) -> BatchResult:
        """Consume ``msgs`` in order, stopping at the first message that is not consumed (the
        Java listener's batch semantics)."""
        statuses = self.consume_each(msgs, key_function, handler, stop_at_failure=True)
        consumed = next((i for i, s in enumerate(statuses) if s is not SUCCESS), len(statuses))
        status = SUCCESS if consumed == len(statuses) else LATER
        return BatchResult(status, consumed - 1)

    def close(self) -> None:
        """Stop background work (lease renewal)."""


class PassThroughStrategy(Strategy):
    """Dedup disabled: every message goes to the handler, no store I/O."""


class _Delivery:
    """One message of a batch on its way through the decision path."""

    __slots__ = (
        "element",
        "fingerprint",
        "handler_seconds",
        "msg",
        "outcome",
        "owner",
        "position",
        "status",
    )

    def __init__(self, position: int, msg: Any) -> None:
        self.position = position  # in the batch, and so in the statuses
        self.msg = msg
        self.element: Optional[DedupElement] = None  # None: consumed without dedup
        self.owner: Optional[str] = None  # set while this delivery owns a claim
        self.status: Optional[ConsumeStatus] = None  # decided without the handler
        self.outcome: Optional[Outcome] = None  # for metrics; set once decided
        self.handler_seconds: Optional[float] = None  # timed only with metrics
        self.fingerprint: Optional[str] = None  # the payload's, with payload_fingerprint


class DedupStrategy(Strategy):
    """Applies a :class:`DedupConfig` to messages; holds no per-message state."""

    def __init__(self, config: DedupConfig, on_duplicate: Optional[DuplicateHook] = None) -> None:
        if config.persist is None:
            raise ValueError("DedupStrategy needs a config with a store")
        self.config = config
        self.store: DedupStore = config.persist
        self.on_duplicate = on_duplicate
        #: The listener's ``payload_fingerprint`` if it has one (set by the listener).
        self.payload_fingerprint: Optional[Callable[[Any], Any]] = None
        self._keeper: Optional[LeaseKeeper] = None
        self._keeper_lock = threading.Lock()
        self._log = RateLimitedLog(logger)

    def consume_each(
        self,
        msgs: Iterable[Any],
        key_function: KeyFunction,
        handler: Handler,
        stop_at_failure: bool = False,
    ) -> List[ConsumeStatus]:
        metrics = self.config.metrics
        started = time.time_ns() if metrics is not None else 0
        deliveries = [_Delivery(i, msg) for i, msg in enumerate(msgs)]
        keyed = [d for d in deliveries if self._key(d, key_function)]
        owned = self._claim(keyed) if keyed else []
        keeper = self._lease_keeper() if owned else None
        if keeper is not None:
            keeper.hold([d.element for d in owned], [d.owner for d in owned])  # type: ignore[misc]
        statuses: List[ConsumeStatus] = []
        try:
            for delivery in deliveries:
                status = delivery.status
                if status is None:
                    if metrics is None:
                        status = run_handler(handler, delivery.msg)
                    else:
                        begin = time.perf_counter()
                        status = run_handler(handler, delivery.msg)
                        delivery.handler_seconds = time.perf_counter() - begin
                    if delivery.owner is not None:
                        delivery.outcome = Outcome.CONSUMED if status is SUCCESS else Outcome.FAILED
                statuses.append(status)
                if stop_at_failure and status is not SUCCESS:
                    break
        finally:  # whatever happened, no claim stays held or renewed by this call
            if keeper is not None:
                keeper.drop([d.owner for d in owned])  # type: ignore[misc]
            if owned:
                self._settle(owned, statuses)
            if metrics is not None:
                self._report(metrics, deliveries, len(statuses), started)
        if len(statuses) < len(deliveries):  # stopped at a failure
            statuses += [LATER] * (len(deliveries) - len(statuses))
        return statuses

    # -- the steps -----------------------------------------------------------------------

    def _key(self, delivery: _Delivery, key_function: KeyFunction) -> bool:
        """Set ``delivery.element`` (or its status when the key is refused); True if keyed."""
        msg = delivery.msg
        try:
            raw = key_function(msg)
            if raw is None:
                logger.debug("dedup key is None; consuming without dedup")
                delivery.outcome = Outcome.NO_KEY
                return False
            key = key_text(raw)
        except KeyRefused as exc:
            self._log.log(logging.ERROR, "dedup_message_key: %s; consume later", exc)
            delivery.status, delivery.outcome = LATER, Outcome.KEY_ERROR
            return False
        except Exception:
            return self._hook_failed(delivery, "dedup_message_key")
        topic = message_topic(msg)
        if not key:
            self._log.log(
                logging.WARNING,
                "dedup key is empty for a message of topic %r; consuming without dedup",
                topic,
            )
            delivery.outcome = Outcome.NO_KEY
            return False
        if self.payload_fingerprint is not None:
            try:
                payload = _payload_bytes(self.payload_fingerprint(msg))
                if payload is not None:
                    delivery.fingerprint = payload_fingerprint(payload)
            except Exception:
                return self._hook_failed(delivery, "payload_fingerprint")
        delivery.element = DedupElement(self.config.application_name, topic, message_tag(msg), key)
        return True

    def _hook_failed(self, delivery: _Delivery, hook: str) -> bool:
        """A listener method that derives the key (or the payload fingerprint) raised: logged,
        and the message answered RECONSUME_LATER. Returns False (not keyed)."""
        self._log.log(
            logging.ERROR, "%s raised; the message will be consumed later", hook, exc_info=True
        )
        delivery.status, delivery.outcome = LATER, Outcome.KEY_ERROR
        return False

    def _claim(self, keyed: List[_Delivery]) -> List[_Delivery]:
        """Claim every keyed delivery in one store call; decide the answer of those not
        claimed; return the ones this call owns."""
        owners = [
            new_owner_token()
            if d.fingerprint is None
            else with_fingerprint(new_owner_token(), d.fingerprint)
            for d in keyed
        ]
        elements: List[DedupElement] = [d.element for d in keyed]  # type: ignore[misc]
        try:
            results = self._store_call(
                StoreOp.CLAIM, self.store.claim_many, elements, owners, self.config.lease_ms
            )
        except StoreError as exc:
            self._store_failed(keyed, exc)
            return []
        owned = []
        for delivery, owner, result in zip(keyed, owners, results, strict=False):
            if result.claimed:
                delivery.owner = owner
                owned.append(delivery)
            else:
                delivery.status = self._duplicate_status(delivery, result)
        return owned

    def _store_failed(self, keyed: List[_Delivery], exc: StoreError) -> None:
        if not isinstance(exc, StoreUnavailableError):
            self._log.log(
                logging.ERROR,
                "dedup store error (%s); %d message(s) will be consumed later",
                exc,
                len(keyed),
                exc_info=exc,
            )
        elif self.config.store_failure_policy is StoreFailurePolicy.CONSUME:
            self._log.log(
                logging.WARNING,
                "dedup store unavailable (%s); consuming %d message(s) WITHOUT dedup "
                "(store_failure_policy='consume')",
                exc,
                len(keyed),
            )
            for delivery in keyed:
                delivery.element, delivery.outcome = None, Outcome.STORE_ERROR_CONSUMED
            return
        else:
            self._log.log(
                logging.WARNING,
                "dedup store unavailable (%s); %d message(s) will be consumed later "
                "(store_failure_policy='reconsume_later')",
                exc,
                len(keyed),
            )
        for delivery in keyed:
            delivery.status, delivery.outcome = LATER, Outcome.STORE_ERROR_LATER

    def _duplicate_status(self, delivery: _Delivery, claim: ClaimResult) -> Optional[ConsumeStatus]:
        """The answer for a message whose claim was refused; None means "run the handler
        without dedup" (a record this library cannot read, as the Java original does)."""
        if delivery.fingerprint is not None and claim.status is not None:
            theirs = fingerprint(claim.holder)
            if theirs is not None and theirs != delivery.fingerprint:
                return self._payload_mismatch(delivery, claim.status)
        if claim.status is DedupStatus.CONSUMED:
            logger.debug("%r already consumed; acking the duplicate", delivery.element)
            delivery.outcome = Outcome.DUPLICATE_CONSUMED
            self._duplicate(delivery, DedupStatus.CONSUMED)
            return SUCCESS
        if claim.status is DedupStatus.CONSUMING:
            logger.debug("%r is being consumed elsewhere; consume later", delivery.element)
            delivery.outcome = Outcome.DUPLICATE_IN_PROGRESS
            self._duplicate(delivery, DedupStatus.CONSUMING)
            return LATER
        self._log.log(
            logging.WARNING,
            "%r has a record this library cannot read; consuming without dedup",
            delivery.element,
        )
        delivery.outcome = Outcome.STORE_ERROR_CONSUMED
        return None

    def _payload_mismatch(self, delivery: _Delivery, status: DedupStatus) -> ConsumeStatus:
        """A duplicate key whose payload differs from the first copy's: a producer bug. Logged
        (and counted); with ``payload_mismatch="reject"`` answered RECONSUME_LATER so that it
        ends in the DLQ for a human to look at, else answered as the duplicate it claims to be.
        """
        reject = self.config.payload_mismatch == "reject"
        self._log.log(
            logging.WARNING,
            "%r: a duplicate key with a different payload (a producer reusing a key?); %s",
            delivery.element,
            "consume later (payload_mismatch='reject')" if reject else "treated as a duplicate",
        )
        delivery.outcome = Outcome.PAYLOAD_MISMATCH
        if reject:
            return LATER
        self._duplicate(delivery, status)
        return SUCCESS if status is DedupStatus.CONSUMED else LATER

    def _duplicate(self, delivery: _Delivery, status: DedupStatus) -> None:
        """Call the listener's ``on_duplicate`` hook; its exceptions are logged, no more."""
        if self.on_duplicate is None:
            return
        try:
            self.on_duplicate(delivery.msg, status)
        except Exception:
            self._log.log(logging.ERROR, "on_duplicate raised; ignored", exc_info=True)

    def _settle(self, owned: List[_Delivery], statuses: List[ConsumeStatus]) -> None:
        """Mark the claims whose handler succeeded CONSUMED; release the others (failed, not
        reached, or interrupted). Never raises a StoreError."""
        done: List[DedupElement] = []
        done_owners: List[str] = []
        undone: List[DedupElement] = []
        undone_owners: List[str] = []
        reached = len(statuses)
        for delivery in owned:
            if delivery.position < reached and statuses[delivery.position] is SUCCESS:
                done.append(delivery.element)  # type: ignore[arg-type]
                done_owners.append(delivery.owner)  # type: ignore[arg-type]
            else:
                undone.append(delivery.element)  # type: ignore[arg-type]
                undone_owners.append(delivery.owner)  # type: ignore[arg-type]
        if done:
            try:
                self._store_call(
                    StoreOp.MARK_CONSUMED,
                    self.store.mark_consumed_many,
                    done,
                    done_owners,
                    self.config.retention_ms,
                )
            except StoreError as exc:
                # The handler succeeded: ack anyway. The claim lapses after the lease, and a
                # redelivery after that may run the handler again (at-least-once).
                self._log.log(
                    logging.ERROR,
                    "handled %d message(s) but could not mark them CONSUMED (%s); acking anyway",
                    len(done),
                    exc,
                )
        if undone:
            self._release(undone, undone_owners)

    def _release(self, elements: List[DedupElement], owners: List[str]) -> None:
        try:
            released = self._store_call(StoreOp.RELEASE, self.store.release_many, elements, owners)
        except StoreError as exc:
            # The retry finds the claim CONSUMING until the lease lapses, then runs.
            self._log.log(logging.ERROR, "could not release %d claim(s) (%s)", len(elements), exc)
            return
        if released < len(elements):
            logger.info(
                "%d of %d claim(s) had already expired and were taken over; left untouched",
                len(elements) - released,
                len(elements),
            )

    # -- metrics -------------------------------------------------------------------------

    def _store_call(self, op: StoreOp, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, timed for the metrics when there are any."""
        metrics = self.config.metrics
        if metrics is None:
            return fn(*args)
        begin = time.perf_counter()
        try:
            result = fn(*args)
        except BaseException:
            self._time_store_call(metrics, op, time.perf_counter() - begin, False)
            raise
        try:  # inline: the success path is per message
            metrics.store_operation(
                self.config.application_name, op, time.perf_counter() - begin, True
            )
        except Exception:
            self._metrics_failed()
        return result

    def _time_store_call(
        self, metrics: DedupMetrics, op: StoreOp, seconds: float, ok: bool
    ) -> None:
        try:
            metrics.store_operation(self.config.application_name, op, seconds, ok)
        except Exception:
            self._metrics_failed()

    def _report(
        self, metrics: DedupMetrics, deliveries: List[_Delivery], reached: int, started: int
    ) -> None:
        """One decision per message that got an answer (those after a batch's first failure
        are not counted: they are counted when they come back)."""
        app = self.config.application_name
        for delivery in deliveries[:reached]:
            if delivery.outcome is None:
                continue
            msg, element = delivery.msg, delivery.element
            topic = element.topic if element is not None else message_topic(msg)
            try:
                # tuple.__new__: a NamedTuple's own __new__ costs 0.2 us, a fifth of the budget
                metrics.message(
                    _new_tuple(
                        Decision,
                        (app, topic, delivery.outcome, msg, started, delivery.handler_seconds),
                    )
                )
            except Exception:
                self._metrics_failed()

    def _metrics_failed(self) -> None:
        self._log.log(logging.ERROR, "the metrics object raised; ignored", exc_info=True)

    def _on_renewal(self, renewed: int, lost: int, seconds: float, ok: bool) -> None:
        metrics = self.config.metrics
        if metrics is not None:
            app = self.config.application_name
            try:
                metrics.store_operation(app, StoreOp.RENEW, seconds, ok)
                metrics.leases(app, renewed, lost)
            except Exception:
                self._metrics_failed()

    # -- lease keeper --------------------------------------------------------------------

    def _lease_keeper(self) -> Optional[LeaseKeeper]:
        """The keeper for the current settings, or None when renewal is off or the store
        cannot renew."""
        config = self.config
        if not (config.lease_renewal and self.store.supports_renewal):
            return None
        keeper = self._keeper
        lease_ms, max_ms = config.lease_ms, config.max_processing_ms
        if keeper is None or (keeper.lease_ms, keeper.max_processing_ms) != (lease_ms, max_ms):
            with self._keeper_lock:
                old = self._keeper
                if old is None or (old.lease_ms, old.max_processing_ms) != (lease_ms, max_ms):
                    # The old keeper (settings changed) still renews what it holds until dropped.
                    self._keeper = LeaseKeeper(
                        self.store, lease_ms, max_ms, on_renewal=self._renewal_callback()
                    )
                keeper = self._keeper
        return keeper

    def _renewal_callback(self) -> RenewalCallback:
        """The keeper's report callback; a weak reference, so the keeper (and its thread) never
        keep this strategy alive."""
        ref = weakref.ref(self)

        def report(renewed: int, lost: int, seconds: float, ok: bool) -> None:
            strategy = ref()
            if strategy is not None:
                strategy._on_renewal(renewed, lost, seconds, ok)

        return report

    def close(self) -> None:
        with self._keeper_lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()


def make_strategy(
    config: Optional[DedupConfig], on_duplicate: Optional[DuplicateHook] = None
) -> Strategy:
    """The strategy for ``config``: dedup, or pass-through when it is None or disabled."""
    if config is None or not config.enabled or config.persist is None:
        return PassThroughStrategy()
    return DedupStrategy(config, on_duplicate)


def _payload_bytes(value: Any) -> Optional[bytes]:
    """A payload fingerprint's input as bytes (None: no check for this message)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return bytes(value)


# -- running handlers ----------------------------------------------------------------------------


def run_handler(handler: Handler, msg: Any) -> ConsumeStatus:
    """Call the user's handler and map its result (:func:`handler_status`). An ``Exception``
    is logged and means RECONSUME_LATER; anything else a handler raises propagates."""
    try:
        result = handler(msg)
    except Exception:
        logger.exception("do_handle_msg raised; the message will be consumed later")
        return LATER
    if result is True:  # the common case, before the general rule
        return SUCCESS
    status = handler_status(result)
    if status is None:
        logger.error(
            "do_handle_msg returned %r (%s); return True on success and False to retry "
            "(or a client's ConsumeStatus/ConsumeResult); the message will be consumed later",
            result,
            type(result).__name__,
        )
        return LATER
    return status


def run_handlers(msgs: List[Any], handler: Handler, stop_at_failure: bool) -> List[ConsumeStatus]:
    """Run the handler on each message, without dedup."""
    statuses = [LATER] * len(msgs)
    for i, msg in enumerate(msgs):
        statuses[i] = run_handler(handler, msg)
        if stop_at_failure and statuses[i] is not SUCCESS:
            break
    return statuses
