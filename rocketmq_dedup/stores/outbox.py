"""The outbox's port: what :class:`~rocketmq_dedup.outbox.Outbox` and its relays need from the
database the handlers write to, and nothing else. A store that has an outbox offers
:class:`OutboxTables` as its ``outbox`` attribute (MySQL's:
:class:`~rocketmq_dedup.stores.mysql.outbox.MySQLOutboxTables`, PostgreSQL's:
:class:`~rocketmq_dedup.stores.postgres.outbox.PostgresOutboxTables`, both on
:class:`~rocketmq_dedup.stores.sql_outbox.SqlOutboxTables`); another database plugs in by
implementing this class (its SQL text, how a row is written and claimed there).

A row's life: :meth:`~OutboxTables.write` (in the handler's transaction, through its
connection: the row commits with the handler's writes, or never) -> PENDING; a relay's
:meth:`~OutboxTables.claim` -> still PENDING, held by the relay for a lease; after the
broker's answer, :meth:`~OutboxTables.settle` -> SENT, back to PENDING after a backoff, or
PARKED; an operator's :meth:`~OutboxTables.retry` -> PENDING again, :meth:`~OutboxTables.drop`
-> DROPPED; :meth:`~OutboxTables.purge` deletes SENT and DROPPED rows past their retention.

What an implementation promises (the relays rely on it):

* **A sharding key's rows in commit order.** :meth:`~OutboxTables.write` of a row with a
  sharding key takes that key's lock in the handler's transaction (held until it ends), so the
  rows of one sharding key are ordered as their transactions committed: a row written later in
  that order never sorts before an earlier one (MySQL: by the AUTO_INCREMENT id, assigned
  under the lock).
* **Heads only.** :meth:`~OutboxTables.claim` returns a row with a sharding key only when every
  earlier row of that key is SENT or DROPPED (a PARKED or unsent one holds the rest back), or
  when those earlier rows are claimed with it, in order, as one run; rows without one in any
  order. It decides from one consistent read (the earlier rows of a key committed before the
  row, so a read that sees the row sees them).
* **One relay per row.** A claimed row is held by its claim (an owner token) until the lease
  ends: other relays skip it (MySQL: ``FOR UPDATE SKIP LOCKED``, then the claim written and
  committed). :meth:`~OutboxTables.settle` changes only rows its owner still holds, so a
  relay whose lease lapsed marks nothing another relay has taken since.

Errors: :class:`~rocketmq_dedup.errors.StoreError` (an outage as
:class:`~rocketmq_dedup.errors.StoreUnavailableError`), wrapped once.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

from rocketmq_dedup.outbox.message import OutboxMessage
from rocketmq_dedup.status import OutboxStatus


class ClaimedRow(NamedTuple):
    """A row a relay claimed, to send."""

    id: int
    message: OutboxMessage
    attempts: int
    """Sends tried before this claim."""
    failing_for_ms: Optional[int]
    """How long its sends have been failing (since the first failure); None: never failed."""


class Failure(NamedTuple):
    """What a relay learnt of a row whose send failed."""

    id: int
    error: str
    park: bool
    """True: PARKED (not retried until an operator says so); False: PENDING again after
    ``retry_in_ms``."""
    retry_in_ms: int = 0


class Backlog(NamedTuple):
    """The outbox's unsent rows."""

    pending: int
    oldest_pending_ms: Optional[int]
    """Age of the oldest PENDING row (None: none)."""
    parked: int


class ListedRow(NamedTuple):
    """A row as an operator sees it (``rocketmq-dedup outbox list``)."""

    id: int
    status: OutboxStatus
    topic: str
    tag: Optional[str]
    message_key: str
    sharding_key: Optional[str]
    attempts: int
    age_ms: int
    """Since the row was written."""
    due_in_ms: int
    """Until a relay may (again) take it; 0 or less: now."""
    claimed_by: Optional[str]
    body_bytes: int
    last_error: Optional[str]


class OutboxTables(abc.ABC):
    """An outbox's tables in one database (module docstring)."""

    #: The outbox table's name (the metrics' ``outbox`` label).
    name: str

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the outbox is, for messages (never a password)."""

    @abc.abstractmethod
    def schema_statements(self) -> List[str]:
        """The statements that create its tables (idempotent)."""

    # -- in the handler's transaction ---------------------------------------------------------

    @abc.abstractmethod
    def write(self, conn: Any, message: OutboxMessage) -> int:
        """Write ``message`` as a PENDING row through ``conn`` (a DB-API connection, or a
        SQLAlchemy ``Connection``, in its transaction) and return its id; with a sharding key,
        first take that key's lock (module docstring). Raises what the driver raised, wrapped:
        the caller's transaction decides what happens next."""

    @abc.abstractmethod
    def in_transaction(self, conn: Any) -> Optional[bool]:
        """Whether ``conn`` is in a transaction (so a row written through it commits with the
        rest), as far as the driver tells without a round trip; None: it does not tell."""

    # -- the relays' own connections -----------------------------------------------------------

    @abc.abstractmethod
    def claim(self, owner: str, limit: int, run: int, lease_ms: int) -> List[ClaimedRow]:
        """Claim up to ``limit`` sendable rows for ``owner`` for ``lease_ms`` (module
        docstring): heads of their sharding keys, each followed by up to ``run - 1`` rows of
        its key in order; rows without a sharding key. Returned in send order (a sharding
        key's rows in its order). Rows in their backoff, or held by another claim, are
        skipped."""

    @abc.abstractmethod
    def settle(
        self,
        owner: str,
        sent: Sequence[tuple[int, str]],
        failed: Sequence[Failure],
        released: Sequence[int],
        release_in_ms: int = 0,
    ) -> None:
        """After the broker's answers: ``sent`` (row id, the broker's message id) -> SENT;
        ``failed`` -> PENDING after their backoff, or PARKED; ``released`` (not tried) ->
        claimable again after ``release_in_ms``. Only rows ``owner`` still holds change."""

    @abc.abstractmethod
    def backlog(self) -> Backlog:
        """The unsent rows: how many, the oldest PENDING one's age, how many are PARKED."""

    # -- operators -----------------------------------------------------------------------------

    @abc.abstractmethod
    def rows(
        self, status: Optional[OutboxStatus], limit: int, after_id: int = 0
    ) -> List[ListedRow]:
        """Rows with id above ``after_id`` (of ``status``, or every status), oldest first."""

    @abc.abstractmethod
    def retry(self, ids: Optional[Sequence[int]]) -> int:
        """PARKED rows (and PENDING ones in their backoff, not claimed) back to PENDING, due
        now: those of ``ids``, or every PARKED row when None. Returns how many."""

    @abc.abstractmethod
    def drop(self, ids: Sequence[int]) -> int:
        """PARKED rows (and PENDING ones not claimed) of ``ids`` -> DROPPED: never sent; the
        rows of their sharding key behind them go on. Returns how many."""

    @abc.abstractmethod
    def purge(
        self,
        older_than_ms: int,
        batch_size: int = 1000,
        progress: Optional[Callable[[int], None]] = None,
    ) -> int:
        """Delete SENT and DROPPED rows sent (or dropped) more than ``older_than_ms`` ago, and
        sharding-key locks unused for as long with no unsent row, ``batch_size`` at a time;
        returns the rows deleted."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connections it opened (it reconnects if used again)."""


__all__ = ["Backlog", "ClaimedRow", "Failure", "ListedRow", "OutboxTables"]
