"""The outbox on MySQL/MariaDB: the port of :mod:`rocketmq_dedup.stores.outbox`, its SQL text in
:mod:`.sql` (``<table>_outbox`` and ``<table>_outbox_lane``).

* **Write** (in the handler's transaction, through its connection): one ``INSERT``; with a
  sharding key, first the key's lock, an upsert of its row in ``<table>_outbox_lane`` that is
  held until the transaction ends. A second transaction writing for the same key waits there
  until the first commits (or rolls back), so its row's AUTO_INCREMENT id is assigned after the
  first's commit: within a sharding key, id order is commit order. (Ids alone would not do:
  they are assigned at the INSERT, and two transactions may commit in the other order.)
* **Claim** (a relay's own connection, four round trips where the connection takes several
  statements in one text): the heads, PENDING rows due now with no unsent row of their key
  before them, in one consistent read; the runs that follow the heads of sharding keys; then, in
  a transaction, the rows still sendable, locked ``FOR UPDATE SKIP LOCKED`` (rows another relay
  is claiming are skipped, not waited for); a run is kept up to its first row not locked; the
  claim (owner, lease as ``due_at``) is written and committed with the rows read back.
* **Settle**: one round trip of ``UPDATE`` statements, each only for rows the claim still holds.

Needs ``FOR UPDATE SKIP LOCKED`` (MariaDB 10.6+, MySQL 8.0+) and window functions for the runs
(MariaDB 10.2+, MySQL 8.0+). The relays' connections come from the store's factory, prepared as
the store's others (autocommit, utf8mb4, UTC), in a small pool of their own.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from rocketmq_dedup.errors import DedupConfigError, StoreError
from rocketmq_dedup.outbox.message import OutboxMessage, properties_from_json
from rocketmq_dedup.status import OutboxStatus
from rocketmq_dedup.stores.mysql.connection import Runner, Statements, autocommit_on, column_text
from rocketmq_dedup.stores.mysql.errors import as_store_error, is_connection_error
from rocketmq_dedup.stores.mysql.pool import ConnectionPool
from rocketmq_dedup.stores.mysql.sql import (
    OUTBOX_BACKLOG_SQL,
    OUTBOX_CLAIM_SQL,
    OUTBOX_CLAIMED_SQL,
    OUTBOX_DROP_SQL,
    OUTBOX_HEADS_SQL,
    OUTBOX_INSERT_SQL,
    OUTBOX_LANE_LOCK_SQL,
    OUTBOX_LANE_PURGE_SQL,
    OUTBOX_LANE_SCHEMA_SQL,
    OUTBOX_LIST_SQL,
    OUTBOX_LIST_STATUS_SQL,
    OUTBOX_LOCK_SQL,
    OUTBOX_PARK_SQL,
    OUTBOX_PURGE_SQL,
    OUTBOX_RELEASE_SQL,
    OUTBOX_RETRY_LATER_SQL,
    OUTBOX_RETRY_PARKED_SQL,
    OUTBOX_RETRY_SQL,
    OUTBOX_RUN_SQL,
    OUTBOX_SCHEMA_SQL,
    OUTBOX_SENT_SQL,
    RELAY_SESSION_SQL,
    outbox_table_names,
    quote_table,
)
from rocketmq_dedup.stores.outbox import (
    Backlog,
    ClaimedRow,
    Failure,
    ListedRow,
    OutboxTables,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Connections of the relays' pool: a relay's loop uses one at a time; one more for its backlog
#: gauge and the operator calls.
POOL_SIZE = 2
#: ``last_error`` is a VARCHAR(1024).
_ERROR_CHARS = 1024
_START: Tuple[str, Sequence[Any]] = ("START TRANSACTION", ())
_COMMIT: Tuple[str, Sequence[Any]] = ("COMMIT", ())


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class MySQLOutboxTables(OutboxTables):
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
        self._insert = OUTBOX_INSERT_SQL.format(table=table)
        self._lane_lock = OUTBOX_LANE_LOCK_SQL.format(lanes=lanes)
        self._heads = OUTBOX_HEADS_SQL.format(table=table)
        self._backlog = OUTBOX_BACKLOG_SQL.format(table=table)
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

    def _sql(self, template: str, n: int = 0) -> str:
        return template.format(table=self._table, lanes=self._lanes, marks=_marks(n))

    # -- in the handler's transaction ---------------------------------------------------------

    def write(self, conn: Any, message: OutboxMessage) -> int:
        row = (
            message.sharding_key,
            message.topic,
            message.tag,
            message.message_key,
            " ".join(message.other_keys),
            message.properties_json(),
            message.body,
        )
        try:
            if hasattr(conn, "exec_driver_sql"):  # a SQLAlchemy Connection
                if message.sharding_key is not None:
                    conn.exec_driver_sql(self._lane_lock, (message.sharding_key,))
                return int(conn.exec_driver_sql(self._insert, row).lastrowid)
            cursor = conn.cursor()
            try:
                if message.sharding_key is not None:
                    cursor.execute(self._lane_lock, (message.sharding_key,))
                cursor.execute(self._insert, row)
                return int(cursor.lastrowid)
            finally:
                cursor.close()
        except Exception as exc:
            raise as_store_error(exc, self.describe()) from exc

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
        connection the idle ones are closed and ``fn`` runs once more (every operation here may
        run twice: an interrupted transaction was rolled back by the server, and a second
        settle changes nothing the first did)."""
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

    def claim(self, owner: str, limit: int, run: int, lease_ms: int) -> List[ClaimedRow]:
        return self._op(self._claim, owner, limit, run, lease_ms)

    def _claim(
        self, runner: Runner, owner: str, limit: int, run: int, lease_ms: int
    ) -> List[ClaimedRow]:
        heads = runner.run(self._heads, (limit, limit), True)
        if not heads:
            return []
        groups = self._groups(
            runner, [(int(i), column_text(lane)) for i, lane in heads], run, limit
        )
        wanted = [i for group in groups for i in group][:limit]
        if not wanted:
            return []
        locked = {
            int(row[0])
            for row in runner.run_all([_START, (self._sql(OUTBOX_LOCK_SQL, len(wanted)), wanted)])[
                1
            ]
        }
        kept: List[int] = []
        for group in groups:  # a run up to its first row not locked
            for i in group:
                if i not in locked or len(kept) >= limit:
                    break
                kept.append(i)
        if not kept:
            runner.run_all([_COMMIT])
            return []
        n = len(kept)
        _, rows, _ = runner.run_all(
            [
                (self._sql(OUTBOX_CLAIM_SQL, n), (owner, lease_ms, *kept)),
                (self._sql(OUTBOX_CLAIMED_SQL, n), kept),
                _COMMIT,
            ]
        )
        by_id = {int(row[0]): _claimed(row) for row in rows}
        return [by_id[i] for i in kept if i in by_id]

    def _groups(
        self, runner: Runner, heads: List[Tuple[int, Optional[str]]], run: int, limit: int
    ) -> List[List[int]]:
        """The heads in order, each a group: alone, or (``run`` > 1, a sharding key) followed
        by the sendable rows of its key that come right after it, read now (a row that is not
        due, claimed or in its backoff, ends the run), as many as the claim has room for."""
        lanes = [(i, lane) for i, lane in heads if lane is not None]
        room = limit - len(heads)  # the heads fill the claim: no runs
        if run <= 1 or not lanes or room <= 0:
            return [[i] for i, _ in heads]
        each = min(run - 1, -(-room // len(lanes)))
        sql = " UNION ALL ".join([self._sql(OUTBOX_RUN_SQL)] * len(lanes))
        params = [value for i, lane in lanes for value in (lane, i, each)]
        after: Dict[int, List[Tuple[int, bool]]] = {}
        heads_of = {lane: i for i, lane in lanes}
        for row_id, lane, sendable in runner.run(sql, params, True):
            head = heads_of[column_text(lane)]
            after.setdefault(head, []).append((int(row_id), bool(sendable)))
        groups = []
        for i, lane in heads:
            group = [i]
            if lane is not None:
                for row_id, sendable in sorted(after.get(i, [])):
                    if not sendable:
                        break
                    group.append(row_id)
            groups.append(group)
        return groups

    def settle(
        self,
        owner: str,
        sent: Sequence[Tuple[int, str]],
        failed: Sequence[Failure],
        released: Sequence[int],
        release_in_ms: int = 0,
    ) -> None:
        statements: List[Tuple[str, Sequence[Any]]] = []
        if sent:
            ids = [i for i, _ in sent]
            n = len(ids)
            sql = self._sql(OUTBOX_SENT_SQL, n)
            statements.append((sql, [*ids, *(m for _, m in sent), *ids, owner]))
        for failure in failed:
            error = failure.error[:_ERROR_CHARS]
            if failure.park:
                statements.append((self._sql(OUTBOX_PARK_SQL), (error, failure.id, owner)))
            else:
                statements.append(
                    (
                        self._sql(OUTBOX_RETRY_LATER_SQL),
                        (failure.retry_in_ms, error, failure.id, owner),
                    )
                )
        if released:
            statements.append(
                (
                    self._sql(OUTBOX_RELEASE_SQL, len(released)),
                    (release_in_ms, *released, owner),
                )
            )
        if statements:
            self._op(_run_all, statements)

    def backlog(self) -> Backlog:
        rows = self._op(_fetch, self._backlog, ())
        pending, oldest, parked = rows[0]
        return Backlog(int(pending), None if oldest is None else int(oldest), int(parked))

    # -- operators -----------------------------------------------------------------------------

    def rows(
        self, status: Optional[OutboxStatus], limit: int, after_id: int = 0
    ) -> List[ListedRow]:
        if status is None:
            found = self._op(_fetch, self._sql(OUTBOX_LIST_SQL), (after_id, limit))
        else:
            sql = self._sql(OUTBOX_LIST_STATUS_SQL)
            found = self._op(_fetch, sql, (status.value, after_id, limit))
        return [_listed(row) for row in found]

    def retry(self, ids: Optional[Sequence[int]]) -> int:
        if ids is None:
            return int(self._op(_count, self._sql(OUTBOX_RETRY_PARKED_SQL), ()))
        if not ids:
            return 0
        return int(self._op(_count, self._sql(OUTBOX_RETRY_SQL, len(ids)), list(ids)))

    def drop(self, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        return int(self._op(_count, self._sql(OUTBOX_DROP_SQL, len(ids)), list(ids)))

    def purge(
        self,
        older_than_ms: int,
        batch_size: int = 1000,
        progress: Optional[Callable[[int], None]] = None,
    ) -> int:
        total = 0
        for template in (OUTBOX_PURGE_SQL, OUTBOX_LANE_PURGE_SQL):
            sql = self._sql(template)
            while True:
                deleted = int(self._op(_count, sql, (older_than_ms, batch_size)))
                if template is OUTBOX_PURGE_SQL:
                    total += deleted
                    if progress is not None:
                        progress(total)
                if deleted < batch_size:
                    break
        return total

    def close(self) -> None:
        self.pool.close()


def _run_all(runner: Runner, statements: Statements) -> List[Any]:
    return runner.run_all(statements)


def _fetch(runner: Runner, sql: str, params: Sequence[Any]) -> Any:
    return runner.run(sql, params, True)


def _count(runner: Runner, sql: str, params: Sequence[Any]) -> Any:
    return runner.run(sql, params, False)


def _claimed(row: Sequence[Any]) -> ClaimedRow:
    """A row :data:`~.sql.OUTBOX_CLAIMED_SQL` read."""
    row_id, topic, tag, key, others, props, body, lane, attempts, failing_for = row
    other_keys = column_text(others)
    message = OutboxMessage(
        topic=column_text(topic),
        body=bytes(body),
        message_key=column_text(key),
        other_keys=tuple(other_keys.split()) if other_keys else (),
        tag=column_text(tag),
        properties=properties_from_json(props),
        sharding_key=column_text(lane),
    )
    failing = None if failing_for is None else int(failing_for)
    return ClaimedRow(int(row_id), message, int(attempts), failing)


def _listed(row: Sequence[Any]) -> ListedRow:
    """A row :data:`~.sql.OUTBOX_LIST_SQL` read."""
    row_id, status, topic, tag, key, lane, attempts, age, due_in, owner, size, error = row
    return ListedRow(
        id=int(row_id),
        status=OutboxStatus(column_text(status)),
        topic=column_text(topic),
        tag=column_text(tag),
        message_key=column_text(key),
        sharding_key=column_text(lane),
        attempts=int(attempts),
        age_ms=int(age),
        due_in_ms=int(due_in),
        claimed_by=column_text(owner),
        body_bytes=int(size),
        last_error=column_text(error),
    )


__all__ = ["MySQLOutboxTables"]
