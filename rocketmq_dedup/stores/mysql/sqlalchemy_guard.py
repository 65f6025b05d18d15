"""SQLAlchemy engine events of the exactly-once mode on MySQL (the ``[sqlalchemy]`` extra;
imported only for a store built on an ``Engine``): the refusals every dialect gets
(:mod:`rocketmq_dedup.stores.sqlalchemy_guard`), and MySQL's own: a pooled connection whose
session idle timeout (``wait_timeout``) this mode lowered, left idle in the engine's pool for
(nearly) that long, is replaced at checkout (the application's or the store's), so no checkout
gets a session the server already ended. (PostgreSQL needs none: its bound is ``SET LOCAL``,
gone with the transaction.)
"""

from __future__ import annotations

import time
from typing import Any, Tuple

from rocketmq_dedup.stores.mysql.connection import idle_too_long
from rocketmq_dedup.stores.sqlalchemy_guard import REFUSALS, Listener, install

#: The session idle timeout this mode set on the connection, and since when it has been idle.
WAIT_TIMEOUT_INFO = "rocketmq_dedup_wait_timeout"
_IDLE_SINCE_INFO = "rocketmq_dedup_idle_since"


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


_LISTENERS: Tuple[Listener, ...] = (
    *REFUSALS,
    ("checkin", _stamp_idle),
    ("checkout", _replace_if_timed_out),
)


def guard_engine(engine: Any) -> None:
    """Install the module's listeners on ``engine`` (once: installing again changes nothing)."""
    install(engine, _LISTENERS)


__all__ = ["WAIT_TIMEOUT_INFO", "guard_engine"]
