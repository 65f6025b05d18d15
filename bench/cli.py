"""``python -m bench``: run the benchmark cases, print the table and the target ratios."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import uuid
from pathlib import Path
from typing import Optional, Sequence

from bench.aio import AIO_CASES
from bench.cases import IN_PROCESS_CASES, BenchError, Case, Context
from bench.drain import CONSUMER_CASES, baseline_consumer_cases
from bench.e2e import E2E_CASES
from bench.outbox import OUTBOX_CASES
from bench.report import (
    environment,
    evaluate,
    format_added_cpu,
    format_table,
    format_targets,
    git_commit,
    to_json,
    write_json,
)
from bench.runner import log_stderr, run_cases
from bench.settings import BenchSetupError, Servers

ALL_CASES: tuple[type[Case], ...] = (
    IN_PROCESS_CASES + AIO_CASES + E2E_CASES + CONSUMER_CASES + OUTBOX_CASES
)
QUICK_REPS, FULL_REPS = 5, 7
ROUNDS = 8  # parts per case and repetition, measured in interleaved rounds (bench.runner)


def cpu_choice(text: str) -> Optional[int]:
    """``--cpu``: a CPU number, or None for "all" (leave the process unpinned)."""
    if text == "all":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError("takes a CPU number or 'all'")
    return int(text)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Throughput of rocketmq-dedup against its baselines (msgs/s, median of "
        "interleaved repetitions) and the speed targets.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small N, {QUICK_REPS} reps; of the cases through the broker only the drain "
        "cases (*_drain)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument(
        "--cases",
        metavar="NAMES",
        help="comma-separated case names or globs (e.g. 'redis_*,noop'); "
        "named e2e cases run even with --quick",
    )
    parser.add_argument(
        "--reps",
        type=int,
        metavar="N",
        help=f"repetitions (default {QUICK_REPS} with --quick, else {FULL_REPS})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        metavar="N",
        help=f"interleaved rounds per repetition: each case's messages are measured in N parts, "
        f"one per round, in a new shuffled order each round (default {ROUNDS}; 1: each case "
        "whole, one after the other)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the case orders")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="PATH",
        help="also run memory_fresh and memory_dup, and the selected drain and paced cases "
        "with a store, with the listener of the checkout at PATH (e.g. a 'git worktree' of an "
        "older commit), in a child process, side by side with this run's (cases baseline_*)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a target fails")
    parser.add_argument("--chart", type=Path, metavar="PATH", help="also render a PNG chart")
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit")
    parser.add_argument(
        "--services",
        action="store_true",
        help="print the servers the selected cases need (redis mysql postgres broker)",
    )
    parser.add_argument(
        "--cpu",
        type=cpu_choice,
        default=0,
        metavar="N|all",
        help="pin this process (and the consumers it starts) to CPU N (default 0), or 'all' "
        "to leave it unpinned; see BENCHMARKS.md, 'Where things run'",
    )
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def select_cases(pattern: Optional[str], quick: bool) -> list[type[Case]]:
    if pattern is None:
        return [c for c in ALL_CASES if c.in_quick or not quick]
    wanted = [p.strip() for p in pattern.split(",") if p.strip()]
    unknown = [p for p in wanted if not any(fnmatch.fnmatchcase(c.name, p) for c in ALL_CASES)]
    if unknown:
        names = ", ".join(c.name for c in ALL_CASES)
        raise SystemExit(f"bench: error: no case matches {', '.join(unknown)} (cases: {names})")
    return [c for c in ALL_CASES if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]


def needed_services(cases: Sequence[type[Case]]) -> list[str]:
    needs = set().union(*(c.needs for c in cases))
    return [s for s in ("redis", "mysql", "postgres", "broker") if s in needs]


def check_servers(servers: Servers, services: Sequence[str]) -> dict[str, str]:
    """Reach every server the cases need; return their versions. Raises BenchSetupError."""
    checks = {
        "redis": servers.check_redis,
        "mysql": servers.check_mysql,
        "postgres": servers.check_postgres,
        "broker": servers.check_namesrv,
    }
    return {name: checks[name]() for name in services}


def pin_to_cpu(cpu: Optional[int]) -> Optional[list[int]]:
    """Pin this process to ``cpu`` (None: leave it); return the CPUs it may run on (None where
    the platform cannot tell)."""
    if not hasattr(os, "sched_setaffinity"):
        if cpu is not None:
            log_stderr("warning: this platform cannot pin a process to a CPU; running unpinned")
        return None
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            raise SystemExit(f"bench: error: cannot pin to CPU {cpu}: {exc}") from exc
    return sorted(os.sched_getaffinity(0))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    classes = select_cases(args.cases, args.quick)
    if args.baseline is not None:
        from bench.baseline import baseline_cases

        selected = {c.name for c in classes}
        classes += [c for c in baseline_cases(args.baseline) if c.of.name in selected]
        classes += baseline_consumer_cases(args.baseline, selected)
    if args.services:
        print(" ".join(needed_services(classes)))
        return 0
    if args.list:
        print("\n".join(c.name for c in classes))
        return 0
    reps = args.reps or (QUICK_REPS if args.quick else FULL_REPS)
    if reps < 3:
        log_stderr(f"warning: {reps} rep(s); the targets are defined on the median of >= 3")
    pinned = pin_to_cpu(args.cpu)
    servers = Servers.from_env()
    try:
        versions = check_servers(servers, needed_services(classes))
    except BenchSetupError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    ctx = Context(servers, uuid.uuid4().hex[:8])
    cases = [c(ctx, c.quick_n if args.quick else c.full_n) for c in classes]
    kind = "quick" if args.quick else "full"
    log_stderr(f"{len(cases)} cases x {reps} reps x {args.rounds} rounds ({kind})")
    try:
        results = run_cases(cases, reps, args.rounds, args.seed)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 3
    evaluated = evaluate(results)
    baseline = None
    if args.baseline is not None:
        baseline = {"path": str(args.baseline), "commit": git_commit(args.baseline)}
    options = {
        "quick": args.quick,
        "reps_per_case": reps,
        "rounds_per_rep": args.rounds,
        "seed": args.seed,
        "cpu_affinity": pinned,
        "baseline": baseline,
        "n": {c.name: c.n for c in cases},
    }
    env = environment(versions, options)
    print(f"cpu: {env['cpu_model']} ({env['cpus_usable']} usable), commit {env['git_commit']}")
    print(format_table(results))
    added = format_added_cpu(results)
    if added:
        print()
        print(added)
    print()
    print(format_targets(evaluated))
    document = to_json(results, env, evaluated)
    if args.json:
        write_json(args.json, document)
        log_stderr(f"wrote {args.json}")
    if args.chart:
        from bench.chart import render

        render(document, args.chart)
        log_stderr(f"wrote {args.chart}")
    if args.check and not all(t.passed for t in evaluated):
        return 1
    return 0
