"""The dedup decisions, per message and per batch. Stores only do I/O; this module decides.

Per message::

    key None/""      -> run the handler, no dedup ("" also logs a warning)
    claim taken      -> run the handler -> True: mark CONSUMED, CONSUME_SUCCESS
                                        -> False/raises: release the claim, RECONSUME_LATER
    CONSUMED record  -> CONSUME_SUCCESS without the handler (a duplicate)
    CONSUMING record -> RECONSUME_LATER (the broker redelivers it later)
    store failure    -> the store_failure_policy: run without dedup, or RECONSUME_LATER
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.message import DedupElement, message_tag, message_topic, to_text
from rocketmq_dedup.status import ConsumeStatus, DedupStatus, StoreFailurePolicy
from rocketmq_dedup.stores.base import ClaimResult

logger = logging.getLogger(__name__)

KeyFunction = Callable[[Any], Any]
Handler = Callable[[Any], Any]


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


class _OwnerTokens:
    """Unique claim tokens: a random per-process prefix plus a counter (fork-safe)."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = f"{os.urandom(6).hex()}.{os.getpid()}."
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


new_owner_token = _OwnerTokens()


class _Claim:
    """One batch member's claim and whether its handler succeeded."""

    __slots__ = ("element", "owner", "result", "succeeded")

    def __init__(self, element: DedupElement, owner: str, result: ClaimResult) -> None:
        self.element = element
        self.owner = owner
        self.result = result
        self.succeeded = False


class _NoDedup(Exception):
    """The message is consumed without dedup (key None or empty)."""


_KEY_FAILED = object()  # marks a batch member whose dedup_message_key raised


class DedupStrategy:
    """Applies a :class:`DedupConfig` to messages; holds no per-message state."""

    def __init__(self, config: Optional[DedupConfig]) -> None:
        self.config = config

    # -- single message ------------------------------------------------------------------

    def consume(self, msg: Any, key_function: KeyFunction, handler: Handler) -> ConsumeStatus:
        """Dedup and handle one message; never raises."""
        config = self.config
        if config is None or not config.enabled:
            return _run(handler, msg)
        try:
            element = self.element(msg, key_function)
        except _NoDedup:
            return _run(handler, msg)
        except Exception:
            logger.exception("dedup_message_key failed; the message will be consumed later")
            return ConsumeStatus.RECONSUME_LATER
        assert config.persist is not None
        owner = new_owner_token()
        try:
            claim = config.persist.claim(element, owner, config.lease_ms)
        except StoreError as exc:
            if self._policy_consumes(exc, 1):
                return _run(handler, msg)
            return ConsumeStatus.RECONSUME_LATER
        if not claim.claimed:
            answer = _duplicate_status(element, claim)
            return _run(handler, msg) if answer is None else answer
        logger.debug("claimed %r as %s", element, owner)
        keeper = config.lease_keeper()
        if keeper is not None:
            keeper.hold([element], [owner])
        status = _run(handler, msg)
        if keeper is not None:
            keeper.drop([owner])
        if status is ConsumeStatus.CONSUME_SUCCESS:
            self._mark_consumed([element], [owner])
        else:
            self._release([element], [owner])
        return status

    # -- batch ---------------------------------------------------------------------------

    def consume_batch(
        self, msgs: Sequence[Any], key_function: KeyFunction, handler: Handler
    ) -> BatchResult:
        """Dedup and handle ``msgs`` in order, stopping at the first message that is not
        consumed (the Java listener's batch semantics). Never raises."""
        statuses = self.consume_each(msgs, key_function, handler, stop_at_failure=True)
        consumed = next(
            (i for i, s in enumerate(statuses) if s is not ConsumeStatus.CONSUME_SUCCESS),
            len(statuses),
        )
        status = (
            ConsumeStatus.CONSUME_SUCCESS
            if consumed == len(msgs)
            else ConsumeStatus.RECONSUME_LATER
        )
        return BatchResult(status, consumed - 1)

    def consume_each(
        self,
        msgs: Sequence[Any],
        key_function: KeyFunction,
        handler: Handler,
        stop_at_failure: bool = False,
    ) -> List[ConsumeStatus]:
        """Dedup and handle ``msgs`` in order; return each message's status. Claims, CONSUMED
        marks and releases take one store call each for the whole batch. With
        ``stop_at_failure`` the messages after the first one not consumed are not attempted
        (RECONSUME_LATER). Never raises."""
        config = self.config
        if config is None or not config.enabled:
            return _run_each(msgs, handler, stop_at_failure)
        assert config.persist is not None
        elements: List[Any] = []  # DedupElement, None (no dedup) or _KEY_FAILED
        for msg in msgs:
            try:
                elements.append(self.element(msg, key_function))
            except _NoDedup:
                elements.append(None)
            except Exception:
                logger.exception("dedup_message_key failed; the message will be consumed later")
                elements.append(_KEY_FAILED)
        keyed = [(i, e) for i, e in enumerate(elements) if isinstance(e, DedupElement)]
        owners = [new_owner_token() for _ in keyed]
        try:
            results = config.persist.claim_many([e for _, e in keyed], owners, config.lease_ms)
        except StoreError as exc:
            if self._policy_consumes(exc, len(keyed)):
                return _run_each(msgs, handler, stop_at_failure)
            return [ConsumeStatus.RECONSUME_LATER] * len(msgs)
        claims: Dict[int, _Claim] = {
            i: _Claim(e, o, r) for (i, e), o, r in zip(keyed, owners, results)
        }
        owned = [c for c in claims.values() if c.result.claimed]
        keeper = config.lease_keeper() if owned else None
        if keeper is not None:
            keeper.hold([c.element for c in owned], [c.owner for c in owned])

        statuses = [ConsumeStatus.RECONSUME_LATER] * len(msgs)
        for i, msg in enumerate(msgs):
            claim = claims.get(i)
            if elements[i] is _KEY_FAILED:
                status = ConsumeStatus.RECONSUME_LATER
            elif claim is not None and not claim.result.claimed:
                answer = _duplicate_status(claim.element, claim.result)
                status = _run(handler, msg) if answer is None else answer
            else:  # claimed, or no key: run the handler
                status = _run(handler, msg)
                if claim is not None:
                    claim.succeeded = status is ConsumeStatus.CONSUME_SUCCESS
            statuses[i] = status
            if stop_at_failure and status is not ConsumeStatus.CONSUME_SUCCESS:
                break

        if keeper is not None:
            keeper.drop([c.owner for c in owned])
        done = [c for c in owned if c.succeeded]
        if done:
            self._mark_consumed([c.element for c in done], [c.owner for c in done])
        unfinished = [c for c in owned if not c.succeeded]
        if unfinished:
            self._release([c.element for c in unfinished], [c.owner for c in unfinished])
        return statuses

    # -- helpers -------------------------------------------------------------------------

    def element(self, msg: Any, key_function: KeyFunction) -> DedupElement:
        """The dedup element of ``msg``; raises ``_NoDedup`` when its key is None or ""."""
        assert self.config is not None
        raw_key = key_function(msg)
        if raw_key is None:
            logger.debug("dedup key is None; consuming without dedup")
            raise _NoDedup
        key = to_text(raw_key)
        if not key:
            logger.warning(
                "dedup key is empty for a message of topic %r; consuming without dedup",
                message_topic(msg),
            )
            raise _NoDedup
        return DedupElement(self.config.application_name, message_topic(msg), message_tag(msg), key)

    def _policy_consumes(self, exc: StoreError, count: int) -> bool:
        assert self.config is not None
        if self.config.store_failure_policy is StoreFailurePolicy.CONSUME:
            logger.warning(
                "dedup store failed (%s); consuming %d message(s) WITHOUT dedup "
                "(store_failure_policy='consume')",
                exc,
                count,
            )
            return True
        logger.warning(
            "dedup store failed (%s); %d message(s) will be consumed later "
            "(store_failure_policy='reconsume_later')",
            exc,
            count,
        )
        return False

    def _mark_consumed(self, elements: List[DedupElement], owners: List[str]) -> None:
        assert self.config is not None and self.config.persist is not None
        try:
            self.config.persist.mark_consumed_many(elements, owners, self.config.retention_ms)
        except StoreError as exc:
            # The handler succeeded: ack anyway. The claim expires after the lease, and a
            # redelivery after that may run the handler again (at-least-once).
            logger.error(
                "handled %d message(s) but could not mark them CONSUMED (%s); acking anyway",
                len(elements),
                exc,
            )

    def _release(self, elements: List[DedupElement], owners: List[str]) -> None:
        assert self.config is not None and self.config.persist is not None
        try:
            released = self.config.persist.release_many(elements, owners)
        except StoreError as exc:
            # The retry finds the claim CONSUMING until the lease lapses, then runs.
            logger.error("could not release %d claim(s) (%s)", len(elements), exc)
            return
        if released < len(elements):
            logger.info(
                "%d of %d claim(s) had already expired and were taken over; left untouched",
                len(elements) - released,
                len(elements),
            )


def _run(handler: Handler, msg: Any) -> ConsumeStatus:
    """Call the user's handler; True means success. Never raises."""
    try:
        result = handler(msg)
    except Exception:
        logger.exception("do_handle_msg raised; the message will be consumed later")
        return ConsumeStatus.RECONSUME_LATER
    if result is True:
        return ConsumeStatus.CONSUME_SUCCESS
    if result is None:
        logger.warning("do_handle_msg returned None; return True on success, False to retry")
    elif result:
        return ConsumeStatus.CONSUME_SUCCESS
    return ConsumeStatus.RECONSUME_LATER


def _duplicate_status(element: DedupElement, claim: ClaimResult) -> Optional[ConsumeStatus]:
    """The answer for a message whose claim was refused; None means "run the handler without
    dedup" (a record this library cannot read, as the Java original does)."""
    if claim.status is DedupStatus.CONSUMED:
        logger.debug("%r already consumed; acking the duplicate", element)
        return ConsumeStatus.CONSUME_SUCCESS
    if claim.status is DedupStatus.CONSUMING:
        logger.debug("%r is being consumed elsewhere; consume later", element)
        return ConsumeStatus.RECONSUME_LATER
    logger.warning("%r has a record this library cannot read; consuming without dedup", element)
    return None


def _run_each(msgs: Sequence[Any], handler: Handler, stop_at_failure: bool) -> List[ConsumeStatus]:
    statuses = [ConsumeStatus.RECONSUME_LATER] * len(msgs)
    for i, msg in enumerate(msgs):
        statuses[i] = _run(handler, msg)
        if stop_at_failure and statuses[i] is not ConsumeStatus.CONSUME_SUCCESS:
            break
    return statuses
