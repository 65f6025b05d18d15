"""``python -m bench.callbacks``: the listener called as the classic client calls it.

librocketmq calls a consumer's listener through ctypes from its own pthreads, each call with a
fresh Python thread state. This drives the listener on the bench's Redis from 8 native pthreads
(``tests/native``: a tiny C library built with ``cc``), from 8 Python threads, and, as the floor,
a callback that does nothing from the same pthreads; the process is pinned to one CPU like the
e2e consumer. Prints one JSON line per mode and repetition: msgs/s, and per message the CPU
time (user and system) and context switches of this process. See BENCHMARKS.md, "Through the
broker".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bench.cases import BenchListener, listener_options
from bench.messages import make_messages
from bench.settings import LIBRARY_KEY_PREFIX, Servers
from rocketmq_dedup import ConsumeStatus, DedupConfig

MODES = ("native_nodedup", "native_redis", "python_redis")
THREADS = 8


def run_threads(mode: str, library: Any, callback: Callable[[int], int], per: int) -> None:
    """``THREADS`` threads (native pthreads or Python threads) call ``callback`` ``per`` times
    each, with indexes ``thread * per + call``."""
    from tests.native import run_callbacks

    if mode.startswith("native"):
        run_callbacks(library, callback, THREADS, per)
        return
    threads = [
        threading.Thread(target=lambda t=t: [callback(t * per + i) for i in range(per)])
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(mode: str, library: Any, client: Any, per: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    messages = make_messages(run, THREADS * per)
    if mode.endswith("nodedup"):

        def callback(index: int) -> int:
            return 0

    else:
        config = DedupConfig.enable_dedup_consume_config(
            f"bench-callbacks-{run}", client, key_prefix=LIBRARY_KEY_PREFIX, **listener_options()
        )
        listener = BenchListener(config, lambda msg: True)
        ok = ConsumeStatus.CONSUME_SUCCESS

        def callback(index: int) -> int:
            return 0 if listener(messages[index]) is ok else 1

    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run_threads(mode, library, callback, per)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = THREADS * per
    if not mode.endswith("nodedup"):
        for key in client.scan_iter(match=f"{LIBRARY_KEY_PREFIX}:bench-callbacks-{run}:*"):
            client.delete(key)
    return {
        "mode": mode,
        "msgs_per_s": round(n / seconds),
        "user_us_per_msg": round((after.ru_utime - before.ru_utime) / n * 1e6, 1),
        "sys_us_per_msg": round((after.ru_stime - before.ru_stime) / n * 1e6, 1),
        "switches_per_msg": round(
            (after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw) / n, 2
        ),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callbacks", description=__doc__)
    parser.add_argument("--per-thread", type=int, default=2_000, help="calls per thread")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to pin this process to")
    args = parser.parse_args(argv)
    from tests.native import build_library

    os.sched_setaffinity(0, {args.cpu})
    client = Servers.from_env().redis_client()
    with tempfile.TemporaryDirectory() as directory:
        library = build_library(Path(directory))
        for _ in range(args.reps):
            for mode in MODES:
                print(json.dumps(measure(mode, library, client, args.per_thread)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
