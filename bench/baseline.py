"""``--baseline PATH``: the memory-store cases and the exactly-once listener cases
(``mysql_tx_dedup``, ``pg_tx_dedup``) of another checkout (an older commit's ``git worktree``),
run beside this run's cases so that both are measured side by side.

Each baseline case drives a child process (:mod:`bench.baseline_worker`) that imports the
other checkout's ``rocketmq_dedup``: two versions of one package cannot share a process. The
child inherits this process's CPU pinning; the parent times each part around the request (a
pipe round trip, some 50 us a part of thousands of messages) and takes the CPU time and context
switches the child reports for the part, so ``cpu us/msg`` is the other checkout's listener.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from bench.cases import (
    LIBRARY_TABLE,
    TX_ACCOUNTS,
    BenchError,
    Case,
    Context,
    MemoryDup,
    MemoryFresh,
    MySQLTxDedup,
    PostgresTxDedup,
    SQLListenerCase,
    listener_options,
)
from bench.settings import TX_ACCOUNT_TABLE, TX_LEDGER_TABLE

WORKER = Path(__file__).with_name("baseline_worker.py")
PREFIX = "baseline_"
#: The exactly-once cases' twins that run this checkout's listener in a child process as the
#: baseline's runs the other's (``child_*``): a listener in a process of its own runs faster
#: than one in the bench's (measured: 1.1-1.2 times), so this checkout's against the
#: baseline's is ``child_*/baseline_*``; the targets stay in-process (``*_tx_dedup/*_tx_record``).
CHILD_PREFIX = "child_"
THIS_CHECKOUT = Path(__file__).resolve().parents[1]


class Child:
    """A running worker script (``worker``, run by ``python``) that imports ``checkout``'s
    package: one request, one answer."""

    def __init__(
        self,
        checkout: Path,
        worker: Path = WORKER,
        python: str = sys.executable,
        name: str = "baseline worker",
    ) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [python, str(worker), str(checkout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._read()
        imported = Path(ready["ready"]).resolve()
        if checkout.resolve() not in imported.parents:
            self.close()
            raise BenchError(f"{name}: imported {imported}, not the one in {checkout}")

    def ask(self, op: str, **fields: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise BenchError(f"{self.name}: {answer['error']}")
        return answer

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"{self.name} exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RemoteHandler:
    """The child's handler call count, read as the runner reads a local handler's."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @property
    def calls(self) -> int:
        return int(self.child.ask("calls")["calls"])

    def reset(self) -> None:
        self.child.ask("reset")


class BaselineCase(Case):
    """``of``, measured with the other checkout's listener."""

    of: ClassVar[type[Case]]
    checkout: ClassVar[Path]

    def __init__(self, ctx: Context, n: int) -> None:
        super().__init__(ctx, n)
        self.child: Optional[Child] = None

    def setup(self) -> None:
        self.child = Child(self.checkout)
        self.handler = RemoteHandler(self.child)  # type: ignore[assignment]

    def prepare(self, rep: object) -> None:
        assert self.child is not None
        options = {"application": self.app, **listener_options()}
        prefix = f"{self.ctx.run_id}-{self.name}-{rep}"
        answer = self.child.ask(
            "prepare", prefix=prefix, n=self.n, duplicates=self.duplicates, options=options
        )
        self.expect_no_failures(answer["failures"], "the untimed first pass")
        self.items = range(self.n)

    def measure(self, items: Optional[Sequence[Any]] = None) -> float:
        assert self.child is not None
        span = range(self.n) if items is None else items
        assert isinstance(span, range)
        answer = self.child.ask("measure", start=span.start, stop=span.stop)
        self.expect_no_failures(answer["failures"], "the timed pass")
        self.usage = (answer["cpu_s"], answer["voluntary"], answer["involuntary"])
        return float(answer["seconds"])

    def consume(self, item: Any) -> Any:  # pragma: no cover - measure() is overridden
        raise NotImplementedError

    def close(self) -> None:
        if self.child is not None:
            self.child.close()


class BaselineTransaction(BaselineCase):
    """Mixed before an exactly-once listener case (``of``): the case's tables, accounts and
    cleanup as they are, its listener the other checkout's, in the child, on the same server
    and tables, running the same business transaction (its statements sent to the child)."""

    statements: ClassVar[int]

    def setup(self) -> None:
        super(BaselineCase, self).setup()  # the case's own: tables, accounts, its listener

    def start_tx_listener(self) -> None:
        self.child = Child(self.checkout)
        self.handler = RemoteHandler(self.child)  # type: ignore[assignment]
        servers = self.ctx.servers
        postgres = "postgres" in self.needs
        self.child.ask(
            "start_tx",
            database="postgres" if postgres else "mysql",
            connect=servers.postgres_dsn if postgres else servers.mysql,
            app=self.app,
            table=LIBRARY_TABLE,
            business={
                "statements": self.statements,
                "account_table": TX_ACCOUNT_TABLE,
                "ledger_table": TX_LEDGER_TABLE,
                "accounts": TX_ACCOUNTS,
                "quote": '"' if postgres else "`",
            },
            options=listener_options(),
        )

    def prepare(self, rep: object) -> None:
        assert self.child is not None
        prefix = f"{self.ctx.run_id}-{self.name}-{rep}"
        self.child.ask("prepare_tx", prefix=prefix, n=self.n)
        self.items = range(self.n)

    def close(self) -> None:
        super().close()  # the child, and its listener's connections
        # then the case's own closes after SQLListenerCase's (which closes a listener of this
        # process: there is none)
        super(SQLListenerCase, self).close()


def baseline_cases(checkout: Path) -> tuple[type[Case], ...]:
    """The baseline twins of the memory-store cases and the exactly-once listener cases,
    reading ``checkout``'s package."""
    if not (checkout / "rocketmq_dedup" / "__init__.py").is_file():
        raise SystemExit(f"bench: error: --baseline {checkout}: no rocketmq_dedup package there")
    memory = tuple(
        type(
            f"Baseline{case.__name__}",
            (BaselineCase,),
            {
                "name": PREFIX + case.name,
                "of": case,
                "checkout": checkout,
                "quick_n": case.quick_n,
                "full_n": case.full_n,
                "duplicates": case.duplicates,
                "__doc__": f"{case.name} with the listener of {checkout}.",
            },
        )
        for case in (MemoryFresh, MemoryDup)
    )
    transactions = tuple(
        type(
            f"{kind.title()}{case.__name__}",
            (BaselineTransaction, case),
            {
                "name": f"{kind}_{case.name}",
                "of": case,
                "checkout": where,
                "__doc__": f"{case.name} with the listener of {where}, in a child process.",
            },
        )
        for kind, where in (("baseline", checkout), (CHILD_PREFIX.rstrip("_"), THIS_CHECKOUT))
        for case in (MySQLTxDedup, PostgresTxDedup)
    )
    return memory + transactions
