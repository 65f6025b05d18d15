"""``python -m bench.handoff``: what a thread hand-off costs here, unpinned and on one CPU.

Two threads pass control back and forth through a pair of locks (the way a coalesced request's
caller is woken, or a client's callback thread is handed a message). Run unpinned first, then
with the process pinned to one CPU; prints one JSON line per mode with microseconds per round
(two hand-offs) and the CPU time it used. See BENCHMARKS.md, "Where things run".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from typing import Optional, Sequence


def ping_pong(rounds: int) -> dict[str, float]:
    """Time ``rounds`` lock ping-pongs between this thread and a new one."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def partner() -> None:
        for _ in range(rounds):
            ping.acquire()
            pong.release()

    thread = threading.Thread(target=partner)
    thread.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for _ in range(rounds):
        ping.release()
        pong.acquire()
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    thread.join()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"us_per_round": elapsed / rounds * 1e6, "cpu_us_per_round": cpu / rounds * 1e6}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20_000, help="ping-pongs per mode")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU of the pinned mode")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    print(json.dumps({"mode": "unpinned", "cpus": cpus, **ping_pong(args.rounds)}))
    os.sched_setaffinity(0, {args.cpu})  # threads started from now on inherit it
    print(json.dumps({"mode": "pinned", "cpus": [args.cpu], **ping_pong(args.rounds)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
