"""Statements sent to PostgreSQL in one round trip: libpq's pipeline mode on a psycopg
connection's ``pgconn``, for the exactly-once mode's transactions
(:mod:`rocketmq_dedup.stores.postgres.transaction`).

:func:`run` sends every statement (extended protocol, parameters encoded by the caller, the key
as binary ``bytea``), one Sync, then reads each statement's result. The server runs them in
order and, at the first that fails, skips the rest up to the Sync (``PIPELINE_ABORTED``): a
COMMIT sent after a statement that failed is never run. Nothing is raised here: the caller
reads each result and decides (a refused record is an answer, not an error: :func:`error_of`
turns a result into psycopg's error when it is one).

Waiting is on the connection's socket (``poll``, which releases the GIL), with libpq in the
non-blocking mode psycopg keeps its connections in, so other threads run while a pipeline
waits for the server. A statement given a ``name`` is prepared under it on a connection that
keeps prepared statements (``prepared`` is the set of names it has): the Parse rides the same
round trip the first time, and the statement is only bound and run after that.
"""

from __future__ import annotations

import contextlib
import select
from typing import Any, List, NamedTuple, Optional, Sequence, Set, Tuple

from rocketmq_dedup.stores.postgres.connections import import_psycopg, libpq_text

#: libpq's ExecStatus values read here (PGRES_FATAL_ERROR, PGRES_PIPELINE_SYNC,
#: PGRES_PIPELINE_ABORTED) and PQpipelineStatus's PQ_PIPELINE_OFF.
FATAL_ERROR, PIPELINE_SYNC, PIPELINE_ABORTED = 7, 10, 11
PIPELINE_OFF = 0

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT


class Statement(NamedTuple):
    """One statement as libpq takes it."""

    text: bytes
    """Its SQL, placeholders ``$1``, ``$2``..."""
    formats: Tuple[int, ...] = ()
    """Per parameter: 1 binary, 0 text."""
    name: bytes = b""
    """The name to prepare it under (b"": never prepared, e.g. a statement whose text varies)."""

    @classmethod
    def of(cls, sql: str, formats: Tuple[int, ...] = (), name: str = "") -> Statement:
        """From psycopg's ``%s`` text (:func:`~.connections.libpq_text`)."""
        return cls(libpq_text(sql), formats, name.encode())


#: A statement and its parameters (encoded: bytes, or None for NULL).
Step = Tuple[Statement, Sequence[Optional[bytes]]]


def run(pgconn: Any, steps: Sequence[Step], prepared: Optional[Set[bytes]] = None) -> List[Any]:
    """Send ``steps`` in one pipeline and return each one's ``PGresult``, in order (a statement
    after a failed one: ``PIPELINE_ABORTED``). ``prepared``: the names prepared on this
    connection (None: prepare nothing). Raises psycopg's ``OperationalError`` when the
    connection fails (it is then unusable)."""
    sent: List[bytes] = []  # per result to come: the name a Parse prepares, b"" a statement
    pgconn.enter_pipeline_mode()
    try:
        for statement, params in steps:
            name = statement.name
            if prepared is None or not name:
                pgconn.send_query_params(statement.text, params, param_formats=statement.formats)
            else:
                if name not in prepared and name not in sent:
                    pgconn.send_prepare(name, statement.text)
                    sent.append(name)
                pgconn.send_query_prepared(name, params, param_formats=statement.formats)
            sent.append(b"")
        pgconn.pipeline_sync()
        _flush(pgconn)
        results = _results(pgconn)
    finally:
        if pgconn.pipeline_status != PIPELINE_OFF:
            _exit_pipeline(pgconn)
    if len(sent) == len(steps):
        return results
    kept = []
    refused = None  # a failed Parse: its error stands for the statement it prepared
    for parsed, result in zip(sent, results, strict=True):
        if not parsed:
            kept.append(result if refused is None else refused)
            refused = None
        elif failed(result):
            refused = result
        else:
            prepared.add(parsed)  # type: ignore[union-attr]
    return kept


def run_text(pgconn: Any, text: bytes) -> List[Any]:
    """Send ``text`` (statements without parameters, ``;``-separated) as one simple query and
    return each statement's ``PGresult``, in order; the server runs none after one that fails
    (whose result is then the last). Raises psycopg's ``OperationalError`` when the connection
    fails."""
    pgconn.send_query(text)
    _flush(pgconn)
    results: List[Any] = []
    while (result := _next_result(pgconn)) is not None:
        results.append(result)
    return results


def _flush(pgconn: Any) -> None:
    """Send what libpq buffered (a non-blocking connection may take several writes), reading
    meanwhile so a server writing results back never waits on us."""
    while pgconn.flush():
        if _wait(pgconn, _READ | _WRITE) & _READ:
            pgconn.consume_input()


def _results(pgconn: Any) -> List[Any]:
    """Every result up to the pipeline's Sync (each statement's ends with a None)."""
    results: List[Any] = []
    while True:
        result = _next_result(pgconn)
        if result is None:
            continue
        if result.status == PIPELINE_SYNC:
            return results
        results.append(result)


def _next_result(pgconn: Any) -> Any:
    """The next ``PGresult`` (None at the end of a statement's), once the server sent it."""
    while pgconn.is_busy():
        _wait(pgconn, _READ)
        pgconn.consume_input()
    return pgconn.get_result()


def _exit_pipeline(pgconn: Any) -> None:
    # a connection that failed mid-pipeline cannot leave it: it is discarded anyway
    with contextlib.suppress(Exception):
        pgconn.exit_pipeline_mode()


def _wait(pgconn: Any, events: int) -> int:
    """Wait (the GIL released) until the connection's socket is ready for ``events``."""
    poller = select.poll()
    poller.register(pgconn.socket, events)
    while True:
        ready = poller.poll()
        if ready:
            return int(ready[0][1])


def error_of(pgconn: Any, result: Any) -> Exception:
    """psycopg's error for a failed ``result``: a lost connection as ``OperationalError``, a
    statement's failure as the error class of its sqlstate (``sqlstate`` and ``diag`` set)."""
    psycopg = import_psycopg()
    if result is None or pgconn.status == psycopg.pq.ConnStatus.BAD:
        message = pgconn.get_error_message() or (result.error_message if result else b"")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        lost: Exception = psycopg.OperationalError(message.strip() or "the connection was lost")
        return lost
    if result.status == PIPELINE_ABORTED:
        skipped: Exception = psycopg.InternalError("a statement after a failed one was skipped")
        return skipped
    error: Exception = psycopg.errors.error_from_result(result, encoding="utf-8")
    return error


def failed(result: Any) -> bool:
    """Whether ``result`` is a failed statement's (or one skipped after it)."""
    return result is None or result.status in (FATAL_ERROR, PIPELINE_ABORTED)


def sqlstate(result: Any) -> Optional[str]:
    """The sqlstate of a failed statement's result."""
    value = result.error_field(_SQLSTATE) if result is not None else None
    return value.decode() if isinstance(value, bytes) else None


_SQLSTATE = ord("C")  # PG_DIAG_SQLSTATE


__all__ = ["Statement", "Step", "error_of", "failed", "run", "run_text", "sqlstate"]
