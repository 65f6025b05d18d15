"""Short-lived native threads, each calling a listener once (issue 21): how much the process's
resident memory grows.

A host whose native threads come and go (one per request, a pool that is rebuilt) calls the
listener from each of them: here ``threads`` pthreads of the C library in ``tests/native``,
started ``wave`` at a time and joined before the next wave, each handling one message on the
memory store. The messages repeat 16 keys (duplicates after the first), so the store itself
does not grow with the number of threads; what grows is what is kept per thread.

``python -m tests.native.churn --threads 4000 [--wave 50] [--no-reap]`` prints one JSON line:
``rss_growth_mib`` (resident set after the run minus before it, both after a GC, two waves of
warm-up first), ``kept_states`` (native threads' states kept at the end), ``successes``. Run it
in a fresh process: the RSS of a process that already ran other work says little. Used by
tests/unit/test_threads.py (4,000 threads) and bench/threads.py (40,000).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

KEYS = 16


def rss_bytes() -> int:
    """This process's resident set (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def measure(threads: int, wave: int = 50, reap: bool = True) -> Dict[str, Any]:
    """Run ``threads`` short-lived native threads (``wave`` at a time), each calling a
    listener once; return what the module docs say. ``reap=False`` turns off the freeing of
    ended threads' states, leaving the cap alone (what Python >= 3.12 gets)."""
    from rocketmq_dedup import ConsumeStatus, DedupConcurrentListener, DedupConfig, _threads
    from rocketmq_dedup.stores.memory import MemoryDedupStore
    from rocketmq_dedup.testing import ClassicMessage
    from tests.native import build_library, run_callbacks

    if not reap:
        _threads._registry.reap_at = _threads.MAX_KEPT + 1

    class Listener(DedupConcurrentListener):
        def do_handle_msg(self, msg: Any) -> bool:
            return True

    listener = Listener(DedupConfig.enable_dedup_consume_config("churn", MemoryDedupStore()))
    messages = [ClassicMessage(f"churn-{key}") for key in range(KEYS)]
    success = int(ConsumeStatus.CONSUME_SUCCESS)

    def callback(index: int) -> int:
        return int(listener(messages[index % KEYS]))

    with tempfile.TemporaryDirectory() as directory:
        library = build_library(Path(directory))
        for _ in range(2):  # warm-up: code paths, the store's records, the allocator
            run_callbacks(library, callback, wave, 1)
        gc.collect()
        before, start, successes, started = rss_bytes(), time.perf_counter(), 0, 0
        while started < threads:
            count = min(wave, threads - started)
            successes += run_callbacks(library, callback, count, 1)[0]
            started += count
        seconds = time.perf_counter() - start
        gc.collect()
        after = rss_bytes()
    assert success == 0  # run_callbacks counts the calls that returned 0
    return {
        "threads": threads,
        "wave": wave,
        # getattr: the measurement also runs on the code before issue 21 (no cap, no reaping)
        "reaps": bool(getattr(_threads, "REAPS", False)) and reap,
        "max_kept": getattr(_threads, "MAX_KEPT", None),
        "rss_growth_mib": round((after - before) / 2**20, 2),
        "kept_states": _threads.kept_states() if hasattr(_threads, "kept_states") else None,
        "successes": successes,
        "seconds": round(seconds, 2),
        "python": platform.python_version(),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.native.churn", description=__doc__)
    parser.add_argument("--threads", type=int, default=4_000)
    parser.add_argument("--wave", type=int, default=50, help="threads started at once")
    parser.add_argument("--no-reap", action="store_true", help="the cap alone")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.threads, args.wave, not args.no_reap)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
