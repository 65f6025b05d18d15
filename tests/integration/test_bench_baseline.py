"""The bench's exactly-once baseline cases (``--baseline``): another checkout's listener and
this one's, each in a child process, on the bench's MariaDB and PostgreSQL tables."""

from __future__ import annotations

import uuid
from pathlib import Path

from bench.baseline import baseline_cases
from bench.cases import Context
from bench.runner import run_cases
from bench.settings import Servers

REPO = Path(__file__).resolve().parents[2]


def test_the_exactly_once_baselines_run_each_checkouts_listener_in_a_child() -> None:
    """baseline_* and child_* of mysql_tx_dedup and pg_tx_dedup: every message handled (the
    runner checks the handler's calls), each answered CONSUME_SUCCESS, with the child's CPU per
    message."""
    ctx = Context(Servers.from_env(), uuid.uuid4().hex[:8])
    transactions = [c for c in baseline_cases(REPO) if "_tx_" in c.name]
    results = run_cases(
        [c(ctx, 200) for c in transactions], reps=1, rounds=2, seed=0, log=lambda line: None
    )
    assert sorted(r.name for r in results) == [
        "baseline_mysql_tx_dedup",
        "baseline_pg_tx_dedup",
        "child_mysql_tx_dedup",
        "child_pg_tx_dedup",
    ]
    for result in results:
        assert len(result.reps) == 1 and result.reps[0] > 0
        assert 0 < result.cpu_us[0] < 100_000
