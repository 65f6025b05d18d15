"""``python -m rocketmq_dedup`` and the ``rocketmq-dedup`` console script."""

from __future__ import annotations

import sys

from rocketmq_dedup.errors import MissingExtraError


def run() -> int:
    """Run the command line; without the ``[cli]`` extra, say how to get it (exit status 2)."""
    try:
        from rocketmq_dedup.cli import main
    except MissingExtraError as exc:
        print(f"rocketmq-dedup: the command line needs click: {exc}", file=sys.stderr)
        return 2
    return main()


if __name__ == "__main__":
    sys.exit(run())
