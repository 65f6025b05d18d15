"""The benchmark harness's own parts that decide a verdict: CPU targets and the baseline."""

from __future__ import annotations

import time
from pathlib import Path

from bench.baseline import baseline_cases
from bench.cases import Context
from bench.drain import CONSUMER_CASES
from bench.drain_profile import switch_counts
from bench.drain_worker import Tally
from bench.report import (
    TARGETS,
    Target,
    TargetResult,
    added_cpu,
    evaluate,
    format_added_cpu,
    verdict,
)
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
    in the fresh case, none in the duplicate case, with the child's CPU per message (the
    memory store's; the exactly-once ones: tests/integration/test_bench_baseline.py)."""
    memory = [c for c in baseline_cases(REPO) if c.of.name.startswith("memory_")]
    cases = [c(Context(Servers.from_env(), "t"), 600) for c in memory]
    results = run_cases(cases, reps=2, rounds=3, seed=0, log=lambda line: None)
    assert [r.name for r in results] == ["baseline_memory_fresh", "baseline_memory_dup"]
    for result in results:
        assert len(result.reps) == 2 and all(rate > 0 for rate in result.reps)
        assert all(0 < us < 10_000 for us in result.cpu_us)


def test_added_cpu_is_the_per_rep_difference_to_the_clients_own() -> None:
    """The report's added CPU: per client, each store's CPU per message minus the client's own
    (nodedup), rep by rep, their median, and that as a ratio to the client's own."""
    own, redis = CaseResult("e2e_nodedup_drain", 10), CaseResult("e2e_redis_drain", 10)
    own.cpu_us, redis.cpu_us = [20.0, 30.0, 25.0], [40.0, 42.0, 55.0]
    table = added_cpu([own, redis])
    row = table["drain"]["e2e"]
    assert row["nodedup"] == 25.0
    assert row["redis"] == 20.0  # median of 20, 12, 30
    assert row["redis_ratio"] == 0.8
    assert "mysql" not in row and "paced" not in table
    line = "classic push  own    25.0 us  redis +  20.0 us (x0.80)"
    assert line in format_added_cpu([own, redis])


def test_every_client_drains_and_keeps_pace_with_each_store() -> None:
    """Drain and paced cases exist for the classic push, 5.x push and 5.x simple consumers,
    without dedup and on Redis and MySQL; each dedup case has its target against nodedup."""
    names = {case.name for case in CONSUMER_CASES}
    targets = {t.name for t in TARGETS}
    for client in ("e2e", "e2e_grpc", "e2e_simple"):
        for regime in ("drain", "paced"):
            assert f"{client}_nodedup_{regime}" in names
            for store in ("redis", "mysql"):
                assert f"{client}_{store}_{regime}" in names
                assert f"{client}_{store}_{regime}/{client}_nodedup_{regime}" in targets


def test_tally_counts_each_key_of_its_run_once() -> None:
    """The drain consumer's tally: only bodies of its run count, each key once, failures
    apart; it is done at the N-th key, with the lag from the send time in the body."""
    tally = Tally(2, b"run1")
    sent = b"run1 %d" % (time.time_ns() - 5_000_000)
    tally.completed("run1-0", sent, True)
    tally.completed("run1-0", sent, True)  # a redelivered copy
    tally.completed("run1-1", sent, False)
    assert not tally.done.is_set() and tally.failures == 1
    tally.completed("run1-1", sent, True)
    assert tally.done.is_set() and tally.deliveries == 4
    assert all(4.0 < lag < 5_000 for lag in tally.lags_ms)


#: Three events as ``perf script -F comm,tid,event,ip,sym,dso`` prints them (stacks trimmed).
PERF_SCRIPT = """\
ConsumeTP  4652 sched:sched_switch:
\tffffffff821f8b58 __schedule ([kernel.kallsyms])
\tffffffff8143f416 eventfd_read ([kernel.kallsyms])
\t           1b7f6 read (/usr/lib/x86_64-linux-gnu/libc.so.6)

EventLoop  4259          cpu-clock:
\t          25f831 std::this_thread::__sleep_for (/opt/librocketmq.so)

Consume TP  4653 sched:sched_switch:
\tffffffff821f8b58 __schedule ([kernel.kallsyms])
\tffffffff8143f416 futex_wait ([kernel.kallsyms])
\t           85f16 __futex_abstimed_wait_common (/usr/lib/x86_64-linux-gnu/libc.so.6)

ConsumeTP  4652 sched:sched_switch:
\tffffffff821f8b58 __schedule ([kernel.kallsyms])
\tffffffff81234567 irqentry_exit ([kernel.kallsyms])
"""


def test_switches_are_counted_by_thread_name_and_kernel_reason() -> None:
    """Each sched_switch counts once under its thread's name and the kernel function that
    blocked it; other events (a cpu-clock sample) count nothing."""
    counts = switch_counts(PERF_SCRIPT.splitlines())
    assert counts == {
        ("ConsumeTP", "eventfd wait"): 1,
        ("Consume TP", "futex"): 1,
        ("ConsumeTP", "preempted"): 1,
    }
