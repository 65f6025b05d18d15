"""Runs the repetitions. Every repetition measures every case once, in interleaved rounds
(see :func:`run_rep`), so the cases of a ratio are measured side by side in time."""

from __future__ import annotations

import gc
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from bench.cases import BenchError, Case

WARMUP_N = 300


@dataclass(frozen=True)
class Usage:
    """This process's CPU time (s) and context switches, all threads together."""

    cpu_s: float
    voluntary: int
    involuntary: int

    @classmethod
    def zero(cls) -> Usage:
        return cls(0.0, 0, 0)

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

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.cpu_s + other.cpu_s,
            self.voluntary + other.voluntary,
            self.involuntary + other.involuntary,
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
    details: dict[str, list[float]] = field(default_factory=dict)  # Case.details, per rep

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
            **{name: statistics.median(values) for name, values in self.details.items()},
        }

    def add(self, rate: float, usage: Usage, details: Optional[dict[str, float]] = None) -> None:
        self.reps.append(rate)
        for name, value in (details or {}).items():
            self.details.setdefault(name, []).append(value)
        self.cpu_us.append(usage.cpu_s / self.n * 1e6)
        self.voluntary_switches.append(usage.voluntary / self.n)
        self.involuntary_switches.append(usage.involuntary / self.n)


Log = Callable[[str], None]


def log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Sample:
    """One case in one repetition: time spent in its timed passes and what they used."""

    seconds: float = 0.0
    usage: Usage = field(default_factory=Usage.zero)
    details: dict[str, float] = field(default_factory=dict)  # of a case measured whole

    def add(self, seconds: float, usage: Usage) -> None:
        self.seconds += seconds
        self.usage = self.usage.plus(usage)


def measure(case: Case, sample: Sample, items: Optional[Sequence[Any]] = None) -> None:
    """Time one timed pass of ``case`` (over ``items``, default all) into ``sample``."""
    before = Usage.now()
    seconds = case.measure(items)
    used = Usage.now().since(before) if case.usage is None else Usage(*case.usage)
    sample.add(seconds, used)


def expect_calls(case: Case) -> None:
    """Raise BenchError unless the handler ran exactly as the case requires."""
    calls, expected = case.handler.calls, case.expected_calls()
    if calls != expected:
        raise BenchError(
            f"{case.name}: the handler ran {calls} times in the timed pass, expected "
            f"{expected}: the case did not measure what it claims"
        )


def run_rep(cases: list[Case], rep: int, rounds: int, rng: random.Random) -> dict[str, Sample]:
    """One repetition of every case.

    The messages of every chunked case are prepared first (untimed) and cut into ``rounds``
    parts; each round then measures one part of every case, in a new shuffled order, so the
    two cases of a ratio sample the same stretches of time however the machine drifts. A case
    that is not chunked (e2e) is prepared, measured whole and cleaned up in its slot of the
    first round. Raises BenchError when a handler was not called exactly as its case requires.
    """
    samples = {case.name: Sample() for case in cases}
    prepared: list[Case] = []
    try:
        parts = {}
        for case in cases:
            if case.chunked:
                prepared.append(case)
                case.prepare(rep)
                case.handler.reset()
                parts[case.name] = case.parts(rounds)
        # The prepared messages of every case stay alive for the whole repetition: keep them
        # out of the cyclic GC, whose full collections would otherwise walk them all (measured
        # inside timed parts: 1.96 s in 5 pauses of up to 0.61 s over 2 full-size repetitions,
        # charged to whichever case ran; 0.79 s in pauses of up to 0.15 s with the freeze).
        gc.collect()
        gc.freeze()
        for r in range(rounds):
            order = list(cases)
            rng.shuffle(order)
            for case in order:
                if case.chunked:
                    measure(case, samples[case.name], parts[case.name][r])
                elif r == 0:
                    case.prepare(rep)
                    case.handler.reset()
                    try:
                        measure(case, samples[case.name])
                        expect_calls(case)
                        samples[case.name].details = case.details()
                    finally:
                        case.cleanup()
        for case in prepared:
            expect_calls(case)
    finally:
        gc.unfreeze()
        for case in prepared:  # every case's records, even after a failure; never masks it
            try:
                case.cleanup()
            except Exception as exc:
                log_stderr(f"warning: cleaning up {case.name} failed: {type(exc).__name__}: {exc}")
    return samples


def run_cases(
    cases: list[Case], reps: int, rounds: int, seed: int, log: Log = log_stderr
) -> list[CaseResult]:
    """Set up, warm up, run ``reps`` repetitions of ``rounds`` interleaved rounds, close.
    Results in case order."""
    results = {case.name: CaseResult(case.name, case.n) for case in cases}
    started: list[Case] = []
    try:
        for case in cases:
            case.setup()
            started.append(case)
            case.warm_up(WARMUP_N)
        for rep in range(reps):
            began = time.monotonic()
            samples = run_rep(cases, rep, rounds, random.Random(seed + rep))
            for case in cases:
                sample = samples[case.name]
                rate = case.n / sample.seconds
                results[case.name].add(rate, sample.usage, sample.details)
                log(f"  rep {rep + 1}/{reps}  {case.name:<32} {rate:>14,.0f} msg/s")
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
