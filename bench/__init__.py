"""Benchmark harness for rocketmq-dedup. Speed targets live here, never in timed unit tests.

Usage (from the repository root)::

    scripts/bench.sh --quick                  # ~40 s: in-process cases, 3 reps
    scripts/bench.sh --json bench-results/full.json --chart bench-results/full.png
    python -m bench --cases 'redis_*' --reps 7 --check     # exit 1 if a target fails
    python -m bench.chart RESULT.json OUT.png             # the chart from a saved result
    python -m bench.profile [--cases redis_fresh,redis_dup]  # where the time goes
    python -m bench.threads                               # memory, native threads coming and going

Every case measures messages per second; its result is the median of the repetitions. Each
repetition runs every case once, in a shuffled order, and each target ratio is the median of
the per-repetition ratios, so the two cases of a ratio are always measured side by side.
Every timed pass checks the handler's call count (all messages for ``*_fresh``, none for
``*_dup``) and every answer, so a case cannot silently measure the wrong thing.
"""
