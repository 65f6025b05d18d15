"""The store contract, run against every store: memory, Redis, Redis Cluster, MariaDB."""

from __future__ import annotations

import pytest

from rocketmq_dedup import DedupElement, DedupStatus
from rocketmq_dedup.stores.base import ALREADY_CONSUMED, CLAIMED, HELD_BY_OTHER, Claim, DedupStore
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
