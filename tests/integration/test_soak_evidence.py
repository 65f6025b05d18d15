"""The soak consumer's observed MySQL store (bench.soak.consumer) on MariaDB: it tells a claim
that inserted a new row from one that took over a row whose lease had lapsed, the line the soak's
explainer reads to see whether a claim was won while another was live."""

from __future__ import annotations

from pathlib import Path

from bench.soak.consumer import Evidence, ObservedMySQL
from bench.soak.evidence import fields, parse_events
from rocketmq_dedup import DedupElement
from rocketmq_dedup.stores.base import Claim
from tests.support import mysql_connect, wait_for


def test_a_claim_of_a_lapsed_row_is_written_as_taken_over(
    mysql_table: str, app_name: str, tmp_path: Path
) -> None:
    """A new row: ``claimed``; a live one: ``refused`` with its holder; the same row once its
    lease lapsed: ``taken_over`` by the new owner."""
    store = ObservedMySQL(mysql_connect(), mysql_table)
    path = tmp_path / "evidence.log"
    store.watch(Evidence(str(path)))
    element = DedupElement(app_name, "T", "", "k")
    assert store.claim(Claim(element, "first"), 300).claimed
    assert not store.claim(Claim(element, "second"), 10_000).claimed
    wait_for(lambda: store.claim(Claim(element, "second"), 10_000).claimed, timeout=10)
    store.close()
    said = [fields(e.detail) for e in parse_events(path.read_text().splitlines())]
    assert [(s[""], s["owner"]) for s in (said[0], said[1], said[-1])] == [
        ("claimed", "first"),
        ("refused", "second"),
        ("taken_over", "second"),
    ]
    assert said[1]["holder"] == "first" and said[1]["status"] == "CONSUMING"


def test_a_deferred_mark_is_written_as_deferred_and_a_written_one_as_ok(
    mysql_table: str, app_name: str, tmp_path: Path
) -> None:
    """With deferral (the default) the mark's line says ``deferred``: it lands after the
    listener answered, so the explainer must not take it for a landed mark (a SIGKILL in
    between loses it); with ``defer_marks_ms=0`` it says ``ok``. (Before, both said ``ok``.)"""
    said = []
    for defer in (10, 0):
        store = ObservedMySQL(mysql_connect(), mysql_table, defer_marks_ms=defer)
        path = tmp_path / f"evidence-{defer}.log"
        store.watch(Evidence(str(path)))
        claim = Claim(DedupElement(app_name, "T", "", f"m{defer}"), "owner")
        assert store.claim(claim, 60_000).claimed
        store.mark_consumed(claim, 60_000)
        store.close()
        marks = [e for e in parse_events(path.read_text().splitlines()) if e.kind == "mark"]
        said.append(fields(marks[0].detail)[""])
    assert said == ["deferred", "ok"]
