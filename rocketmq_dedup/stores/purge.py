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
import logging
from typing import Any, Callable, List, NamedTuple, Protocol, Sequence, Tuple, runtime_checkable

logger = logging.getLogger(__name__)


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


def purge_batch(
    rows: Sequence[Tuple[bytes, int]],
    delete: Callable[[List[bytes]], int],
    gives_way: Callable[[BaseException], bool],
    after: bytes,
    dry_run: bool = False,
) -> PurgeBatch:
    """One batch, from the keys a store's scan read (``rows``: each key and how long ago it
    expired, in ms; negative: live): ``delete(expired keys)`` (with ``dry_run``: count them).
    A DELETE that meets a consumer's lock (``gives_way``: a deadlock, a lock wait timeout)
    deletes nothing; the next pass takes those rows."""
    expired = [bytes(key) for key, overdue in rows if overdue >= 0]
    oldest = max((int(overdue) for _, overdue in rows), default=0)
    count = len(expired)
    if expired and not dry_run:
        try:
            count = int(delete(expired))
        except Exception as exc:
            if not gives_way(exc):
                raise
            logger.debug("a purge batch gave way to a consumer's lock: %s", exc)
            count = 0
    last = bytes(rows[-1][0]) if rows else after
    return PurgeBatch(count, len(rows), last, max(0, oldest))


class PurgeSession(abc.ABC):
    """A database session of its own for the purge (see the module docstring)."""

    #: The name of the table's purge lock (for logs).
    lock_name: str = ""
    #: The store's error for a driver error (outage, refusal or defect).
    _wrap: Callable[[Exception], Exception]

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a driver error raised as the store's error."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self._wrap(exc) from exc

    def _closed(self) -> Exception:
        """The error of a call on a closed session."""
        return self._wrap(RuntimeError("the purge session is closed"))

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
