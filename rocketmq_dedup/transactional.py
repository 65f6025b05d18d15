"""Exactly-once mode: the handler's database writes and the dedup record commit in one
transaction, with an optional per-entity sequence guard.

The plain :class:`~rocketmq_dedup.DedupConcurrentListener` runs a handler once in normal
operation and at least once always: a crash between the handler's success and the CONSUMED
mark, or a lease that lapsed under a stalled handler, can run it twice. When the handler's
effect is a write to the database that also holds the dedup records (MySQL/MariaDB or
PostgreSQL), this mode makes it exactly once: the CONSUMED record is written in the handler's
own transaction, with its COMMIT (one round trip where the driver allows), and its primary key
lets one copy of a message commit, whatever the others did. A copy that loses is rolled back:
its writes never commit, and it is acked as the duplicate it is. Each database's I/O is its
store's transaction port (:mod:`rocketmq_dedup.stores.mysql.transaction`,
:mod:`rocketmq_dedup.stores.postgres.transaction`); the decisions below are the same on both.

When a key is claimed (the ``exactly_once_claim`` setting):

* ``"at_commit"`` (the default): a first delivery goes straight to its transaction; the record
  decides at COMMIT. A twin in its handler in this same process is answered RECONSUME_LATER at
  once; a redelivery (and a key this process committed lately) is looked up first, so a
  duplicate of a committed message costs one round trip. A concurrent copy in another process
  runs its handler too (waiting on the first's row locks if it touches the same rows), and is
  rolled back at its COMMIT.
* ``"before_handler"``: the transaction starts with the key's lock, taken without waiting
  (MySQL's named lock ``GET_LOCK``, PostgreSQL's ``pg_try_advisory_xact_lock``), then its
  look-up: a duplicate from any consumer of the same server is answered at once, whatever locks
  the first copy holds. The lock writes nothing, needs no renewal, and is freed by the end of
  the transaction or when its session ends.

Sequence guard, per entity (state in the ``<table>_seq`` table, updated in the same
transaction): ``sequence_mode="strict"`` - seq <= last applied: acked without the handler
(stale or repeat); seq == last + 1 (an entity never seen expects ``sequence_start``): run;
seq > last + 1: RECONSUME_LATER without the handler (outcome ``sequence_gap``; the broker's
retry brings it back once the gap is filled). ``"latest"`` - seq > last (or never seen): run;
otherwise acked without the handler. A message acked without the handler still gets its
CONSUMED record (committed), so its redeliveries are plain duplicates. Messages of one entity
are serialized by the row lock (a second one waits for the first's COMMIT, up to
``innodb_lock_wait_timeout``). Under the classic client's orderly consumer a RECONSUME_LATER
retries the same message before the rest of its queue, so there ``strict`` needs each entity's
messages sent in order to one queue (a sharding key), which orderly sending gives; out-of-order
sends (a gap) belong with the concurrent consumer, whose retries go round the other messages.

A consumer killed in its handler: its session ends with its socket, and the server rolls its
transaction back at once (a redelivery runs right away). A consumer frozen in its handler
(SIGSTOP, a hung VM): its session's idle timeout (MySQL's ``wait_timeout``, set on the
transaction connections, PostgreSQL's ``idle_in_transaction_session_timeout``, set for each
transaction: ``max_processing_milli_seconds``, or the lease without lease renewal) ends it,
which rolls it back and frees its locks; until then a copy in another process may run and
commit (the frozen one then fails its COMMIT).

What it covers: writes through ``conn``, to the database that holds the dedup table, on one
server (or one writer: named locks and the no-wait look-up are per server, so a multi-writer
Galera cluster is not supported). Not covered: RPCs, other databases, files, messages sent by
the handler (they may repeat when an attempt is rolled back).

A store outage never means "run without dedup" here: the handler needs that database anyway,
so an unreachable store is RECONSUME_LATER whatever ``store_failure_policy`` says.
"""

from __future__ import annotations

import abc
from typing import Any, Optional, Tuple

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import DedupConfigError, TransactionMisuseError
from rocketmq_dedup.hooks import Hooks
from rocketmq_dedup.listener import BaseDedupListener
from rocketmq_dedup.stores.base import DedupStore
from rocketmq_dedup.strategy.base import Strategy
from rocketmq_dedup.strategy.exactly_once import TransactionalStrategy, transactions_of


class TransactionalDedupListener(BaseDedupListener):
    """A listener whose handler's database writes and dedup record commit together (see the
    module docstring for what it guarantees and what it cannot).

    Subclass it, implement ``do_handle_msg(msg, conn)`` (write through ``conn``; return True
    to commit, False or raise to roll back and retry) and optionally ``sequence_key(msg)``.
    Entry points as :class:`DedupConcurrentListener`: ``listener(msg)``,
    ``consume_message(msgs)``, ``consume_each(msgs)``, the 5.x adapters; one transaction per
    message.

    :param dedup_config: a config whose store is the MySQL or the PostgreSQL store on the
        business database (a connection factory, a ``psycopg_pool`` pool, or a SQLAlchemy
        ``Engine``); anything else raises :class:`DedupConfigError`. ``pool_size`` bounds
        each of a factory's two pools, the one for look-ups, and the one for transactions (a
        connection per running handler): set it to at least the consumer's thread count (with
        an Engine or a ``psycopg_pool`` pool, theirs serve the transactions). Its
        ``exactly_once_claim``, ``sequence_mode`` and ``sequence_start`` settings apply
        (module docstring).
    """

    def __init__(self, dedup_config: DedupConfig) -> None:
        store: Optional[DedupStore] = getattr(dedup_config, "persist", None)
        transactions = transactions_of(store) if isinstance(store, DedupStore) else None
        if not isinstance(dedup_config, DedupConfig) or transactions is None:
            got = "no config" if dedup_config is None else f"a config whose store is {store!r}"
            raise DedupConfigError(
                f"{type(self).__name__} needs a DedupConfig with dedup enabled on the MySQL or "
                "PostgreSQL store of the business database (a connection factory, a "
                "psycopg_pool pool or a SQLAlchemy Engine), since the dedup record commits in "
                f"the handler's transaction; got {got}"
            )
        if self._has_sequence_key() and not transactions.supports_sequences:
            assert store is not None
            raise DedupConfigError(
                f"{store.describe()} has no sequence table (<table>_seq must fit 64 "
                "characters): sequence_key cannot be used with it"
            )
        super().__init__(dedup_config)

    def _has_sequence_key(self) -> bool:
        return type(self).sequence_key is not TransactionalDedupListener.sequence_key

    def _hooks(self) -> Hooks:
        sequence_of = self.sequence_key if self._has_sequence_key() else None
        return super()._hooks()._replace(sequence_of=sequence_of)

    def _make_strategy(self, dedup_config: Optional[DedupConfig], hooks: Hooks) -> Strategy:
        assert dedup_config is not None  # checked in __init__
        return TransactionalStrategy(dedup_config, hooks)

    @abc.abstractmethod
    def do_handle_msg(self, msg: Any, conn: Any) -> Any:
        """The business logic, inside the message's transaction.

        ``conn`` is the transaction's connection: a DB-API or psycopg connection
        (``conn.cursor()``; psycopg's ``conn.execute()``) on which ``commit()``,
        ``rollback()``, ``close()`` and autocommit are refused, or, with a SQLAlchemy
        ``Engine``, the ``Connection`` of ``engine.begin()``. Return True (or a
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
