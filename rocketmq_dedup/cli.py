"""Command line: ``python -m rocketmq_dedup schema mysql [--table NAME]``."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from rocketmq_dedup.errors import DedupConfigError
from rocketmq_dedup.stores.mysql import DEFAULT_TABLE_NAME, schema_sql


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m rocketmq_dedup")
    commands = parser.add_subparsers(dest="command", required=True)
    schema = commands.add_parser("schema", help="print the DDL of a record store")
    schema.add_argument("store", choices=["mysql"])
    schema.add_argument("--table", default=DEFAULT_TABLE_NAME, help="table name")
    args = parser.parse_args(argv)
    try:
        print(schema_sql(args.table) + ";")
    except DedupConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
