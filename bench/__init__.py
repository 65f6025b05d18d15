"""Benchmark harness for rocketmq-dedup: ``python -m bench --help``.

Speed targets live here, never in timed unit tests. Every case measures messages per second
as the median of several repetitions; the cases of one repetition run back to back in a
rotated order, so the ratios compare numbers taken side by side.
"""
