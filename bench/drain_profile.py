"""``python -m bench.drain_profile CASE TOOL``: one drain (or paced) case with a profiler
attached to its consumer process for one repetition (after an untimed one), to see where the
consumer's CPU goes: ``perf`` (``perf record``, software clock, call graphs with the kernel's
side), ``strace`` (system calls counted per thread, ``strace -c``), ``pyspy`` (py-spy's raw
stacks, ``--gil``: only the thread holding the GIL, ``--native``: C frames too), ``sched``
(``perf record`` of every context switch with its kernel stack: the printed figures then say,
per message and per thread name, why the consumer's threads stopped running, e.g. a coalesced
request's caller waiting on its eventfd, a futex, a socket receive, or preempted). The output
file is ``OUT`` (default ``CASE.TOOL`` in the current directory); the case's own figures (CPU
and switches per message, measured with the profiler attached) are printed as JSON.

A profiler slows what it watches: compare its shares between cases, never its times with the
bench's. See BENCHMARKS.md, issue 33.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from bench.cases import Context
from bench.drain import CONSUMER_CASES, ConsumerCase
from bench.settings import Servers


def profiler_command(tool: str, out: Path, options: Sequence[str]) -> list[str]:
    if tool == "perf":
        head = ["perf", "record", "-e", "cpu-clock", "-F", "4000", "-g", "-p", "{pid}"]
        return [*head, *options, "-o", str(out)]
    if tool == "strace":
        return ["strace", "-c", "-f", "-p", "{tids}", *options, "-o", str(out)]
    if tool == "sched":
        head = ["perf", "record", "-e", "sched:sched_switch", "-g", "-p", "{pid}"]
        return [*head, *options, "-o", str(out)]
    if tool == "pyspy":
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        head = [py_spy, "record", "--pid", "{pid}", "--rate", "2000", "--format", "raw"]
        return [*head, *options, "-o", str(out)]
    raise SystemExit(f"unknown tool {tool!r} (perf, strace, pyspy, sched)")


#: Why a thread stopped running, by a kernel function on its stack at the switch (the first
#: rule that matches; user-space frames below libc are often not unwound, so the kernel's
#: side is what tells the reasons apart).
SWITCH_REASONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("eventfd wait", ("eventfd_read",)),
    ("futex", ("futex_wait",)),
    ("socket receive", ("tcp_recvmsg", "sock_recvmsg", "unix_stream_recvmsg")),
    ("poll", ("do_sys_poll",)),
    ("epoll_wait", ("do_epoll_wait",)),
    ("sleep", ("do_nanosleep",)),
    ("preempted", ("irqentry_exit", "exit_to_user_mode", "preempt_schedule")),
)


def switch_reason(kernel_functions: Sequence[str]) -> str:
    """The reason (:data:`SWITCH_REASONS`) of one switch, from its stack's kernel functions;
    ``other`` when none matches."""
    for reason, markers in SWITCH_REASONS:
        if any(f.startswith(markers) for f in kernel_functions):
            return reason
    return "other"


def switch_counts(script: Iterable[str]) -> Counter[Tuple[str, str]]:
    """Switches counted by (thread name, reason), from ``perf script -F
    comm,tid,event,ip,sym,dso`` output: a header line per event (``NAME TID EVENT:``), its stack
    one frame a line (tab-indented: address, function, ``(dso)``), a blank line after it."""
    counts: Counter[Tuple[str, str]] = Counter()
    thread: Optional[str] = None
    frames: List[str] = []

    def close() -> None:
        if thread is not None:
            counts[thread, switch_reason(frames)] += 1

    for line in script:
        if line.startswith(("\t", " ")) and line.strip():  # a frame of the current event
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "([kernel.kallsyms])":
                frames.append(parts[1])
            continue
        if not line.strip():
            continue
        close()
        head, _, event = line.rstrip().rpartition(" ")
        thread, frames = None, []
        if event.startswith("sched:sched_switch"):
            thread = head.rsplit(None, 1)[0].strip() if head.strip() else "?"
    close()
    return counts


def switches_per_message(out: Path, n: int) -> Dict[str, Dict[str, float]]:
    """``perf script`` of a ``sched`` recording, as switches per message by thread name and
    reason (the names librocketmq gives its threads: ``ConsumeTP`` runs the listener)."""
    script = subprocess.run(
        ["perf", "script", "-i", str(out), "-F", "comm,tid,event,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    table: Dict[str, Dict[str, float]] = {}
    for (thread, reason), count in sorted(switch_counts(script.splitlines()).items()):
        table.setdefault(thread, {})[reason] = round(count / n, 3)
    return table


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_profile", description=__doc__)
    names = [c.name for c in CONSUMER_CASES]
    parser.add_argument("case", choices=names)
    parser.add_argument("tool", choices=("perf", "strace", "pyspy", "sched"))
    parser.add_argument(
        "--tool-options", default="", metavar="TEXT", help="more options for the tool (one string)"
    )
    parser.add_argument("--n", type=int, default=20_000, help="messages of the profiled run")
    parser.add_argument("--out", type=Path, help="the profiler's output file")
    parser.add_argument(
        "--checkout", type=Path, help="profile the listener of the checkout at PATH instead"
    )
    args = parser.parse_args(argv)
    case_type = next(c for c in CONSUMER_CASES if c.name == args.case)
    if args.checkout is not None:
        case_type = type(case_type.__name__, (case_type,), {"checkout": args.checkout})
    case = case_type(Context(Servers.from_env(), uuid.uuid4().hex[:8]), args.n)
    assert isinstance(case, ConsumerCase)
    out = args.out or Path(f"{args.case}.{args.tool}")
    case.setup()
    try:
        case.warm_up(2_000)
        case.prepare("profiled")
        case.profile = profiler_command(args.tool, out.resolve(), args.tool_options.split())
        seconds = case.measure()
        cpu_s, voluntary, involuntary = case.usage or (0.0, 0, 0)
        figures = {
            "case": case.name,
            "n": case.n,
            "msgs_per_s": case.n / seconds,
            "cpu_us_per_msg": cpu_s / case.n * 1e6,
            "voluntary_switches_per_msg": voluntary / case.n,
            "involuntary_switches_per_msg": involuntary / case.n,
            **case.details(),
            "out": str(out),
        }
        if args.tool == "sched":
            figures["switches_per_msg_by_thread"] = switches_per_message(out.resolve(), case.n)
        print(json.dumps(figures))
    finally:
        case.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
