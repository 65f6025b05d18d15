"""The store contract, run against every store: memory, Redis, Redis Cluster, MariaDB."""

from __future__ import annotations

import pytest

from rocketmq_dedup import DedupElement, DedupStatus
from rocketmq_dedup.stores.base import (
    ALREADY_CONSUMED,
    CLAIMED,
    HELD_BY_OTHER,
    MAX_REASON_LENGTH,
    Claim,
    ClaimResult,
    DedupStore,
)
from tests.support import claims, outcome, wait_for

LEASE = 60_000
RETENTION = 60_000
SHORT = 300  # ms: leases and retentions that the tests watch expire


def element(app: str, key: str = "k1", tag: str = "TagA", topic: str = "T") -> DedupElement:
    return DedupElement(app, topic, tag, key)


def test_fresh_claim_is_taken(store: DedupStore, app_name: str) -> None:
    """A claim on an element without a record succeeds and leaves it CONSUMING."""
    e = element(app_name)
    assert store.claim(Claim(e, "o1"), LEASE) == CLAIMED
    assert store.get_status(e) is DedupStatus.CONSUMING


def test_second_claim_sees_consuming(store: DedupStore, app_name: str) -> None:
    """While a claim holds, another owner's claim fails and reports CONSUMING."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(HELD_BY_OTHER)


def test_claim_after_mark_consumed_sees_consumed(store: DedupStore, app_name: str) -> None:
    """After mark_consumed, claims report CONSUMED."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(ALREADY_CONSUMED)
    assert store.get_status(e) is DedupStatus.CONSUMED


def test_release_by_owner_frees_the_element(store: DedupStore, app_name: str) -> None:
    """The owner's release deletes the claim, so the next claim succeeds."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    assert store.release(Claim(e, "o1")) is True
    assert store.get_status(e) is None
    assert store.claim(Claim(e, "o2"), LEASE) == CLAIMED


def test_release_by_other_owner_keeps_the_claim(store: DedupStore, app_name: str) -> None:
    """A release with the wrong owner token deletes nothing."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    assert store.release(Claim(e, "o2")) is False
    assert store.get_status(e) is DedupStatus.CONSUMING


def test_release_never_deletes_consumed(store: DedupStore, app_name: str) -> None:
    """A CONSUMED record survives a release, even by the owner that claimed it."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    assert store.release(Claim(e, "o1")) is False
    assert store.get_status(e) is DedupStatus.CONSUMED


def test_expired_lease_is_taken_over(store: DedupStore, app_name: str) -> None:
    """After the lease lapses another owner claims; the first owner's release is a no-op."""
    e = element(app_name)
    assert store.claim(Claim(e, "o1"), SHORT) == CLAIMED
    wait_for(lambda: store.claim(Claim(e, "o2"), LEASE).claimed, timeout=10)
    assert store.release(Claim(e, "o1")) is False
    assert outcome(store.claim(Claim(e, "o3"), LEASE)) == outcome(HELD_BY_OTHER)


def test_late_success_overrides_newer_claim(store: DedupStore, app_name: str) -> None:
    """A success recorded after losing the lease still becomes CONSUMED, and the newer
    claimer's later release cannot delete it."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), SHORT)
    wait_for(lambda: store.claim(Claim(e, "o2"), LEASE).claimed, timeout=10)
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    assert store.release(Claim(e, "o2")) is False
    assert store.get_status(e) is DedupStatus.CONSUMED


def test_consumed_record_expires_after_retention(store: DedupStore, app_name: str) -> None:
    """A CONSUMED record lives for the retention only; then the element can be claimed."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_consumed(Claim(e, "o1"), SHORT)
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(ALREADY_CONSUMED)
    wait_for(lambda: store.claim(Claim(e, "o3"), LEASE).claimed, timeout=10)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("", "A:B"), ("A", "B")),  # the Java original's ':' collision
        (("A", "B:C"), ("A:B", "C")),
        (("", "Key"), ("", "key")),  # case-sensitive
        (("", "x" * 300 + "1"), ("", "x" * 300 + "2")),  # differ after 255 characters
        (("", "\U0001f600"), ("", "\U0001f601")),  # 4-byte UTF-8
        (("", "a{b}c"), ("", "a%7Bb%7Dc")),  # escaping is injective
        (("t" * 300 + "1", "k"), ("t" * 300 + "2", "k")),  # long tags
    ],
)
def test_distinct_elements_never_collide(
    store: DedupStore, app_name: str, first: tuple[str, str], second: tuple[str, str]
) -> None:
    """Elements that differ in any field have independent records."""
    a = element(app_name, tag=first[0], key=first[1])
    b = element(app_name, tag=second[0], key=second[1])
    store.claim(Claim(a, "o1"), LEASE)
    store.mark_consumed(Claim(a, "o1"), RETENTION)
    assert store.claim(Claim(b, "o2"), LEASE) == CLAIMED


def test_huge_and_unicode_keys_round_trip(store: DedupStore, app_name: str) -> None:
    """A 64 KiB key with any Unicode (and undecodable bytes) is claimed and deduped."""
    key = "\u4e2d\U0001f600\udcff" + "k" * 65536
    e = element(app_name, key=key, tag="\u6807\u7b7e" * 100)
    assert store.claim(Claim(e, "o1"), LEASE) == CLAIMED
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(ALREADY_CONSUMED)


def test_claim_many_reports_each_element_in_order(store: DedupStore, app_name: str) -> None:
    """claim_many returns one result per element, in order, including a repeated element."""
    fresh, held, done = (element(app_name, key=k) for k in ("fresh", "held", "done"))
    store.claim(Claim(held, "x"), LEASE)
    store.claim(Claim(done, "x"), LEASE)
    store.mark_consumed(Claim(done, "x"), RETENTION)
    results = store.claim_many(claims([fresh, held, done, fresh], ["a", "b", "c", "d"]), LEASE)
    assert [outcome(r) for r in results] == [
        outcome(r) for r in (CLAIMED, HELD_BY_OTHER, ALREADY_CONSUMED, HELD_BY_OTHER)
    ]


def test_batch_mark_and_release(store: DedupStore, app_name: str) -> None:
    """mark_consumed_many records every element; release_many only deletes owned claims."""
    a, b, c = (element(app_name, key=k) for k in "abc")
    store.claim_many(claims([a, b, c], ["oa", "ob", "oc"]), LEASE)
    store.mark_consumed_many(claims([a], ["oa"]), RETENTION)
    assert store.release_many(claims([a, b, c], ["oa", "ob", "wrong"])) == 1
    assert [store.get_status(x) for x in (a, b, c)] == [
        DedupStatus.CONSUMED,
        None,
        DedupStatus.CONSUMING,
    ]


def test_empty_batches_do_nothing(store: DedupStore) -> None:
    """Batch calls with no elements return empty results without I/O errors."""
    assert store.claim_many(claims([], []), LEASE) == []
    store.mark_consumed_many(claims([], []), RETENTION)
    assert store.release_many(claims([], [])) == 0


def test_renew_extends_only_owned_claims(store: DedupStore, app_name: str) -> None:
    """renew_many extends the owner's CONSUMING claim; a wrong owner or a CONSUMED record is
    left alone and reported False."""
    mine, other, done = (element(app_name, key=k) for k in ("mine", "other", "done"))
    store.claim(Claim(mine, "o1"), SHORT)
    store.claim(Claim(other, "o2"), SHORT)
    store.claim(Claim(done, "o3"), LEASE)
    store.mark_consumed(Claim(done, "o3"), RETENTION)
    assert store.renew_many(claims([mine, other, done], ["o1", "wrong", "o3"]), LEASE) == [
        True,
        False,
        False,
    ]
    wait_for(lambda: store.claim(Claim(other, "x"), LEASE).claimed, timeout=10)  # not extended
    assert outcome(store.claim(Claim(mine, "x"), LEASE)) == outcome(
        HELD_BY_OTHER
    )  # extended past SHORT
    assert store.get_status(done) is DedupStatus.CONSUMED


def test_mark_consumed_without_a_record_records_it(store: DedupStore, app_name: str) -> None:
    """A success is recorded even when its claim record is gone (expired or purged)."""
    e = element(app_name)
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    assert store.get_status(e) is DedupStatus.CONSUMED
    assert outcome(store.claim(Claim(e, "o2"), LEASE)) == outcome(ALREADY_CONSUMED)


def test_refused_claim_names_the_holder(store: DedupStore, app_name: str) -> None:
    """A refused claim reports the owner token that wrote the live record (CONSUMING or
    CONSUMED), so a duplicate's payload can be compared with the first one's."""
    e = element(app_name)
    store.claim(Claim(e, "first#0123456789abcdef"), LEASE)
    assert store.claim(Claim(e, "o2"), LEASE).holder == "first#0123456789abcdef"
    store.mark_consumed(Claim(e, "first#0123456789abcdef"), RETENTION)
    assert store.claim(Claim(e, "o3"), LEASE).holder == "first#0123456789abcdef"


# -- FAILED records --------------------------------------------------------------------------


def test_a_failed_record_keeps_its_reason_and_refuses_claims(
    store: DedupStore, app_name: str
) -> None:
    """mark_failed leaves a FAILED record whose reason reads back; a claim is refused by it."""
    e = element(app_name)
    assert store.claim(Claim(e, "o1"), LEASE) == CLAIMED
    store.mark_failed(Claim(e, "o1"), RETENTION, "amount must be positive: -5")
    record = store.read(e)
    assert record is not None
    assert (record.status, record.owner, record.reason) == (
        DedupStatus.FAILED,
        "o1",
        "amount must be positive: -5",
    )
    refused = store.claim(Claim(e, "o2"), LEASE)
    assert outcome(refused) == (False, DedupStatus.FAILED)
    assert [outcome(r) for r in store.claim_many([Claim(e, "o3")], LEASE)] == [
        (False, DedupStatus.FAILED)
    ]


def test_a_failed_record_lives_its_retention(store: DedupStore, app_name: str) -> None:
    """A FAILED record expires after its retention, like a CONSUMED one; then a claim runs."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_failed(Claim(e, "o1"), SHORT, "bad")
    assert store.get_status(e) is DedupStatus.FAILED
    wait_for(lambda: store.get_status(e) is None, timeout=10)
    assert store.claim(Claim(e, "o2"), LEASE) == CLAIMED


def test_mark_failed_never_downgrades_consumed(store: DedupStore, app_name: str) -> None:
    """A success is never downgraded: mark_failed on a CONSUMED record leaves it CONSUMED."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_consumed(Claim(e, "o1"), RETENTION)
    store.mark_failed(Claim(e, "o2"), RETENTION, "late")
    record = store.read(e)
    assert record is not None and (record.status, record.owner) == (DedupStatus.CONSUMED, "o1")


def test_mark_failed_writes_over_any_claim_and_consumed_wins_over_failed(
    store: DedupStore, app_name: str
) -> None:
    """mark_failed writes over another owner's claim (or none); a later success marks it
    CONSUMED (a success is always recorded)."""
    held, gone = element(app_name, "held"), element(app_name, "gone")
    store.claim(Claim(held, "o1"), LEASE)
    store.mark_failed(Claim(held, "o2"), RETENTION, "why")
    store.mark_failed(Claim(gone, "o3"), RETENTION, "why")
    assert store.get_status(held) is store.get_status(gone) is DedupStatus.FAILED
    assert store.release(Claim(held, "o1")) is False  # o1's claim is gone
    store.mark_consumed(Claim(held, "o1"), RETENTION)
    assert store.get_status(held) is DedupStatus.CONSUMED


def test_a_reason_is_kept_bounded_on_one_line(store: DedupStore, app_name: str) -> None:
    """A long, multi-line reason is kept as one line of at most MAX_REASON_LENGTH characters."""
    e = element(app_name)
    store.claim(Claim(e, "o1"), LEASE)
    store.mark_failed(Claim(e, "o1"), RETENTION, "line one\nline two " + "é" * 400)
    record = store.read(e)
    assert record is not None and record.reason is not None
    assert len(record.reason) == MAX_REASON_LENGTH
    assert record.reason.startswith("line one line two éé") and record.reason.endswith("\u2026")


# -- lapsed claims ---------------------------------------------------------------------------


def test_claims_that_lapsed_are_counted_at_each_takeover(store: DedupStore, app_name: str) -> None:
    """Each takeover of an expired CONSUMING claim counts one more lapsed claim, on the single
    and the batch claim alike."""
    store.count_lapses()
    e = element(app_name)
    assert store.claim(Claim(e, "o1"), SHORT) == CLAIMED  # fresh: none lapsed
    wait_for(lambda: store.get_status(e) is None, timeout=10)
    assert store.claim(Claim(e, "o2"), SHORT) == ClaimResult(True, None, 1)
    wait_for(lambda: store.get_status(e) is None, timeout=10)
    assert store.claim_many([Claim(e, "o3")], LEASE) == [ClaimResult(True, None, 2)]
    refused = store.claim(Claim(e, "o4"), LEASE)  # a duplicate of a live claim counts nothing
    assert (refused.claimed, refused.lapsed) == (False, 0)


def test_a_settled_record_counts_its_lapsed_claims_from_zero(
    store: DedupStore, app_name: str
) -> None:
    """A release, a CONSUMED or FAILED record that expired, starts the count again at 0."""
    store.count_lapses()
    released, consumed, failed = (element(app_name, k) for k in ("r", "c", "f"))
    for e in (released, consumed, failed):
        store.claim(Claim(e, "o1"), SHORT)
    wait_for(lambda: store.get_status(released) is None, timeout=10)
    takeovers = [store.claim(Claim(e, "o2"), LEASE) for e in (released, consumed, failed)]
    assert [r.lapsed for r in takeovers] == [1, 1, 1]
    assert store.release(Claim(released, "o2"))
    store.mark_consumed(Claim(consumed, "o2"), SHORT)
    store.mark_failed(Claim(failed, "o2"), SHORT, "bad")
    wait_for(lambda: store.get_status(consumed) is store.get_status(failed) is None, timeout=10)
    again = [store.claim(Claim(e, "o3"), LEASE) for e in (released, consumed, failed)]
    assert again == [CLAIMED] * 3
