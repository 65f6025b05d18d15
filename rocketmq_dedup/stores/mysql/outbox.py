"""The outbox on MySQL/MariaDB: the port of :mod:`rocketmq_dedup.stores.outbox`, its SQL text in
:mod:`.sql` (``<table>_outbox`` and ``<table>_outbox_lane``).

* **Write** (in the handler's transaction, through its connection): one ``INSERT``; with a
  sharding key, first the key's lock, an upsert of its row in ``<table>_outbox_lane`` that is
  held until the transaction ends. A second transaction writing for the same key waits there
  until the first commits (or rolls back), so its row's AUTO_INCREMENT id is assigned after the
  first's commit: within a sharding key, id order is commit order. (Ids alone would not do:
  they are assigned at the INSERT, and two transactions may commit in the other order.)
* **Claim** and **settle** (a relay's own connection): as every SQL database's
  (:mod:`rocketmq_dedup.stores.sql_outbox`), four round trips for a claim and one for a settle
  where the connection takes several statements in one text; the runs behind the heads are one
  index range per sharding key, UNION ALL'd.

Needs ``FOR UPDATE SKIP LOCKED`` (MariaDB 10.6+, MySQL 8.0+) and window functions for the runs
(MariaDB 10.2+, MySQL 8.0+). The relays' connections come from the store's factory, prepared as
the store's others (autocommit, utf8mb4, UTC), in a small pool of their own.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.stores.mysql.connection import Runner, Statements, autocommit_on
from rocketmq_dedup.stores.mysql.errors import as_store_error, is_connection_error
from rocketmq_dedup.stores.mysql.pool import ConnectionPool
from rocketmq_dedup.stores.mysql.sql import (
    NOW_MS,
    OUTBOX_INSERT_SQL,
    OUTBOX_LANE_LOCK_SQL,
    OUTBOX_LANE_PURGE_SQL,
    OUTBOX_LANE_SCHEMA_SQL,
    OUTBOX_PURGE_SQL,
    OUTBOX_RUN_SQL,
    OUTBOX_SCHEMA_SQL,
    OUTBOX_SENT_SQL,
    RELAY_SESSION_SQL,
    outbox_table_names,
    quote_table,
)
from rocketmq_dedup.stores.sql_outbox import SqlOutboxTables, portable_statements

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Connections of the relays' pool: a relay's loop uses one at a time; one more for its backlog
#: gauge and the operator calls.
POOL_SIZE = 2


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class MySQLOutboxTables(SqlOutboxTables):
    """The outbox of a MySQL store (module docstring).

    :param open_runner: opens a new prepared connection (the store's).
    :param table_name: the dedup table; the outbox's are named after it.
    :param describe: the store's description, for errors.
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table_name: str,
        pool_timeout: float,
        describe: Callable[[], str],
    ) -> None:
        names = outbox_table_names(table_name)
        if names is None:
            raise DedupConfigError(
                f"no outbox for table {table_name!r}: {table_name}_outbox_lane would be longer "
                "than 64 characters (use a table name of at most 52)"
            )
        self.name, self.lane_table = names
        self._describe = describe
        table, lanes = quote_table(self.name), quote_table(self.lane_table)
        self._table = table
        self._lanes = lanes
        self._run_sql = OUTBOX_RUN_SQL.format(table=table)
        self._sent_sql = OUTBOX_SENT_SQL.format(table=table, marks="{marks}")
        self.sql = portable_statements(
            table,
            lanes,
            now_ms=NOW_MS,
            body_length="LENGTH",
            begin="START TRANSACTION",
            lane_lock=OUTBOX_LANE_LOCK_SQL,
            insert=OUTBOX_INSERT_SQL,
            purge=OUTBOX_PURGE_SQL,
            lane_purge=OUTBOX_LANE_PURGE_SQL,
        )
        self._open_runner = open_runner
        self.pool = ConnectionPool(self._open_relay_runner, POOL_SIZE, pool_timeout)

    def describe(self) -> str:
        return f"{self._describe()} outbox {self.name}"

    def _open_relay_runner(self) -> Runner:
        """A connection for the relays: the store's, in READ COMMITTED. Under REPEATABLE READ
        the claim's locking read and the UPDATEs would take gap locks on the status index,
        and a handler's INSERT into such a gap would wait for the relay while the relay waits
        for the handler's row (a deadlock, measured with eight writers and three relays)."""
        runner = self._open_runner()
        try:
            runner.run(RELAY_SESSION_SQL, (), False)
        except BaseException:
            runner.close()
            raise
        return runner

    def schema_statements(self) -> List[str]:
        return [
            OUTBOX_SCHEMA_SQL.format(table=self._table),
            OUTBOX_LANE_SCHEMA_SQL.format(table=self._lanes),
        ]

    # -- in the handler's transaction ---------------------------------------------------------

    def _inserted_id(self, result: Any) -> int:
        return int(result.lastrowid)

    def _store_error(self, exc: Exception) -> StoreError:
        return as_store_error(exc, self.describe())

    def in_transaction(self, conn: Any) -> Optional[bool]:
        if hasattr(conn, "exec_driver_sql"):
            return bool(conn.in_transaction())
        autocommit = autocommit_on(conn)  # mysqlclient, PyMySQL
        if autocommit is not None:
            return not autocommit
        return None  # mysql-connector-python keeps no such status

    # -- the relays' connections ---------------------------------------------------------------

    def _op(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(runner, *args)`` on a pooled connection, errors wrapped once; after a lost
        connection the idle ones are closed and ``fn`` runs once more."""
        pool = self.pool
        for attempt in (1, 2):
            try:
                runner = pool.take()
            except StoreError:
                raise
            except Exception as exc:
                raise as_store_error(exc, self.describe()) from exc
            try:
                result = fn(runner, *args)
            except Exception as exc:
                pool.discard(runner)
                if attempt == 2 or not is_connection_error(exc):
                    raise as_store_error(exc, self.describe()) from exc
                pool.drain()
                continue
            except BaseException:
                pool.discard(runner)
                raise
            pool.give(runner)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetch(self, runner: Runner, sql: str, params: Sequence[Any]) -> List[Any]:
        return list(runner.run(sql, params, True))

    def _count(self, runner: Runner, sql: str, params: Sequence[Any]) -> int:
        return int(runner.run(sql, params, False))

    def _run_all(self, runner: Runner, statements: Statements) -> List[Any]:
        return runner.run_all(statements)

    def _ids(self, template: str, ids: Sequence[int]) -> Tuple[str, List[Any]]:
        return template.format(ids=f"id IN ({_marks(len(ids))})"), list(ids)

    def _runs(self, lanes: Sequence[Tuple[int, str]], each: int) -> Tuple[str, List[Any]]:
        sql = " UNION ALL ".join([self._run_sql] * len(lanes))
        return sql, [value for i, lane in lanes for value in (lane, i, each)]

    def _sent(self, owner: str, sent: Sequence[Tuple[int, str]]) -> Tuple[str, List[Any]]:
        ids = [i for i, _ in sent]
        sql = self._sent_sql.format(marks=_marks(len(ids)))
        return sql, [*ids, *(m for _, m in sent), *ids, owner]

    def close(self) -> None:
        self.pool.close()


__all__ = ["MySQLOutboxTables"]
