"""Targets, ratios, the environment record, the printed table and the JSON file."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from bench.runner import CaseResult


@dataclass(frozen=True)
class Target:
    """``numerator / denominator >= threshold``, or ``numerator >= threshold`` (msg/s) when
    there is no denominator."""

    numerator: str
    denominator: Optional[str]
    threshold: Optional[float]
    """None: reported for information, no target."""
    cpu_us: bool = False
    """The case's CPU microseconds per message (of the process that ran it; a ratio of two
    cases' when there is a denominator), which must be at most ``threshold``."""
    detail: Optional[str] = None
    """One of the case's details (:meth:`bench.cases.Case.details`, e.g. a latency in ms),
    which must be at most ``threshold``."""

    @property
    def at_most(self) -> bool:
        return self.cpu_us or self.detail is not None

    @property
    def name(self) -> str:
        name = f"{self.numerator}/{self.denominator}" if self.denominator else self.numerator
        if self.detail is not None:
            return f"{name} {self.detail}"
        return f"{name} cpu_us/msg" if self.cpu_us else name

    @property
    def cases(self) -> tuple[str, ...]:
        return (self.numerator, self.denominator) if self.denominator else (self.numerator,)


TARGETS: tuple[Target, ...] = (
    Target("redis_dup", "redis_naive_dup", 1.4),
    Target("redis_fresh", "redis_naive_fresh", 0.95),
    Target("redis_fresh", "powertools_fresh", 1.5),
    Target("redis_dup", "powertools_dup", 4.0),
    Target("redis_batch32_fresh", "redis_fresh", 8.0),
    Target("redis_threads8_fresh", "redis_fresh", 2.5),
    Target("redis_threads8_nocoalesce_fresh", "redis_fresh", None),
    Target("redis_threads8_lockwake_fresh", "redis_fresh", None),
    Target("aio_redis_tasks64_fresh", "redis_threads8_fresh", 1.0),
    Target("redis_call_fresh", "redis_fresh", None),
    Target("memory_call_fresh", "memory_fresh", None),
    Target("memory_fresh", None, 60_000.0),
    Target("memory_fresh", None, 5.0, cpu_us=True),
    Target("memory_dup", None, 3.0, cpu_us=True),
    Target("baseline_memory_fresh", None, None, cpu_us=True),
    Target("baseline_memory_dup", None, None, cpu_us=True),
    Target("memory_fresh", "baseline_memory_fresh", None, cpu_us=True),
    Target("memory_dup", "baseline_memory_dup", None, cpu_us=True),
    Target("memory_prometheus_fresh", "memory_fresh", 0.85),
    Target("mysql_fresh", "mysql_naive_fresh", 0.9),
    Target("pg_fresh", "pg_naive_fresh", 0.9),
    Target("mysql_tx_dedup", "mysql_tx_plain", 0.85),
    Target("mysql_tx_record", "mysql_tx_plain", None),
    Target("mysql_tx_dedup", "mysql_tx_record", 0.95),
    Target("mysql_tx12_dedup", "mysql_tx12_plain", 0.95),
    Target("pg_tx_dedup", "pg_tx_record", 0.95),
    Target("pg_tx_record", "pg_tx_plain", None),
    Target("pg_tx_dedup", "pg_tx_plain", None),
    Target("pg_tx_record_narrow", "pg_tx_record", None),
    Target("mysql_tx_record_narrow", "mysql_tx_record", None),
    # --baseline: the other checkout's exactly-once listener and this one's, each in a child
    # process (bench/baseline.py), against each other and against the in-process floor
    Target("child_mysql_tx_dedup", "baseline_mysql_tx_dedup", None),
    Target("child_pg_tx_dedup", "baseline_pg_tx_dedup", None),
    Target("baseline_mysql_tx_dedup", "mysql_tx_record", None),
    Target("child_mysql_tx_dedup", "mysql_tx_record", None),
    Target("baseline_pg_tx_dedup", "pg_tx_record", None),
    Target("child_pg_tx_dedup", "pg_tx_record", None),
    Target("e2e_redis", "e2e_nodedup", 0.95),
    Target("e2e_mysql", "e2e_nodedup", 0.90),
    # the outbox (bench/outbox.py; targets set from the first measurement, BENCHMARKS.md)
    Target("e2e_tx_outbox_apart", "e2e_tx_publish", 0.9),
    Target("e2e_tx_outbox", "e2e_tx_publish", None),
    Target("e2e_outbox_latency", None, 5.0, detail="latency_p50_ms"),
    Target("e2e_outbox_latency", None, 50.0, detail="latency_p99_ms"),
    Target("e2e_outbox_latency_poll", None, None, detail="latency_p50_ms"),
    Target("e2e_outbox_latency_poll", None, None, detail="latency_p99_ms"),
    Target("outbox_relay", None, 2_000.0),
    Target("outbox_relay_sharded", None, 1_000.0),
    # Issue 33: a consumer draining a backlog (its CPU the bottleneck), and one paced below its
    # capacity (it keeps up: the rates match), per client (classic push, 5.x push, 5.x simple)
    *(
        Target(f"{client}_{store}_drain", f"{client}_nodedup_drain", threshold)
        for client in ("e2e", "e2e_grpc", "e2e_simple")
        for store, threshold in (("redis", 0.7), ("mysql", 0.6))
    ),
    *(
        Target(f"{client}_{store}_paced", f"{client}_nodedup_paced", 0.95)
        for client in ("e2e", "e2e_grpc", "e2e_simple")
        for store in ("redis", "mysql")
    ),
    *(
        Target(f"{client}_{store}_{regime}", f"baseline_{client}_{store}_{regime}", None, True)
        for regime in ("drain", "paced")
        for client in ("e2e", "e2e_grpc", "e2e_simple")
        for store in ("redis", "mysql")
    ),
)


@dataclass(frozen=True)
class TargetResult:
    """A target's value in every repetition: the ratio of the two cases measured side by side
    (msg/s for an absolute target). ``value``, which is judged, is their median."""

    target: Target
    rep_values: list[float]
    of_medians: float  # the ratio of the cases' medians (or the median msg/s), for reference

    @property
    def value(self) -> float:
        return statistics.median(self.rep_values)

    @property
    def passed(self) -> bool:
        threshold = self.target.threshold
        if threshold is None:
            return True
        return self.value <= threshold if self.target.at_most else self.value >= threshold


def evaluate(results: list[CaseResult]) -> list[TargetResult]:
    """The targets whose cases all ran."""
    by_name = {r.name: r for r in results}
    evaluated = []
    for target in TARGETS:
        if not all(name in by_name for name in target.cases):
            continue
        num = by_name[target.numerator]
        if target.detail is not None:
            if target.detail not in num.details:
                continue
            nums = num.details[target.detail]
        else:
            nums = num.cpu_us if target.cpu_us else num.reps
        if target.denominator is None:
            evaluated.append(TargetResult(target, list(nums), statistics.median(nums)))
            continue
        den = by_name[target.denominator]
        dens = den.cpu_us if target.cpu_us else den.reps
        per_rep = [a / b for a, b in zip(nums, dens, strict=False)]
        of_medians = statistics.median(nums) / statistics.median(dens)
        evaluated.append(TargetResult(target, per_rep, of_medians))
    return evaluated


def ratios(results: list[CaseResult]) -> dict[str, float]:
    """Every target ratio that could be computed (median of the per-repetition ratios)."""
    return {
        t.target.name: t.value
        for t in evaluate(results)
        if t.target.denominator and not t.target.at_most
    }


def verdict(t: TargetResult) -> str:
    if t.target.threshold is None:
        return "info"
    return "PASS" if t.passed else "FAIL"


def format_table(results: list[CaseResult]) -> str:
    lines = [
        f"{'case':<32} {'N':>9} {'msgs/s median':>14} {'min':>12} {'max':>12}  reps"
        f" {'cpu us/msg':>10} {'switches/msg':>12}"
    ]
    for r in results:
        costs = r.costs()
        switches = costs["voluntary_switches_per_msg"] + costs["involuntary_switches_per_msg"]
        lines.append(
            f"{r.name:<32} {r.n:>9,} {r.median:>14,.0f} {min(r.reps):>12,.0f} "
            f"{max(r.reps):>12,.0f}  {len(r.reps):>4} {costs['cpu_us_per_msg']:>10.1f} "
            f"{switches:>12.2f}"
        )
    return "\n".join(lines)


def format_targets(evaluated: list[TargetResult]) -> str:
    lines = [
        "ratios: median of the per-rep ratios (cases of one rep run side by side); "
        "cpu_us/msg: CPU of the process that ran the case",
        f"{'target':<48} {'value':>9} {'per-rep range':>21} {'of medians':>10} "
        f"{'needs':>10}  result",
    ]
    for t in evaluated:
        absolute = t.target.denominator is None
        fmt = "{:,.0f}" if absolute and not t.target.at_most else "{:.2f}"
        spread = f"{fmt.format(min(t.rep_values))} .. {fmt.format(max(t.rep_values))}"
        bound = "<= " if t.target.at_most else ">= "
        needs = "-" if t.target.threshold is None else bound + fmt.format(t.target.threshold)
        lines.append(
            f"{t.target.name:<48} {fmt.format(t.value):>9} {spread:>21} "
            f"{fmt.format(t.of_medians):>10} {needs:>10}  {verdict(t)}"
        )
    return "\n".join(lines)


#: The consumer cases' clients (name prefixes) and stores (bench.drain).
CONSUMER_CLIENTS = {"e2e": "classic push", "e2e_grpc": "5.x push", "e2e_simple": "5.x simple"}
CONSUMER_STORES = ("redis", "mysql")


def added_cpu(results: list[CaseResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Per regime and client: the consumer's own CPU per message (``nodedup``, µs), and per
    store the CPU dedup adds to it (the median of the per-rep differences, µs) and that as a
    ratio to the client's own (``<store>_ratio``); baselines too, as ``baseline_<store>``."""
    by_name = {r.name: r for r in results}
    table: dict[str, dict[str, dict[str, float]]] = {}
    for regime in ("drain", "paced"):
        for client in CONSUMER_CLIENTS:
            own = by_name.get(f"{client}_nodedup_{regime}")
            if own is None:
                continue
            row = {"nodedup": statistics.median(own.cpu_us)}
            for store in CONSUMER_STORES:
                for prefix in ("", "baseline_"):
                    case = by_name.get(f"{prefix}{client}_{store}_{regime}")
                    if case is None:
                        continue
                    extra = [a - b for a, b in zip(case.cpu_us, own.cpu_us, strict=False)]
                    row[prefix + store] = statistics.median(extra)
                    row[f"{prefix}{store}_ratio"] = statistics.median(extra) / row["nodedup"]
            table.setdefault(regime, {})[client] = row
    return table


def format_added_cpu(results: list[CaseResult]) -> str:
    """The table of :func:`added_cpu` (empty without consumer cases)."""
    lines = []
    for regime, clients in added_cpu(results).items():
        lines.append(
            f"consumer CPU per message, {regime}: the client's own, and what dedup adds "
            "(median of per-rep differences; x: ratio to the client's own)"
        )
        for client, row in clients.items():
            cells = [f"{CONSUMER_CLIENTS[client]:<13} own {row['nodedup']:7.1f} us"]
            for store in CONSUMER_STORES:
                for prefix in ("", "baseline_"):
                    if prefix + store in row:
                        cells.append(
                            f"{prefix}{store} +{row[prefix + store]:6.1f} us "
                            f"(x{row[prefix + store + '_ratio']:.2f})"
                        )
            lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def to_json(
    results: list[CaseResult], env: dict[str, Any], evaluated: list[TargetResult]
) -> dict[str, Any]:
    return {
        "cases": {
            r.name: {"msgs_per_s": r.median, "reps": r.reps, "n": r.n, **r.costs()} for r in results
        },
        "ratios": ratios(results),
        "added_cpu_us_per_msg": added_cpu(results),
        "targets": [
            {
                "name": t.target.name,
                "value": t.value,
                "per_rep": t.rep_values,
                "of_medians": t.of_medians,
                "threshold": t.target.threshold,
                "at_most": t.target.at_most,
                "pass": t.passed,
                "verdict": verdict(t),
            }
            for t in evaluated
        ],
        "env": env,
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def environment(server_versions: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """Software and machine facts (no host name), plus the run's options."""
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": {name: _version(name) for name in PACKAGES},
        "servers": server_versions,
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "git_commit": git_commit(Path(__file__).resolve().parent.parent),
        **options,
    }


PACKAGES = (
    "rocketmq-dedup",
    "redis",
    "hiredis",
    "mysqlclient",
    "psycopg",
    "psycopg-binary",
    "aws-lambda-powertools",
    "rocketmq-client-python",
    "pyinstrument",
    "matplotlib",
)


def _version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> Optional[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit(root: Path) -> Optional[str]:
    """The commit checked out at ``root`` (12 hex digits, ``-dirty`` when it has changes);
    None when git cannot tell."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None
