"""The dedup decisions of :class:`~rocketmq_dedup.DedupConcurrentListener`. Per message::

    key None/""          -> run the handler, no dedup ("" also logs a warning)
    key refused/raised   -> RECONSUME_LATER, an ERROR logged (never keyed by accident)
    claim taken          -> run the handler -> success: mark CONSUMED, CONSUME_SUCCESS
                                            -> retry/raises: release the claim, RECONSUME_LATER
                            (after ``local_retries`` more runs in place, if configured)
    CONSUMED record      -> CONSUME_SUCCESS without the handler (a duplicate)
    CONSUMING record     -> RECONSUME_LATER (the broker redelivers it later); when its holder
                            runs in this process and ``in_progress_wait_milli_seconds`` is set,
                            answered from that holder's outcome if it ends within the wait
    store unavailable    -> the store_failure_policy: run without dedup, or RECONSUME_LATER
    store error (a bug)  -> RECONSUME_LATER, an ERROR logged

A batch makes one store call per phase (claim, mark, release) for all its messages.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, List, Optional, Sequence

from rocketmq_dedup.config import DedupConfig, Snapshot
from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.inflight import InFlight, in_flight
from rocketmq_dedup.lease import LeaseKeeper, RenewalCallback
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.owner import owner_tokens, with_fingerprint
from rocketmq_dedup.status import ConsumeStatus, DedupStatus, Outcome
from rocketmq_dedup.stores.base import Claim, Record
from rocketmq_dedup.strategy.base import DedupTemplate, Delivery, retry_locally
from rocketmq_dedup.strategy.rules import LATER, SUCCESS, run_handler

logger = logging.getLogger(__name__)


class DedupStrategy(DedupTemplate):
    """Claim, handler, then CONSUMED or release (module docstring); holds no per-message
    state."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        self._keeper: Optional[LeaseKeeper] = None
        self._keeper_lock = threading.Lock()
        self._in_flight: InFlight = in_flight(self.store)

    # -- claim ---------------------------------------------------------------------------

    def consume_one(self, msg: Any) -> ConsumeStatus:
        """One message (every classic-client callback): the template's steps in one frame,
        without its batch bookkeeping (the in-process wait takes the batch path). With
        metrics, as few clock reads as the steps allow (the end of one timing is the start of
        the next), and a handled message's reports in one call."""
        config = self.config
        snap = config._snapshot or config.snapshot()
        if snap.in_progress_wait_ms:
            return self.consume((msg,))[0]
        delivery = Delivery(0, msg)
        metrics = snap.metrics
        started = 0
        if metrics is not None and snap.metrics_start_time:
            delivery.started = started = time.time_ns()
        report = metrics is not None  # the decision, by the finally below (unless reported)
        try:
            if not self._key(delivery, snap):  # no dedup, or a refused key
                return delivery.status or self._run(delivery, snap)
            owner = owner_tokens.next()  # _new_claim, inlined
            if delivery.fingerprint is not None:
                owner = with_fingerprint(owner, delivery.fingerprint)
            claim = Claim(delivery.element, owner)  # type: ignore[arg-type]
            store = self.store
            began = time.perf_counter() if metrics is not None else 0.0
            try:
                result = store.claim(claim, snap.lease_ms)
            except StoreError as exc:
                if metrics is not None:
                    self._time_store_call(
                        metrics, snap, StoreOp.CLAIM, time.perf_counter() - began, False
                    )
                self._store_failed([delivery], exc, snap)
                return delivery.status or self._run(delivery, snap)
            claimed = time.perf_counter() if metrics is not None else 0.0
            if not result.claimed:  # (no in-process wait on this path: _refused's is moot)
                if metrics is not None:
                    self._time_store_call(metrics, snap, StoreOp.CLAIM, claimed - began, True)
                status = self._duplicate_status(delivery, result.record, snap)
                return self._run(delivery, snap) if status is None else status
            keeper = (self._keeper or self._lease_keeper(snap)) if snap.lease_renewal else None
            if keeper is not None:
                keeper.hold_one(claim, snap.lease_ms, snap.max_processing_ms)
            status = LATER
            try:  # _run, inlined
                status = run_handler(self.hooks.listener.do_handle_msg, msg)
                if status is not SUCCESS and snap.local_retries:
                    status = self._retry_locally(msg, snap, status)
            finally:  # whatever happened, the claim is not held past this call
                handled = time.perf_counter() if metrics is not None else 0.0
                if keeper is not None:
                    keeper.drop_one(claim)
                if status is SUCCESS:
                    try:
                        store.mark_consumed(claim, snap.retention_ms)
                    except StoreError as exc:
                        self._mark_failed(1, exc)
                        if metrics is not None:
                            self._time_store_call(
                                metrics, snap, StoreOp.CLAIM, claimed - began, True
                            )
                            seconds = time.perf_counter() - handled
                            self._time_store_call(
                                metrics, snap, StoreOp.MARK_CONSUMED, seconds, False
                            )
                            delivery.outcome = Outcome.CONSUMED
                            delivery.handler_seconds = handled - claimed
                    else:
                        if metrics is not None:  # the common case: its three reports at once
                            marked = time.perf_counter()
                            report = False  # reported here, with its store calls
                            try:
                                snap.metrics_handled(  # type: ignore[misc]
                                    snap.application_name,
                                    claim[0].topic,
                                    msg,
                                    started,
                                    handled - claimed,
                                    claimed - began,
                                    marked - handled,
                                )
                            except Exception:
                                self._metrics_failed()
                else:
                    if metrics is not None:
                        self._time_store_call(metrics, snap, StoreOp.CLAIM, claimed - began, True)
                        delivery.outcome = Outcome.FAILED
                        delivery.handler_seconds = handled - claimed
                    self._release_claims((claim,), snap)
            return status
        finally:
            if report and metrics is not None and delivery.outcome is not None:
                self._decided(metrics, snap, delivery, started)

    def _claim(self, keyed: List[Delivery], snap: Snapshot) -> List[Delivery]:
        """Claim every keyed delivery in one store call; decide the answer of those not
        claimed; return the ones this call holds."""
        claims = [self._new_claim(d) for d in keyed]
        try:
            results = self._store_call(
                snap, StoreOp.CLAIM, self.store.claim_many, claims, snap.lease_ms
            )
        except StoreError as exc:
            self._store_failed(keyed, exc, snap)
            return []
        held = []
        for delivery, claim, result in zip(keyed, claims, results, strict=True):
            if result.claimed:
                delivery.claim = claim
                held.append(delivery)
            else:
                delivery.status = self._refused(delivery, result.record, snap)
        if held:
            if snap.in_progress_wait_ms:
                for delivery in held:
                    owner = delivery.claim.owner  # type: ignore[union-attr]
                    delivery.attempt, _ = self._in_flight.enter(owner, snap.hold_ms)
            keeper = self._lease_keeper(snap)
            if keeper is not None:
                keeper.hold([d.claim for d in held], snap.lease_ms, snap.max_processing_ms)  # type: ignore[misc]
        return held

    @staticmethod
    def _new_claim(delivery: Delivery) -> Claim:
        """A claim of the delivery's element by a new owner token (carrying the payload's
        fingerprint, if any)."""
        owner = owner_tokens.next()
        if delivery.fingerprint is not None:
            owner = with_fingerprint(owner, delivery.fingerprint)
        return Claim(delivery.element, owner)  # type: ignore[arg-type]

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
        msg = delivery.msg
        begin = time.perf_counter() if snap.metrics is not None else 0.0
        status = run_handler(self.hooks.listener.do_handle_msg, msg)
        if status is not SUCCESS and snap.local_retries:
            status = self._retry_locally(msg, snap, status)
        if snap.metrics is not None:
            delivery.handler_seconds = time.perf_counter() - begin
        if delivery.claim is not None:
            delivery.outcome = Outcome.CONSUMED if status is SUCCESS else Outcome.FAILED
        return status

    def _retry_locally(self, msg: Any, snap: Snapshot, status: ConsumeStatus) -> ConsumeStatus:
        """``local_retries`` more runs of the handler, the claim still held."""
        return retry_locally(
            lambda: run_handler(self.hooks.listener.do_handle_msg, msg), snap, status
        )

    # -- finish --------------------------------------------------------------------------

    def _finish(self, held: List[Delivery], statuses: List[ConsumeStatus], snap: Snapshot) -> None:
        """Mark the claims whose handler succeeded CONSUMED; release the others (failed, not
        reached, or interrupted). Never raises a StoreError."""
        keeper = self._keeper
        if keeper is not None:
            keeper.drop([d.claim for d in held])  # type: ignore[misc]
        reached = len(statuses)
        done: List[Delivery] = []
        undone: List[Delivery] = []
        for delivery in held:
            ok = delivery.position < reached and statuses[delivery.position] is SUCCESS
            (done if ok else undone).append(delivery)
        if done:
            self._mark([d.claim for d in done], snap)  # type: ignore[misc]
        if undone:
            self._release_claims([d.claim for d in undone], snap)  # type: ignore[misc]
        for delivery in held:
            attempt = delivery.attempt
            if attempt is not None:
                owner = delivery.claim.owner  # type: ignore[union-attr]
                consumed = delivery.position < reached and statuses[delivery.position] is SUCCESS
                self._in_flight.leave(owner, attempt, consumed)

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

    def _mark_failed(self, count: int, exc: StoreError) -> None:
        """Marking CONSUMED failed after the handler succeeded: acked anyway (the claim lapses
        after the lease, and a redelivery after that may run the handler again)."""
        self._log.log(
            logging.ERROR,
            "handled %d message(s) but could not mark them CONSUMED (%s); acking anyway",
            count,
            exc,
        )

    def _release_claims(self, claims: Sequence[Claim], snap: Snapshot) -> None:
        try:
            released = self._store_call(snap, StoreOp.RELEASE, self.store.release_many, claims)
        except StoreError as exc:
            # The retry finds the claim CONSUMING until the lease lapses, then runs.
            self._log.log(logging.ERROR, "could not release %d claim(s) (%s)", len(claims), exc)
            return
        if released < len(claims):
            logger.info(
                "%d of %d claim(s) had already expired and were taken over; left untouched",
                len(claims) - released,
                len(claims),
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
                strategy._on_renewal(renewed, lost, seconds, ok)

        return report

    def _on_renewal(self, renewed: int, lost: int, seconds: float, ok: bool) -> None:
        snap = self.config.snapshot()
        metrics = snap.metrics
        if metrics is not None:
            try:
                metrics.store_operation(snap.application_name, StoreOp.RENEW, seconds, ok)
                metrics.leases(snap.application_name, renewed, lost)
            except Exception:
                self._metrics_failed()

    def close(self) -> None:
        with self._keeper_lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()


__all__ = ["LATER", "SUCCESS", "DedupStrategy"]
