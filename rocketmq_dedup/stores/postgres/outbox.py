"""The outbox on PostgreSQL: the port of :mod:`rocketmq_dedup.stores.outbox`, its SQL text in
:mod:`.sql` (``<table>_outbox`` and ``<table>_outbox_lane``, created with the dedup table).

* **Write** (in the handler's transaction, through its connection: a psycopg connection, the
  exactly-once handler's ``conn``, or a SQLAlchemy ``Connection``): one ``INSERT ... RETURNING
  id``; with a sharding key, first the key's lock, ``INSERT ... ON CONFLICT DO UPDATE`` of its
  row in ``<table>_outbox_lane``, held until the transaction ends. A second transaction writing
  for the same key waits there until the first commits (or rolls back), so its row's id (the
  identity's sequence) is taken after the first's commit: within a sharding key, id order is
  commit order. Neither statement fails on purpose: PostgreSQL aborts the whole transaction at
  a failed statement, and the handler's writes with it.
* **Claim** and **settle** (a relay's own connection): as every SQL database's
  (:mod:`rocketmq_dedup.stores.sql_outbox`); the statements of one step go in one round trip
  (psycopg's pipeline mode): the heads, the runs (one statement over arrays), [BEGIN, the lock
  ``FOR UPDATE SKIP LOCKED``], [the claim, the rows, COMMIT]; a settle's UPDATEs together.

The relays' connections come from the store's source (a factory, an engine's detached
connections, or a new connection of a psycopg_pool pool's conninfo, never one of the pool's),
prepared as the store's others (autocommit, UTF-8), in a small pool of their own; they read
committed, PostgreSQL's default (its row locks take no gaps: a relay never blocks a handler's
INSERT).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.stores.pool import BoundedPool
from rocketmq_dedup.stores.postgres.connections import Runner, import_psycopg, is_outage
from rocketmq_dedup.stores.postgres.sql import (
    NOW_MS,
    OUTBOX_INSERT_SQL,
    OUTBOX_LANE_LOCK_SQL,
    OUTBOX_LANE_PURGE_SQL,
    OUTBOX_PURGE_SQL,
    OUTBOX_RUN_SQL,
    OUTBOX_SENT_SQL,
    outbox_schema_statements,
    outbox_table_names,
    quote_table,
)
from rocketmq_dedup.stores.sql_outbox import SqlOutboxTables, Statements, portable_statements

T = TypeVar("T")

#: Connections of the relays' pool: a relay's loop uses one at a time; one more for its backlog
#: gauge and the operator calls.
POOL_SIZE = 2


class PostgresOutboxTables(SqlOutboxTables):
    """The outbox of a PostgreSQL store (module docstring).

    :param open_runner: opens a new prepared connection of the store's source.
    :param table_name: the dedup table; the outbox's are named after it.
    :param describe: the store's description, for errors.
    :param wrap: the store's error for a driver error.
    """

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        table_name: str,
        pool_timeout: float,
        describe: Callable[[], str],
        wrap: Callable[[Exception], StoreError],
    ) -> None:
        names = outbox_table_names(table_name)
        if names is None:
            raise DedupConfigError(
                f"no outbox for table {table_name!r}: the outbox's names (the longest "
                f"{table_name}_outbox_by_status) would be longer than 63 bytes (use a table "
                "name of at most 46)"
            )
        self.name, self.lane_table = names
        self._table_name = table_name
        self._describe = describe
        self._wrap = wrap
        table, lanes = quote_table(self.name), quote_table(self.lane_table)
        self._run_sql = OUTBOX_RUN_SQL.format(table=table)
        self._sent_sql = OUTBOX_SENT_SQL.format(table=table)
        self.sql = portable_statements(
            table,
            lanes,
            now_ms=NOW_MS,
            body_length="octet_length",
            begin="BEGIN",
            lane_lock=OUTBOX_LANE_LOCK_SQL,
            insert=OUTBOX_INSERT_SQL,
            purge=OUTBOX_PURGE_SQL,
            lane_purge=OUTBOX_LANE_PURGE_SQL,
        )
        self.pool: BoundedPool[Runner] = BoundedPool(
            open_runner, POOL_SIZE, pool_timeout, "PostgreSQL", is_outage, self.describe
        )

    def describe(self) -> str:
        return f"{self._describe()} outbox {self.name}"

    def schema_statements(self) -> List[str]:
        return outbox_schema_statements(self._table_name)

    def _store_error(self, exc: Exception) -> StoreError:
        """The store's error for a driver error (for a SQLAlchemy error, the psycopg error it
        wraps)."""
        orig = getattr(exc, "orig", None)
        return self._wrap(orig if isinstance(orig, Exception) else exc)

    # -- in the handler's transaction ---------------------------------------------------------

    def _inserted_id(self, result: Any) -> int:
        (row_id,) = result.fetchone()  # INSERT ... RETURNING id
        return int(row_id)

    def in_transaction(self, conn: Any) -> Optional[bool]:
        """A SQLAlchemy ``Connection``'s own answer; a psycopg connection's from its session's
        status (no round trip): in a transaction (or one aborted), or idle with autocommit off
        (psycopg begins one at the first statement)."""
        if hasattr(conn, "exec_driver_sql"):
            return bool(conn.in_transaction())
        status = getattr(getattr(conn, "info", None), "transaction_status", None)
        if status is None:
            return None
        states = import_psycopg().pq.TransactionStatus
        if status in (states.INTRANS, states.INERROR):
            return True
        if status == states.IDLE:
            return not conn.autocommit
        return None  # a statement running, or a broken connection: the write will tell

    # -- the relays' connections ---------------------------------------------------------------

    def _op(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(runner, *args)`` on a pooled connection (:meth:`BoundedPool.run`: a connection
        that raised is closed, so none is left in a transaction; after a lost one, ``fn`` runs
        once more), errors wrapped once."""
        try:
            return self.pool.run(fn, *args)
        except StoreError:
            raise
        except Exception as exc:
            raise self._store_error(exc) from exc

    def _fetch(self, runner: Runner, sql: str, params: Sequence[Any]) -> List[Any]:
        return runner.rows(sql, params)

    def _count(self, runner: Runner, sql: str, params: Sequence[Any]) -> int:
        return runner.count(sql, params)

    def _run_all(self, runner: Runner, statements: Statements) -> List[Any]:
        """The statements in one pipeline (one round trip); each one's rows or count."""
        conn = runner.conn
        cursors = []
        with conn.pipeline():
            for sql, params in statements:
                cursor = conn.cursor()
                cursor.execute(sql, params)
                cursors.append(cursor)
        try:
            return [
                cursor.fetchall() if cursor.description is not None else cursor.rowcount
                for cursor in cursors
            ]
        finally:
            for cursor in cursors:
                cursor.close()

    def _ids(self, template: str, ids: Sequence[int]) -> Tuple[str, List[Any]]:
        return template.format(ids="id = ANY(%s::bigint[])"), [list(ids)]

    def _runs(self, lanes: Sequence[Tuple[int, str]], each: int) -> Tuple[str, List[Any]]:
        return self._run_sql, [[lane for _, lane in lanes], [i for i, _ in lanes], each]

    def _sent(self, owner: str, sent: Sequence[Tuple[int, str]]) -> Tuple[str, List[Any]]:
        return self._sent_sql, [[i for i, _ in sent], [m for _, m in sent], owner]

    def close(self) -> None:
        self.pool.close()


__all__ = ["PostgresOutboxTables"]
