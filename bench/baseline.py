"""``--baseline PATH``: the memory-store cases of another checkout (an older commit's
``git worktree``), run beside this run's cases so that both are measured side by side.

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

from bench.cases import BenchError, Case, Context, MemoryDup, MemoryFresh, listener_options

WORKER = Path(__file__).with_name("baseline_worker.py")
PREFIX = "baseline_"


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


def baseline_cases(checkout: Path) -> tuple[type[Case], ...]:
    """The baseline twins of the memory-store cases, reading ``checkout``'s package."""
    if not (checkout / "rocketmq_dedup" / "__init__.py").is_file():
        raise SystemExit(f"bench: error: --baseline {checkout}: no rocketmq_dedup package there")
    return tuple(
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
