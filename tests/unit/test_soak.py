"""The soak's pure parts: the seeded plan (bench.soak.plan), the verdict on its evidence
(bench.soak.evidence), the accounting (bench.soak.accounting: lost against outstanding and
delayed, consumer kinds, nacks, the control), the drain's end and the options passed to
DedupConfig (bench.soak.run), on synthetic records."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import List, Sequence

import pytest

from bench.soak import accounting
from bench.soak import outbox as soak_outbox
from bench.soak.evidence import (
    LOST_BY_BROKER,
    Effect,
    Event,
    Kill,
    fields,
    judge,
    parse_events,
    summary,
)
from bench.soak.plan import (
    FAIL_FIRST_SHARE,
    fails_first,
    faults,
    handler_ms,
    key_name,
    kind_of,
    outbox_faults,
    sends,
)
from bench.soak.report import table
from bench.soak.run import QUIET_S, SIZES, check_options, mode_options, parse_options


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


def test_a_postgres_mode_adds_its_kill_and_leaves_every_other_run_as_it_was() -> None:
    """With the PostgreSQL store's kill the schedule has one fault more, still in the window,
    the broker restart last; without it (every run without a PostgreSQL mode) the schedule is
    the one it always was, fault for fault."""
    with_pg = faults(100.0, seed=3, stores=("redis_kill", "mysql_kill", "postgres_kill"))
    kinds = Counter(f.kind for f in with_pg)
    assert kinds == {
        "sigkill": 3, "redis_kill": 1, "mysql_kill": 1, "postgres_kill": 1, "broker_restart": 1
    }  # fmt: skip
    assert all(10.0 <= f.at_s <= 90.0 for f in with_pg) and with_pg[-1].kind == "broker_restart"
    assert faults(100.0, seed=3) == faults(100.0, seed=3, stores=("redis_kill", "mysql_kill"))


def test_soak_modes_default_to_those_of_the_projects_servers() -> None:
    """The default modes (and so the quick run's) leave exactly-once-postgres out (it is run
    by name (--modes), and starts a PostgreSQL of its own), and the outbox's."""
    from bench.soak.run import DEFAULT_MODES, MODES, OUTBOX, POSTGRES_MODES, STORE_KILL

    assert set(DEFAULT_MODES) < set(MODES)
    assert set(POSTGRES_MODES) == {"exactly-once-postgres"}
    assert set(MODES) - set(DEFAULT_MODES) == {*POSTGRES_MODES, OUTBOX}
    assert STORE_KILL["exactly-once-postgres"] == "postgres_kill"


def test_parse_events_reads_both_line_shapes_and_skips_a_torn_line() -> None:
    """Lines with a thread id and without (older files) are read; a line cut by a SIGKILL is
    skipped; a detail's fields are read by name."""
    events = parse_events(
        [
            "1.5 10 7 k1 claim claimed,owner=o.10.1@1,took=0.0010",
            "1.6 10 k1 decision consumed:mark_ok",
            "2.0 10 k2 deci",
            "",
        ]
    )
    assert events == [
        Event(1.5, 10, "k1", "claim", "claimed,owner=o.10.1@1,took=0.0010", 7),
        Event(1.6, 10, "k1", "decision", "consumed:mark_ok"),
    ]
    assert fields(events[0].detail) == {"": "claimed", "owner": "o.10.1@1", "took": "0.0010"}


class Consumer:
    """The evidence lines one consumer process writes (bench.soak.consumer), built by hand:
    a callback thread's claim, effect, mark and decision, the LeaseKeeper's renewals (thread
    99), the watchdog's stalls."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.events: List[Event] = []
        self.effects: List[Effect] = []
        self.tokens = 0

    def line(self, at: float, key: str, kind: str, detail: str = "-", tid: int = 1) -> None:
        self.events.append(Event(at, self.pid, key, kind, detail, tid))

    def claim(self, key: str, at: float, outcome: str = "claimed", tid: int = 1) -> str:
        self.tokens += 1
        owner = f"r.{self.pid}.{self.tokens}@1"
        self.line(at, key, "claim", f"{outcome},owner={owner},took=0.0010", tid)
        return owner

    def effect(self, key: str, at: float, error: bool = False, tid: int = 1) -> None:
        self.line(at, key, "effect_begin", tid=tid)
        if error:
            self.line(at + 0.01, key, "effect_error", "OperationalError", tid)
        else:
            self.line(at + 0.01, key, "effect", "took=0.0100", tid)
        self.effects.append(Effect(key, self.pid, at))

    def mark(
        self, key: str, owner: str, at: float, ok: bool = True, tid: int = 1, deferred: bool = False
    ) -> None:
        outcome = "deferred" if deferred else "ok" if ok else "error,error=StoreUnavailableError"
        self.line(at, key, "mark", f"{outcome},owner={owner},took=0.0010", tid)
        self.line(at, key, "decision", "consumed:mark_ok" if ok else "consumed:mark_failed", tid)

    def renew(self, key: str, owner: str, at: float, outcome: str = "ok", took: float = 0.002):
        self.line(at, key, "renew", f"{outcome},owner={owner},took={took:.4f}", tid=99)

    def stall(self, at: float, gap: float) -> None:
        self.line(at, "-", "stall", f"gap={gap:.3f},cpu=0.010,load=9.0", tid=98)

    def applies(self, key: str, at: float, mark_after: float = 0.05, tid: int = 1) -> str:
        """Claims, applies and marks ``key`` from ``at``: the ordinary path."""
        owner = self.claim(key, at, tid=tid)
        self.effect(key, at + 0.02, tid=tid)
        self.mark(key, owner, at + 0.02 + mark_after, tid=tid)
        return owner

    def without_dedup(self, key: str, at: float, tid: int = 1) -> None:
        """The claim raised (store down) and the handler ran anyway (the default policy)."""
        self.line(at, key, "claim", "error,error=StoreUnavailableError,owner=x,took=2.5", tid)
        self.effect(key, at + 0.02, tid=tid)
        self.line(at + 0.04, key, "decision", "store_error_consumed", tid)


def verdict_of(*consumers: Consumer, kills: Sequence[Kill] = (), store_kill: str = "redis_kill"):
    """The verdict on every key of these consumers' evidence."""
    events = sorted((e for c in consumers for e in c.events), key=lambda e: e.at)
    effects = [e for c in consumers for e in c.effects]
    keys = sorted({e.key for e in effects})
    return judge(keys, effects, events, list(kills), store_kill)


def effects(*rows: tuple[str, int, float]) -> list[Effect]:
    return [Effect(*row) for row in rows]


def test_lost_and_applied_keys() -> None:
    """A key with no effect row is lost; applied keys are counted once."""
    verdict = judge(["a", "b", "c"], effects(("a", 1, 1.0), ("b", 1, 2.0)), [], [], "redis_kill")
    assert verdict.lost == ["c"] and verdict.applied_keys == 2 and verdict.doubles == {}


def test_an_applier_killed_after_its_effect_explains_the_claim_after_its_lease() -> None:
    """The first applier was SIGKILLed after its effect, before its mark: a claim after its
    lease lapsed is explained; one while its claim was still live is not."""
    a, b = Consumer(10), Consumer(11)
    a.claim("k", 5.0)
    a.effect("k", 5.02)
    b.applies("k", 15.2)
    assert verdict_of(a, b, kills=[Kill("sigkill", 5.1, 10)]).doubles == {"k": "killed_before_mark"}
    early = Consumer(11)
    early.applies("k", 12.0)
    verdict = verdict_of(a, early, kills=[Kill("sigkill", 5.1, 10)])
    assert verdict.unexplained == ["k"] and summary(verdict) == (1, 0)
    assert "claim was live" in str(verdict.appliers["k"][1]["note"])


def test_an_applier_killed_while_its_mark_was_deferred_explains_the_claim_after_its_lease() -> None:
    """The first applier's CONSUMED mark was deferred (``mark deferred``: the listener acked
    first) and its process was SIGKILLed a moment later: the mark never landed, and a claim
    after the lease is ``killed_before_mark`` (the soak of this stop called it unexplained:
    "claimed 14.204s after pid 25826's CONSUMED mark"); one while the claim was live is not
    explained."""
    a = Consumer(10)
    owner = a.claim("k", 5.0)
    a.effect("k", 5.02)
    a.mark("k", owner, 5.04, deferred=True)
    kills = [Kill("sigkill", 5.045, 10)]
    later = Consumer(11)
    later.applies("k", 19.3)
    assert verdict_of(a, later, kills=kills).doubles == {"k": "killed_before_mark"}
    early = Consumer(11)
    early.applies("k", 12.0)
    assert verdict_of(a, early, kills=kills).unexplained == ["k"]


def test_a_deferred_mark_of_a_process_that_lived_on_explains_nothing() -> None:
    """A deferred mark whose process was neither killed nor stalled lands within
    milliseconds: a claim after the lease is unexplained (a defect: the mark never rode a
    round trip), never ``mark_failed``."""
    a = Consumer(10)
    owner = a.claim("k", 5.0)
    a.effect("k", 5.02)
    a.mark("k", owner, 5.04, deferred=True)
    later = Consumer(11)
    later.applies("k", 19.3)
    assert verdict_of(a, later).unexplained == ["k"]


def test_a_record_lost_with_redis_is_explained_and_one_kept_by_mariadb_is_not() -> None:
    """CONSUMED was confirmed, Redis was killed within the AOF window, and the key was
    claimed again after the restart; a MariaDB kill loses no committed row."""
    a, b = Consumer(10), Consumer(11)
    a.applies("k", 5.0)
    b.applies("k", 9.0)
    assert verdict_of(a, b, kills=[Kill("redis_kill", 5.8)]).doubles == {
        "k": "record_lost_with_store"
    }
    mysql = verdict_of(a, b, kills=[Kill("mysql_kill", 5.8)], store_kill="mysql_kill")
    assert mysql.unexplained == ["k"]


def test_a_mark_failed_in_a_redis_kill_is_told_from_the_claim_lost_with_it() -> None:
    """The claim was confirmed, then Redis was killed and the mark failed: a later claim after
    the claim's lease is ``mark_failed``; one before it, after the restart, is only possible
    because the claim was lost with Redis."""
    a = Consumer(10)
    owner = a.claim("k", 5.0)
    a.effect("k", 5.02)
    a.mark("k", owner, 5.9, ok=False)
    late, early = Consumer(11), Consumer(11)
    late.applies("k", 15.5)
    early.applies("k", 8.0)
    kills = [Kill("redis_kill", 5.5)]
    assert verdict_of(a, late, kills=kills).doubles == {"k": "mark_failed"}
    assert verdict_of(a, early, kills=kills).doubles == {"k": "record_lost_with_store"}
    assert verdict_of(a, early).unexplained == ["k"]


def test_an_applier_that_ran_without_dedup_explains_itself_and_the_next() -> None:
    """The second applier's claim failed (store down) and it ran without dedup: explained by
    its own evidence though the first's explains nothing; an applier that ran without dedup
    left no record, so a later claim that won is explained too."""
    a, b = Consumer(10), Consumer(11)
    a.applies("k", 1.0)
    b.without_dedup("k", 3.0)
    verdict = verdict_of(a, b)
    assert verdict.doubles == {"k": "ran_without_dedup"}
    assert verdict.appliers["k"][1]["pid"] == 11
    first, then = Consumer(10), Consumer(11)
    first.without_dedup("j", 1.0)
    then.applies("j", 3.0)
    assert verdict_of(first, then).doubles == {"j": "ran_without_dedup"}


def test_every_applier_is_weighed_not_only_the_first() -> None:
    """Three appliers: the second ran without dedup (explained), but the third claimed after
    the first's CONSUMED mark was confirmed with no fault near: the key is unexplained (the
    outage of the second does not excuse the third)."""
    a, b, c = Consumer(10), Consumer(11), Consumer(12)
    a.applies("k", 1.0)
    b.without_dedup("k", 3.0)
    c.applies("k", 5.0)
    verdict = verdict_of(a, b, c)
    assert verdict.unexplained == ["k"]
    causes = [entry.get("cause") for entry in verdict.appliers["k"]]
    assert causes == [None, "ran_without_dedup", None]
    assert "CONSUMED mark" in str(verdict.appliers["k"][2]["note"])


def test_a_lease_lapsed_in_a_measured_stall_is_explained_from_the_second_applier() -> None:
    """Applier B claimed first and its process stalled (its watchdog says for how long)
    before it could renew; A took the lapsed claim over and applied first; B woke, applied
    and marked CONSUMED over A's record. By effect time A is the first applier and its
    evidence explains nothing: B's, the second applier's, does. Without the stall lines the
    same lapse is unexplained."""
    a, b = Consumer(10), Consumer(11)
    owner = b.claim("k", 0.0)
    b.stall(10.6, 10.5)  # the process stalled from 0.1 to 10.6
    b.effect("k", 10.62)
    b.mark("k", owner, 10.7)
    a.applies("k", 10.2)
    a.events[0] = Event(
        10.2, 10, "k", "claim", a.events[0].detail.replace("claimed", "taken_over"), 1
    )
    verdict = verdict_of(a, b)
    assert verdict.doubles == {"k": "lease_lapsed_under_stall"}
    assert [entry["pid"] for entry in verdict.appliers["k"]] == [11, 10]  # in claim order
    b.events = [e for e in b.events if e.kind != "stall"]
    unstalled = verdict_of(a, b)
    assert unstalled.unexplained == ["k"]
    assert "0.0s stalled" in str(unstalled.appliers["k"][1]["note"])


def test_a_lease_lapsed_because_renewals_failed_is_explained_but_not_while_renewed() -> None:
    """The first applier's renewals raised (the store was down) until its lease lapsed: the
    store's; a claim while its last successful renewal was still live is a defect."""
    a, b = Consumer(10), Consumer(11)
    owner = a.claim("k", 0.0)
    a.renew("k", owner, 3.3, "error,error=StoreUnavailableError")
    a.renew("k", owner, 6.6, "error,error=StoreUnavailableError")
    a.renew("k", owner, 9.9, "error,error=StoreUnavailableError")
    b.applies("k", 10.5)
    a.effect("k", 12.0)
    a.mark("k", owner, 12.1)
    assert verdict_of(a, b).doubles == {"k": "lease_lapsed_store"}
    renewed, c = Consumer(10), Consumer(11)
    owner = renewed.claim("k", 0.0)
    renewed.renew("k", owner, 3.3)
    c.applies("k", 10.5)  # the lease ran to 13.3
    renewed.effect("k", 12.0)
    renewed.mark("k", owner, 12.1)
    verdict = verdict_of(renewed, c)
    assert verdict.unexplained == ["k"]
    assert "claim was live" in str(verdict.appliers["k"][1]["note"])


def test_a_claim_in_flight_through_an_outage_may_run_after_the_lapse_it_found() -> None:
    """A loaded soak run's key (times from its evidence, MariaDB killed meanwhile): two copies
    claimed at once by one process; the first won, its handler's effect and its renewal hung
    17-21 s; the second claim's call took 20.7 s and found the first claim expired (taken
    over): it ran after that claim could lapse, while its renewal hung: the store's. Before,
    the explainer judged the claim by the writes landed when its call began (none) and called
    it 'both won'. A takeover whose call ended before the first claim could lapse is still a
    defect."""

    def two_copies(second_claim_ends: float, took: float) -> Consumer:
        a = Consumer(10)
        a.line(0.1, "k", "claim", "claimed,owner=r.10.1@1,took=0.1014")
        a.line(0.11, "k", "effect_begin")
        a.line(second_claim_ends, "k", "claim", f"taken_over,owner=r.10.2@1,took={took}", 2)
        a.line(second_claim_ends + 0.01, "k", "effect_begin", tid=2)
        a.line(second_claim_ends + 0.06, "k", "effect", "took=0.0532", 2)
        a.line(second_claim_ends + 0.1, "k", "mark", "ok,owner=r.10.2@1,took=0.0339", 2)
        a.renew("k", "r.10.1@1", second_claim_ends + 0.06, "lost", took=17.4029)
        a.line(21.13, "k", "effect", "took=21.0202")
        a.line(35.0, "k", "mark", "ok,owner=r.10.1@1,took=13.8709")
        a.effects += [Effect("k", 10, 0.11), Effect("k", 10, second_claim_ends + 0.01)]
        return a

    assert verdict_of(two_copies(20.73, 20.6615)).doubles == {"k": "lease_lapsed_store"}
    early = verdict_of(two_copies(5.0, 4.9))
    assert early.unexplained == ["k"]
    assert "claim was live" in str(early.appliers["k"][1]["note"])


def test_a_renewal_that_never_answered_before_its_process_was_killed_covers_the_lapse() -> None:
    """A loaded soak run's key (its times, less 151 s): MariaDB, the store and the effects'
    database, stopped answering for 12 s. The first applier's effect INSERT and its renewal
    (begun at 3.6) hung until the soak SIGKILLed its process (12.19); the server, answering
    again, committed the effect and found the lease lapsed, and another consumer took the
    claim over. Before, a renewal left no line until it answered, and the lapse read as '0.0s
    in failing or slow store calls', unexplained; its ``renew_begin`` line now shows the store
    call in flight until the kill: the store's. Without that line it is still unexplained."""

    def run(renewal_begun: bool) -> object:
        a, b = Consumer(15715), Consumer(16320)
        owner = a.claim("k", 0.2462)
        a.line(0.2619, "k", "effect_begin")
        a.effects.append(Effect("k", 15715, 0.2619))
        if renewal_begun:
            a.line(3.6, "k", "renew_begin", f"owner={owner}", tid=99)
        b.line(12.8738, "k", "claim", "taken_over,owner=r.16320.1@1,took=0.0108")
        b.effect("k", 12.8906)
        b.mark("k", "r.16320.1@1", 12.8909, deferred=True)
        return verdict_of(a, b, kills=[Kill("sigkill", 12.1862, 15715)])

    assert run(renewal_begun=True).doubles == {"k": "lease_lapsed_store"}  # type: ignore[attr-defined]
    assert run(renewal_begun=False).unexplained == ["k"]  # type: ignore[attr-defined]


def test_a_failed_mark_and_an_ambiguous_effect_commit_are_explained() -> None:
    """Acked after a failed CONSUMED mark, claimed again after the lease; an effect whose
    commit raised although the row exists (its claim released, the retry ran)."""
    a, b = Consumer(1), Consumer(2)
    owner = a.claim("m", 1.0)
    a.effect("m", 1.02)
    a.mark("m", owner, 1.05, ok=False)
    b.applies("m", 30.0)
    assert verdict_of(a, b).doubles == {"m": "mark_failed"}
    c, d = Consumer(1), Consumer(2)
    c.claim("c", 1.0)
    c.effect("c", 1.02, error=True)
    d.applies("c", 3.0)
    assert verdict_of(c, d).doubles == {"c": "ambiguous_effect_commit"}


def test_a_claim_after_a_confirmed_mark_without_a_fault_is_unexplained() -> None:
    """Two applications, both confirmed, no fault near them: a defect, reported as such."""
    a, b = Consumer(10), Consumer(11)
    a.applies("a", 5.0)
    b.applies("a", 9.0)
    verdict = verdict_of(a, b, kills=[Kill("redis_kill", 30.0), Kill("sigkill", 5.05, 12)])
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


def test_the_quick_drain_stops_early_and_the_full_one_waits_for_its_deadline() -> None:
    """Every key applied: both end QUIET_S after the last decision (final). Keys missing: the
    quick drain stops after its time or once nothing was decided for its idle time since it
    began (not final: outstanding); the full one waits until its deadline after the last
    fault (final: lost)."""
    quick, full = SIZES["quick"], SIZES["full"]
    for size in (quick, full):
        assert size.drain_end(True, QUIET_S, 0.0, 0.0) == "all_applied"
        assert size.drain_end(True, QUIET_S - 1, 1.0, 1.0) is None
    idle, stop = quick.idle_s, quick.drain_s
    assert idle is not None and stop is not None and idle < stop
    assert quick.drain_end(False, idle, idle, 0.0) == "idle"
    assert quick.drain_end(False, idle - 1, stop - 1, 0.0) is None
    assert quick.drain_end(False, 99.0, idle - 1, 999.0) is None  # the silence before it
    assert quick.drain_end(False, 0.0, stop, 0.0) == "stopped"
    deadline = full.loss_deadline_s
    assert deadline == 300.0  # the issue: 5 minutes after the last fault
    assert full.drain_end(False, 999.0, 999.0, deadline - 1) is None
    assert full.drain_end(False, 0.0, 0.0, deadline) == "deadline"
    assert set(accounting.FINAL_ENDS) == {"all_applied", "deadline"}


def test_every_mode_shares_the_plan_of_a_key_index() -> None:
    """Key i of every mode (another run id) has the same copies, handler time and failure:
    the control's missing keys can be matched with a mode's by index."""
    assert sends("aaaa", 500, 10.0, seed=3) != sends("bbbb", 500, 10.0, seed=3)
    shape = [(s.at_s, s.key[-6:], s.copy) for s in sends("aaaa", 500, 10.0, seed=3)]
    assert shape == [(s.at_s, s.key[-6:], s.copy) for s in sends("bbbb", 500, 10.0, seed=3)]
    for i in range(2_000):
        a, b = key_name("aaaa", i), key_name("bbbb", i)
        assert fails_first(a) == fails_first(b) and handler_ms(a) == handler_ms(b)
    assert any(fails_first(key_name("aaaa", i)) for i in range(200))


def test_a_missing_key_is_lost_only_after_the_deadline() -> None:
    """A drain that reached its deadline (or applied every key) calls its missing keys lost;
    one stopped earlier calls them outstanding, except the keys the dedup layer acked
    without an effect (lost whatever the drain); dead-lettered keys are neither."""
    missing = {
        "a": "not_redelivered_after_broker_restart",
        "b": "never_delivered",
        "c": "acked_without_effect",
        "d": "dead_lettered",
    }
    final = accounting.settle(missing, "deadline")
    assert final == {
        "final": True, "lost": 3, "outstanding": 0, "acked_not_applied": 1, "dead_lettered": 1,
    }  # fmt: skip
    for end in ("idle", "stopped"):
        early = accounting.settle(missing, end)
        assert early["final"] is False and early["lost"] == 1 and early["outstanding"] == 2
    assert accounting.settle({}, "all_applied")["lost"] == 0
    with pytest.raises(ValueError):
        accounting.settle(missing, "bored")


def test_dead_lettered_keys_and_the_controls_doubles_are_classified() -> None:
    """A missing key found in the DLQ is dead_lettered whatever its answers; the control's
    double applies are no_dedup (a dedup mode's same evidence is unexplained)."""
    events = [Event(10.0, 1, "k", "decision", "failed")]
    verdict = judge(["k", "j"], [], events, [], "none", dead_lettered={"k"})
    assert verdict.lost_causes == {"k": "dead_lettered", "j": "never_delivered"}
    twice = effects(("a", 1, 1.0), ("a", 2, 2.0))
    decided = [
        Event(1.1, 1, "a", "decision", "consumed"),
        Event(2.1, 2, "a", "decision", "consumed"),
    ]
    control = judge(["a"], twice, decided, [], "none", dedup=False)
    assert control.doubles == {"a": "no_dedup"} and summary(control) == (1, 1)
    assert judge(["a"], twice, decided, [], "none").unexplained == ["a"]


def test_delays_and_delayed_keys() -> None:
    """A key's delay runs from its first successful send to its first application; keys over
    the late threshold are the delayed ones, with their median and max; keys never applied
    have no delay."""
    applied = accounting.first_applied(
        effects(("a", 1, 101.0), ("a", 2, 50.0), ("b", 1, 12.0), ("c", 1, 230.0), ("d", 1, 400.0))
    )
    assert applied["a"] == 50.0
    sent = {"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0, "e": 10.0}
    delays = accounting.delays(sent, applied)
    assert delays == {"a": 40.0, "b": 2.0, "c": 220.0, "d": 390.0}
    summary_ = accounting.delay_summary(delays, late_s=60.0)
    assert summary_["delayed"] == 2
    assert summary_["delayed_median_s"] == 305.0 and summary_["delayed_max_s"] == 390.0
    assert summary_["median_s"] == 130.0 and summary_["max_s"] == 390.0
    assert accounting.delay_summary({}, 60.0)["delayed"] == 0
    assert accounting.delays({"a": 20.0}, {"a": 19.5}) == {"a": 0.0}  # clocks of two processes


def test_missing_keys_and_nacks_by_consumer_kind() -> None:
    """A key goes to one consumer kind's channel by its index, the same in every mode and in
    the proportion of the mix's slots; missing keys are counted per kind and cause; the
    answers count nacks (later) per kind of the answering process."""
    mix = ("classic", "classic", "classic", "grpc")
    kinds_ = [kind_of(key_name("r", i), mix) for i in range(4_000)]
    assert Counter(kinds_) == {"classic": 3_000, "grpc": 1_000}
    assert kinds_ == [kind_of(key_name("other", i), mix) for i in range(4_000)]
    key_kinds = {"x": "classic", "y": "grpc", "v": "grpc"}
    missing = {"x": "not_redelivered", "y": LOST_BY_BROKER, "v": "never_delivered"}
    assert accounting.missing_by_kind(missing, key_kinds) == {
        "classic": {"not_redelivered": 1},
        "grpc": {LOST_BY_BROKER: 1, "never_delivered": 1},
    }
    pids = {1: "classic", 2: "grpc", 3: "orderly"}
    events = [
        Event(1.0, 2, "y", "decision", "failed"),
        Event(1.0, 2, "y", "answer", "later"),
        Event(5.0, 1, "x", "answer", "later"),
        Event(2.0, 2, "y", "answer", "later"),
        Event(3.0, 3, "z", "answer", "ack"),
        Event(3.5, 9, "w", "answer", "ack"),  # a pid the run does not know
    ]
    assert accounting.answers_by_kind(events, pids) == {
        "classic": {"ack": 0, "later": 1},
        "grpc": {"ack": 0, "later": 2},
        "none": {"ack": 1, "later": 0},
        "orderly": {"ack": 1, "later": 0},
    }


def test_throughput_over_the_busy_span_and_cpu_per_message() -> None:
    """msgs/s counts the decisions from the first send until 99 % of the keys were applied
    (a straggler applied minutes later does not dilute it); CPU ms per decision per kind."""
    applied = {f"k{i}": 100.0 + i / 10 for i in range(100)}  # 99 % applied at 109.8
    applied["k99"] = 400.0
    end = accounting.busy_end(applied, 100, start=100.0)
    assert end == pytest.approx(109.8)
    decisions = [Event(100.0 + i / 20, 1, f"k{i}", "decision", "consumed") for i in range(200)]
    decisions.append(Event(400.0, 2, "k99", "decision", "consumed"))
    rate = accounting.throughput(decisions, 100.0, end)
    assert rate == {"busy_s": 9.8, "msgs_per_s": round(197 / 9.8, 1)}
    assert accounting.busy_end({"a": 1.0}, 100, start=0.0) is None
    cpu = accounting.cpu_per_message({10: 0.2, 11: 0.1, 20: 0.5}, decisions,
                                     {10: "classic", 11: "classic", 1: "classic", 2: "grpc",
                                      20: "grpc"})  # fmt: skip
    assert cpu == {"classic": 1.5, "grpc": 500.0, "all": round(800 / 201, 3)}


def result(missing_by_kind: dict, lost: int, keys_by_kind: dict, later: int, keys: list) -> dict:
    return {
        "missing_by_kind": missing_by_kind, "lost": lost, "outstanding": 0,
        "keys_by_kind": keys_by_kind, "missing_keys": keys,
        "answers_by_kind": {"classic": {"ack": 100, "later": later}},
    }  # fmt: skip


def test_each_mode_beside_the_control() -> None:
    """Per kind and cause, mode / control; missing per 1,000 keys of a kind; nacks; how many
    key indices both miss. Without a control: nothing."""
    results = {
        "plain-redis": result(
            {"grpc": {LOST_BY_BROKER: 3}, "classic": {"not_redelivered": 1}},
            4, {"grpc": 1000, "classic": 3000}, 50, ["r1-000001", "r1-000002", "r1-000009"],
        ),
        "no-dedup": result(
            {"grpc": {LOST_BY_BROKER: 2}}, 2,
            {"grpc": 500, "classic": 3500}, 40, ["c1-000002", "c1-000003"],
        ),
    }  # fmt: skip
    out = accounting.compare(results, "no-dedup")
    assert list(out) == ["plain-redis"]
    redis = out["plain-redis"]
    assert redis["lost"] == [4, 2] and redis["nacks"] == [50, 40]
    assert redis["missing_by_kind"] == {"classic": [1, 0], "grpc": [3, 2]}
    assert redis["missing_by_cause"] == {
        "not_redelivered": [1, 0], LOST_BY_BROKER: [3, 2],
    }  # fmt: skip
    assert redis["missing_per_1000_keys"] == {"classic": [0.33, 0.0], "grpc": [3.0, 4.0]}
    assert redis["same_key_indices"] == 1
    assert accounting.compare({"plain-redis": results["plain-redis"]}, "no-dedup") == {}
    report = {"modes": {}, "control": out}
    text = table(report)
    assert "| plain-redis | 4 / 2 | 0 / 0 | 1 / 0 | 3 / 2 |" in text


def test_options_reach_dedup_config_checked_before_anything_starts() -> None:
    """--options K=V,... (JSON values, else strings) for every dedup mode, --variant options
    for MODE:VARIANT on top; none for the control; DedupConfig refuses unknown names and bad
    values, and the soak's own settings are refused, before any server is touched."""
    assert parse_options("a=200, b=0.5,c=true,d=reconsume_later,e=null") == {
        "a": 200, "b": 0.5, "c": True, "d": "reconsume_later", "e": None,
    }  # fmt: skip
    assert parse_options("") == {}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_options("in_progress_wait_ms")
    common = {"store_failure_policy": "reconsume_later"}
    variants = {"long": {"dedup_processing_expire_milli_seconds": 20_000}}
    assert mode_options(["plain-redis", "plain-redis:long", "no-dedup"], common, variants) == {
        "plain-redis": common,
        "plain-redis:long": {**common, "dedup_processing_expire_milli_seconds": 20_000},
        "no-dedup": {},
    }
    for bad in (["plain-redis:nope"], ["no-dedup:long"], ["redis"], ["plain-mysql", "plain-mysql"]):
        with pytest.raises(ValueError):
            mode_options(bad, common, variants)
    check_options({"store_failure_policy": "reconsume_later", "pool_size": 4})
    for refused in (
        {"in_progress_wait_ms_typo": 1},
        {"store_failure_policy": "sometimes"},
        {"metrics": None},
    ):
        with pytest.raises(ValueError):
            check_options(refused)


def test_every_size_ends_its_drain_and_only_the_full_one_calls_keys_lost() -> None:
    """A size with neither a drain time nor an idle end nor a deadline would drain forever:
    every size of the soak has one of them; only the full one has a loss deadline, and only
    the quick one runs its modes at once."""
    for name, size in SIZES.items():
        ends = (size.drain_s, size.idle_s, size.loss_deadline_s)
        assert any(e is not None for e in ends), name
    assert SIZES["quick"].loss_deadline_s is None and SIZES["quick"].together
    assert not SIZES["full"].together


@pytest.mark.parametrize("script", ["bench.sh", "soak.sh"])
@pytest.mark.parametrize("args", [["--help"], ["--quick", "-h"]])
def test_help_starts_nothing(script: str, args: List[str], tmp_path: Path) -> None:
    """`scripts/bench.sh --help` and `scripts/soak.sh --help` print their options and start
    nothing: no bootstrap, no server, not even the state directory."""
    state = tmp_path / "state"
    env = {**os.environ, "ROCKETMQ_DEDUP_STATE_ROOT": str(state)}
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["bash", str(root / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(root),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
    assert not state.exists()


def test_the_observed_store_writes_every_claim_renewal_mark_and_release(tmp_path: Path) -> None:
    """The soak consumer's store subclass writes one line per key and call (outcome, owner,
    the holder a refused claim saw, a store error), a renewal's begin too, and answers what
    the store answered."""
    from bench.soak.consumer import Evidence, Observed
    from rocketmq_dedup import DedupElement, MemoryDedupStore
    from rocketmq_dedup.errors import StoreUnavailableError
    from rocketmq_dedup.stores.base import Claim

    class ObservedMemory(Observed, MemoryDedupStore):
        pass

    now = [0.0]
    store = ObservedMemory(clock=lambda: now[0])
    path = tmp_path / "evidence.log"
    store.watch(Evidence(str(path)))
    first, second = (
        Claim(DedupElement("a", "T", "", "k"), "o1"),
        Claim(DedupElement("a", "T", "", "k"), "o2"),
    )
    other = Claim(DedupElement("a", "T", "", "j"), "o3")
    assert store.claim(first, 10_000).claimed
    assert not store.claim(second, 10_000).claimed
    assert store.renew_many([first, other], 10_000) == [True, False]
    store.mark_consumed(first, 60_000)
    assert store.claim_many([other], 10_000)[0].claimed
    assert store.release_many([other]) == 1
    assert store.release(other) is False

    def fail(*args: object) -> None:
        raise StoreUnavailableError("down")

    store.do_claim = fail  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailableError):
        store.claim(second, 10_000)
    lines = parse_events(path.read_text().splitlines())
    begun = [(e.key, e.kind, e.detail) for e in lines if e.kind.endswith("_begin")]
    assert begun == [("k", "renew_begin", "owner=o1"), ("j", "renew_begin", "owner=o3")]
    assert [e.kind for e in lines[2:6]] == ["renew_begin", "renew_begin", "renew", "renew"]
    lines = [e for e in lines if not e.kind.endswith("_begin")]
    seen = [(e.key, e.kind, fields(e.detail)) for e in lines]
    assert [(key, kind, said[""], said["owner"]) for key, kind, said in seen] == [
        ("k", "claim", "claimed", "o1"),
        ("k", "claim", "refused", "o2"),
        ("k", "renew", "ok", "o1"),
        ("j", "renew", "lost", "o3"),
        ("k", "mark", "ok", "o1"),
        ("j", "claim", "claimed", "o3"),
        ("j", "release", "ok", "o3"),
        ("j", "release", "gone", "o3"),
        ("k", "claim", "error", "o2"),
    ]
    refused = seen[1][2]
    assert refused["status"] == "CONSUMING" and refused["holder"] == "o1"
    assert seen[-1][2]["error"] == "StoreUnavailableError"
    assert all(float(said["took"]) >= 0 for _, _, said in seen)
    assert {e.tid for e in lines} == {threading.get_native_id()}


def test_stalls_are_summed_and_the_worst_listed() -> None:
    """The watchdogs' stall lines: how many, how many of a second or more, the longest first."""
    events = [
        Event(110.0, 1, "-", "stall", "gap=0.300,cpu=0.010,load=3.0"),
        Event(120.0, 2, "-", "stall", "gap=9.700,cpu=0.020,load=14.5"),
        Event(130.0, 1, "-", "stall", "gap=1.500,cpu=1.400,load=8.0"),
        Event(130.0, 1, "k", "decision", "consumed"),
    ]
    out = accounting.stall_summary(events, {1: "classic", 2: "grpc"}, start=100.0, worst=2)
    assert out["count"] == 3 and out["over_1s"] == 2 and out["max_s"] == 9.7
    assert out["total_s"] == 11.5
    assert out["worst"] == [
        {"pid": 2, "kind": "grpc", "at_s": 10.3, "gap_s": 9.7, "cpu_s": 0.02, "load": 14.5},
        {"pid": 1, "kind": "classic", "at_s": 28.5, "gap_s": 1.5, "cpu_s": 1.4, "load": 8.0},
    ]


# -- the outbox mode (issue 35) ----------------------------------------------------------------


def test_the_outbox_accounting_counts_b_sent_delivered_and_applied() -> None:
    """Rows, sends (one sent twice: a relay killed before its mark), deliveries, applications
    downstream; nothing fails when each B is applied once and belongs to an applied A."""
    a = [Effect("r-1", 1, 1.0), Effect("r-2", 1, 1.0), Effect("r-3", 1, 1.0)]
    b = [Effect("r-1:B", 2, 2.0), Effect("r-2:B", 2, 2.0)]
    events = [
        Event(1.5, 3, "r-1:B", "b_sent", "M1"),
        Event(1.6, 3, "r-2:B", "b_sent", "M2"),
        Event(9.0, 4, "r-2:B", "b_sent", "M3"),  # sent again after the relay's lease
        Event(2.0, 5, "r-1:B", "b_answer", "ack"),
        Event(2.0, 5, "r-2:B", "b_answer", "ack"),
        Event(9.5, 5, "r-2:B", "b_answer", "ack"),  # the copy, dropped downstream
    ]
    rows = {"r-1:B": "SENT", "r-2:B": "SENT", "r-3:B": "PENDING"}
    section = soak_outbox.account(a, b, events, rows)
    assert section["a_applied"] == 3 and section["b_rows"] == 3
    assert section["b_rows_by_status"] == {"SENT": 2, "PENDING": 1}
    assert (section["b_sent"], section["b_sends"], section["b_sent_twice"]) == (2, 3, 1)
    assert (section["b_delivered"], section["b_deliveries"], section["b_delivered_twice"]) == (
        2,
        3,
        1,
    )
    assert section["b_applied"] == 2 and section["b_double_applied"] == 0
    assert section["b_missing"] == 1 and section["b_missing_keys"] == ["r-3"]
    assert soak_outbox.failed(section) == []


def test_the_outbox_accounting_fails_a_b_applied_twice_or_without_its_a() -> None:
    """A B applied twice downstream, or a B (a row, or applied) whose A never committed."""
    a = [Effect("r-1", 1, 1.0)]
    b = [Effect("r-1:B", 2, 2.0), Effect("r-1:B", 2, 3.0), Effect("r-9:B", 2, 2.0)]
    section = soak_outbox.account(a, b, [], {"r-1:B": "SENT", "r-8:B": "SENT"})
    assert section["b_double_applied"] == 1
    assert section["b_without_a_keys"] == ["r-8", "r-9"]
    assert len(soak_outbox.failed(section)) == 2


def test_the_outbox_modes_relay_kills_leave_the_other_faults_as_they_were() -> None:
    """Two relay kills at seeded moments while messages flow; faults() is unchanged by them."""
    kills = outbox_faults(60.0, 1)
    assert [f.kind for f in kills] == ["relay_kill", "relay_kill"]
    assert all(9.0 <= f.at_s <= 51.0 for f in kills)
    assert outbox_faults(60.0, 1) == kills
    assert faults(60.0, 1) == faults(60.0, 1)
    assert "relay_kill" not in {f.kind for f in faults(60.0, 1)}


def test_the_outbox_mode_is_known_but_not_a_default_mode() -> None:
    """--modes outbox is accepted; the default modes (the quick soak CI runs) leave it out."""
    from bench.soak.run import DEFAULT_MODES, MODES, OUTBOX

    assert OUTBOX in MODES and OUTBOX not in DEFAULT_MODES
    assert mode_options([OUTBOX], {}, {}) == {OUTBOX: {}}
