"""SQLAlchemy engine events of the exactly-once mode, for any dialect (the ``[sqlalchemy]``
extra; imported only for a store built on an ``Engine``): while a handler runs,
``conn.commit()``, ``conn.rollback()`` and ``conn.close()`` on the ``Connection`` it was given
are refused. The ``commit``/``rollback`` events fire before the DB-API call (``close()`` of a
connection in a transaction rolls it back first), so the transaction is neither committed nor
rolled back by them; savepoints (``conn.begin_nested()``) stay allowed.

The listeners are installed once per engine and hold nothing: the transaction a handler runs
in is found through the pooled connection's ``info`` while it runs, so no engine or connection
is kept alive by this module. What a dialect adds (MySQL's session idle timeout at checkout:
:mod:`rocketmq_dedup.stores.mysql.sqlalchemy_guard`) goes through :func:`install`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

#: In a pooled connection's ``info`` (it lives as long as its DB-API connection): how to refuse
#: an end of the transaction while a handler runs (a callable taking the call's name).
_GUARD_INFO = "rocketmq_dedup_guard"


def guard(connection: Any, refuse: Callable[[str], None]) -> None:
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


#: An engine event and its listener.
Listener = Tuple[str, Callable[..., Any]]

#: The refusals, for every dialect.
REFUSALS: Tuple[Listener, ...] = (("commit", _refuse_commit), ("rollback", _refuse_rollback))


def install(engine: Any, listeners: Sequence[Listener] = REFUSALS) -> None:
    """Install ``listeners`` on ``engine`` (once: installing again changes nothing)."""
    from sqlalchemy import event

    for name, listener in listeners:
        if not event.contains(engine, name, listener):
            event.listen(engine, name, listener)


__all__ = ["REFUSALS", "Listener", "guard", "install", "unguard"]
