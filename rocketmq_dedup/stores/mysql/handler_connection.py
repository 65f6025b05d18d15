"""The handler's ``conn`` on a MySQL DB-API driver: the message transaction's own connection,
with the calls that would end, leave or reconfigure that transaction refused."""

from __future__ import annotations

from typing import Any

from rocketmq_dedup.stores.handler_connection import GuardedConnection

#: Calls on the handler's DB-API connection that are refused: each would end the message's
#: transaction (PyMySQL's ``begin()`` and mysql-connector's ``start_transaction()`` commit the
#: open one), leave it (``close()``, a new session: ``connect()``, ``reconnect()``,
#: ``change_user()``), make later statements autocommit, or send them to another database than
#: the dedup record's (``select_db()``).
REFUSED_CALLS = frozenset(
    {
        "autocommit",
        "begin",
        "change_user",
        "close",
        "cmd_change_user",
        "cmd_init_db",
        "cmd_reset_connection",
        "commit",
        "connect",
        "reconnect",
        "reset_session",
        "rollback",
        "select_db",
        "set_autocommit",
        "start_transaction",
    }
)
#: Attributes whose assignment is refused (mysql-connector-python's properties).
REFUSED_ASSIGNMENTS = frozenset({"autocommit", "database"})


class HandlerConnection(GuardedConnection):
    """The transaction's DB-API connection (:class:`GuardedConnection`, refusing
    :data:`REFUSED_CALLS` and :data:`REFUSED_ASSIGNMENTS`), and ``ping``, which never
    reconnects: ``ping()`` checks the session (a lost one raises the driver's error),
    ``ping(True)`` / ``ping(reconnect=True)`` is refused (a new session would silently drop the
    transaction's writes so far and autocommit the next)."""

    __slots__ = ()

    REFUSED_CALLS = REFUSED_CALLS
    REFUSED_ASSIGNMENTS = REFUSED_ASSIGNMENTS

    def ping(self, *args: Any, **kwargs: Any) -> Any:
        """The driver's ``ping`` without reconnecting (see the class docstring)."""
        reconnect = args[0] if args else kwargs.get("reconnect", False)
        if reconnect:
            self._refuse("ping(reconnect=True)")
        return self._conn.ping(False)


__all__ = ["REFUSED_ASSIGNMENTS", "REFUSED_CALLS", "HandlerConnection"]
