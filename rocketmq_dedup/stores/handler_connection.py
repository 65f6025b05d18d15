"""The handler's ``conn`` on a driver connection (DB-API or psycopg): the message transaction's
own connection, everything passing through except the calls and assignments that would end,
leave or reconfigure that transaction, which each driver's subclass lists."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, FrozenSet

#: Told what the handler tried (the transaction raises the refusal into the handler).
Refuse = Callable[[str], None]


class GuardedConnection:
    """The transaction's connection, everything passing through (``cursor()``, ``execute()``,
    attributes) except :attr:`REFUSED_CALLS` and :attr:`REFUSED_ASSIGNMENTS`, which raise
    :class:`~rocketmq_dedup.errors.TransactionMisuseError` (and fail the message even if the
    handler catches it and returns True). Special methods are not forwarded: ``with conn:``
    (which would commit and close a driver's connection) fails."""

    __slots__ = ("_conn", "_refuse")

    #: Calls refused on the connection.
    REFUSED_CALLS: ClassVar[FrozenSet[str]] = frozenset()
    #: Attributes whose assignment is refused.
    REFUSED_ASSIGNMENTS: ClassVar[FrozenSet[str]] = frozenset()

    def __init__(self, conn: Any, refuse: Refuse) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_refuse", refuse)

    def __getattr__(self, name: str) -> Any:
        if name in self.REFUSED_CALLS:
            refuse = self._refuse

            def refused(*args: Any, **kwargs: Any) -> Any:
                refuse(f"{name}()")

            return refused
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.REFUSED_ASSIGNMENTS:
            self._refuse(name)
        setattr(self._conn, name, value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._conn!r}>"


__all__ = ["GuardedConnection", "Refuse"]
