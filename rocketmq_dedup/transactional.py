"""Exactly-once mode: the handler's database writes and the dedup record commit in one
transaction, with an optional per-entity sequence guard.

The plain :class:`~rocketmq_dedup.DedupConcurrentListener` runs a handler once in normal
operation and at least once always: a crash between the handler's success and the CONSUMED
mark, or a lease that lapsed under a stalled handler, can run it twice. When the handler's
effect is a write to the MySQL/MariaDB database that also holds the dedup records, this mode
makes it exactly once:

1. **Claim** (as the plain listener, autocommit): a CONSUMING record with a lease and an owner
   token. A concurrent duplicate finds it and is answered RECONSUME_LATER at once: it never
   waits on the first copy's locks, because the first copy's transaction writes the dedup row
   only at its very end (step 4), right before COMMIT.
2. **Begin** one transaction per message on the business database: a connection of the
   store's transaction pool, switched to autocommit off when it was opened (so the connection
   factory's autocommit setting does not matter, and no ``START TRANSACTION`` round trip is
   spent), or ``engine.connect()`` + ``begin()`` with a SQLAlchemy ``Engine``.
3. **Sequence guard** (optional, :meth:`TransactionalDedupListener.sequence_key`): lock the
   entity's row of the sequence table, decide by ``sequence_mode`` (below).
4. **Handler** ``do_handle_msg(msg, conn)`` writes through ``conn``; then, in the same
   transaction, the **owner-fenced CONSUMED write**: an UPDATE that matches the record only
   while it is still this attempt's CONSUMING claim (or, if the record was lost, an INSERT
   the primary key refuses when any other attempt wrote one). One row: COMMIT ->
   CONSUME_SUCCESS. No row: another attempt took the message over (this one's lease lapsed):
   ROLLBACK; acked as a duplicate if that attempt already committed, else RECONSUME_LATER.
   So at most one attempt ever commits, whatever the leases did.
5. Handler ``False``/``None``/a retry value/an exception, or any SQL error: ROLLBACK, the
   claim is released (compare-and-delete), RECONSUME_LATER.

Sequence guard, per entity (state in the ``<table>_seq`` table, updated in the same
transaction): ``sequence_mode="strict"`` - seq <= last applied: acked without the handler
(stale or repeat); seq == last + 1 (an entity never seen expects ``sequence_start``): run;
seq > last + 1: RECONSUME_LATER without the handler (the broker's retry brings it back once the
gap is filled). ``"latest"`` - seq > last (or never seen): run; otherwise acked without the
handler. A message acked without the handler still gets its CONSUMED record (committed), so
its redeliveries are plain duplicates. Messages of one entity are serialized by the row lock
(a second one waits for the first's COMMIT, up to ``innodb_lock_wait_timeout``).
Under the classic client's orderly consumer a RECONSUME_LATER retries the same message
before the rest of its queue, so there ``strict`` needs each entity's messages sent in order
to one queue (a sharding key), which orderly sending gives; out-of-order sends (a gap) belong
with the concurrent consumer, whose retries go round the other messages.

What it covers: writes through ``conn``, to the database that holds the dedup table. Not
covered: RPCs, other databases, files, messages sent by the handler (they may repeat when an
attempt is rolled back), and redeliveries after the CONSUMED record's retention
(``dedup_record_reserve_minutes``; the sequence guard still catches those).

A store outage never means "run without dedup" here: the handler needs that database anyway,
so an unreachable store is RECONSUME_LATER whatever ``store_failure_policy`` says.
"""

from __future__ import annotations

import abc
import enum
import logging
import time
from typing import Any, Callable, Iterable, List, Optional, Set, Tuple, Union, cast

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import (
    DedupConfigError,
    StoreError,
    StoreUnavailableError,
    TransactionMisuseError,
)
from rocketmq_dedup.listener import BaseDedupListener
from rocketmq_dedup.metrics import Outcome
from rocketmq_dedup.status import ConsumeStatus, DedupStatus
from rocketmq_dedup.stores.base import ClaimResult
from rocketmq_dedup.stores.mysql import MySQLDedupStore
from rocketmq_dedup.stores.mysql.transaction import Transaction
from rocketmq_dedup.strategy import (
    LATER,
    SUCCESS,
    DedupStrategy,
    DuplicateHook,
    Handler,
    KeyFunction,
    Strategy,
    _Delivery,
    handler_status,
)

logger = logging.getLogger(__name__)

SequenceFunction = Callable[[Any], Any]
TxHandler = Callable[[Any, Any], Any]
_INT64 = 2**63


class _Bad(enum.Enum):
    """``sequence_key`` failed (logged): the message is retried later."""

    BAD = "bad"


class _Verdict(enum.Enum):
    RUN = "run"
    STALE = "stale"  # ack without the handler
    GAP = "gap"  # strict only: RECONSUME_LATER without the handler


SequenceKey = Union[None, Tuple[str, int], _Bad]


class TransactionalStrategy(DedupStrategy):
    """The exactly-once decisions (module docstring); the I/O is the MySQL store's
    :class:`~rocketmq_dedup.stores.mysql.transaction.Transaction`. Reuses the plain
    strategy's key step, claim step, lease renewal and release; replaces what happens to a
    claimed message (a transaction instead of handler-then-mark) and to store failures
    (always RECONSUME_LATER)."""

    def __init__(
        self,
        config: DedupConfig,
        sequence_function: Optional[SequenceFunction] = None,
        on_duplicate: Optional[DuplicateHook] = None,
    ) -> None:
        super().__init__(config, on_duplicate)
        if not isinstance(self.store, MySQLDedupStore):  # checked by the listener too
            raise DedupConfigError("the exactly-once mode needs the MySQL store")
        self.mysql: MySQLDedupStore = self.store
        self.sequence_function = sequence_function

    def consume_each(
        self,
        msgs: Iterable[Any],
        key_function: KeyFunction,
        handler: Handler,
        stop_at_failure: bool = False,
    ) -> List[ConsumeStatus]:
        call = cast(TxHandler, handler)  # do_handle_msg(msg, conn)
        metrics = self.config.metrics
        started = time.time_ns() if metrics is not None else 0
        deliveries = [_Delivery(i, msg) for i, msg in enumerate(msgs)]
        keyed = [d for d in deliveries if self._key(d, key_function)]
        owned = self._claim(keyed) if keyed else []
        keeper = self._lease_keeper() if owned else None
        if keeper is not None:
            keeper.hold([d.element for d in owned], [d.owner for d in owned])  # type: ignore[misc]
        statuses: List[ConsumeStatus] = []
        settled: Set[int] = set()  # positions whose claim was committed CONSUMED or released
        try:
            for delivery in deliveries:
                status = delivery.status
                if status is None:
                    status = self._transact(delivery, call, settled)
                statuses.append(status)
                if stop_at_failure and status is not SUCCESS:
                    break
        finally:  # whatever happened, no claim stays held or renewed by this call
            if keeper is not None:
                keeper.drop([d.owner for d in owned])  # type: ignore[misc]
            left = [d for d in owned if d.position not in settled]
            if left:
                self._release([d.element for d in left], [d.owner for d in left])  # type: ignore[misc]
            if metrics is not None:
                self._report(metrics, deliveries, len(statuses), started)
        if len(statuses) < len(deliveries):  # stopped at a failure
            statuses += [LATER] * (len(deliveries) - len(statuses))
        return statuses

    # -- one message ---------------------------------------------------------------------

    def _transact(
        self, delivery: _Delivery, handler: TxHandler, settled: Set[int]
    ) -> ConsumeStatus:
        """One message's transaction; returns its answer. ``delivery.position`` goes into
        ``settled`` once its claim is committed or released."""
        owner = delivery.owner
        sequence = self._sequence_key(delivery)
        if sequence is _Bad.BAD:
            delivery.outcome = Outcome.FAILED
            return self._give_up(delivery, settled)
        try:
            tx = self.mysql.begin_transaction()
        except TransactionMisuseError as exc:  # an engine in autocommit mode
            self._log.log(logging.ERROR, "%s; the message will be consumed later", exc)
            delivery.outcome = Outcome.STORE_ERROR_LATER
            return self._give_up(delivery, settled)
        except StoreError as exc:
            self._transaction_failed(delivery, exc)
            return self._give_up(delivery, settled)
        done = False  # committed or rolled back
        try:
            status = self._in_transaction(delivery, tx, handler, sequence)
            done = True
            if status is SUCCESS and delivery.outcome is not Outcome.DUPLICATE_CONSUMED:
                settled.add(delivery.position)
                return status
            if delivery.outcome is Outcome.DUPLICATE_CONSUMED and owner is not None:
                settled.add(delivery.position)  # stale, committed CONSUMED; or another's commit
            return status
        except Exception as exc:  # the transaction's own statements failed
            self._transaction_failed(delivery, exc)
            return LATER
        except BaseException:
            tx.broken = True  # interrupted mid-statement, maybe: never reuse the connection
            raise
        finally:
            if not done:
                tx.rollback()
            tx.close()
            if owner is not None and delivery.position not in settled:
                self._give_up(delivery, settled)

    def _in_transaction(
        self,
        delivery: _Delivery,
        tx: Transaction,
        handler: TxHandler,
        sequence: Optional[Tuple[str, int]],
    ) -> ConsumeStatus:
        """Inside the open transaction: guard, handler, fenced CONSUMED write, COMMIT. Returns
        the answer with the transaction committed or rolled back; raises what a statement of
        the dedup layer raised (the caller rolls back)."""
        app = self.config.application_name
        verdict = _Verdict.RUN
        if sequence is not None:
            entity, seq = sequence
            verdict = self._verdict(tx.lock_sequence(app, entity), seq)
            if verdict is _Verdict.GAP:
                logger.debug("%r: seq %d is ahead of the entity's next; later", entity, seq)
                tx.rollback()
                delivery.outcome = Outcome.FAILED
                return LATER
            if verdict is _Verdict.STALE:
                logger.debug("%r: seq %d already applied or superseded; acking", entity, seq)
        if verdict is _Verdict.RUN:
            status = self._run_handler(delivery, tx, handler)
            if delivery.owner is not None and self._keeper is not None:
                self._keeper.drop([delivery.owner])  # the lease has served; commit is next
            misuse = tx.ended_by_handler()
            if misuse is not None:
                self._log.log(
                    logging.ERROR,
                    "do_handle_msg called %s on its connection; the transaction was rolled "
                    "back and the message will be consumed later (return True to commit, "
                    "False or raise to roll back)",
                    misuse,
                )
                tx.rollback()
                delivery.outcome = Outcome.FAILED
                return LATER
            if status is not SUCCESS:
                tx.rollback()
                delivery.outcome = Outcome.FAILED
                return LATER
            if sequence is not None:
                tx.set_sequence(app, sequence[0], sequence[1])
        if delivery.owner is not None and not tx.mark_consumed(
            delivery.element,  # type: ignore[arg-type]
            delivery.owner,
            self.config.retention_ms,
        ):
            tx.rollback()
            return self._taken_over(delivery)
        tx.commit()
        if verdict is _Verdict.STALE:
            delivery.outcome = Outcome.DUPLICATE_CONSUMED
        elif delivery.owner is not None:
            delivery.outcome = Outcome.CONSUMED
        return SUCCESS

    def _run_handler(
        self, delivery: _Delivery, tx: Transaction, handler: TxHandler
    ) -> ConsumeStatus:
        """The handler's answer; its exceptions are logged (its connection is then discarded)
        and mean RECONSUME_LATER; what is not an ``Exception`` propagates."""
        begin = time.perf_counter()
        try:
            with tx.guarded():
                result = handler(delivery.msg, tx.conn)
        except Exception as exc:
            tx.broken = True
            if not isinstance(exc, TransactionMisuseError):
                logger.exception(
                    "do_handle_msg raised; its transaction is rolled back and the message "
                    "will be consumed later"
                )
            return LATER
        finally:
            if self.config.metrics is not None:
                delivery.handler_seconds = time.perf_counter() - begin
        if result is True:
            return SUCCESS
        status = handler_status(result)
        if status is None:
            logger.error(
                "do_handle_msg returned %r (%s); return True to commit and False to roll back "
                "(or a client's ConsumeStatus/ConsumeResult); the message will be consumed later",
                result,
                type(result).__name__,
            )
            return LATER
        return status

    def _taken_over(self, delivery: _Delivery) -> ConsumeStatus:
        """The fenced write matched no row: another attempt owns the key. Its record says
        whether it already committed (ack as a duplicate) or is still at work (later)."""
        element = delivery.element
        try:
            record = self.mysql.record_owner(element)  # type: ignore[arg-type]
        except StoreError as exc:
            logger.warning(
                "%r: could not read the record after losing the claim (%s)", element, exc
            )
            record = None
        if record is not None and record[0] is DedupStatus.CONSUMED:
            logger.info("%r was committed by another attempt; rolled back, acking", element)
            delivery.outcome = Outcome.DUPLICATE_CONSUMED
            self._duplicate(delivery, DedupStatus.CONSUMED)
            return SUCCESS
        logger.info("%r: the claim was taken over by another attempt; rolled back", element)
        delivery.outcome = Outcome.DUPLICATE_IN_PROGRESS
        return LATER

    def _give_up(self, delivery: _Delivery, settled: Set[int]) -> ConsumeStatus:
        """Release the delivery's claim (if it has one and it is not settled): LATER."""
        if delivery.owner is not None and delivery.position not in settled:
            settled.add(delivery.position)
            self._release([delivery.element], [delivery.owner])  # type: ignore[list-item]
        return LATER

    def _transaction_failed(self, delivery: _Delivery, exc: BaseException) -> None:
        delivery.outcome = Outcome.STORE_ERROR_LATER
        outage = isinstance(exc, StoreUnavailableError) or (
            not isinstance(exc, StoreError) and self.mysql.is_outage(exc)
        )
        if outage:
            self._log.log(
                logging.WARNING,
                "the business database is unavailable (%s); the message will be consumed later "
                "(the exactly-once mode never consumes without it)",
                exc,
            )
        else:
            self._log.log(
                logging.ERROR,
                "the message's transaction failed (%s: %s); rolled back, consume later",
                type(exc).__name__,
                exc,
                exc_info=exc,
            )

    # -- the sequence guard --------------------------------------------------------------

    def _sequence_key(self, delivery: _Delivery) -> SequenceKey:
        """The validated ``sequence_key(msg)``: None, (entity, seq), or BAD (logged)."""
        if self.sequence_function is None:
            return None
        try:
            raw = self.sequence_function(delivery.msg)
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

    def _verdict(self, last: Optional[int], seq: int) -> _Verdict:
        if self.config.sequence_mode == "latest":
            return _Verdict.RUN if last is None or seq > last else _Verdict.STALE
        expected = self.config.sequence_start if last is None else last + 1
        if seq == expected:
            return _Verdict.RUN
        return _Verdict.STALE if seq < expected else _Verdict.GAP

    # -- store failures: never "consume without dedup" ------------------------------------

    def _store_failed(self, keyed: List[_Delivery], exc: StoreError) -> None:
        if isinstance(exc, StoreUnavailableError):
            self._log.log(
                logging.WARNING,
                "dedup store unavailable (%s); %d message(s) will be consumed later (the "
                "exactly-once mode never consumes without its database, whatever "
                "store_failure_policy says)",
                exc,
                len(keyed),
            )
        else:
            self._log.log(
                logging.ERROR,
                "dedup store error (%s); %d message(s) will be consumed later",
                exc,
                len(keyed),
                exc_info=exc,
            )
        for delivery in keyed:
            delivery.status, delivery.outcome = LATER, Outcome.STORE_ERROR_LATER

    def _duplicate_status(self, delivery: _Delivery, claim: ClaimResult) -> Optional[ConsumeStatus]:
        status = super()._duplicate_status(delivery, claim)
        if status is None:  # a record this library cannot read: no fenced write is possible
            delivery.outcome = Outcome.STORE_ERROR_LATER
            return LATER
        return status


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
    if not -_INT64 <= seq < _INT64:
        return "the sequence number must fit a signed 64-bit integer"
    return None


class TransactionalDedupListener(BaseDedupListener):
    """A listener whose handler's database writes and dedup record commit together (see the
    module docstring for what it guarantees and what it cannot).

    Subclass it, implement ``do_handle_msg(msg, conn)`` (write through ``conn``; return True
    to commit, False or raise to roll back and retry) and optionally ``sequence_key(msg)``.
    Entry points as :class:`DedupConcurrentListener`: ``listener(msg)``,
    ``consume_message(msgs)``, ``consume_each(msgs)``, the 5.x adapters; one transaction per
    message.

    :param dedup_config: a config whose store is the MySQL store on the business database (a
        connection factory, or a SQLAlchemy ``Engine``); anything else raises
        :class:`DedupConfigError`. ``pool_size`` bounds each of the store's two pools, the one
        for claims, releases and lease renewal, and the one for transactions (a connection per
        running handler): set it to at least the consumer's thread count (with an Engine, the
        engine's pool serves the transactions). Its ``sequence_mode``/``sequence_start``
        drive the sequence guard.
    """

    def __init__(self, dedup_config: DedupConfig) -> None:
        store = getattr(dedup_config, "persist", None)
        if not isinstance(dedup_config, DedupConfig) or not isinstance(store, MySQLDedupStore):
            got = "no config" if dedup_config is None else f"a config whose store is {store!r}"
            raise DedupConfigError(
                f"{type(self).__name__} needs a DedupConfig with dedup enabled on the MySQL "
                "store (a connection factory or a SQLAlchemy Engine of the business "
                f"database), since the dedup record commits in the handler's transaction; got "
                f"{got}"
            )
        if self._has_sequence_key() and store.sequence_table_name is None:
            raise DedupConfigError(
                f"table_name {store.table_name!r} is too long for a sequence table "
                "(<table>_seq must fit 64 characters)"
            )
        super().__init__(dedup_config)

    def _has_sequence_key(self) -> bool:
        return type(self).sequence_key is not TransactionalDedupListener.sequence_key

    def _make_strategy(
        self, dedup_config: Optional[DedupConfig], on_duplicate: Optional[DuplicateHook]
    ) -> Strategy:
        assert dedup_config is not None  # checked in __init__
        sequence = self.sequence_key if self._has_sequence_key() else None
        return TransactionalStrategy(dedup_config, sequence, on_duplicate)

    @abc.abstractmethod
    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        """The business logic, inside the message's transaction.

        ``conn`` is the transaction's connection: a DB-API connection (``conn.cursor()``) on
        which ``commit()``, ``rollback()``, ``close()`` and autocommit are refused, or, with
        a SQLAlchemy ``Engine``, the ``Connection`` of ``engine.begin()``. Return True (or a
        client's success value) to commit your writes together with the dedup record;
        ``False``, ``None``, a retry value or an exception rolls everything back and the
        broker redelivers the message later.
        """

    def sequence_key(self, msg: Any) -> Optional[Tuple[str, int]]:
        """``(entity, seq)`` for the sequence guard (e.g. ``(order_id, step)``), or None for
        no ordering (the default). Anything else, or an exception, is logged and the message
        is retried later."""
        return None


__all__ = [
    "TransactionMisuseError",
    "TransactionalDedupListener",
    "TransactionalStrategy",
]
