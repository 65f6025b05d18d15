"""The lease keeper on its own: which held claims it renews, and how soon."""

from __future__ import annotations

from typing import List

from rocketmq_dedup import DedupStatus, MemoryDedupStore
from rocketmq_dedup.lease import LeaseKeeper
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.stores.base import Claim
from tests.support import wait_for


def _claimed(store: MemoryDedupStore, key: str, lease_ms: int) -> Claim:
    claim = Claim(DedupElement("app", "T", "", key), f"owner-{key}")
    assert store.claim(claim, lease_ms).claimed
    return claim


def test_a_shorter_lease_wakes_the_keeper_to_renew_it_in_time() -> None:
    """A keeper waiting a third of a 60 s lease is woken by a claim of 300 ms: that claim is
    renewed every 100 ms and outlives its lease twice over."""
    store = MemoryDedupStore()
    rounds: List[int] = []
    keeper = LeaseKeeper(store, lambda renewed, lost, seconds, ok: rounds.append(renewed))
    long, short = _claimed(store, "long", 60_000), _claimed(store, "short", 300)
    try:
        keeper.hold_one(long, 60_000, 600_000)
        keeper.hold_one(short, 300, 600_000)
        wait_for(lambda: len(rounds) >= 6, timeout=5)  # 6 rounds: at least 0.6 s
        assert store.get_status(short.element) is DedupStatus.CONSUMING
        assert rounds[-1] == 2  # both renewed
    finally:
        keeper.close()


def test_a_dropped_claim_is_no_longer_renewed() -> None:
    """``drop_one(claim)`` (the single-message path's drop) stops renewing that claim only: it
    lapses after its lease while the other stays held."""
    store = MemoryDedupStore()
    rounds: List[int] = []
    keeper = LeaseKeeper(store, lambda renewed, lost, seconds, ok: rounds.append(renewed))
    kept, dropped = _claimed(store, "kept", 300), _claimed(store, "dropped", 300)
    try:
        keeper.hold_one(kept, 300, 600_000)
        keeper.hold_one(dropped, 300, 600_000)
        keeper.drop_one(dropped)
        wait_for(lambda: store.get_status(dropped.element) is None, timeout=5)
        wait_for(lambda: len(rounds) >= 4, timeout=5)
        assert store.get_status(kept.element) is DedupStatus.CONSUMING
        assert set(rounds) == {1}  # only the kept claim, every round
    finally:
        keeper.close()
