"""The soak's pure parts: the seeded plan (bench.soak.plan) and the verdict on its evidence
(bench.soak.evidence), on synthetic records."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.soak.evidence import Effect, Event, Kill, judge, parse_events, summary
from bench.soak.plan import FAIL_FIRST_SHARE, fails_first, faults, handler_ms, sends
from bench.soak.run import QUIET_S, SIZES


def test_the_plan_is_seeded_and_duplicates_30_percent_of_the_keys() -> None:
    """Same seed, same plan; 30 % of the keys get a second copy, a third of them within 10 ms
    of the first, the rest 2-6 s later; copies come in time order."""
    plan = sends("r", 10_000, 60.0, seed=7)
    assert plan == sends("r", 10_000, 60.0, seed=7)
    assert plan != sends("r", 10_000, 60.0, seed=8)
    copies = Counter(s.key for s in plan)
    assert len(copies) == 10_000 and set(copies.values()) == {1, 2}
    doubled = [k for k, n in copies.items() if n == 2]
    assert 0.28 < len(doubled) / 10_000 < 0.32
    first = {s.key: s.at_s for s in plan if s.copy == 0}
    gaps = [s.at_s - first[s.key] for s in plan if s.copy == 1]
    concurrent = [g for g in gaps if g <= 0.010]
    assert 0.30 < len(concurrent) / len(gaps) < 0.37
    assert all(2.0 <= g <= 6.0 for g in gaps if g > 0.010)
    assert [s.at_s for s in plan] == sorted(s.at_s for s in plan)


def test_handlers_take_1_to_20_ms_and_5_percent_fail_first() -> None:
    """Handler times and first-attempt failures depend on the key only."""
    keys = [f"k{i}" for i in range(20_000)]
    assert {handler_ms(k) for k in keys} == set(range(1, 21))
    failing = sum(fails_first(k) for k in keys) / len(keys)
    assert abs(failing - FAIL_FIRST_SHARE) < 0.01
    assert handler_ms("k1") == handler_ms("k1") and fails_first("k1") == fails_first("k1")


def test_faults_cover_every_kind_while_messages_flow() -> None:
    """At least three SIGKILLs, one of each server fault, between 10 % and 90 % of the sends."""
    schedule = faults(100.0, seed=3)
    kinds = Counter(f.kind for f in schedule)
    assert kinds == {"sigkill": 3, "redis_kill": 1, "mysql_kill": 1, "broker_restart": 1}
    assert all(10.0 <= f.at_s <= 90.0 for f in schedule)
    assert schedule[-1].kind == "broker_restart"  # nothing flows while the broker restarts
    assert [f.at_s for f in schedule] == sorted(f.at_s for f in schedule)


def test_parse_events_skips_a_torn_line() -> None:
    """A line cut by a SIGKILL is skipped, the others are read."""
    events = parse_events(["1.5 10 k1 decision consumed:mark_ok", "2.0 10 k2 deci", ""])
    assert events == [Event(1.5, 10, "k1", "decision", "consumed:mark_ok")]


def effects(*rows: tuple[str, int, float]) -> list[Effect]:
    return [Effect(*row) for row in rows]


def test_lost_and_applied_keys() -> None:
    """A key with no effect row is lost; applied keys are counted once."""
    verdict = judge(["a", "b", "c"], effects(("a", 1, 1.0), ("b", 1, 2.0)), [], [], "redis_kill")
    assert verdict.lost == ["c"] and verdict.applied_keys == 2 and verdict.doubles == {}


def test_a_double_apply_after_a_kill_before_the_mark_is_explained() -> None:
    """The first applier was SIGKILLed after its effect and never reported a decision."""
    verdict = judge(
        ["a"],
        effects(("a", 10, 5.0), ("a", 11, 20.0)),
        [Event(20.1, 11, "a", "decision", "consumed:mark_ok")],
        [Kill("sigkill", 5.01, 10)],
        "redis_kill",
    )
    assert verdict.doubles == {"a": "killed_before_mark"}
    assert summary(verdict) == (1, 1)


def test_a_double_apply_after_the_record_was_lost_with_redis_is_explained() -> None:
    """CONSUMED was confirmed, Redis was killed within the AOF window, and the key ran again
    after the restart."""
    verdict = judge(
        ["a"],
        effects(("a", 10, 5.0), ("a", 11, 9.0)),
        [
            Event(5.1, 10, "a", "decision", "consumed:mark_ok"),
            Event(9.1, 11, "a", "decision", "consumed:mark_ok"),
        ],
        [Kill("redis_kill", 5.8)],
        "redis_kill",
    )
    assert verdict.doubles == {"a": "record_lost_with_store"}


def test_outage_mark_failure_and_ambiguous_commit_are_explained() -> None:
    """Ran without dedup in an outage; acked after a failed mark; an effect whose commit
    raised although the row exists."""
    verdict = judge(
        ["a", "b", "c"],
        effects(("a", 1, 1.0), ("a", 2, 3.0), ("b", 1, 1.0), ("b", 2, 30.0)),
        [
            Event(1.1, 1, "a", "decision", "store_error_consumed"),
            Event(1.1, 1, "b", "decision", "consumed:mark_failed"),
        ],
        [],
        "redis_kill",
    )
    assert verdict.doubles == {"a": "ran_without_dedup", "b": "mark_failed"}
    ambiguous = judge(
        ["c"],
        effects(("c", 1, 1.0), ("c", 2, 3.0)),
        [Event(1.2, 1, "c", "effect_error", "OperationalError")],
        [Kill("mysql_kill", 1.1)],
        "mysql_kill",
    )
    assert ambiguous.doubles == {"c": "ambiguous_effect_commit"}


def test_a_double_apply_without_evidence_is_unexplained() -> None:
    """Two applications, both confirmed, no fault near them: a defect, reported as such."""
    verdict = judge(
        ["a"],
        effects(("a", 10, 5.0), ("a", 11, 9.0)),
        [
            Event(5.1, 10, "a", "decision", "consumed:mark_ok"),
            Event(9.1, 11, "a", "decision", "consumed:mark_ok"),
        ],
        [Kill("redis_kill", 30.0), Kill("sigkill", 5.05, 12)],
        "redis_kill",
    )
    assert verdict.unexplained == ["a"]
    assert summary(verdict) == (1, 0)


def test_lost_keys_are_classified() -> None:
    """Acked without an effect: the dedup layer's loss; answered RECONSUME_LATER (a handler
    run without dedup that failed included) and not redelivered, or never delivered: the
    transport's, near a broker restart or not."""
    events = [
        Event(10.0, 1, "nacked", "decision", "failed"),
        Event(10.0, 1, "acked", "decision", "duplicate_consumed"),
        Event(10.0, 1, "later", "decision", "duplicate_in_progress"),
        Event(10.0, 1, "outage", "decision", "store_error_consumed"),
        Event(10.0, 1, "marked", "decision", "consumed:mark_failed"),
    ]
    keys = ["nacked", "acked", "later", "outage", "marked", "silent"]
    verdict = judge(keys, [], events, [Kill("broker_restart", 14.0)], "redis_kill")
    assert verdict.lost_causes == {
        "nacked": "not_redelivered_after_broker_restart",
        "acked": "acked_without_effect",
        "later": "not_redelivered_after_broker_restart",
        "outage": "not_redelivered_after_broker_restart",
        "marked": "acked_without_effect",
        "silent": "never_delivered",
    }
    far = judge(["nacked"], [], events[:1], [Kill("broker_restart", 40.0)], "redis_kill")
    assert far.lost_causes == {"nacked": "not_redelivered"}


def test_sendback_failures_are_counted_from_the_client_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only error lines of sendMessageBack, only in the given consumers' logs."""
    from bench.soak import run

    logs = tmp_path / "logs" / "rocketmq-cpp"
    logs.mkdir(parents=True)
    error = "[2026-Nov-24 02:39:11](error):msg: response is null[sendMessageBack:252]\n"
    (logs / "7_rocketmq-cpp.log.0").write_text(error * 2 + "(info):sendMessageBack ok\n")
    (logs / "7_rocketmq-cpp.log.1").write_text(error)
    (logs / "8_rocketmq-cpp.log.0").write_text(error)
    monkeypatch.setattr(run, "HOME", tmp_path)
    assert run.sendback_failures([7]) == 3
    assert run.sendback_failures([7, 8, 9]) == 4


def test_the_quick_drain_also_ends_when_nothing_moves_and_the_full_one_waits() -> None:
    """Every key applied: both end QUIET_S after the last decision; keys missing: only the
    quick size ends, once nothing was decided for its idle time since the drain began, and
    the full one waits for its deadline."""
    quick, full = SIZES["quick"], SIZES["full"]
    for size in (quick, full):
        assert size.drained(True, QUIET_S, 0.0) and not size.drained(True, QUIET_S - 1, 99.0)
    idle = quick.idle_s
    assert idle is not None and idle < quick.drain_s
    assert quick.drained(False, idle, idle) and not quick.drained(False, idle - 1, 99.0)
    assert not quick.drained(False, 99.0, idle - 1)  # the silence before the drain
    assert not full.drained(False, full.drain_s, full.drain_s)
