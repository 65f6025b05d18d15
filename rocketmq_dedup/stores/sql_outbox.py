"""What the SQL databases' outboxes share (the port: :mod:`rocketmq_dedup.stores.outbox`): the
statements both databases write alike, and every decision, so that a database's class
(:class:`~rocketmq_dedup.stores.mysql.outbox.MySQLOutboxTables`,
:class:`~rocketmq_dedup.stores.postgres.outbox.PostgresOutboxTables`) does I/O only.

* **The claim** (:meth:`SqlOutboxTables.claim`, on a relay's own connection): the heads, PENDING
  rows due now with no unsent row of their key before them, in one consistent read; the runs
  that follow the heads of sharding keys (:meth:`~SqlOutboxTables._runs`); then, in a
  transaction, the rows still sendable, locked ``FOR UPDATE SKIP LOCKED`` (rows another relay is
  claiming are skipped, not waited for); a run is kept up to its first row not locked
  (:func:`kept_in_runs`); the claim (owner, lease as ``due_at``) is written and committed with
  the rows read back.
* **Settle**: one batch of ``UPDATE`` statements, each only for rows the claim still holds; an
  error is kept as its column holds it (:func:`bounded_error`).
* **Operators**: list, retry, drop; the purge deletes ``batch_size`` rows at a time.

The statements' text (:class:`OutboxSql`) is built from :func:`portable_statements` with the
database's clock (``{now_ms}``: epoch milliseconds on the server's clock), the body's length
function and, left for each call, ``{ids}``: the database's "id is one of these" (MySQL
``id IN (%s, ...)``, PostgreSQL ``id = ANY(%s)``, :meth:`SqlOutboxTables._ids`).
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from rocketmq_dedup.errors import StoreError
from rocketmq_dedup.outbox.message import OutboxMessage, properties_from_json
from rocketmq_dedup.status import OutboxStatus
from rocketmq_dedup.stores.outbox import Backlog, ClaimedRow, Failure, ListedRow, OutboxTables
from rocketmq_dedup.stores.sql_common import column_text

#: ``last_error`` is a VARCHAR(1024) on every database.
ERROR_CHARS = 1024

#: Statements run in order in one batch (a round trip where the database allows it).
Statements = List[Tuple[str, Sequence[Any]]]


class OutboxSql(NamedTuple):
    """An outbox's statements, formatted for its tables; ``{ids}`` is left for each call."""

    lane_lock: str
    """In the handler's transaction: the sharding key's lock, held until the transaction ends,
    by a statement that never fails on purpose. Parameter: the sharding key."""
    insert: str
    """In the handler's transaction: the row (:func:`row_values`); the database's id of it is
    :meth:`SqlOutboxTables._inserted_id`'s."""
    heads: str
    """Parameters (limit of rows without a sharding key, limit); rows (id, lane): each sharding
    key's first PENDING row if it is due and no row of the key is PARKED (a parked row holds
    back the rest of its key), and the due PENDING rows without a sharding key, in id order."""
    begin: str
    lock: str
    """Parameters (ids); rows (id,): those still sendable, locked, skipping rows another relay
    is claiming (in a transaction)."""
    claim: str
    """Parameters (owner, lease ms, ids): the claim, held for the lease."""
    claimed: str
    """Parameters (ids); the rows to send (:func:`claimed_row`)."""
    commit: str
    retry_later: str
    """Parameters (retry in ms, error, id, owner)."""
    park: str
    """Parameters (error, id, owner)."""
    release: str
    """Parameters (release in ms, ids, owner)."""
    backlog: str
    """One row: PENDING rows, the oldest one's age (ms, or NULL), PARKED rows."""
    list_all: str
    """Parameters (after id, limit); rows as :func:`listed_row` reads them."""
    list_status: str
    """Parameters (status, after id, limit)."""
    retry: str
    """Parameters (ids)."""
    retry_parked: str
    drop: str
    """Parameters (ids)."""
    purge: str
    """Parameters (older than ms, batch size): SENT and DROPPED rows past the retention."""
    lane_purge: str
    """Parameters (older than ms, batch size): sharding-key locks unused for as long with no
    unsent row (a transaction that takes the lock meanwhile updates ``used_at`` first, and the
    DELETE, waiting for it, then skips it)."""


def portable_statements(
    table: str,
    lanes: str,
    *,
    now_ms: str,
    body_length: str,
    begin: str,
    lane_lock: str,
    insert: str,
    purge: str,
    lane_purge: str,
) -> OutboxSql:
    """The statements both databases write alike, formatted for the outbox ``table`` and its
    locks ``lanes`` (quoted), with the database's clock in epoch ms, the body's length function,
    its BEGIN, and its own statements: the handler's two (an upsert and how an INSERT's id comes
    back differ) and the purge's (a DELETE with a LIMIT is MySQL's alone)."""
    retryable = "(status = 'PARKED' OR (status = 'PENDING' AND claimed_by IS NULL))"
    listed = (
        f"id, status, topic, tag, message_key, lane, attempts, {now_ms} - created_at, "
        f"due_at - {now_ms}, claimed_by, {body_length}(body), last_error"
    )
    text = OutboxSql(
        lane_lock=lane_lock,
        insert=insert,
        heads=(
            "SELECT id, lane FROM ("
            "SELECT o.id, o.lane FROM (SELECT lane, MIN(id) AS id FROM {table} "
            "WHERE status = 'PENDING' AND lane IS NOT NULL GROUP BY lane) h "
            f"JOIN {{table}} o ON o.id = h.id WHERE o.due_at <= {now_ms} "
            "AND NOT EXISTS (SELECT 1 FROM {table} p "
            "WHERE p.lane = h.lane AND p.status = 'PARKED') "
            "UNION ALL "
            "(SELECT id, lane FROM {table} "
            f"WHERE status = 'PENDING' AND lane IS NULL AND due_at <= {now_ms} "
            "ORDER BY id LIMIT %s)"
            ") heads ORDER BY id LIMIT %s"
        ),
        begin=begin,
        lock=(
            "SELECT id FROM {table} WHERE {ids} AND status = 'PENDING' "
            f"AND due_at <= {now_ms} FOR UPDATE SKIP LOCKED"
        ),
        claim=f"UPDATE {{table}} SET claimed_by = %s, due_at = {now_ms} + %s WHERE {{ids}}",
        claimed=(
            "SELECT id, topic, tag, message_key, other_keys, properties, body, lane, attempts, "
            f"{now_ms} - failing_since FROM {{table}} WHERE {{ids}}"
        ),
        commit="COMMIT",
        retry_later=(
            f"UPDATE {{table}} SET claimed_by = NULL, due_at = {now_ms} + %s, "
            f"attempts = attempts + 1, last_error = %s, "
            f"failing_since = COALESCE(failing_since, {now_ms}) WHERE id = %s AND claimed_by = %s"
        ),
        park=(
            "UPDATE {table} SET status = 'PARKED', claimed_by = NULL, attempts = attempts + 1, "
            f"last_error = %s, failing_since = COALESCE(failing_since, {now_ms}) "
            "WHERE id = %s AND claimed_by = %s"
        ),
        release=(
            f"UPDATE {{table}} SET claimed_by = NULL, due_at = {now_ms} + %s "
            "WHERE {ids} AND claimed_by = %s"
        ),
        backlog=(
            "SELECT (SELECT COUNT(*) FROM {table} WHERE status = 'PENDING'), "
            f"(SELECT {now_ms} - created_at FROM {{table}} "
            "WHERE id = (SELECT MIN(id) FROM {table} WHERE status = 'PENDING')), "
            "(SELECT COUNT(*) FROM {table} WHERE status = 'PARKED')"
        ),
        list_all=f"SELECT {listed} FROM {{table}} WHERE id > %s ORDER BY id LIMIT %s",
        list_status=(
            f"SELECT {listed} FROM {{table}} WHERE status = %s AND id > %s ORDER BY id LIMIT %s"
        ),
        retry=(
            "UPDATE {table} SET status = 'PENDING', due_at = 0, failing_since = NULL "
            f"WHERE {{ids}} AND {retryable}"
        ),
        retry_parked=(
            "UPDATE {table} SET status = 'PENDING', due_at = 0, failing_since = NULL "
            "WHERE status = 'PARKED'"
        ),
        drop=(
            f"UPDATE {{table}} SET status = 'DROPPED', sent_at = {now_ms} "
            f"WHERE {{ids}} AND {retryable}"
        ),
        purge=purge,
        lane_purge=lane_purge,
    )
    return OutboxSql(
        *(sql.format(table=table, lanes=lanes, now_ms=now_ms, ids="{ids}") for sql in text)
    )


class SqlOutboxTables(OutboxTables):
    """The outbox of a SQL database (module docstring): the decisions; the subclass runs the
    statements (:meth:`_op` and the runner hooks) and writes the handlers' rows."""

    sql: OutboxSql

    # -- I/O hooks ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def _inserted_id(self, result: Any) -> int:
        """The id of the row :attr:`OutboxSql.insert` wrote, from its cursor (or a SQLAlchemy
        ``CursorResult``)."""

    @abc.abstractmethod
    def _store_error(self, exc: Exception) -> StoreError:
        """The store's error for what the driver (or SQLAlchemy, in the handler's transaction)
        raised."""

    @abc.abstractmethod
    def _op(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(runner, *args)`` on one of the relays' connections, errors wrapped once; after
        a lost connection ``fn`` may run once more (every operation here may run twice: an
        interrupted transaction was rolled back by the server, and a second settle changes
        nothing the first did)."""

    @abc.abstractmethod
    def _fetch(self, runner: Any, sql: str, params: Sequence[Any]) -> List[Any]:
        """Run one statement; its rows."""

    @abc.abstractmethod
    def _count(self, runner: Any, sql: str, params: Sequence[Any]) -> int:
        """Run one statement; how many rows it changed."""

    @abc.abstractmethod
    def _run_all(self, runner: Any, statements: Statements) -> List[Any]:
        """Run ``statements`` in order (in one round trip where the database allows it); each
        one's rows, or its count of changed rows. Raises at the first that fails."""

    @abc.abstractmethod
    def _ids(self, template: str, ids: Sequence[int]) -> Tuple[str, List[Any]]:
        """``template`` with its ``{ids}`` for ``ids``, and the parameters that stand for
        them."""

    @abc.abstractmethod
    def _runs(self, lanes: Sequence[Tuple[int, str]], each: int) -> Tuple[str, List[Any]]:
        """The statement that reads, for each (head id, sharding key), up to ``each`` PENDING
        rows of the key after the head, in id order: rows (id, lane, due now)."""

    @abc.abstractmethod
    def _sent(self, owner: str, sent: Sequence[Tuple[int, str]]) -> Tuple[str, List[Any]]:
        """The statement that marks ``sent`` (row id, the broker's message id) SENT, with one
        more attempt, where ``owner`` still holds them."""

    # -- in the handler's transaction -----------------------------------------------------------

    def write(self, conn: Any, message: OutboxMessage) -> int:
        sql, row, lane = self.sql, row_values(message), message.sharding_key
        try:
            if hasattr(conn, "exec_driver_sql"):  # a SQLAlchemy Connection
                if lane is not None:
                    conn.exec_driver_sql(sql.lane_lock, (lane,))
                return self._inserted_id(conn.exec_driver_sql(sql.insert, row))
            cursor = conn.cursor()
            try:
                if lane is not None:
                    cursor.execute(sql.lane_lock, (lane,))
                cursor.execute(sql.insert, row)
                return self._inserted_id(cursor)
            finally:
                cursor.close()
        except Exception as exc:
            raise self._store_error(exc) from exc

    # -- the claim ---------------------------------------------------------------------------------

    def claim(self, owner: str, limit: int, run: int, lease_ms: int) -> List[ClaimedRow]:
        result: List[ClaimedRow] = self._op(self._claim, owner, limit, run, lease_ms)
        return result

    def _claim(
        self, runner: Any, owner: str, limit: int, run: int, lease_ms: int
    ) -> List[ClaimedRow]:
        sql = self.sql
        found = self._fetch(runner, sql.heads, (limit, limit))
        heads = [(int(i), column_text(lane)) for i, lane in found]
        if not heads:
            return []
        groups = self._groups(runner, heads, run, limit)
        wanted = [i for group in groups for i in group][:limit]
        lock, ids = self._ids(sql.lock, wanted)
        locked = {int(row[0]) for row in self._run_all(runner, [(sql.begin, ()), (lock, ids)])[1]}
        kept = kept_in_runs(groups, locked, limit)
        if not kept:
            self._run_all(runner, [(sql.commit, ())])
            return []
        claim, ids = self._ids(sql.claim, kept)
        claimed, _ = self._ids(sql.claimed, kept)
        _, rows, _ = self._run_all(
            runner, [(claim, (owner, lease_ms, *ids)), (claimed, ids), (sql.commit, ())]
        )
        by_id = {int(row[0]): claimed_row(row) for row in rows}
        return [by_id[i] for i in kept if i in by_id]

    def _groups(
        self, runner: Any, heads: List[Tuple[int, Optional[str]]], run: int, limit: int
    ) -> List[List[int]]:
        """The heads in order, each a group: alone, or (``run`` > 1, a sharding key) followed
        by the sendable rows of its key that come right after it, read now (a row that is not
        due, claimed or in its backoff, ends the run), as many as the claim has room for."""
        lanes = [(i, lane) for i, lane in heads if lane is not None]
        room = limit - len(heads)  # the heads fill the claim: no runs
        if run <= 1 or not lanes or room <= 0:
            return [[i] for i, _ in heads]
        each = min(run - 1, -(-room // len(lanes)))
        sql, params = self._runs(lanes, each)
        after: Dict[int, List[Tuple[int, bool]]] = {}
        heads_of = {lane: i for i, lane in lanes}
        for row_id, lane, sendable in self._fetch(runner, sql, params):
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

    # -- after the broker's answers -------------------------------------------------------------

    def settle(
        self,
        owner: str,
        sent: Sequence[Tuple[int, str]],
        failed: Sequence[Failure],
        released: Sequence[int],
        release_in_ms: int = 0,
    ) -> None:
        sql = self.sql
        statements: Statements = []
        if sent:
            statements.append(self._sent(owner, sent))
        for failure in failed:
            error = bounded_error(failure.error)
            if failure.park:
                statements.append((sql.park, (error, failure.id, owner)))
            else:
                later = (failure.retry_in_ms, error, failure.id, owner)
                statements.append((sql.retry_later, later))
        if released:
            release, ids = self._ids(sql.release, released)
            statements.append((release, (release_in_ms, *ids, owner)))
        if statements:
            self._op(self._run_all, statements)

    def backlog(self) -> Backlog:
        ((pending, oldest, parked),) = self._op(self._fetch, self.sql.backlog, ())
        return Backlog(int(pending), None if oldest is None else int(oldest), int(parked))

    # -- operators ---------------------------------------------------------------------------------

    def rows(
        self, status: Optional[OutboxStatus], limit: int, after_id: int = 0
    ) -> List[ListedRow]:
        if status is None:
            found = self._op(self._fetch, self.sql.list_all, (after_id, limit))
        else:
            found = self._op(self._fetch, self.sql.list_status, (status.value, after_id, limit))
        return [listed_row(row) for row in found]

    def retry(self, ids: Optional[Sequence[int]]) -> int:
        if ids is None:
            return int(self._op(self._count, self.sql.retry_parked, ()))
        return self._change(self.sql.retry, ids)

    def drop(self, ids: Sequence[int]) -> int:
        return self._change(self.sql.drop, ids)

    def _change(self, template: str, ids: Sequence[int]) -> int:
        if not ids:
            return 0
        sql, params = self._ids(template, list(ids))
        return int(self._op(self._count, sql, params))

    def purge(
        self,
        older_than_ms: int,
        batch_size: int = 1000,
        progress: Optional[Callable[[int], None]] = None,
    ) -> int:
        total = 0
        for sql in (self.sql.purge, self.sql.lane_purge):
            while True:
                deleted = int(self._op(self._count, sql, (older_than_ms, batch_size)))
                if sql is self.sql.purge:
                    total += deleted
                    if progress is not None:
                        progress(total)
                if deleted < batch_size:
                    break
        return total


def row_values(message: OutboxMessage) -> Tuple[Any, ...]:
    """The values of :attr:`OutboxSql.insert`: sharding key, topic, tag, message key, the other
    keys (space-separated), the properties (JSON), the body."""
    return (
        message.sharding_key,
        message.topic,
        message.tag,
        message.message_key,
        " ".join(message.other_keys),
        message.properties_json(),
        message.body,
    )


def kept_in_runs(groups: Iterable[List[int]], locked: Iterable[int], limit: int) -> List[int]:
    """The rows of ``groups`` to claim: each group (a head and its run) up to its first row
    not ``locked`` (another relay holds it, or it stopped being sendable), ``limit`` at most."""
    held = set(locked)
    kept: List[int] = []
    for group in groups:
        for i in group:
            if i not in held or len(kept) >= limit:
                break
            kept.append(i)
    return kept


def bounded_error(error: str) -> str:
    """A send's error as ``last_error`` holds it: at most :data:`ERROR_CHARS` characters, a NUL
    (which a PostgreSQL text cannot hold) as U+FFFD."""
    return error[:ERROR_CHARS].replace("\x00", "\ufffd")


def claimed_row(row: Sequence[Any]) -> ClaimedRow:
    """A row :attr:`OutboxSql.claimed` read."""
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


def listed_row(row: Sequence[Any]) -> ListedRow:
    """A row :attr:`OutboxSql.list_all` read."""
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


__all__ = [
    "ERROR_CHARS",
    "OutboxSql",
    "SqlOutboxTables",
    "bounded_error",
    "claimed_row",
    "kept_in_runs",
    "listed_row",
    "portable_statements",
    "row_values",
]
