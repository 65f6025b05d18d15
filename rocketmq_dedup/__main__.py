"""``python -m rocketmq_dedup`` and the ``rocketmq-dedup`` console script.

``--version`` (``-V``) answers without the ``[cli]`` extra; every command needs it (click).
"""

from __future__ import annotations

import sys
from typing import List, Optional

from rocketmq_dedup.errors import MissingExtraError

#: What ``--version`` prints (click's ``version_option`` format, with or without click).
VERSION_LINE = "rocketmq-dedup, version {version}"


def run(argv: Optional[List[str]] = None) -> int:
    """Run the command line; without the ``[cli]`` extra, answer ``--version`` and say how to
    get the rest (exit status 2)."""
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        from rocketmq_dedup import __version__

        print(VERSION_LINE.format(version=__version__))
        return 0
    try:
        from rocketmq_dedup.cli import main
    except MissingExtraError as exc:
        print(f"rocketmq-dedup: the command line needs click: {exc}", file=sys.stderr)
        return 2
    return main(args)


if __name__ == "__main__":
    sys.exit(run())
