"""Runs the repetitions: every repetition runs every case once, in a shuffled order, so the
cases of one repetition are measured close together in time."""

from __future__ import annotations

import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from bench.cases import BenchError, Case

WARMUP_N = 300


@dataclass(frozen=True)
class Usage:
    """This process's CPU time (s) and context switches, all threads together."""

    cpu_s: float
    voluntary: int
    involuntary: int

    @classmethod
    def now(cls) -> Usage:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return cls(r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)

    def since(self, before: Usage) -> Usage:
        return Usage(
            self.cpu_s - before.cpu_s,
            self.voluntary - before.voluntary,
            self.involuntary - before.involuntary,
        )


@dataclass
class CaseResult:
    """One case's rates (messages per second), one per repetition in run order, and what each
    message cost this process (CPU time, context switches) in the timed pass."""

    name: str
    n: int
    reps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    voluntary_switches: list[float] = field(default_factory=list)
    involuntary_switches: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.reps)

    def costs(self) -> dict[str, float]:
        """Medians per message: CPU microseconds and context switches of the bench process
        (not of the servers; for the e2e cases this process is the consumer)."""
        return {
            "cpu_us_per_msg": statistics.median(self.cpu_us),
            "voluntary_switches_per_msg": statistics.median(self.voluntary_switches),
            "involuntary_switches_per_msg": statistics.median(self.involuntary_switches),
        }

    def add(self, rate: float, usage: Usage) -> None:
        self.reps.append(rate)
        self.cpu_us.append(usage.cpu_s / self.n * 1e6)
        self.voluntary_switches.append(usage.voluntary / self.n)
        self.involuntary_switches.append(usage.involuntary / self.n)


Log = Callable[[str], None]


def log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_once(case: Case, rep: int) -> tuple[float, Usage]:
    """One timed repetition of ``case``; returns messages per second and this process's
    resource usage during the timed pass. Raises BenchError when the handler was not called
    exactly as the case requires."""
    case.prepare(rep)
    case.handler.reset()
    try:
        before = Usage.now()
        elapsed = case.measure()
        usage = Usage.now().since(before)
        calls, expected = case.handler.calls, case.expected_calls()
        if calls != expected:
            raise BenchError(
                f"{case.name}: the handler ran {calls} times in the timed pass, expected "
                f"{expected}: the case did not measure what it claims"
            )
    finally:
        case.cleanup()
    return case.n / elapsed, usage


def run_cases(cases: list[Case], reps: int, seed: int, log: Log = log_stderr) -> list[CaseResult]:
    """Set up, warm up, run ``reps`` interleaved repetitions, close. Results in case order."""
    results = {case.name: CaseResult(case.name, case.n) for case in cases}
    started: list[Case] = []
    try:
        for case in cases:
            case.setup()
            started.append(case)
            case.warm_up(WARMUP_N)
        for rep in range(reps):
            order = list(cases)
            random.Random(seed + rep).shuffle(order)
            began = time.monotonic()
            for case in order:
                rate, usage = run_once(case, rep)
                results[case.name].add(rate, usage)
                log(f"  rep {rep + 1}/{reps}  {case.name:<22} {rate:>14,.0f} msg/s")
            log(f"rep {rep + 1}/{reps} done in {time.monotonic() - began:.1f}s")
    except BaseException as exc:  # say what failed before closing, which may itself hang
        log(f"error: {type(exc).__name__}: {exc}; closing the cases")
        raise
    finally:
        close_all(reversed(started), log)
    return [results[case.name] for case in cases]


def close_all(cases: Iterable[Case], log: Log) -> None:
    """Close every case (deleting its records) even if one fails; never masks the run's error."""
    for case in cases:
        try:
            case.close()
        except Exception as exc:
            log(f"warning: closing {case.name} failed: {type(exc).__name__}: {exc}")
