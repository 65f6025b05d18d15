"""What the SQL record stores (MySQL, PostgreSQL) share besides their pool
(:mod:`rocketmq_dedup.stores.pool`): their options' validation, the purge's walk in key order,
records read back by digest, a text column read as ``str``, the operator's delete rule, the
latency check, and what follows their tables (:class:`SqlTables`: the sequence table's absence
told, the write proof the start-up check deferred). The statements and the connections are each
store's own."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import DedupStatus
from rocketmq_dedup.stores.base import Claim, Record
from rocketmq_dedup.stores.operations import Diagnosis, OperatedStore, round_trip

logger = logging.getLogger(__name__)

#: One purge step: (rows deleted or, dry, expired; rows scanned; the last key scanned).
PurgeStep = Tuple[int, int, bytes]


def pool_options(size: Any, timeout: Any, max_size: int) -> Tuple[int, float]:
    """``pool_size`` and ``pool_timeout`` checked: an int from 1 to ``max_size``, and seconds
    more than 0 and at most an hour."""
    if type(size) is not int or not 1 <= size <= max_size:
        raise DedupConfigError(f"pool_size must be an int from 1 to {max_size}; got {size!r}")
    seconds = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not seconds or not 0 < timeout <= 3600:
        raise DedupConfigError(
            f"pool_timeout must be seconds, more than 0 and at most 3600; got {timeout!r}"
        )
    return size, float(timeout)


def purge_in_key_order(
    step: Callable[[bytes, int], PurgeStep],
    batch_size: int,
    progress: Optional[Callable[[int, int], None]],
) -> int:
    """Walk the table in primary-key order, ``step(after, batch_size)`` at a time (each reads
    the next ``batch_size`` keys after ``after`` and deletes, or counts, the expired ones), and
    return how many were deleted or counted; ``progress(rows scanned, rows expired)`` after
    each step."""
    if type(batch_size) is not int or batch_size < 1:
        raise DedupConfigError(f"batch_size must be a positive int; got {batch_size!r}")
    total, scanned, after = 0, 0, b""  # every key is 32 bytes, so b"" sorts first
    while True:
        expired, rows, after = step(after, batch_size)
        total += expired
        scanned += rows
        if progress is not None:
            progress(scanned, total)
        if rows < batch_size:
            return total


def records_of(
    elements: Sequence[DedupElement], digests: Sequence[bytes], found: Dict[bytes, Record]
) -> List[Optional[Record]]:
    """The live record of each element (with its element) from the records found by digest."""
    return [
        record._replace(element=element) if record is not None else None
        for record, element in ((found.get(d), e) for d, e in zip(digests, elements, strict=True))
    ]


def failed_keys(records: Dict[bytes, Record]) -> List[bytes]:
    """The keys of the FAILED records among ``records`` (whose reasons are read next)."""
    return [key for key, record in records.items() if record.status is DedupStatus.FAILED]


def add_reasons(
    records: Dict[bytes, Record], rows: Sequence[Any], text: Callable[[Any], Any] = str
) -> Dict[bytes, Record]:
    """``records`` with the reasons of (key, reason) ``rows`` (a reason read as ``text``)."""
    for key, reason in rows:
        key = bytes(key)
        records[key] = records[key]._replace(reason=None if reason is None else text(reason))
    return records


def deletable(record: Optional[Record], force: bool) -> Optional[DedupStatus]:
    """The status an operator's ``delete`` removes from ``record``: a CONSUMING claim, or with
    ``force`` whatever it is; None when it leaves it (no record, unreadable, or CONSUMED
    without ``force``)."""
    if record is None or record.status is None:
        return None
    if record.status is DedupStatus.CONSUMED and not force:
        return None
    return record.status


def column_text(value: Any) -> Any:
    """A text column's value as ``str``: drivers asked for ``use_unicode=False`` (or returning
    binary strings) give bytes."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def is_sqlalchemy_engine(client: Any) -> bool:
    """True for a SQLAlchemy ``Engine`` (never imports SQLAlchemy)."""
    kind = type(client)
    return kind.__module__.startswith("sqlalchemy") and hasattr(client, "raw_connection")


def detached_connections(engine: Any) -> Callable[[], Any]:
    """A connection factory on a SQLAlchemy ``Engine``: each call a new DB-API connection from
    ``engine.raw_connection()``, detached from the engine's pool (the store keeps it in its
    own, in autocommit mode, which must never leak into the engine's pool)."""

    def connect() -> Any:
        fairy = engine.raw_connection()
        fairy.detach()  # closing it now closes the DB-API connection, never pools it
        return fairy.dbapi_connection

    return connect


def latency(check: Callable[[], Any]) -> Diagnosis:
    """The median of 5 round trips of ``check``."""
    times = []
    for _ in range(5):
        begin = time.perf_counter()
        check()
        times.append(time.perf_counter() - begin)
    return Diagnosis("latency", True, round_trip(sorted(times)[2]) + " (median of 5)")


class SqlTables(OperatedStore):
    """Mixed into a SQL store (before :class:`DedupStore`): what follows its tables.

    * The start-up check's write proof (:meth:`DedupStore.prove_writes`) when the table does
      not exist yet (the quick start builds the config, then calls ``create_table()``): logged
      and deferred to :meth:`tables_created`, which the store's ``create_table()`` calls.
    * A dedup table whose ``<table>_seq`` name would be too long: told once, at
      ``create_table()`` (the exactly-once mode then has no sequence guard).
    """

    table_name: str
    sequence_table_name: Optional[str]
    #: The application whose write proof waits for the table.
    _unproven: Optional[str] = None
    #: How long a sequence table's name may be, for the warning ("64 characters").
    longest_name = ""

    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the server's "no such table"."""
        raise NotImplementedError

    def do_prove_writes(self, claims: List[Claim]) -> None:
        """The probe (INSERT, UPDATE, SELECT and DELETE on the table), or, when the table does
        not exist yet, the same in :meth:`tables_created` once it exists."""
        try:
            super().do_prove_writes(claims)
        except Exception as exc:
            if not self.is_missing_table(exc):
                raise
            self._unproven = claims[0].element.application
            logger.info(
                "%s: the table does not exist yet; create_table() checks the writes once it "
                "has made it",
                self.describe(),
            )

    def tables_created(self) -> None:
        """After ``create_table()``: tell a missing sequence table; prove the writes if the
        start-up check ran before the table existed."""
        if self.sequence_table_name is None:
            logger.warning(
                "%s: no sequence table (%s_seq would be longer than %s); the exactly-once "
                "mode's sequence guard is unavailable",
                self.describe(),
                self.table_name,
                self.longest_name,
            )
        application, self._unproven = self._unproven, None
        if application is not None:
            self.prove_writes(application)
