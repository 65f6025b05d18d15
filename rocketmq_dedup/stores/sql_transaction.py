"""What the SQL databases' implementations of the exactly-once port
(:mod:`rocketmq_dedup.stores.transaction`) share: one message's transaction as a chain of I/O
steps that each database writes (:meth:`SqlTransaction._claim_key`, ``_lock_sequence``,
``_commit_record``, ``_commit``, ``_rollback``), and around them the rules that are the same on
MySQL and PostgreSQL:

* every driver error of a step is wrapped once (the database's own classification: an outage, a
  lock conflict, a refusal a person must fix, a defect), and a connection whose step raised is
  never given to another message;
* the handler runs with the calls that would end or reconfigure its transaction refused
  (:meth:`refuse`, which also marks the transaction misused, so a handler that catches the
  refusal and returns True still fails);
* after the handler, :meth:`misuse` asks the database's implementation how the session is
  (without a round trip where the driver knows), once;
* :meth:`close` rolls back what is still open and gives the connection back only when nothing
  went wrong with it; it never raises. It also lets go of the handler's ``conn``: that object
  refers back to the transaction (its guard reports misuse to :meth:`refuse`), and the cycle
  would leave every message's transaction (4 to 10 objects) to the cyclic garbage collector,
  which then ran about five times as often as for the same work written by hand (measured in
  the bench's exactly-once cases); without it, reference counting frees them at once.
"""

from __future__ import annotations

import abc
import logging
from typing import Any, Awaitable, Callable, Optional, TypeVar

from rocketmq_dedup.errors import StoreError, TransactionMisuseError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import Record, bounded_reason
from rocketmq_dedup.stores.handler_connection import end_guarded
from rocketmq_dedup.stores.transaction import (
    AsyncTransaction,
    Entity,
    KeyClaim,
    SequenceStep,
    Transaction,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How a session that changed under the transaction (a reconnect) is told.
RECONNECTED = "lost the session its transaction began on (a reconnect)"


class SqlTransactionRules:
    """What the sync and the asyncio transactions on a SQL database share (module docstring):
    the state, the refusal, which connection is fit for reuse and how a step's error is
    wrapped.

    :param wrap: the database's error for a driver error of these transactions.
    """

    #: A statement or the handler raised: never reuse the connection.
    broken = False
    #: How the handler broke the transaction.
    misused: Optional[str] = None
    #: Neither committed nor rolled back yet.
    _open = True
    # (class-level defaults: a transaction is made per message, and sets them only when they
    # change)

    def __init__(self, wrap: Callable[[BaseException], StoreError]) -> None:
        self._wrap = wrap

    def refuse(self, what: str) -> None:
        """Called by the guards: record the misuse and raise it into the handler."""
        if self.misused is None:
            self.misused = f"called {what} on its connection"
        raise TransactionMisuseError(
            f"do_handle_msg called {what} on its connection: the listener ends the message's "
            "transaction itself (return True to commit, False or raise to roll back), and the "
            "connection is in use until then"
        )

    def _handler_raised(self, exc: BaseException) -> None:
        """The handler raised ``exc``: by default its connection is never reused (it may have
        left it mid-result)."""
        self.broken = True

    def _fit(self) -> bool:
        """Whether the connection may serve another message once the transaction ended."""
        return not self.broken and self.misused is None

    def _step_failed(self, exc: BaseException) -> BaseException:
        """A step of the dedup layer raised ``exc``: the connection is not reused, and what to
        raise is returned (a driver error wrapped once; ours and interrupts as they are)."""
        self.broken = True
        if isinstance(exc, (StoreError, TransactionMisuseError)) or not isinstance(exc, Exception):
            return exc
        return self._wrap(exc)


class SqlTransaction(SqlTransactionRules, Transaction):
    """One message's transaction on a SQL database (module docstring)."""

    # -- the database's steps ----------------------------------------------------------------

    @abc.abstractmethod
    def _claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        """:meth:`Transaction.claim_key`'s statements."""

    @abc.abstractmethod
    def _lock_sequence(self, entity: Entity) -> Optional[int]:
        """:meth:`Transaction.lock_sequence`'s statements."""

    @abc.abstractmethod
    def _commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep],
    ) -> Optional[Record]:
        """:meth:`Transaction.commit_record`'s statements; sets ``_open`` False once the
        transaction ended (committed, or rolled back after a refusal)."""

    @abc.abstractmethod
    def _commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        """:meth:`Transaction.commit_failure`'s statements: roll the handler's writes back,
        then the FAILED record alone and COMMIT; sets ``_open`` False once the transaction
        ended."""

    @abc.abstractmethod
    def _commit(self) -> None:
        """COMMIT (and what must go with it)."""

    @abc.abstractmethod
    def _rollback(self) -> None:
        """ROLLBACK (and what must go with it)."""

    @abc.abstractmethod
    def _session_misuse(self) -> Optional[str]:
        """After the handler: how the session is unfit to commit (a reconnect, an ended
        transaction, autocommit...), as a phrase that follows "do_handle_msg"; None when
        intact."""

    def _guard(self) -> None:
        """Start refusing the calls that end or reconfigure the transaction (a proxy that
        refuses at all times needs nothing here)."""

    def _unguard(self) -> None:
        """Stop refusing them."""

    @abc.abstractmethod
    def _give_back(self, fit: bool) -> None:
        """Give the connection back (``fit``) or discard it."""

    # -- the port ------------------------------------------------------------------------------

    def claim_key(self, element: DedupElement, entity: Optional[Entity]) -> KeyClaim:
        return self._io(self._claim_key, element, entity)

    def lock_sequence(self, entity: Entity) -> Optional[int]:
        return self._io(self._lock_sequence, entity)

    def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        self._guard()
        try:
            return handler(msg, self.conn)
        except BaseException as exc:
            self._handler_raised(exc)
            raise
        finally:
            self._unguard()

    def misuse(self) -> Optional[str]:
        if self.misused is None:
            self.misused = self._io(self._session_misuse)
        return self.misused

    def commit_record(
        self,
        element: DedupElement,
        owner: str,
        retention_ms: int,
        applied: Optional[SequenceStep] = None,
    ) -> Optional[Record]:
        return self._io(self._commit_record, element, owner, retention_ms, applied)

    def commit_failure(
        self, element: DedupElement, owner: str, retention_ms: int, reason: str
    ) -> Optional[Record]:
        reason = bounded_reason(reason)  # as every store keeps one (the port's promise)
        return self._io(self._commit_failure, element, owner, retention_ms, reason)

    def commit(self) -> None:
        self._io(self._commit)
        self._open = False

    def close(self) -> None:
        if self._open:
            try:
                self._rollback()
            except BaseException:
                self.broken = True  # the server rolls back and frees the locks when the
                logger.debug("rollback failed; the connection will be discarded", exc_info=True)
        self._open = False
        try:
            self._give_back(self._fit())
        except Exception:
            logger.debug("giving a transaction's connection back failed", exc_info=True)
        end_guarded(self.conn)  # a conn the handler kept now refuses every use
        self.conn = None  # the cycle through the handler's conn (module docstring)

    # -- shared rules ----------------------------------------------------------------------------

    def _io(self, step: Callable[..., T], *args: Any) -> T:
        """Run a step of the dedup layer; a driver error is wrapped once, and the connection
        is not reused after any error."""
        try:
            return step(*args)
        except BaseException as exc:
            failure = self._step_failed(exc)
            if failure is exc:
                raise
            raise failure from exc


class AsyncSqlTransaction(SqlTransactionRules, AsyncTransaction):
    """One call's transaction on an asyncio connection to a SQL database: the rules of
    :class:`SqlTransaction` (shared: :class:`SqlTransactionRules`), each step awaited."""

    @abc.abstractmethod
    async def _claim_key(self, element: DedupElement) -> KeyClaim:
        """:meth:`AsyncTransaction.claim_key`'s statements."""

    @abc.abstractmethod
    async def _commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        """:meth:`SqlTransaction._commit_record`, awaited."""

    @abc.abstractmethod
    async def _commit(self) -> None:
        """COMMIT."""

    @abc.abstractmethod
    async def _rollback(self) -> None:
        """ROLLBACK."""

    @abc.abstractmethod
    def _session_misuse(self) -> Optional[str]:
        """:meth:`SqlTransaction._session_misuse` (read from the driver, no round trip)."""

    @abc.abstractmethod
    async def _give_back(self, fit: bool) -> None:
        """Give the connection back (``fit``) or discard it."""

    # -- the port ------------------------------------------------------------------------------

    async def claim_key(self, element: DedupElement) -> KeyClaim:
        return await self._io(self._claim_key(element))

    async def run_handler(self, handler: Callable[[Any, Any], Any], msg: Any) -> Any:
        try:
            return await handler(msg, self.conn)
        except BaseException as exc:
            self._handler_raised(exc)
            raise

    async def misuse(self) -> Optional[str]:
        if self.misused is None:
            self.misused = self._session_misuse()
        return self.misused

    async def commit_record(
        self, element: DedupElement, owner: str, retention_ms: int
    ) -> Optional[Record]:
        return await self._io(self._commit_record(element, owner, retention_ms))

    async def commit(self) -> None:
        await self._io(self._commit())
        self._open = False

    async def close(self) -> None:
        if self._open:
            try:
                await self._rollback()
            except BaseException:
                self.broken = True
                logger.debug("rollback failed; the connection will be discarded", exc_info=True)
        self._open = False
        try:
            await self._give_back(self._fit())
        except Exception:
            logger.debug("giving a transaction's connection back failed", exc_info=True)
        end_guarded(self.conn)  # a conn the handler kept now refuses every use
        self.conn = None  # the cycle through the handler's conn (module docstring)

    async def _io(self, step: Awaitable[T]) -> T:
        """:meth:`SqlTransaction._io`, awaited."""
        try:
            return await step
        except BaseException as exc:
            failure = self._step_failed(exc)
            if failure is exc:
                raise
            raise failure from exc


__all__ = ["RECONNECTED", "AsyncSqlTransaction", "SqlTransaction", "SqlTransactionRules"]
