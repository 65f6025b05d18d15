"""The exactly-once mode's port: what :class:`~rocketmq_dedup.strategy.exactly_once.
TransactionalStrategy` needs from the database a handler writes to, and nothing else.

A store that supports the mode offers a :class:`TransactionSource` (its ``transactions``
attribute); each message gets one :class:`Transaction` from it, used in this order::

    begin        a connection of the source's, in a transaction (or about to be: the first
                 statement opens it)
    claim_key    (``exactly_once_claim="before_handler"``) the key's lock without waiting, then
                 the key's record, [and the entity's sequence row, locked]
    lock_sequence (``"at_commit"`` with a sequence key) the entity's sequence row, locked
    before_handler what must reach the database before the handler (PostgreSQL: the BEGIN,
                 when no statement carried it yet; nothing on MySQL)
    run_handler  the user's handler on :attr:`Transaction.conn`; then :meth:`misuse`
    commit_record the CONSUMED record [and the entity's new sequence number], then COMMIT
    commit_failure (the handler declared a permanent failure) ROLLBACK of its writes, then the
                 FAILED record alone and COMMIT
    commit       (a message without a dedup key) COMMIT alone
    close        always: rolls back whatever is still open and gives the connection back, or
                 discards it when it may be unfit for another message

While the handler runs, :func:`current_transaction` is its transaction (the strategy sets it), so
what the handler writes through ``conn`` can ask to hear of the COMMIT
(:meth:`Transaction.call_after_commit`): the outbox wakes its relay that way.

The decisions (what a refused record, a held lock or a stale step means) are the strategy's;
an implementation does the I/O and keeps two promises about order that the decisions rely on:

* **A key's lock before its record** (:meth:`Transaction.claim_key`): the record is read only
  once the lock is held, so a copy that committed and let go of the lock before is always
  seen; never read, then locked.
* **No snapshot before a wait**: on a database whose transactions read from a snapshot taken at
  their first read (MySQL/MariaDB's REPEATABLE READ), nothing is read before the waits for the
  key's and the entity's locks, so the handler reads the writes of the step it waited for.

Errors: every method but :meth:`Transaction.run_handler` raises
:class:`~rocketmq_dedup.errors.StoreError` (an outage as
:class:`~rocketmq_dedup.errors.StoreUnavailableError`, a lock wait or deadlock as
:class:`~rocketmq_dedup.errors.StoreLockConflictError`), wrapped once, or
:class:`~rocketmq_dedup.errors.TransactionMisuseError` when the handler left the session unfit
to commit; ``run_handler`` raises what the handler raised.
"""

from __future__ import annotations

import abc
import contextvars
from typing import Any, Callable, List, NamedTuple, Optional

from rocketmq_dedup.message import DedupElement, fields_digest
from rocketmq_dedup.stores.base import Record


class Entity(NamedTuple):
    """An entity of the sequence guard: its application and its id."""

    application: str
    name: str

    def digest(self) -> bytes:
        """Its key in the sequence table: SHA-256 of the length-prefixed (application, name)
        (:func:`~rocketmq_dedup.message.fields_digest`)."""
        return fields_digest(self)


class SequenceStep(NamedTuple):
    """An entity's step that a commit applies: its sequence number becomes ``seq``."""

    entity: Entity
    seq: int


class KeyClaim(NamedTuple):
    """What :meth:`Transaction.claim_key` found."""

    taken: bool
    """Whether this transaction now holds the key's lock (False: another attempt holds it, so
    a copy is in its handler right now)."""
    record: Optional[Record] = None
    """When taken: the key's live record, if any (a copy that committed)."""
    last_seq: Optional[int] = None
    """When taken with an entity: the entity's last applied sequence number (None: none yet);
    its row is locked until the end of the transaction."""


class Transaction(abc.ABC):
    """One message's transaction (see the module docstring for the order of the calls)."""

    #: What the handler gets as ``conn``.
    conn: Any

    #: What :meth:`call_after_commit` registered (None: nothing); the strategy calls each once
    #: the transaction committed.
    after_commit: Optional[List[Callable[[], None]]] = None

    def call_after_commit(self, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called once this transaction has committed, never when it rolls
        back: by the strategy, on the consumer's thread, after the COMMIT's answer and before
        the message is acked. A callback registered twice is called once; one that raises is
        logged and changes nothing."""
        callbacks = self.after_commit
        if callbacks is None:
            callbacks = self.after_commit = []
        if callback not in callbacks:
            callbacks.append(callback)

    @abc.abstractmethod
    def claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        """Take the key's lock without waiting; once held, lock the entity's sequence row (if
        any, waiting for it) and read the key's live record. The lock is held until the
        transaction ends."""

    @abc.abstractmethod
    def lock_sequence(self, entity: Entity) -> Optional[int]:
        """Lock the entity's sequence row until the end of the transaction (waiting for it;
        creating it when new) and return its last applied sequence number (None: none)."""

    def before_handler(self) -> None:  # noqa: B027 - optional hook
        """Right before :meth:`run_handler`: have the transaction begun on the server, if no
        statement did yet, so that the handler's statements run in it (and a transaction
        found ended after the handler is the handler's doing). Raises :class:`StoreError`
        (never into the handler). Nothing by default: a connection whose transaction begins
        with its first statement needs nothing."""

    @abc.abstractmethod
    def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        """``handler(msg, conn)``, with the calls that would end or reconfigure the transaction
        refused while it runs; returns what it returned, raises what it raised."""

    @abc.abstractmethod
    def misuse(self) -> Optional[str]:
        """After the handler: how it ended, left or broke its transaction, if it visibly did,
        as a phrase that follows "do_handle_msg" (e.g. "called commit() on its connection");
        None when the transaction is intact."""

    @abc.abstractmethod
    def commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep] = None,
    ) -> Optional[Record]:
        """Write the CONSUMED record (and the entity's new sequence number) and COMMIT, in as
        few round trips as the connection allows. Returns None when committed, else the live
        record of another attempt that refused it (nothing was committed; :meth:`close` rolls
        back). An expired record in the way is replaced in the same transaction."""

    @abc.abstractmethod
    def commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        """Roll back the handler's writes (and nothing else: a key's lock taken by
        :meth:`claim_key` stays held), then write the FAILED record with ``reason`` (at most
        :data:`~rocketmq_dedup.stores.base.MAX_REASON_LENGTH` characters; on a table without a
        reason column, the record without it) and COMMIT it alone, in a transaction of its
        own on the same connection. No sequence step is applied. Returns None when committed,
        else the live record of another attempt that refused it (nothing was committed); an
        expired record in the way is replaced, as :meth:`commit_record` does."""

    @abc.abstractmethod
    def commit(self) -> None:
        """COMMIT without a record (a message without a dedup key)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Roll back what is still open and give the connection back, or discard it when it
        raised, was misused, or may still hold a lock. Never raises."""


class TransactionSource(abc.ABC):
    """Opens the exactly-once mode's transactions on one database."""

    #: Whether the sequence guard is available (its table exists, or can).
    supports_sequences: bool = True

    @abc.abstractmethod
    def begin(self, hold_seconds: int) -> Transaction:
        """One message's transaction, whose session the server ends after ``hold_seconds``
        idle (a frozen consumer holds its locks no longer)."""


class AsyncTransaction(abc.ABC):
    """One call's transaction on an asyncio connection: :class:`Transaction`'s port, awaited
    (the same order of the calls, the same promises and errors), for
    :func:`~rocketmq_dedup.exactly_once` over an ``async def``. What a call never needs is not
    part of it: the sequence guard (a call has no sequence key) and ``commit_failure`` (a
    function that raises rolls back and its caller gets the exception: no FAILED record)."""

    #: What the function gets as ``conn``.
    conn: Any

    #: Never set by a call's function (:meth:`Transaction.call_after_commit` is the listener's
    #: outbox): the strategy's after-commit step reads it as "nothing".
    after_commit: Optional[List[Callable[[], None]]] = None

    @abc.abstractmethod
    async def claim_key(self, element: DedupElement) -> KeyClaim:
        """:meth:`Transaction.claim_key` without an entity."""

    async def before_handler(self) -> None:  # noqa: B027 - optional hook
        """:meth:`Transaction.before_handler`."""

    @abc.abstractmethod
    async def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        """``await handler(msg, conn)``, the calls that would end the transaction refused."""

    @abc.abstractmethod
    async def misuse(self) -> Optional[str]:
        """:meth:`Transaction.misuse`."""

    @abc.abstractmethod
    async def commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        """:meth:`Transaction.commit_record`."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """:meth:`Transaction.commit`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """:meth:`Transaction.close`: never raises."""


class AsyncTransactionSource(abc.ABC):
    """Opens :class:`AsyncTransaction` s on one database (an asyncio store's ``transactions``)."""

    @abc.abstractmethod
    async def begin(self, hold_seconds: int) -> AsyncTransaction:
        """:meth:`TransactionSource.begin`, awaited."""


#: The transaction whose handler runs in this context (thread), set by the strategy around it.
running_transaction: contextvars.ContextVar[Optional[Transaction]] = contextvars.ContextVar(
    "rocketmq_dedup_running_transaction", default=None
)


def current_transaction() -> Optional[Transaction]:
    """The exactly-once transaction whose handler is running on this thread, or None outside a
    handler."""
    return running_transaction.get()


__all__ = [
    "AsyncTransaction",
    "AsyncTransactionSource",
    "Entity",
    "KeyClaim",
    "SequenceStep",
    "Transaction",
    "TransactionSource",
    "current_transaction",
    "running_transaction",
]
