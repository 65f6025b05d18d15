"""``python -m bench.drain_profile CASE TOOL``: one drain (or paced) case with a profiler
attached to its consumer process for one repetition (after an untimed one), to see where the
consumer's CPU goes: ``perf`` (``perf record``, software clock, call graphs with the kernel's
side), ``strace`` (system calls counted per thread, ``strace -c``), ``pyspy`` (py-spy's raw
stacks, ``--gil``: only the thread holding the GIL, ``--native``: C frames too). The output
file is ``OUT`` (default ``CASE.TOOL`` in the current directory); the case's own figures (CPU
and switches per message, measured with the profiler attached) are printed as JSON.

A profiler slows what it watches: compare its shares between cases, never its times with the
bench's. See BENCHMARKS.md, issue 33.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Optional, Sequence

from bench.cases import Context
from bench.drain import CONSUMER_CASES, ConsumerCase
from bench.settings import Servers


def profiler_command(tool: str, out: Path, options: Sequence[str]) -> list[str]:
    if tool == "perf":
        head = ["perf", "record", "-e", "cpu-clock", "-F", "4000", "-g", "-p", "{pid}"]
        return [*head, *options, "-o", str(out)]
    if tool == "strace":
        return ["strace", "-c", "-f", "-p", "{tids}", *options, "-o", str(out)]
    if tool == "pyspy":
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        head = [py_spy, "record", "--pid", "{pid}", "--rate", "2000", "--format", "raw"]
        return [*head, *options, "-o", str(out)]
    raise SystemExit(f"unknown tool {tool!r} (perf, strace, pyspy)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_profile", description=__doc__)
    names = [c.name for c in CONSUMER_CASES]
    parser.add_argument("case", choices=names)
    parser.add_argument("tool", choices=("perf", "strace", "pyspy"))
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
        print(json.dumps(figures))
    finally:
        case.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
