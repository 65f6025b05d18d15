"""The exactly-once decisions of :class:`~rocketmq_dedup.TransactionalDedupListener`: the
handler's writes and the dedup record commit in one transaction. The I/O is the store's
transaction port (:mod:`rocketmq_dedup.stores.transaction`; MySQL's is
:class:`~rocketmq_dedup.stores.mysql.transaction.MySQLTransactions`, PostgreSQL's
:class:`~rocketmq_dedup.stores.postgres.transaction.PostgresTransactions`), so the decisions are
tested without a server. The decisions that do no I/O (:class:`TransactionDecisions`) are shared
with the asyncio strategy of :func:`~rocketmq_dedup.exactly_once` over an ``async def``
(:class:`~rocketmq_dedup.once.strategy.AsyncCallTransactionStrategy`), which awaits the same
steps on the asyncio port (:class:`~rocketmq_dedup.stores.transaction.AsyncTransaction`).

Per message, with ``exactly_once_claim="at_commit"`` (the default)::

    twin in its handler in this process  -> RECONSUME_LATER at once (or, with
                                            in_progress_wait_milli_seconds, its outcome)
    a redelivery, or a key this process   -> its record is looked up first (one round trip):
    committed lately                         CONSUMED -> acked without the handler
    otherwise                             -> one transaction: [sequence guard], the handler,
                                            then the record's INSERT with the COMMIT (one
                                            round trip). The key refuses a second record:
                                            a copy that committed first wins, the other is
                                            rolled back and acked as its duplicate.

With ``"before_handler"`` the transaction starts with the key's lock, taken without waiting,
and only then the look-up of its record (one round trip on a connection that takes several
statements; the entity's sequence row, if any, is locked between the two): a lock another
session holds -> RECONSUME_LATER at once, whatever locks that copy's transaction holds; a
CONSUMED record -> acked; else the handler runs holding the lock, which the COMMIT's round trip
frees. Lock first, then read: a copy that committed and freed the lock is always seen.

A handler that raises (or returns) :class:`~rocketmq_dedup.errors.PermanentFailure`: its writes
are rolled back and the FAILED record, with the reason, is committed alone on the same
connection (the port's ``commit_failure``; a key lock taken before the handler is held until
that commit), and the message is answered as ``permanent_failure`` says; a copy finds the FAILED
record and is answered the same way. The entity's sequence number does not move (the step was
not applied: the steps after it wait). A handler that kills its process leaves no record here
(the server rolls the transaction back), so ``max_lapsed_claims`` has nothing to count in this
mode.

Never "consume without dedup": a store outage, a lock conflict (outcome ``lock_conflict``), a
refused record this library cannot read, a sequence key that fails are all RECONSUME_LATER. A
handler that ends, leaves or breaks its transaction (``commit()``, autocommit, a reconnect) is
rolled back and its message retried.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Any, List, Optional, Set, Tuple, Union, cast

from rocketmq_dedup.config import DedupConfig, Snapshot, fits_bigint
from rocketmq_dedup.errors import (
    DedupConfigError,
    PermanentFailure,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
    TransactionMisuseError,
)
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.inflight import InFlight, in_flight
from rocketmq_dedup.message import DedupElement, reconsume_times
from rocketmq_dedup.metrics import StoreOp
from rocketmq_dedup.owner import owner_tokens, with_fingerprint
from rocketmq_dedup.status import (
    ConsumeStatus,
    DedupStatus,
    ExactlyOnceClaim,
    Outcome,
    SequenceMode,
)
from rocketmq_dedup.stores.base import DedupStore, Record
from rocketmq_dedup.stores.transaction import (
    AsyncTransaction,
    Entity,
    SequenceStep,
    Transaction,
    TransactionSource,
    running_transaction,
)
from rocketmq_dedup.strategy.base import DedupDecisions, DedupTemplate, Delivery, retry_locally
from rocketmq_dedup.strategy.rules import LATER, SUCCESS, answer

logger = logging.getLogger(__name__)

#: How many keys committed by this process are remembered at least (a duplicate of one is
#: looked up before its handler runs): between this many and twice as many.
RECENT_KEYS = 4096


class RecentKeys:
    """The keys this process committed lately, in two generations: a key joins the newer; when
    that holds :data:`RECENT_KEYS`, it becomes the older and the older is dropped. So the last
    :data:`RECENT_KEYS` keys at least are remembered, and adding one is a set's ``add`` (the
    lock is taken once per generation, not per key: an ``OrderedDict`` trimmed under a lock
    cost 0.3 us a message more). Thread-safe: a key added while the generations turn over may
    be forgotten, which costs its duplicate a transaction rolled back (its record refuses it),
    never a second commit."""

    __slots__ = ("_lock", "_newer", "_older")

    def __init__(self) -> None:
        self._newer: Set[DedupElement] = set()
        self._older: Set[DedupElement] = set()
        self._lock = threading.Lock()

    def __contains__(self, element: Optional[DedupElement]) -> bool:
        return element in self._newer or element in self._older

    def add(self, element: DedupElement) -> None:
        newer = self._newer
        newer.add(element)
        if len(newer) >= RECENT_KEYS:
            with self._lock:
                if self._newer is newer:
                    self._older, self._newer = newer, set()


class _Bad(enum.Enum):
    """``sequence_key`` failed (logged): the message is retried later."""

    BAD = "bad"


class _Verdict(enum.Enum):
    RUN = "run"
    STALE = "stale"  # ack without the handler
    GAP = "gap"  # strict only: RECONSUME_LATER without the handler


SequenceKey = Union[None, Tuple[str, int], _Bad]


def transactions_of(store: DedupStore) -> Optional[TransactionSource]:
    """The store's transaction port, if it supports the exactly-once mode."""
    transactions = getattr(store, "transactions", None)
    return transactions if isinstance(transactions, TransactionSource) else None


def hold_seconds(snap: Snapshot) -> int:
    """How long the server keeps an idle transaction's session (whole seconds, at least 1):
    the hold, so a frozen consumer holds its locks no longer."""
    return max(1, -(-snap.hold_ms // 1000))


class TransactionDecisions(DedupDecisions):
    """The exactly-once decisions that do no I/O, shared by the sync strategy and the asyncio
    one of :func:`~rocketmq_dedup.exactly_once` (which await the same steps): what a refusing
    record, a failed statement, a misused transaction, a handler's answer and a commit's
    answer mean, and what this process remembers (its attempts in flight, its keys committed
    lately)."""

    def __init__(self, config: DedupConfig, hooks: Hooks, store: Any) -> None:
        DedupDecisions.__init__(self, config, hooks)
        self._in_flight: InFlight = in_flight(store)
        self._recent = RecentKeys()

    def _suspect(self, delivery: Delivery) -> bool:
        """Whether a held attempt is likely a duplicate (a redelivery, a key committed here
        lately): its record is looked up before its transaction."""
        return reconsume_times(delivery.msg) > 0 or delivery.element in self._recent

    def _twin_answer(self, delivery: Delivery, consumed: Optional[bool], snap: Snapshot) -> None:
        """A twin in its handler in this process: answered from its outcome (``consumed``;
        None when it still runs)."""
        status = DedupStatus.CONSUMED if consumed else DedupStatus.CONSUMING
        delivery.status = self._duplicate(delivery, status, snap)

    def _owner(self, delivery: Delivery) -> str:
        """A new owner token for the record a transaction commits (with the payload's
        fingerprint, if any)."""
        owner = owner_tokens.next()
        if delivery.fingerprint is not None:
            owner = with_fingerprint(owner, delivery.fingerprint)
        return owner

    def _handler_status(self, delivery: Delivery, result: Any) -> ConsumeStatus:
        """The answer of a handler that returned ``result`` on an intact transaction."""
        status = SUCCESS if result is True else answer(result, commit=True)
        if status is not SUCCESS:
            delivery.outcome = Outcome.FAILED
        return status

    def _record_committed(
        self,
        delivery: Delivery,
        tx: Any,
        element: DedupElement,
        refused: Optional[Record],
        stale: bool,
        snap: Snapshot,
    ) -> ConsumeStatus:
        """What the COMMIT with the CONSUMED record answered: ``refused``, the live record of
        another attempt that refused it (this one rolled back: answered as its duplicate), or
        None: committed (``stale``: a sequence step already applied, acked as a duplicate)."""
        if refused is not None:
            logger.info("%r was recorded by another attempt; rolled back", element)
            return self._refused(delivery, refused, snap)
        self._after_commit(tx)
        self._remember(element)
        if stale:
            return self._duplicate(delivery, DedupStatus.CONSUMED, snap)
        delivery.outcome = Outcome.CONSUMED
        return SUCCESS

    def _found_after_failure(
        self, delivery: Delivery, record: Optional[Record], snap: Snapshot
    ) -> ConsumeStatus:
        """After a transaction failed, the key's record (read again): another copy committed
        (or this one did, its COMMIT's answer lost): a duplicate; none, or still CONSUMING:
        RECONSUME_LATER."""
        if record is None or record.status is DedupStatus.CONSUMING:
            return LATER
        return self._refused(delivery, record, snap)

    def _refused(self, delivery: Delivery, record: Record, snap: Snapshot) -> ConsumeStatus:
        """The answer for a message whose key has another attempt's record: never "run
        without dedup" here, so an unreadable record is RECONSUME_LATER."""
        status = self._duplicate_status(delivery, record, snap)
        if status is None:
            delivery.outcome = Outcome.STORE_ERROR_LATER
            return LATER
        return status

    _OUTAGE_LATER_REASON = (
        "the exactly-once mode never consumes without its database, whatever "
        "store_failure_policy says"
    )

    def _outage_runs_without_dedup(self, snap: Snapshot) -> bool:
        """Never: the handler needs the database the store is on (every store failure is
        RECONSUME_LATER, whatever ``store_failure_policy`` says)."""
        return False

    def _misused(self, delivery: Delivery, what: str) -> ConsumeStatus:
        """The handler ended, left or broke its transaction: rolled back, never reused, and
        the message consumed later."""
        self._log.log(
            logging.ERROR,
            "%s; the transaction was rolled back and the message will be consumed later "
            "(return True to commit, False or raise to roll back)",
            what,
        )
        delivery.outcome = Outcome.FAILED
        return LATER

    def _transaction_failed(self, delivery: Delivery, exc: StoreError) -> None:
        """A statement of the dedup layer failed: logged as what it is (an outage, a lock
        conflict, a refusal a person must fix, a defect); the message is consumed later."""
        if isinstance(exc, StoreLockConflictError):
            delivery.outcome = Outcome.LOCK_CONFLICT
            self._log.log(
                logging.WARNING,
                "a lock wait timed out or a deadlock was broken in the message's transaction "
                "(%s): another copy or another step of its entity held the lock; rolled back, "
                "the message will be consumed later",
                exc,
            )
            return
        if isinstance(exc, StoreMisconfiguredError):
            delivery.outcome = Outcome.STORE_MISCONFIGURED
            self._log.log(
                logging.ERROR,
                "the database refused the message's transaction: %s; rolled back, the message "
                "will be consumed later (a configuration a person must fix, not an outage)",
                exc,
            )
            return
        delivery.outcome = Outcome.STORE_ERROR_LATER
        if isinstance(exc, StoreUnavailableError):
            self._log.log(
                logging.WARNING,
                "the business database is unavailable (%s); the message will be consumed later "
                "(the exactly-once mode never consumes without it)",
                exc,
            )
        else:
            self._log.log(
                logging.ERROR,
                "the message's transaction failed (%s); rolled back, consume later",
                exc,
                exc_info=exc,
            )

    def _after_commit(self, tx: Union[Transaction, AsyncTransaction]) -> None:
        """What the handler asked to hear of the COMMIT (``Transaction.call_after_commit``, the
        outbox's relay wake-up), each called once; one that raises is logged."""
        for callback in tx.after_commit or ():
            try:
                callback()
            except Exception:
                self._log.log(
                    logging.ERROR, "an after-commit callback raised; ignored", exc_info=True
                )

    def _remember(self, element: DedupElement) -> None:
        """A key committed here: a later copy of it is looked up before its handler."""
        self._recent.add(element)

    # -- finish --------------------------------------------------------------------------

    def _finish(self, held: List[Delivery], statuses: List[ConsumeStatus], snap: Snapshot) -> None:
        """Every held attempt leaves the in-process registry, with its outcome."""
        registry = self._in_flight
        for delivery in held:
            consumed = delivery.outcome in (Outcome.CONSUMED, Outcome.DUPLICATE_CONSUMED)
            consumed = consumed and delivery.failure is None
            registry.leave(delivery.element, delivery.attempt, consumed)


class TransactionalStrategy(TransactionDecisions, DedupTemplate):
    """The exactly-once decisions (module docstring) on the consume template, over the store's
    transaction port (:mod:`rocketmq_dedup.stores.transaction`)."""

    def __init__(self, config: DedupConfig, hooks: Hooks) -> None:
        DedupTemplate.__init__(self, config, hooks)
        TransactionDecisions.__init__(self, config, hooks, self.store)
        transactions = transactions_of(self.store)
        if transactions is None:  # checked by the listener too
            raise DedupConfigError(
                f"the exactly-once mode needs a store with transactions; got {self.store!r}"
            )
        self.transactions: TransactionSource = transactions

    # -- claim: what is decided before any transaction --------------------------------------

    def _claim(self, keyed: List[Delivery], snap: Snapshot) -> List[Delivery]:
        """Twins in this process are answered at once (or from their twin's outcome); the
        others are held (entered in the in-process registry), and those likely to be
        duplicates (redeliveries, keys committed here lately) are looked up in one round
        trip."""
        held, suspects = [], []
        for delivery in keyed:
            element: DedupElement = delivery.element  # type: ignore[assignment]
            mine, twin = self._in_flight.enter(element, snap.hold_ms)
            if twin is not None:
                consumed = None
                if snap.in_progress_wait_ms:
                    consumed = self._in_flight.wait(twin, snap.in_progress_wait_ms)
                self._twin_answer(delivery, consumed, snap)
                continue
            delivery.attempt = mine
            held.append(delivery)
            if self._suspect(delivery):
                suspects.append(delivery)
        if suspects:
            elements = [d.element for d in suspects]
            try:
                records = self._store_call(snap, StoreOp.LOOKUP, self.store.read_many, elements)
            except StoreError as exc:
                self._store_failed(suspects, exc, snap)
                return held
            for delivery, record in zip(suspects, records, strict=True):
                if record is not None:
                    delivery.status = self._refused(delivery, record, snap)
        return held

    # -- run: one transaction per message (more with local retries) ------------------------

    def _run(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        status = self._transact(delivery, snap)
        if status is not SUCCESS and snap.local_retries and delivery.outcome is Outcome.FAILED:
            # (_retry answers a ConsumeStatus: a permanent failure is decided in _transact)
            status = cast(
                ConsumeStatus, retry_locally(lambda: self._retry(delivery, snap), snap, status)
            )
        return status

    def _retry(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        """A local retry: a new transaction, as long as the handler is what failed."""
        if delivery.outcome is not Outcome.FAILED:
            return LATER
        return self._transact(delivery, snap)

    def _transact(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        """One transaction for one message: its answer, the transaction committed or rolled
        back (by ``close``, whatever happened)."""
        sequence = self._sequence_key(delivery)
        if sequence is _Bad.BAD:
            delivery.outcome = Outcome.KEY_ERROR
            return LATER
        try:
            tx = self.transactions.begin(hold_seconds(snap))
        except TransactionMisuseError as exc:  # an engine in autocommit mode
            self._log.log(logging.ERROR, "%s; the message will be consumed later", exc)
            delivery.outcome = Outcome.STORE_ERROR_LATER
            return LATER
        except StoreError as exc:
            self._transaction_failed(delivery, exc)
            return LATER
        try:
            return self._in_transaction(delivery, tx, sequence, snap)
        except TransactionMisuseError as exc:  # found at the commit
            return self._misused(delivery, str(exc))
        except StoreError as exc:  # a statement of the dedup layer failed
            self._transaction_failed(delivery, exc)
            return self._after_failure(delivery, snap)
        finally:
            tx.close()

    def _in_transaction(
        self,
        delivery: Delivery,
        tx: Transaction,
        sequence: Optional[Tuple[str, int]],
        snap: Snapshot,
    ) -> ConsumeStatus:
        """Inside the open transaction, a chain of steps: [the key, before the handler],
        [the sequence guard], the handler, the record with the COMMIT."""
        element = delivery.element
        entity = Entity(snap.application_name, sequence[0]) if sequence is not None else None
        last: Optional[int] = None
        if element is not None and snap.exactly_once_claim is ExactlyOnceClaim.BEFORE_HANDLER:
            key = tx.claim_key(element, entity)
            if not key.taken:
                return self._duplicate(delivery, DedupStatus.CONSUMING, snap)
            if key.record is not None:
                return self._refused(delivery, key.record, snap)
            last = key.last_seq
        elif entity is not None:
            last = tx.lock_sequence(entity)
        verdict = _Verdict.RUN
        if sequence is not None:
            verdict = self._verdict(last, sequence[1], snap)
            if verdict is _Verdict.GAP:
                logger.debug("%r: seq %d is ahead of the entity's next; later", *sequence)
                delivery.outcome = Outcome.SEQUENCE_GAP
                return LATER
            if verdict is _Verdict.STALE:
                logger.debug("%r: seq %d already applied or superseded; acking", *sequence)
        if verdict is _Verdict.RUN:
            tx.before_handler()
            status = self._handle(delivery, tx, snap)
            if delivery.failure is not None:  # a permanent failure: its writes never commit
                if element is None:  # no key, nothing to record it in (close rolls back)
                    return status
                return self._commit_failure(delivery, tx, element, status, snap)
            if status is not SUCCESS:
                return status
        if element is None:  # no dedup key: the handler's writes alone
            tx.commit()
            self._after_commit(tx)
            return SUCCESS
        applied = None
        if entity is not None and verdict is _Verdict.RUN:
            applied = SequenceStep(entity, sequence[1])  # type: ignore[index]
        return self._commit(delivery, tx, element, applied, verdict, snap)

    def _handle(self, delivery: Delivery, tx: Transaction, snap: Snapshot) -> ConsumeStatus:
        """The handler in the transaction: its answer, or LATER when it raised or broke the
        transaction (ended it, switched it to autocommit, reconnected)."""
        begin = time.perf_counter() if snap.metrics is not None else 0.0
        running = running_transaction.set(tx)  # current_transaction() in the handler
        try:
            result = tx.run_handler(self.hooks.listener.do_handle_msg, delivery.msg)
        except TransactionMisuseError:  # refused in the handler, which let it propagate
            result = None
        except PermanentFailure as failure:
            result = failure
        except Exception:
            logger.exception(
                "do_handle_msg raised; its transaction is rolled back and the message "
                "will be consumed later"
            )
            delivery.outcome = Outcome.FAILED
            return LATER
        finally:
            running_transaction.reset(running)
            if snap.metrics is not None:
                delivery.handler_seconds = time.perf_counter() - begin
        if isinstance(result, PermanentFailure):  # its writes are rolled back, whatever it did
            return self._permanent_failure(delivery, result, snap)
        misuse = tx.misuse()
        if misuse is not None:
            return self._misused(delivery, f"do_handle_msg {misuse}")
        return self._handler_status(delivery, result)

    def _commit(
        self,
        delivery: Delivery,
        tx: Transaction,
        element: DedupElement,
        applied: Optional[SequenceStep],
        verdict: _Verdict,
        snap: Snapshot,
    ) -> ConsumeStatus:
        """The CONSUMED record with the COMMIT; a record of another copy refuses it (this one
        is rolled back and answered as that copy's duplicate)."""
        owner = self._owner(delivery)
        refused = self._store_call(
            snap, StoreOp.COMMIT, tx.commit_record, element, owner, snap.retention_ms, applied
        )
        stale = verdict is _Verdict.STALE
        return self._record_committed(delivery, tx, element, refused, stale, snap)

    def _commit_failure(
        self,
        delivery: Delivery,
        tx: Transaction,
        element: DedupElement,
        answer_: ConsumeStatus,
        snap: Snapshot,
    ) -> ConsumeStatus:
        """A permanent failure: the handler's writes rolled back and the FAILED record
        committed alone (its answer, ``answer_``, stays); a record of another copy in the way
        refuses it (this one commits nothing and is answered as that copy's duplicate)."""
        owner = self._owner(delivery)
        refused = self._store_call(
            snap,
            StoreOp.MARK_FAILED,
            tx.commit_failure,
            element,
            owner,
            snap.retention_ms,
            delivery.failure,
        )
        if refused is not None:
            logger.info("%r was recorded by another attempt; its failure not recorded", element)
            return self._refused(delivery, refused, snap)
        return answer_

    def _after_failure(self, delivery: Delivery, snap: Snapshot) -> ConsumeStatus:
        """After a transaction failed (its session ended, the server went away): the key's
        record, if any, says another copy committed (or this one did, its COMMIT's answer
        lost): acked as a duplicate. Else, or when that cannot be read, RECONSUME_LATER."""
        element = delivery.element
        if element is None:
            return LATER
        try:
            record = self._store_call(snap, StoreOp.LOOKUP, self.store.read, element)
        except StoreError:
            return LATER
        return self._found_after_failure(delivery, record, snap)

    # -- the sequence guard --------------------------------------------------------------

    def _sequence_key(self, delivery: Delivery) -> SequenceKey:
        """The validated ``sequence_key(msg)``: None, (entity, seq), or BAD (logged)."""
        sequence_of = self.hooks.sequence_of
        if sequence_of is None:
            return None
        try:
            raw = sequence_of(delivery.msg)
        except Exception:
            self._log.log(
                logging.ERROR,
                "sequence_key raised; the message will be consumed later",
                exc_info=True,
            )
            return _Bad.BAD
        if raw is None:
            return None
        problem = _sequence_problem(raw)
        if problem is not None:
            self._log.log(
                logging.ERROR,
                "sequence_key returned %r: %s; the message will be consumed later",
                raw,
                problem,
            )
            return _Bad.BAD
        entity, seq = raw
        return entity, int(seq)

    @staticmethod
    def _verdict(last: Optional[int], seq: int, snap: Snapshot) -> _Verdict:
        if snap.sequence_mode is SequenceMode.LATEST:
            return _Verdict.RUN if last is None or seq > last else _Verdict.STALE
        expected = snap.sequence_start if last is None else last + 1
        if seq == expected:
            return _Verdict.RUN
        return _Verdict.STALE if seq < expected else _Verdict.GAP


def _sequence_problem(raw: Any) -> Optional[str]:
    """Why a ``sequence_key`` value is refused, or None."""
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        return "expected None or an (entity: str, seq: int) pair"
    entity, seq = raw
    if not isinstance(entity, str):
        return f"the entity must be a str, not {type(entity).__name__}"
    if not entity:
        return "the entity is empty"
    if isinstance(seq, bool) or not isinstance(seq, int):
        return f"the sequence number must be an int, not {type(seq).__name__}"
    if not fits_bigint(seq):
        return "the sequence number must fit a signed 64-bit integer"
    return None


__all__ = [
    "RECENT_KEYS",
    "RecentKeys",
    "TransactionDecisions",
    "TransactionalStrategy",
    "hold_seconds",
    "transactions_of",
]
