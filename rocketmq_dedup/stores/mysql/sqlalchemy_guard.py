"""SQLAlchemy engine events for the exactly-once mode (the ``[sqlalchemy]`` extra; imported only
for a store built on an ``Engine``):

* while a handler runs, ``conn.commit()``, ``conn.rollback()`` and ``conn.close()`` on the
  ``Connection`` it was given are refused (the ``commit``/``rollback`` events fire before the
  DB-API call, so the transaction is neither committed nor rolled back by them); savepoints
  (``conn.begin_nested()``) stay allowed;
* a pooled connection whose session idle timeout this mode lowered, left idle in the engine's
  pool for (nearly) that long, is replaced at checkout (the application's or the store's), so no
  checkout gets a session the server already ended.

The listeners are installed once per engine and hold nothing: the transaction a handler runs
in is found through the pooled connection's ``info`` while it runs, so no engine or connection
is kept alive by this module.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from rocketmq_dedup.stores.mysql.connection import idle_too_long

#: In a pooled connection's ``info`` (it lives as long as its DB-API connection): how to refuse
#: an end of the transaction while a handler runs (a callable taking the call's name).
_GUARD_INFO = "rocketmq_dedup_guard"
#: The session idle timeout this mode set on the connection, and since when it has been idle.
WAIT_TIMEOUT_INFO = "rocketmq_dedup_wait_timeout"
_IDLE_SINCE_INFO = "rocketmq_dedup_idle_since"


def guard(connection: Any, refuse: Any) -> None:
    """Refuse the ends of ``connection``'s transaction (a SQLAlchemy ``Connection``) through
    ``refuse(name)`` until :func:`unguard`."""
    connection.info[_GUARD_INFO] = refuse


def unguard(connection: Any) -> None:
    """Stop refusing (a closed or invalidated connection has nothing left to guard)."""
    info = _info(connection)
    if info is not None:
        info.pop(_GUARD_INFO, None)


def _info(connection: Any) -> Optional[Any]:
    try:
        return connection.info
    except Exception:  # closed or invalidated: no pooled connection behind it
        return None


def _refuse_commit(connection: Any) -> None:
    _refuse(connection, "commit()")


def _refuse_rollback(connection: Any) -> None:
    _refuse(connection, "rollback()")


def _refuse(connection: Any, what: str) -> None:
    info = _info(connection)
    refuse = info.get(_GUARD_INFO) if info is not None else None
    if refuse is not None:
        refuse(what)


def _stamp_idle(dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin``: when a connection whose idle timeout this mode lowered went idle."""
    if record is not None and WAIT_TIMEOUT_INFO in record.info:
        record.info[_IDLE_SINCE_INFO] = time.monotonic()


def _replace_if_timed_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Pool ``checkout``: a connection idle in the engine's pool for (nearly) the session idle
    timeout this mode set on it has been, or is about to be, ended by the server.
    ``DisconnectionError`` makes the pool connect anew, so the application's engine keeps
    working without ``pool_pre_ping``."""
    info = record.info
    since = info.pop(_IDLE_SINCE_INFO, None)
    timeout = info.get(WAIT_TIMEOUT_INFO)
    if since is not None and timeout is not None and idle_too_long(since, timeout):
        info.pop(WAIT_TIMEOUT_INFO, None)  # the next DB-API connection has the default
        from sqlalchemy import exc

        raise exc.DisconnectionError("the session's idle timeout (wait_timeout) lapsed")


_LISTENERS = (
    ("commit", _refuse_commit),
    ("rollback", _refuse_rollback),
    ("checkin", _stamp_idle),
    ("checkout", _replace_if_timed_out),
)


def guard_engine(engine: Any) -> None:
    """Install the module's listeners on ``engine`` (once: installing again changes nothing)."""
    from sqlalchemy import event

    for name, listener in _LISTENERS:
        if not event.contains(engine, name, listener):
            event.listen(engine, name, listener)


__all__ = ["WAIT_TIMEOUT_INFO", "guard", "guard_engine", "unguard"]
