"""The in-process purger: deletes a SQL store's expired records in the background, paced so it
never competes with consumption, one runner at a time across every process that uses the table.

Opt in by starting one per process next to your listeners (``with Purger(config.persist):``).
It belongs to the table, not to a listener: one per process is enough, whatever number of
listeners and applications share the table, and running it in every consumer process costs one
idle connection each (a standby) while keeping a purge going as long as any consumer runs.

What a purger does, on a thread of its own:

* opens a session of its own (:meth:`PurgeableStore.purge_session`: a new connection, never one
  of the pool the consumers use) and tries the table's purge lock without waiting (MySQL
  ``GET_LOCK(name, 0)``). The lock belongs to the database session: one purger runs, the others
  are standbys that try again every ``interval_seconds``, and when the runner stops (``close``,
  a crash, a lost connection) the lock is freed with its session and a standby takes over.
* each pass walks the table in primary-key order, ``batch_size`` rows a batch, each batch one
  short autocommit statement deleting the expired rows by key (never an unbounded delete, never
  a long transaction; a live row, or one taken over since it was read, is never deleted), and
  sleeps ``pause_seconds`` between batches. A batch that meets a consumer's row lock gives way.
  A pass starts ``interval_seconds`` after the last one ended.
* reports each batch to ``metrics`` (:meth:`DedupMetrics.purge`: rows deleted, and the purge
  lag, how long the longest-expired row the pass has met had been expired) and logs each pass,
  each change of runner and each failure (rate-limited) through ``logging``.
* ``close()`` stops it promptly: a running batch finishes (a statement of at most
  ``batch_size`` rows), the session ends, the lock is freed.

Redis needs no purger: its records expire by themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional

from rocketmq_dedup._ratelimit import RateLimitedLog
from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.metrics import DedupMetrics
from rocketmq_dedup.stores.purge import PurgeableStore, PurgeSession

logger = logging.getLogger(__name__)
_ratelimited = RateLimitedLog(logger, interval=60.0)

DEFAULT_INTERVAL_S = 300.0
DEFAULT_BATCH_SIZE = 1000
DEFAULT_PAUSE_S = 0.5


def _positive(name: str, value: Any, integer: bool = False) -> Any:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < 10**9:
        kind = "an int" if integer else "a number of seconds"
        raise DedupConfigError(f"{name} must be {kind} above 0; got {value!r}")
    return value


class Purger:
    """Deletes a SQL store's expired records on a thread of its own (the module docstring says
    how). ``start()`` it (or use it as a context manager), ``close()`` it when the process
    stops consuming.

    :param store: the store, e.g. ``config.persist`` (a :class:`~rocketmq_dedup.MySQLDedupStore`;
        any :class:`~rocketmq_dedup.stores.purge.PurgeableStore`).
    :param interval_seconds: the wait between two passes, and between a standby's tries of
        the lock (300 s).
    :param batch_size: rows read per batch; the expired ones among them are deleted (1000).
    :param pause_seconds: sleep between two batches of a pass (0.5 s).
    :param metrics: where each batch is reported (:meth:`DedupMetrics.purge`), e.g. the
        config's ``metrics``.
    """

    def __init__(
        self,
        store: Any,
        *,
        interval_seconds: float = DEFAULT_INTERVAL_S,
        batch_size: int = DEFAULT_BATCH_SIZE,
        pause_seconds: float = DEFAULT_PAUSE_S,
        metrics: Optional[DedupMetrics] = None,
    ) -> None:
        if not isinstance(store, PurgeableStore):
            raise DedupConfigError(
                f"{type(store).__qualname__} has nothing to purge: the in-process purger is "
                "for SQL stores (MySQLDedupStore); Redis expires its records by itself"
            )
        self.store = store
        self.interval = float(_positive("interval_seconds", interval_seconds))
        self.batch_size = int(_positive("batch_size", batch_size, integer=True))
        self.pause = float(_positive("pause_seconds", pause_seconds))
        self._report = getattr(metrics, "purge", None)
        self._table = store.table_name
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._session: Optional[PurgeSession] = None
        self._held: Optional[bool] = None  # what the last try of the lock said; None: no session
        #: Passes completed, and expired rows deleted, by this purger.
        self.passes = 0
        self.deleted = 0

    @property
    def running(self) -> bool:
        """True while this purger holds the table's purge lock (it is the one purging)."""
        return self._held is True

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Purger:
        """Start the purger's thread (once); returns the purger."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"rocketmq-dedup-purger-{self._table}", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop: a running batch finishes, the session ends and frees the lock. Waits up to
        ``timeout`` seconds for the thread."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                logger.warning(
                    "purge of %s: still finishing a batch after %.0f s", self._table, timeout
                )

    def __enter__(self) -> Purger:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        where = self.store.describe()
        logger.info(
            "purge of %s: started (a pass every %.0f s, %d rows a batch, %.2f s between batches)",
            where,
            self.interval,
            self.batch_size,
            self.pause,
        )
        while not self._stopping.is_set():
            try:
                if self._lead(where):
                    self._pass(where)
            except Exception as exc:  # the next try opens a new session
                _ratelimited.log(
                    logging.WARNING,
                    "purge of %s failed: %s; trying again in %.0f s",
                    where,
                    exc,
                    self.interval,
                )
                self._end_session()
            self._stopping.wait(self.interval)
        self._end_session()
        logger.info("purge of %s: stopped", where)

    def _lead(self, where: str) -> bool:
        """Whether this purger runs the purge now: its session holds (or just took) the lock."""
        if self._session is None:
            self._session = self.store.purge_session()
        holds = self._session.try_lock()
        if holds == self._held:
            return holds
        self._held = holds
        if holds:
            logger.info(
                "purge of %s: this process purges the table (it holds the lock %s)",
                where,
                self._session.lock_name,
            )
        else:
            logger.info(
                "purge of %s: another process purges the table (the lock %s is held by %s); "
                "trying again every %.0f s",
                where,
                self._session.lock_name,
                self._session.lock_holder(),
                self.interval,
            )
        return holds

    def _pass(self, where: str) -> None:
        """One walk over the table, batch by batch, pausing between batches."""
        assert self._session is not None
        began = time.monotonic()
        after, deleted, scanned, batches, lag_ms = b"", 0, 0, 0, 0
        while True:
            batch = self._session.purge_batch(after, self.batch_size)
            batches += 1
            deleted += batch.deleted
            scanned += batch.scanned
            lag_ms = max(lag_ms, batch.oldest_expired_ms)
            self.deleted += batch.deleted
            self._metrics(batch.deleted, lag_ms / 1000)
            if batch.scanned < self.batch_size or self._stopping.wait(self.pause):
                break
            after = batch.last_key
        self.passes += 1
        logger.info(
            "purge of %s: deleted %d expired row(s) of %d read in %d batch(es), %.1f s; the "
            "longest-expired had expired %.0f s before",
            where,
            deleted,
            scanned,
            batches,
            time.monotonic() - began,
            lag_ms / 1000,
        )

    def _metrics(self, deleted: int, lag_seconds: float) -> None:
        if self._report is None:
            return
        try:
            self._report(self._table, deleted, lag_seconds)
        except Exception:
            _ratelimited.log(logging.WARNING, "purge metrics failed", exc_info=True)

    def _end_session(self) -> None:
        session, self._session = self._session, None
        self._held = None
        if session is not None:
            session.close()
