"""The PostgreSQL store's purge: one batch of it (:func:`purge_step`, for ``purge_expired()`` and
the in-process purger), and the purger's session (:class:`PostgresPurgeSession`, the contract in
:mod:`rocketmq_dedup.stores.purge`).

The session is a connection of its own, opened from the store's factory (or the engine, or the
psycopg_pool pool's connection string: never a pooled connection), prepared like the store's
(autocommit, UTF-8), with a short ``lock_timeout`` (a batch that meets a consumer's row lock
gives way within seconds; the next pass takes those rows). Its purge lock is the session-level
advisory lock ``pg_try_advisory_lock`` on a 64-bit key made of a constant and the table's oid
(one lock per table of the database, whatever the search path), held until the session ends.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from rocketmq_dedup.stores.postgres.connections import Runner, is_lock_conflict
from rocketmq_dedup.stores.postgres.sql import (
    PURGE_LOCK_HOLDER_SQL,
    PURGE_SCAN_SQL,
    PURGE_SESSION_SQL,
    PURGE_SQL,
    PURGE_TRY_LOCK_SQL,
    TABLE_OID_SQL,
    quote_table,
)
from rocketmq_dedup.stores.purge import PurgeBatch, PurgeSession, purge_batch

#: The purge lock's high 32 bits ("RQDP"); its low 32 bits are the table's oid.
PURGE_LOCK_CLASS = 0x52514450


def purge_step(
    runner: Runner, table: str, after: bytes, batch_size: int, dry_run: bool = False
) -> PurgeBatch:
    """One batch on ``runner``'s connection: read ``batch_size`` keys after ``after`` in key
    order, with how long ago each expired, and delete the expired ones by key (with ``dry_run``:
    count them). A DELETE that meets a consumer's lock (a deadlock, a lock wait ended by
    ``lock_timeout``) deletes nothing."""
    rows = runner.rows(PURGE_SCAN_SQL.format(table=table), (after, batch_size))

    def delete(keys: List[bytes]) -> int:
        return runner.count(PURGE_SQL.format(table=table), (keys,))

    return purge_batch(rows, delete, is_lock_conflict, after, dry_run)


class PostgresPurgeSession(PurgeSession):
    """The purger's session on a PostgreSQL table (module docstring).

    :param open_runner: opens a new connection, prepared as the store's, in a runner.
    :param table_name: the table, as validated (``schema.table`` or ``table``).
    :param wrap: turns a driver error into the store's error (outage, refusal or defect).
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table_name: str,
        wrap: Callable[[Exception], Exception],
    ) -> None:
        self._table = quote_table(table_name)
        self._wrap = wrap
        self._runner: Optional[Runner] = None
        runner = self._call(open_runner)
        self._runner = runner
        try:
            self._call(runner.count, PURGE_SESSION_SQL, ())
            [(oid,)] = self._call(runner.rows, TABLE_OID_SQL, (self._table,))
            if oid is None:
                raise self._wrap(RuntimeError(f"the table {table_name} does not exist"))
            self._key = (PURGE_LOCK_CLASS << 32) + int(oid)
            self.lock_name = f"pg_advisory_lock({self._key}) (the purge of {table_name})"
        except BaseException:
            self.close()
            raise

    def _open_runner(self) -> Runner:
        if self._runner is None:
            raise self._closed()
        return self._runner

    def try_lock(self) -> bool:
        [(got,)] = self._call(self._open_runner().rows, PURGE_TRY_LOCK_SQL, (self._key,))
        return bool(got)

    def lock_holder(self) -> str:
        high, low = self._key >> 32, self._key & 0xFFFFFFFF
        rows = self._call(self._open_runner().rows, PURGE_LOCK_HOLDER_SQL, (high, low))
        return f"backend {rows[0][0]}" if rows else "nobody"

    def purge_batch(self, after: bytes, batch_size: int) -> PurgeBatch:
        batch: PurgeBatch = self._call(
            purge_step, self._open_runner(), self._table, after, batch_size
        )
        return batch

    def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
