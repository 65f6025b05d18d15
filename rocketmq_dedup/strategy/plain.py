"""The dedup decisions of :class:`~rocketmq_dedup.DedupConcurrentListener`. Per message::

    key None/""          -> run the handler, no dedup ("" also logs a warning)
    key refused/raised   -> RECONSUME_LATER, an ERROR logged (never keyed by accident)
    claim taken          -> run the handler -> success: mark CONSUMED, CONSUME_SUCCESS
                                            -> retry/raises: release the claim, RECONSUME_LATER
                            (after ``local_retries`` more runs in place, if configured)
                                            -> PermanentFailure: record FAILED with its reason;
                                               answer as ``permanent_failure`` says (no retry)
    claim taken after    -> park it: record FAILED ("its handler ended N consumers"), the
    max_lapsed_claims       handler not run; answer as ``permanent_failure`` says
    lapsed claims
    CONSUMED record      -> CONSUME_SUCCESS without the handler (a duplicate)
    FAILED record        -> as ``permanent_failure`` says, without the handler: RECONSUME_LATER
                            ("dlq", the default) or CONSUME_SUCCESS ("ack")
    CONSUMING record     -> RECONSUME_LATER (the broker redelivers it later); when its holder
                            runs in this process and ``in_progress_wait_milli_seconds`` is set,
                            answered from that holder's outcome if it ends within the wait
    unreadable record    -> run the handler without dedup, a WARNING logged
    store unavailable    -> the store_failure_policy: run without dedup, or RECONSUME_LATER
    store refused        -> RECONSUME_LATER, an ERROR naming the fix (a missing privilege or
                            ACL rule, a read-only server: never an outage, whatever the policy)
    store error (a bug)  -> RECONSUME_LATER, an ERROR logged

A batch (the template's :meth:`~DedupTemplate.consume`) makes one store call per phase (claim,
mark, release) for all its messages. One message (:meth:`ClaimStrategy.consume_one`, each
classic-client callback) takes the same steps without the batch's lists, through the store's
single-claim calls: key, :meth:`~ClaimStrategy._claim_one`, :meth:`~ClaimStrategy._run` and
:meth:`~ClaimStrategy._settle_one`.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, List, Optional, Sequence

from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import PermanentFailure, StoreError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.inflight import InFlight, in_flight
from rocketmq_dedup.lease import LeaseKeeper, RenewalCallback
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.owner import owner_tokens, with_fingerprint
from rocketmq_dedup.status import ConsumeStatus, DedupStatus, Outcome
from rocketmq_dedup.stores.base import CLAIMED, Claim, Record, new_claim
from rocketmq_dedup.strategy.base import DedupTemplate, Delivery, retry_locally
from rocketmq_dedup.strategy.rules import LATER, SUCCESS, run_handler

logger = logging.getLogger(__name__)

#: The outcome of a claimed message, by its handler's answer.
HANDLED_OUTCOMES = {SUCCESS: Outcome.CONSUMED, LATER: Outcome.FAILED}


class ClaimStrategy(DedupTemplate):
    """Claim, handler, then CONSUMED or release (module docstring); holds no per-message
    state."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        self._keeper: Optional[LeaseKeeper] = None
        self._keeper_lock = threading.Lock()
        self._in_flight: InFlight = in_flight(self.store)

    # -- one message ---------------------------------------------------------------------

    def consume_one(self, msg: Any) -> ConsumeStatus:
        """One message: the template's steps for a batch of one, without its lists; its store
        calls are timed with it and reported with its decision (the snapshot's meter). The
        in-process wait takes the batch path: it needs the in-flight registry."""
        snap = self.config.snapshot()
        if snap.in_progress_wait_ms:
            return self.consume((msg,))[0]
        delivery = Delivery(0, msg, snap.meter.arrival())
        try:
            if self._key(delivery, snap):
                self._claim_one(delivery, snap)
            status = delivery.status  # decided without the handler (a parked one still held)
            try:
                if status is None:
                    status = LATER
                    status = self._run(delivery, snap)
            finally:  # whatever happened, the claim is not held past this call
                claim = delivery.claim
                if claim is not None:
                    self._settle_one(delivery, claim, status is SUCCESS, snap)
            return status
        finally:
            snap.meter.report_one(delivery)

    def _claim_one(self, delivery: Delivery, snap: Snapshot) -> None:
        """:meth:`_claim` of one keyed delivery, with the store's single claim: held
        (``delivery.claim``), decided (``delivery.status``: :meth:`_duplicate_status`), or to
        run without dedup."""
        claim = _new_claim(delivery)
        try:
            result = snap.meter.claim(delivery, self.store, claim, snap.lease_ms)
        except StoreError as exc:
            self._store_failed([delivery], exc, snap)
            return
        if not result.claimed:  # (no in-process wait on this path: see consume_one)
            delivery.status = self._duplicate_status(delivery, result.record, snap)
            return
        delivery.claim = claim
        if result is not CLAIMED and result.lapsed and self._park(delivery, result.lapsed, snap):
            return  # held, to be recorded FAILED; its handler does not run
        if snap.lease_renewal:
            keeper = self._keeper or self._lease_keeper(snap)
            if keeper is not None:
                keeper.hold_one(claim, snap.lease_ms, snap.max_processing_ms)

    def _settle_one(self, delivery: Delivery, claim: Claim, consumed: bool, snap: Snapshot) -> None:
        """:meth:`_finish` of one held delivery: FAILED if it can never succeed, CONSUMED if
        its handler succeeded, else its claim released. Never raises a StoreError."""
        if self._keeper is not None:
            self._keeper.drop_one(claim)
        if delivery.failure is not None:
            self._record_failed(delivery, claim, snap)
            return
        if consumed:
            try:
                snap.meter.mark_consumed(delivery, self.store, claim, snap.retention_ms)
            except StoreError as exc:
                self._mark_failed(1, exc)
            return
        try:
            released = snap.meter.release(delivery, self.store, claim)
        except StoreError as exc:
            self._release_failed(1, exc)
            return
        self._released(1, int(released))

    # -- a batch: claim ------------------------------------------------------------------

    def _claim(self, keyed: List[Delivery], snap: Snapshot) -> List[Delivery]:
        """Claim every keyed delivery in one store call; decide the answer of those not
        claimed; return the ones this call holds."""
        claims = [_new_claim(d) for d in keyed]
        try:
            results = self._store_call(
                snap, StoreOp.CLAIM, self.store.claim_many, claims, snap.lease_ms
            )
        except StoreError as exc:
            self._store_failed(keyed, exc, snap)
            return []
        held, running = [], []
        for delivery, claim, result in zip(keyed, claims, results, strict=True):
            if result.claimed:
                delivery.claim = claim
                held.append(delivery)
                if not (result.lapsed and self._park(delivery, result.lapsed, snap)):
                    running.append(delivery)
            else:
                delivery.status = self._refused(delivery, result.record, snap)
        if running:
            self._hold(running, snap)
        return held

    def _hold(self, held: List[Delivery], snap: Snapshot) -> None:
        """The held deliveries enter the in-process registry (with the in-process wait) and
        the lease keeper."""
        if snap.in_progress_wait_ms:
            for delivery in held:
                owner = delivery.claim.owner  # type: ignore[union-attr]
                delivery.attempt, _ = self._in_flight.enter(owner, snap.hold_ms)
        keeper = self._lease_keeper(snap)
        if keeper is not None:
            keeper.hold([d.claim for d in held], snap.lease_ms, snap.max_processing_ms)  # type: ignore[misc]

    def _refused(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> Optional[ConsumeStatus]:
        """A claim refused by ``record``; a twin in its handler in this process is waited for
        (``in_progress_wait_milli_seconds``) and the answer taken from its outcome."""
        if (
            snap.in_progress_wait_ms
            and record is not None
            and record.status is DedupStatus.CONSUMING
            and record.owner is not None
        ):
            twin = self._in_flight.get(record.owner)
            if twin is not None:
                consumed = self._in_flight.wait(twin, snap.in_progress_wait_ms)
                if consumed:
                    record = record._replace(status=DedupStatus.CONSUMED)
        return self._duplicate_status(delivery, record, snap)

    # -- run -----------------------------------------------------------------------------

    def _run(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        """The handler (and its local retries, the claim still held), timed by the meter."""
        msg, clock = delivery.msg, snap.meter.clock
        begin = clock()
        result = run_handler(self.hooks.listener.do_handle_msg, msg)
        if result is not SUCCESS and snap.local_retries:
            result = retry_locally(
                lambda: run_handler(self.hooks.listener.do_handle_msg, msg), snap, result
            )
        delivery.handler_seconds = clock() - begin
        if isinstance(result, PermanentFailure):  # (without a claim: nothing to record it in)
            return self._permanent_failure(delivery, result, snap)
        if delivery.claim is not None:
            delivery.outcome = HANDLED_OUTCOMES[result]
        return result

    # -- a batch: finish -----------------------------------------------------------------

    def _finish(self, held: List[Delivery], statuses: List[ConsumeStatus], snap: Snapshot) -> None:
        """Mark the claims whose handler succeeded CONSUMED; release the others (failed, not
        reached, or interrupted). Never raises a StoreError."""
        if self._keeper is not None:
            self._keeper.drop([d.claim for d in held])  # type: ignore[misc]
        reached = len(statuses)
        failed = [d for d in held if d.failure is not None]
        for delivery in failed:  # rare: one store call each, for its own reason
            self._record_failed(delivery, delivery.claim, snap)  # type: ignore[arg-type]
        consumed = [
            d.position < reached and statuses[d.position] is SUCCESS and d.failure is None
            for d in held
        ]
        done = [d.claim for d, ok in zip(held, consumed, strict=True) if ok]
        undone = [
            d.claim for d, ok in zip(held, consumed, strict=True) if not ok and d.failure is None
        ]
        if done:
            self._mark(done, snap)  # type: ignore[arg-type]
        if undone:
            self._release(undone, snap)  # type: ignore[arg-type]
        for delivery, ok in zip(held, consumed, strict=True):  # a waiting twin finds it settled
            if delivery.attempt is not None:
                owner = delivery.claim.owner  # type: ignore[union-attr]
                self._in_flight.leave(owner, delivery.attempt, ok)

    def _mark(self, claims: Sequence[Claim], snap: Snapshot) -> None:
        """Record the claims CONSUMED; a failure is logged, and the messages acked anyway."""
        try:
            self._store_call(
                snap,
                StoreOp.MARK_CONSUMED,
                self.store.mark_consumed_many,
                claims,
                snap.retention_ms,
            )
        except StoreError as exc:
            self._mark_failed(len(claims), exc)

    def _release(self, claims: Sequence[Claim], snap: Snapshot) -> None:
        """Release the claims, so that the broker's retry runs their messages again."""
        try:
            released = self._store_call(snap, StoreOp.RELEASE, self.store.release_many, claims)
        except StoreError as exc:
            self._release_failed(len(claims), exc)
            return
        self._released(len(claims), released)

    def _record_failed(self, delivery: Delivery, claim: Claim, snap: Snapshot) -> None:
        """Record a held delivery FAILED with its reason (a permanent failure, a parked poison
        message); a failure is logged, the answer stays (the claim lapses after its lease, and
        a redelivery after that decides again: a poison message's lapsed claim counts)."""
        try:
            snap.meter.kept(
                delivery,
                StoreOp.MARK_FAILED,
                self.store.mark_failed,
                claim,
                snap.retention_ms,
                delivery.failure,
            )
        except StoreError as exc:
            self._log.log(
                logging.ERROR,
                "%r can never succeed (%s) but could not be recorded FAILED (%s); its claim "
                "lapses after its lease",
                delivery.element,
                delivery.failure,
                exc,
            )

    def _mark_failed(self, count: int, exc: StoreError) -> None:
        """Marking CONSUMED failed after the handler succeeded: acked anyway (the claim lapses
        after the lease, and a redelivery after that may run the handler again)."""
        self._log.log(
            logging.ERROR,
            "handled %d message(s) but could not mark them CONSUMED (%s); acking anyway",
            count,
            exc,
        )

    def _release_failed(self, count: int, exc: StoreError) -> None:
        """The retry finds the claims CONSUMING until their lease lapses, then runs."""
        self._log.log(logging.ERROR, "could not release %d claim(s) (%s)", count, exc)

    @staticmethod
    def _released(count: int, released: int) -> None:
        if released < count:
            logger.info(
                "%d of %d claim(s) had already expired and were taken over; left untouched",
                count - released,
                count,
            )

    # -- lease keeper --------------------------------------------------------------------

    def _lease_keeper(self, snap: Snapshot) -> Optional[LeaseKeeper]:
        """The keeper, or None when renewal is off or the store cannot renew."""
        if not (snap.lease_renewal and self.store.supports_renewal):
            return None
        keeper = self._keeper
        if keeper is None:
            with self._keeper_lock:
                keeper = self._keeper
                if keeper is None:
                    keeper = self._keeper = LeaseKeeper(self.store, self._renewal_callback())
        return keeper

    def _renewal_callback(self) -> RenewalCallback:
        """The keeper's report callback; a weak reference, so the keeper (and its thread) never
        keep this strategy alive."""
        ref = weakref.ref(self)

        def report(renewed: int, lost: int, seconds: float, ok: bool) -> None:
            strategy = ref()
            if strategy is not None:
                strategy.config.snapshot().meter.leases(renewed, lost, seconds, ok)

        return report

    def close(self) -> None:
        with self._keeper_lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()


def _new_claim(delivery: Delivery) -> Claim:
    """A claim of a keyed delivery's element by a new owner token (carrying the payload's
    fingerprint, if any)."""
    owner = owner_tokens.next()
    if delivery.fingerprint is not None:
        owner = with_fingerprint(owner, delivery.fingerprint)
    element: DedupElement = delivery.element  # type: ignore[assignment]  # (keyed)
    return new_claim(element, owner)


__all__ = ["LATER", "SUCCESS", "ClaimStrategy"]
