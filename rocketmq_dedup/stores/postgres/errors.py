"""What a psycopg error means for the PostgreSQL store, decided once (the record store and the
exactly-once mode's transactions alike), without importing psycopg:

* a **refusal** a person must fix (:func:`refusal`): it will not pass by itself, so it is never
  an outage and never retried as one:

  - the account may not do it: sqlstate 42501 (insufficient_privilege: ``permission denied for
    table ...``, ``... for schema ...``, ``... for database ...``);
  - the server takes no writes: 25006 (read_only_sql_transaction: a hot standby, or
    ``default_transaction_read_only`` on for the database or the role);
  - the server refused the login: 28P01 (invalid_password) and 28000
    (invalid_authorization_specification: no ``pg_hba.conf`` entry, an unknown role). libpq
    reports a failed connection without a sqlstate, so those are also told by the server's
    (English) message: ``password authentication failed``, ``no pg_hba.conf entry``,
    ``role "..." does not exist``, ``... is not permitted to log in``, ``permission denied for
    database``, and libpq's own ``no password supplied``;

* a **lock conflict** (:func:`~.connections.is_lock_conflict`: a deadlock, a serialization
  failure, a lock wait ended by ``lock_timeout`` or ``statement_timeout``);
* an **outage** (:func:`~.connections.is_outage`: psycopg's ``OperationalError`` family that is
  none of the above);
* a **defect**: anything else (a missing table, a syntax error, a bug).
"""

from __future__ import annotations

import re
from typing import Optional

#: What the application's user needs on the dedup table (and on ``<table>_seq``).
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

DENIED, LOGIN, READ_ONLY = "denied", "login", "read-only"

#: Sqlstates that are a configuration a person must fix, by kind.
REFUSALS = {
    "42501": DENIED,  # insufficient_privilege
    "25006": READ_ONLY,  # read_only_sql_transaction
    "28P01": LOGIN,  # invalid_password
    "28000": LOGIN,  # invalid_authorization_specification
}

#: A connection refused with no sqlstate (libpq's connection failure): the server's message.
_LOGIN_MESSAGES = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \"[^\"]*\" does not exist|"
    r"is not permitted to log in|"
    r"(?:Peer|Ident|GSSAPI|SSPI|certificate|LDAP|RADIUS) authentication failed|"
    r"no password supplied|permission denied for database"
)
_DENIED_ON = re.compile(r"permission denied for (table|schema|sequence|database|relation) (\S+)")


def _sqlstate(exc: BaseException) -> Optional[str]:
    value = getattr(exc, "sqlstate", None)
    return value if isinstance(value, str) else None


def refusal(exc: BaseException) -> Optional[str]:
    """The kind of refusal ``exc`` (or an error along its explicit-cause chain, or the driver
    error a SQLAlchemy error wraps) is: :data:`DENIED`, :data:`READ_ONLY` or :data:`LOGIN`;
    None when it is not one."""
    current: Optional[BaseException] = exc
    for _ in range(8):  # a short chain; never loops on a cycle
        if current is None:
            return None
        current = getattr(current, "orig", None) or current
        kind = REFUSALS.get(_sqlstate(current) or "")
        if kind is not None:
            return kind
        text = str(current)
        if _sqlstate(current) is None and _is_psycopg(current) and _LOGIN_MESSAGES.search(text):
            return DENIED if "permission denied" in text else LOGIN
        current = current.__cause__
    return None


def _is_psycopg(exc: BaseException) -> bool:
    return any(str(k.__module__).startswith("psycopg") for k in type(exc).__mro__)


def explain(kind: str, message: str, table: str, user: Optional[str]) -> str:
    """What a person must do about a refusal of ``kind`` (the server's ``message``) met on the
    dedup ``table`` (or the table, schema or database the message names: the sequence
    table...): the GRANT to run for ``user`` (the session's ``current_user``, when known), the
    login to fix, or the server to point at."""
    who = user or "<the store's user>"
    if kind == READ_ONLY:
        return (
            "the PostgreSQL server takes no writes (a hot standby, or "
            "default_transaction_read_only on for the database or the user): point the store "
            "at the primary, or make the database writable for the user"
        )
    if kind == LOGIN:
        return (
            f"the PostgreSQL server refused the login of {who}: fix the user, password or "
            "host of the connection (or the server's pg_hba.conf)"
        )
    named = _DENIED_ON.search(message)
    what, target = (named.group(1), named.group(2).strip('"')) if named else ("table", table)
    if what == "schema":
        fix = f"GRANT USAGE ON SCHEMA {target} TO {who}"
        return f"the PostgreSQL user {who} may not use the schema {target}: {fix}"
    if what == "database":
        fix = f"GRANT CONNECT ON DATABASE {target} TO {who}"
        return f"the PostgreSQL user {who} may not connect to the database {target}: {fix}"
    schema = table.rpartition(".")[0]
    if schema and "." not in target:  # the server names the table without its schema
        target = f"{schema}.{target}"
    grant = f"GRANT {', '.join(PRIVILEGES)} ON {target} TO {who}"
    return f"the PostgreSQL user {who} lacks a privilege on {target}: {grant}"


__all__ = ["DENIED", "LOGIN", "PRIVILEGES", "READ_ONLY", "REFUSALS", "explain", "refusal"]
