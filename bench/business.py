"""The exactly-once cases' business writes, with nothing but the standard library: the bench's
cases import it, and the baseline worker (:mod:`bench.baseline_worker`), which imports nothing
of this checkout's packages, loads it by its path."""

from __future__ import annotations

from typing import Any


class BenchError(AssertionError):
    """A case measured the wrong thing (failed answers, wrong handler call count, a missing
    business row)."""


class BusinessTransaction:
    """The business writes of one message: ``statements`` statements, alternately an UPDATE
    of an account row (``accounts`` of them per application, taken in turn) and an INSERT into
    the ledger (2: one of each), on a DB-API connection whose transaction is open. The caller
    commits."""

    def __init__(
        self,
        app: str,
        statements: int,
        account_table: str,
        ledger_table: str,
        accounts: int,
        quote: str = "`",
    ) -> None:
        self.app = app
        self.statements = statements
        self.accounts = accounts
        account, ledger = (f"{quote}{t}{quote}" for t in (account_table, ledger_table))
        self.update = (
            f"UPDATE {account} SET balance = balance + %s WHERE application_name = %s AND id = %s"
        )
        self.insert = (
            f"INSERT INTO {ledger} (application_name, account, msg_id, amount) "
            "VALUES (%s, %s, %s, %s)"
        )
        self.sequence = 0

    def __call__(self, conn: Any, msg: Any) -> None:
        self.sequence += 1
        account = self.sequence % self.accounts
        cur = conn.cursor()
        try:
            for i in range(self.statements):
                if i % 2 == 0:
                    cur.execute(self.update, (1, self.app, account))
                    if cur.rowcount != 1:
                        raise BenchError(f"account {account} of {self.app} is missing")
                else:
                    cur.execute(self.insert, (self.app, account, msg.id, 1))
        finally:
            cur.close()


__all__ = ["BenchError", "BusinessTransaction"]
