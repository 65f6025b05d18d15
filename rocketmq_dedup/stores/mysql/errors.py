"""What a MySQL/MariaDB driver's error means for the store, decided once, for every driver
(mysqlclient, PyMySQL, mysql-connector-python, and SQLAlchemy's wrappers of them), without
importing any of them:

* an **outage**: the PEP 249 ``OperationalError``/``InterfaceError`` families (the connection or
  the server failed), except the server error codes below that say otherwise;
* a **lock conflict**: a lock wait timeout or a deadlock (the server is up; another session
  held the lock);
* a **refusal** a person must fix (:mod:`.privileges`: a missing privilege, refused
  credentials, a read-only server), which the drivers raise as ``OperationalError`` too;
* a **defect**: everything else (a missing table, a syntax error, a bug).

:func:`as_store_error` turns a driver error into the library's error for it, once.
"""

from __future__ import annotations

from typing import Optional

from rocketmq_dedup.errors import (
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StoreUnavailableError,
)
from rocketmq_dedup.stores.mysql.privileges import REFUSALS, explain

#: "Duplicate entry" (ER_DUP_ENTRY): a second record of a key.
DUPLICATE_ENTRY = 1062
#: "You have an error in your SQL syntax" (ER_PARSE_ERROR): also what a server says to several
#: statements in one text on a connection without multi-statements.
PARSE_ERROR = 1064
#: "Lock wait timeout exceeded" (ER_LOCK_WAIT_TIMEOUT) and "Deadlock found" (ER_LOCK_DEADLOCK).
LOCK_CONFLICT_CODES = frozenset({1205, 1213})
#: "Table doesn't exist" (ER_NO_SUCH_TABLE).
NO_SUCH_TABLE = 1146
#: Codes that some drivers raise as OperationalError but that say the statement or the schema
#: is wrong, not that the server failed: unknown column, syntax, no such table.
SCHEMA_ERROR_CODES = frozenset({1054, PARSE_ERROR, NO_SUCH_TABLE})

# PEP 249 exception families that mean "the connection or the server failed".
_OUTAGE_ERRORS = frozenset({"OperationalError", "InterfaceError"})
_NOT_OUTAGE_CODES = SCHEMA_ERROR_CODES | LOCK_CONFLICT_CODES | frozenset(REFUSALS)


def error_code(exc: BaseException) -> Optional[int]:
    """The server error number of a driver exception (or of the one SQLAlchemy wraps)."""
    exc = getattr(exc, "orig", None) or exc
    code = getattr(exc, "errno", None)  # mysql-connector-python
    if isinstance(code, int):
        return code
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_lock_conflict(exc: BaseException) -> bool:
    """True for a lock wait timeout or a deadlock (:data:`LOCK_CONFLICT_CODES`)."""
    return error_code(exc) in LOCK_CONFLICT_CODES


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` is in a PEP 249 ``OperationalError`` or ``InterfaceError`` family of any
    driver (matched on the class names along its MRO), and its server error code does not say
    otherwise (:data:`SCHEMA_ERROR_CODES`, :data:`LOCK_CONFLICT_CODES`, the refusals of
    :data:`~.privileges.REFUSALS`): the connection or the server failed. So is an error raised
    ``from`` one: mysql-connector-python reports a dead connection met while quoting parameters
    as ``ProgrammingError`` from ``OperationalError``. SQLAlchemy's ``OperationalError`` wraps
    the driver's (``orig``), and has the same name."""
    current: Optional[BaseException] = exc
    for _ in range(8):  # a short explicit-cause chain; never loops on a cycle
        if current is None:
            return False
        if any(cls.__name__ in _OUTAGE_ERRORS for cls in type(current).__mro__):
            return error_code(current) not in _NOT_OUTAGE_CODES
        current = current.__cause__
    return False


def refusal_code(exc: BaseException) -> Optional[int]:
    """The server error number of ``exc`` (or of an error along its explicit-cause chain) when
    it is a refusal a person must fix (:data:`~.privileges.REFUSALS`), else None."""
    current: Optional[BaseException] = exc
    for _ in range(8):
        if current is None:
            return None
        code = error_code(current)
        if code in REFUSALS:
            return code
        current = current.__cause__
    return None


def as_store_error(exc: BaseException, where: str, fix: Optional[str] = None) -> StoreError:
    """The library's error for a driver error of the store described by ``where`` (chain it:
    ``raise as_store_error(exc, where) from exc``). A refusal's ``fix`` is what a person must do
    (the store knows its table and account: :meth:`MySQLDedupStore.misconfiguration`); without
    it, what the server's message names."""
    if isinstance(exc, StoreError):
        return exc
    text = f"{where}: {type(exc).__name__}: {exc}"
    code = refusal_code(exc)
    if code is not None:
        return StoreMisconfiguredError(text, fix or explain(code, str(exc), "the dedup table"))
    if is_lock_conflict(exc):
        return StoreLockConflictError(text)
    if is_connection_error(exc):
        return StoreUnavailableError(text)
    return StoreError(text)


__all__ = [
    "DUPLICATE_ENTRY",
    "LOCK_CONFLICT_CODES",
    "NO_SUCH_TABLE",
    "PARSE_ERROR",
    "SCHEMA_ERROR_CODES",
    "as_store_error",
    "error_code",
    "is_connection_error",
    "is_lock_conflict",
    "refusal_code",
]
