"""The handler's ``conn`` on a DB-API driver: the message transaction's own connection, with the
calls that would end, leave or reconfigure that transaction refused."""

from __future__ import annotations

from typing import Any, Callable

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

#: Told what the handler tried (the transaction raises the refusal into the handler).
Refuse = Callable[[str], None]


class HandlerConnection:
    """The transaction's connection, everything passing through (``cursor()``, ``escape()``,
    attributes) except :data:`REFUSED_CALLS` and :data:`REFUSED_ASSIGNMENTS`, which raise
    :class:`TransactionMisuseError` (and fail the message even if the handler catches it and
    returns True), and ``ping``, which never reconnects: ``ping()`` checks the session (a lost
    one raises the driver's error), ``ping(True)`` / ``ping(reconnect=True)`` is refused (a new
    session would silently drop the transaction's writes so far and autocommit the next)."""

    __slots__ = ("_conn", "_refuse")

    def __init__(self, conn: Any, refuse: Refuse) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_refuse", refuse)

    def __getattr__(self, name: str) -> Any:
        if name in REFUSED_CALLS:
            refuse = self._refuse

            def refused(*args: Any, **kwargs: Any) -> Any:
                refuse(f"{name}()")

            return refused
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in REFUSED_ASSIGNMENTS:  # mysql-connector-python: conn.autocommit = True
            self._refuse(name)
        setattr(self._conn, name, value)

    def ping(self, *args: Any, **kwargs: Any) -> Any:
        """The driver's ``ping`` without reconnecting (see the class docstring)."""
        reconnect = args[0] if args else kwargs.get("reconnect", False)
        if reconnect:
            self._refuse("ping(reconnect=True)")
        return self._conn.ping(False)

    def __repr__(self) -> str:
        return f"<HandlerConnection of {self._conn!r}>"


__all__ = ["REFUSED_ASSIGNMENTS", "REFUSED_CALLS", "HandlerConnection"]
