"""Where the time goes on the Redis hot path: ``python -m bench.profile [--cases ...]``.

Profiles the timed pass of ``redis_fresh`` and ``redis_dup`` (by default) with pyinstrument
and prints, per case: the share of time by layer (library, redis-py, socket wait, ...), the
functions with the most self time, and pyinstrument's call tree.
"""

from __future__ import annotations

import argparse
import uuid
from collections import defaultdict
from typing import Any, Iterator, Optional, Sequence

from bench.cases import IN_PROCESS_CASES, Case, Context
from bench.settings import Servers

DEFAULT_CASES = ("redis_fresh", "redis_dup")
INTERVAL_S = 0.0001

LAYERS = (  # the first marker found in a frame's file path names its layer
    ("/rocketmq_dedup/", "rocketmq_dedup"),
    ("/bench/", "bench harness"),
    ("/redis/", "redis-py"),
    ("/aws_lambda_powertools/", "powertools"),
    ("/MySQLdb/", "mysqlclient"),
    ("/logging/", "logging"),
)
IO_FUNCTIONS = ("socket.", "select.", "Connection.query", "Connection.store_result")


def layer(function: str, path: str) -> str:
    if function.startswith(IO_FUNCTIONS):
        return "socket/driver I/O (includes waiting for the server)"
    return next((name for marker, name in LAYERS if marker in path), "other (stdlib)")


def self_times(frame: Any, owner: Optional[Any] = None) -> Iterator[tuple[Any, float]]:
    """(frame, own time) pairs; a synthetic ``[self]`` leaf counts for its parent."""
    own = frame.time - sum(child.time for child in frame.children)
    target = owner if frame.is_synthetic and owner is not None else frame
    if own > 0:
        yield target, own
    for child in frame.children:
        yield from self_times(child, frame)


def summarise(root: Any, top: int) -> str:
    total = root.time or 1e-12
    by_function: dict[str, float] = defaultdict(float)
    by_layer: dict[str, float] = defaultdict(float)
    for frame, own in self_times(root):
        function, path = frame.function or "?", frame.file_path or ""
        by_function[f"{function}  ({frame.file_path_short}:{frame.line_no})"] += own
        by_layer[layer(function, path)] += own
    lines = ["  time by layer (self time):"]
    for name, secs in sorted(by_layer.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {100 * secs / total:5.1f}%  {name}")
    lines.append(f"  top {top} functions by self time:")
    for where, secs in sorted(by_function.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {100 * secs / total:5.1f}%  {where}")
    return "\n".join(lines)


def profile_case(case: Case, top: int, tree: bool) -> str:
    from pyinstrument import Profiler

    case.setup()
    try:
        case.warm_up(300)
        case.prepare("profile")
        profiler = Profiler(interval=INTERVAL_S)
        profiler.start()
        elapsed = case.measure()
        profiler.stop()
        case.cleanup()
    finally:
        case.close()
    head = f"== {case.name}: {case.n} messages, {case.n / elapsed:,.0f} msg/s under the profiler"
    session = profiler.last_session
    assert session is not None
    parts = [head, summarise(session.root_frame(), top)]
    if tree:
        parts.append(profiler.output_text(unicode=True, color=False, show_all=False))
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated")
    parser.add_argument("--n", type=int, help="messages per case (default: the quick N)")
    parser.add_argument("--top", type=int, default=15, help="functions to list")
    parser.add_argument("--no-tree", action="store_true", help="skip pyinstrument's call tree")
    args = parser.parse_args(argv)
    classes = {c.name: c for c in IN_PROCESS_CASES}
    ctx = Context(Servers.from_env(), uuid.uuid4().hex[:8])
    for name in (n.strip() for n in args.cases.split(",") if n.strip()):
        if name not in classes:
            parser.error(f"unknown case {name!r} (cases: {', '.join(classes)})")
        cls = classes[name]
        print(profile_case(cls(ctx, args.n or cls.quick_n), args.top, not args.no_tree))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
