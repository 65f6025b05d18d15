"""The benchmark harness's own parts that decide a verdict: CPU targets and the baseline."""

from __future__ import annotations

from pathlib import Path

from bench.baseline import baseline_cases
from bench.cases import Context
from bench.report import Target, TargetResult, evaluate, verdict
from bench.runner import CaseResult, run_cases
from bench.settings import Servers

REPO = Path(__file__).resolve().parents[2]


def test_cpu_targets_are_upper_bounds() -> None:
    """A cpu_us target passes at or under its threshold and fails over it."""
    target = Target("memory_dup", None, 3.0, cpu_us=True)
    assert verdict(TargetResult(target, [2.9, 3.0, 3.1], 3.0)) == "PASS"
    assert verdict(TargetResult(target, [3.1, 3.2, 2.0], 3.1)) == "FAIL"


def test_cpu_ratio_is_taken_per_repetition() -> None:
    """A CPU ratio divides the two cases' CPU per message rep by rep."""
    fresh, base = CaseResult("memory_fresh", 10), CaseResult("baseline_memory_fresh", 10)
    fresh.cpu_us, fresh.reps = [5.0, 6.0, 5.5], [1.0, 1.0, 1.0]
    base.cpu_us, base.reps = [10.0, 12.0, 11.0], [1.0, 1.0, 1.0]
    found = {t.target.name: t for t in evaluate([fresh, base])}
    ratio = found["memory_fresh/baseline_memory_fresh cpu_us/msg"]
    assert ratio.rep_values == [0.5, 0.5, 0.5]
    assert found["memory_fresh cpu_us/msg"].value == 5.5
    assert not found["memory_fresh cpu_us/msg"].passed  # > 5.0


def test_baseline_runs_another_checkouts_listener() -> None:
    """The baseline cases run a checkout's listener in a child process: every message handled
    in the fresh case, none in the duplicate case, with the child's CPU per message."""
    cases = [c(Context(Servers.from_env(), "t"), 600) for c in baseline_cases(REPO)]
    results = run_cases(cases, reps=2, rounds=3, seed=0, log=lambda line: None)
    assert [r.name for r in results] == ["baseline_memory_fresh", "baseline_memory_dup"]
    for result in results:
        assert len(result.reps) == 2 and all(rate > 0 for rate in result.reps)
        assert all(0 < us < 10_000 for us in result.cpu_us)
