"""The MySQL store's purge: one batch of it (:func:`purge_step`, for ``purge_expired()`` and the
in-process purger), and the purger's session (:class:`MySQLPurgeSession`, the contract in
:mod:`rocketmq_dedup.stores.purge`).

The session is a connection of its own, opened from the store's factory and prepared like the
pool's (autocommit, utf8mb4, UTC), then set to READ COMMITTED (a key that vanished between the
scan and the DELETE takes no gap lock that a consumer's insert would wait for) and to a short
``innodb_lock_wait_timeout`` (a batch that meets a consumer's row lock gives way within seconds;
the next pass takes those rows). Its purge lock is ``GET_LOCK(name, 0)``, named after the
table's schema and name (hashed: a lock name is at most 64 characters), held until the session
ends.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from rocketmq_dedup.stores.mysql.connection import Runner
from rocketmq_dedup.stores.mysql.errors import is_lock_conflict
from rocketmq_dedup.stores.mysql.sql import PURGE_SCAN_SQL, PURGE_SQL
from rocketmq_dedup.stores.purge import PurgeBatch, PurgeSession, purge_batch

#: Seconds a purge DELETE waits for a row lock a consumer holds before it gives way.
PURGE_LOCK_WAIT_S = 2

#: The purge lock's name: 21 characters and the SHA-1 of ``<schema>.<table>`` (the schema of
#: a qualified name, else the connection's database).
LOCK_NAME_SQL = (
    "SELECT CONCAT('rocketmq_dedup_purge_', SHA1(CONCAT(COALESCE(%s, DATABASE()), '.', %s)))"
)
TRY_LOCK_SQL = "SELECT GET_LOCK(%s, 0)"
HOLDER_SQL = "SELECT IS_USED_LOCK(%s)"
SESSION_SQL = (
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    f"SET SESSION innodb_lock_wait_timeout = {PURGE_LOCK_WAIT_S}",
)


def purge_step(
    runner: Runner, table: str, after: bytes, batch_size: int, dry_run: bool = False
) -> PurgeBatch:
    """One batch on ``runner``'s connection: read ``batch_size`` keys after ``after`` in key
    order, with how long ago each expired, and delete the expired ones by key (with ``dry_run``:
    count them). A DELETE that meets a consumer's lock (a deadlock, a lock wait timeout)
    deletes nothing."""
    rows = runner.run(PURGE_SCAN_SQL.format(table=table), (after, batch_size), True)

    def delete(keys: List[bytes]) -> int:
        sql = PURGE_SQL.format(table=table, marks=", ".join(["%s"] * len(keys)))
        return int(runner.run(sql, keys, False))

    return purge_batch(rows, delete, is_lock_conflict, after, dry_run)


class MySQLPurgeSession(PurgeSession):
    """The purger's session on a MySQL/MariaDB table (module docstring).

    :param open_runner: the store's connection opener (a new, prepared connection).
    :param table_name: the table, as validated (``db.table`` or ``table``).
    :param quoted: the table as an identifier for SQL text.
    :param wrap: turns a driver error into the store's error (outage or defect).
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table_name: str,
        quoted: str,
        wrap: Callable[[Exception], Exception],
    ) -> None:
        self._table = quoted
        self._wrap = wrap
        self._runner: Optional[Runner] = None
        runner = self._call(open_runner)
        self._runner = runner
        try:
            schema, _, table = table_name.rpartition(".")
            for statement in SESSION_SQL:
                self._call(runner.run, statement, (), False)
            [(name,)] = self._call(runner.run, LOCK_NAME_SQL, (schema or None, table), True)
            self.lock_name = str(name.decode() if isinstance(name, bytes) else name)
        except BaseException:
            self.close()
            raise

    def _run(self, sql: str, params: Any, fetch: bool) -> Any:
        if self._runner is None:
            raise self._closed()
        return self._call(self._runner.run, sql, params, fetch)

    def try_lock(self) -> bool:
        [(got,)] = self._run(TRY_LOCK_SQL, (self.lock_name,), True)
        return bool(got == 1)

    def lock_holder(self) -> str:
        [(holder,)] = self._run(HOLDER_SQL, (self.lock_name,), True)
        return f"connection {holder}" if holder is not None else "nobody"

    def purge_batch(self, after: bytes, batch_size: int) -> PurgeBatch:
        if self._runner is None:
            raise self._closed()
        batch: PurgeBatch = self._call(purge_step, self._runner, self._table, after, batch_size)
        return batch

    def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
