"""What the MySQL store needs of its account and its server, and what a refusal means.

The application's account needs ``SELECT, INSERT, UPDATE, DELETE`` on the dedup table, and on
``<table>_seq`` for the exactly-once mode's sequence guard (:data:`PRIVILEGES`); the DDL
(``create_table()``, or ``python -m rocketmq_dedup schema mysql``) may run apart under another
account.

Refusals (:data:`REFUSALS`) are the server errors that a person must fix: they will not pass by
themselves, so they are never outages (handlers never run without dedup because of them). Each
code is MySQL's and MariaDB's unless noted:

* the account may not do it: 1044 (no access to the database), 1142 (command denied on the
  table), 1143 (on a column: column-level grants that miss one), 1227 (a specific privilege),
  1370 (a routine, e.g. one a trigger on the table calls);
* the server refused the login: 1045 (wrong user, password or host), 1698 (no password for a
  socket-authenticated account), 1820 and 1862 (an expired password), 3118 (MySQL) and 4151
  (MariaDB: a locked account);
* the server takes no writes: 1290 (``--read-only``: a replica, or a primary set read-only),
  1836 (MySQL's read-only mode), 1874 (``innodb_read_only``), 1036 (a read-only table), 1792
  (a session left in a READ ONLY transaction, e.g. by the factory's ``init_command``).

Not refusals: 1226 (a per-hour resource limit: it passes by itself), 1040 and 1203 (too many
connections: an outage that passes), the schema errors (1054, 1146: defects, never outages).
"""

from __future__ import annotations

import re
from typing import Dict, Optional

#: What the application's account needs on the dedup table (and on ``<table>_seq``).
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

_DENIED, _LOGIN, _READ_ONLY = "denied", "login", "read-only"

#: Server error numbers that are a configuration a person must fix, by kind.
REFUSALS: Dict[int, str] = {
    1044: _DENIED,  # ER_DBACCESS_DENIED_ERROR
    1142: _DENIED,  # ER_TABLEACCESS_DENIED_ERROR
    1143: _DENIED,  # ER_COLUMNACCESS_DENIED_ERROR
    1227: _DENIED,  # ER_SPECIFIC_ACCESS_DENIED_ERROR
    1370: _DENIED,  # ER_PROCACCESS_DENIED_ERROR
    1045: _LOGIN,  # ER_ACCESS_DENIED_ERROR
    1698: _LOGIN,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR
    1820: _LOGIN,  # ER_MUST_CHANGE_PASSWORD
    1862: _LOGIN,  # ER_MUST_CHANGE_PASSWORD_LOGIN
    3118: _LOGIN,  # ER_ACCOUNT_HAS_BEEN_LOCKED (MySQL)
    4151: _LOGIN,  # ER_ACCOUNT_HAS_BEEN_LOCKED (MariaDB)
    1290: _READ_ONLY,  # ER_OPTION_PREVENTS_STATEMENT (--read-only)
    1836: _READ_ONLY,  # ER_READ_ONLY_MODE
    1874: _READ_ONLY,  # ER_INNODB_READ_ONLY
    1036: _READ_ONLY,  # ER_OPEN_AS_READONLY
    1792: _READ_ONLY,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
}

_ACCOUNT_IN_MESSAGE = re.compile(r"'([^']*)'@'([^']*)'")
_COMMAND_DENIED = re.compile(r"([A-Z]+(?:, [A-Z]+)*) command denied")
# MariaDB: "for table `db`.`t`"; MySQL: "for table 't'"; a column's: "in table 't'".
_TABLE_IN_MESSAGE = re.compile(r"(?:for|in) table [`']([^`']+)[`'](?:\.[`']([^`']+)[`'])?")


def grant_account(current_user: str) -> str:
    """``CURRENT_USER()``'s ``user@host`` as a GRANT names it: ``'user'@'host'``."""
    user, _, host = current_user.rpartition("@")
    return f"'{user}'@'{host}'"


def explain(
    code: int,
    message: str,
    table: str,
    account: Optional[str] = None,
    database: Optional[str] = None,
) -> str:
    """What a person must do about refusal ``code`` (its server ``message``) met on the dedup
    ``table`` (or the table the message names: the sequence table...): the GRANT to run (for
    ``account``, as :func:`grant_account` gives it, else the account the message names), the
    login to fix, or the server to point at."""
    if account is None:
        named = _ACCOUNT_IN_MESSAGE.search(message)
        account = f"'{named.group(1)}'@'{named.group(2)}'" if named else "<the account>"
    denied_on = _TABLE_IN_MESSAGE.search(message)
    if denied_on is not None:
        first, second = denied_on.groups()
        if second is not None:  # `db`.`table`
            table = f"{first}.{second}"
        elif first != table.rpartition(".")[2]:  # another table than the store's
            table = first
    target = table if "." in table or not database else f"{database}.{table}"
    grant = f"GRANT {', '.join(PRIVILEGES)} ON {target} TO {account}"
    kind = REFUSALS[code]
    if kind == _READ_ONLY:
        return (
            "the MySQL server takes no writes (read-only): point the store at the primary, "
            "or make the server writable there (SET GLOBAL read_only = OFF)"
        )
    if kind == _LOGIN:
        return (
            f"the MySQL server refused the login of {account}: fix the user, password or "
            "host of the connection factory (or unlock the account, renew its password)"
        )
    if code == 1044:
        return f"the MySQL user {account} has no access to the database of {target}: {grant}"
    denied = _COMMAND_DENIED.search(message)
    what = denied.group(1).upper() if denied else "a privilege"
    return f"the MySQL user {account} lacks {what} on {target}: {grant}"
