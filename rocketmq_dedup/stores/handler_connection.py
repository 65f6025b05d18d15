"""The handler's ``conn`` on a driver connection (DB-API or psycopg): the message transaction's
own connection, everything passing through except the calls and assignments that would end,
leave or reconfigure that transaction, which each driver's subclass lists.

A ``conn`` serves one message: once its transaction ended (:func:`end_guarded`, called by the
transaction's ``close``), every use of it raises
:class:`~rocketmq_dedup.errors.TransactionMisuseError`. A handler that kept it (in a thread, a
cache, a closure) and uses it later never reaches the pooled connection, which by then serves
another message's transaction."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, FrozenSet, NoReturn

from rocketmq_dedup.errors import TransactionMisuseError

#: Told what the handler tried (the transaction raises the refusal into the handler).
Refuse = Callable[[str], None]

#: What a ``conn`` used after its message's transaction ended raises.
ENDED = (
    "this conn belonged to a message whose transaction has ended: a handler's conn serves "
    "only that message, inside do_handle_msg (the pooled connection behind it now serves "
    "other messages)"
)


class EndedConnection:
    """What a :class:`GuardedConnection` forwards to once its transaction ended: every
    attribute read or assignment raises :class:`~rocketmq_dedup.errors.TransactionMisuseError`
    (the refusal of the transaction is not called: that transaction is over, and the
    connection's next one is not this handler's to fail)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> NoReturn:
        raise TransactionMisuseError(f"{name} on {ENDED}")

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise TransactionMisuseError(f"{name} assigned on {ENDED}")

    def __repr__(self) -> str:
        return "<ended>"


_ENDED_CONNECTION = EndedConnection()


class GuardedConnection:
    """The transaction's connection, everything passing through (``cursor()``, ``execute()``,
    attributes) except :attr:`REFUSED_CALLS` and :attr:`REFUSED_ASSIGNMENTS`, which raise
    :class:`~rocketmq_dedup.errors.TransactionMisuseError` (and fail the message even if the
    handler catches it and returns True). Special methods are not forwarded: ``with conn:``
    (which would commit and close a driver's connection) fails. After :func:`end_guarded`,
    everything raises (module docstring)."""

    __slots__ = ("_conn", "_refuse")

    #: Calls refused on the connection.
    REFUSED_CALLS: ClassVar[FrozenSet[str]] = frozenset()
    #: Attributes whose assignment is refused.
    REFUSED_ASSIGNMENTS: ClassVar[FrozenSet[str]] = frozenset()

    def __init__(self, conn: Any, refuse: Refuse) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_refuse", refuse)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """The driver's ``cursor()`` (every DB-API connection has one: a method of its own, the
        handler's first call, spares the failed look-up that precedes :meth:`__getattr__`)."""
        return self._conn.cursor(*args, **kwargs)

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


def _refuse_ended(what: str) -> NoReturn:
    raise TransactionMisuseError(f"{what} on {ENDED}")


def end_guarded(conn: Any) -> None:
    """``conn``'s message transaction ended: if it is a :class:`GuardedConnection`, every use of
    it raises from now on (module docstring). A function, not a method: the proxy's own names
    would hide the driver's."""
    if isinstance(conn, GuardedConnection):
        object.__setattr__(conn, "_conn", _ENDED_CONNECTION)
        object.__setattr__(conn, "_refuse", _refuse_ended)


__all__ = ["ENDED", "EndedConnection", "GuardedConnection", "Refuse", "end_guarded"]
