"""``python -m bench.threads``: memory with native threads that come and go (issue 21).

A host whose native threads are short-lived (one per request, a pool that is rebuilt) calls
the listener once from each. Each measurement runs ``tests.native.churn`` in a fresh process:
``--threads`` pthreads (50 at a time), each handling one message on the memory store, and the
growth of the process's resident memory. Runs 4,000 and 40,000 threads, with ended threads'
states freed (CPython 3.11 on Linux) and with the cap alone (``--no-reap``: what Python >= 3.12
gets). Prints one JSON line per run, then a summary line with the targets:

* ``growth_4000_mib <= 8``;
* ``growth_40000_mib <= growth_4000_mib + 1``: 40,000 threads cost no more than 4,000 (1 MiB
  allows for the allocator's noise: the runs differ by a few hundred KiB either way).

Exits 1 if a target is missed. See BENCHMARKS.md, "Native threads that come and go".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
COUNTS = (4_000, 40_000)
LIMIT_4000_MIB = 8.0
NOISE_MIB = 1.0


def churn(threads: int, reap: bool) -> Dict[str, Any]:
    """One ``tests.native.churn`` run in a fresh process."""
    command = [sys.executable, "-m", "tests.native.churn", "--threads", str(threads)]
    if not reap:
        command.append("--no-reap")
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    result: Dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def verdict(runs: List[Dict[str, Any]], reap: bool) -> Dict[str, Any]:
    """The targets for the runs of one mode (the median growth of each thread count)."""
    growth = {}
    for count in COUNTS:
        values = sorted(r["rss_growth_mib"] for r in runs if r["threads"] == count)
        growth[count] = values[len(values) // 2]
    return {
        "summary": "reap" if reap else "cap",
        "growth_4000_mib": growth[4_000],
        "growth_40000_mib": growth[40_000],
        "met_4000": growth[4_000] <= LIMIT_4000_MIB,
        "met_40000": growth[40_000] <= growth[4_000] + NOISE_MIB,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    ok = True
    for reap in (True, False):
        runs = []
        for _ in range(args.reps):
            for count in COUNTS:
                runs.append(churn(count, reap))
                print(json.dumps(runs[-1]), flush=True)
        summary = verdict(runs, reap)
        print(json.dumps(summary), flush=True)
        ok = ok and summary["met_4000"] and summary["met_40000"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
