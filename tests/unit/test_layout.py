"""The test suite's own layout rules."""

from __future__ import annotations

import ast
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1] / "shared"
#: (``make_config``: the asyncio call cases make their store on their own event loop)
STORE_FIXTURES = {"store", "mysql_table", "redis_client", "redis_cluster_client", "make_config"}


def test_every_shared_test_takes_a_store() -> None:
    """A shared test runs in both layers, on each layer's stores; one that takes no store
    would run twice for nothing (it belongs in tests/unit)."""
    storeless = []
    for path in sorted(SHARED.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            is_test = isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            if is_test and not {a.arg for a in node.args.args} & STORE_FIXTURES:  # type: ignore[union-attr]
                storeless.append(f"{path.name}::{node.name}")  # type: ignore[union-attr]
    assert storeless == []
