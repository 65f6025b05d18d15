"""What a SQL store gives the in-process purger (:class:`rocketmq_dedup.purger.Purger`): a
session of its own that holds the table's purge lock and deletes expired rows in small batches.
Redis needs none: its records expire by themselves (a TTL on every key).

A store that supports it (:class:`PurgeableStore`: the MySQL store; a PostgreSQL store
implements the same three operations) opens a :class:`PurgeSession` on a **new connection**,
never one of the pool its consumers use, in autocommit mode. The session's contract:

* :meth:`~PurgeSession.try_lock`: the table's purge lock, without waiting: True when this
  session holds it. The lock belongs to the database session, so it is freed when the session
  ends, a crashed process's with its connection, and one session at a time holds it, across
  every process that uses the table. MySQL: ``GET_LOCK(name, 0)``; PostgreSQL:
  ``pg_try_advisory_lock(key)`` (the session-level advisory lock).
* :meth:`~PurgeSession.purge_batch`: reads the next ``batch_size`` keys after ``after`` in
  primary-key order (a plain read, no locks) and deletes the expired ones among them by key, in
  one short statement that checks the expiry again (a row taken over since the read is live and
  stays). Each batch is its own transaction (autocommit): never a long one, never an unbounded
  delete, row locks on expired rows only, taken in key order like the consumers' multi-row
  writes. A batch that meets a consumer's lock gives way (a deadlock or a lock wait timeout
  deletes nothing; the next pass takes those rows).
* :meth:`~PurgeSession.close`: ends the session (and frees the lock).
"""

from __future__ import annotations

import abc
from typing import NamedTuple, Protocol, runtime_checkable


class PurgeBatch(NamedTuple):
    """What one batch of the purge did."""

    deleted: int
    """Expired rows deleted."""
    scanned: int
    """Rows read (fewer than the batch size: the end of the table)."""
    last_key: bytes
    """The last key read: where the next batch starts."""
    oldest_expired_ms: int
    """How long ago the longest-expired row of the batch expired (0 when none had)."""


class PurgeSession(abc.ABC):
    """A database session of its own for the purge (see the module docstring)."""

    #: The name of the table's purge lock (for logs).
    lock_name: str = ""

    @abc.abstractmethod
    def try_lock(self) -> bool:
        """Take the table's purge lock without waiting; True when this session holds it."""

    @abc.abstractmethod
    def lock_holder(self) -> str:
        """Who holds the purge lock, for a log line (e.g. ``connection 1234``; "" unknown)."""

    @abc.abstractmethod
    def purge_batch(self, after: bytes, batch_size: int) -> PurgeBatch:
        """Delete the expired rows among the next ``batch_size`` keys after ``after``."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the session: its connection is closed and the lock freed. Never raises."""


@runtime_checkable
class PurgeableStore(Protocol):
    """A store whose expired records a :class:`~rocketmq_dedup.purger.Purger` deletes."""

    table_name: str

    def purge_session(self) -> PurgeSession:
        """A new :class:`PurgeSession` on a connection of its own."""
        ...

    def describe(self) -> str:
        """Where the records live (for logs)."""
        ...
