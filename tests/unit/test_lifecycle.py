"""Lifecycle and memory: dropped or closed listeners leave no thread, idle keepers exit, the
memory store and the caches stay bounded."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from typing import Any, List, Set

from rocketmq_dedup import DedupConcurrentListener, DedupConfig, DedupStatus, MemoryDedupStore
from rocketmq_dedup.message import DedupElement, element_digest
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.memory import SWEEP_MIN_GROWTH
from rocketmq_dedup.testing import ClassicMessage, ManualClock
from tests.support import wait_for

KEEPER = "rocketmq-dedup-lease-keeper"


def keeper_threads() -> int:
    return len(keepers())


def keepers() -> Set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == KEEPER}


class Slow(DedupConcurrentListener):
    """Holds each message until ``gate`` opens, so its lease is being renewed meanwhile."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        self.handled: List[Any] = []
        self.started: Set[threading.Thread] = set()  # the keeper threads seen while it ran

    def do_handle_msg(self, msg: Any) -> bool:
        self.gate.wait(10)
        self.handled.append(msg)
        return True


def busy_listener(lease_ms: int = 60_000) -> Slow:
    """A listener whose keeper thread is running (a handler held past its claim)."""
    config = DedupConfig.enable_dedup_consume_config(
        "app", MemoryDedupStore(), dedup_processing_expire_milli_seconds=lease_ms
    )
    listener = Slow(config)
    before = keepers()
    worker = threading.Thread(target=listener, args=(ClassicMessage("m1"),))
    worker.start()
    listener.started = wait_for(lambda: keepers() - before)
    listener.gate.set()
    worker.join()
    return listener


def test_dropped_listeners_leave_no_keeper_thread() -> None:
    """60 listeners that ran handlers and were dropped leave no lease-keeper thread."""
    before = keeper_threads()
    for _ in range(60):
        busy_listener()
    gc.collect()
    wait_for(lambda: keeper_threads() <= before, timeout=10)


def test_closed_listener_stops_its_keeper_at_once() -> None:
    """close() (or leaving ``with``) ends the keeper thread before it returns."""
    before = keeper_threads()
    with busy_listener() as listener:
        assert listener.handled
    assert keeper_threads() <= before


def test_idle_keeper_exits_and_restarts_on_the_next_claim() -> None:
    """With nothing held the keeper thread exits after one renewal interval; the next held
    claim starts it again."""
    listener = busy_listener(lease_ms=300)  # renewal interval 0.1 s
    assert listener.started
    wait_for(lambda: not (keepers() & listener.started), timeout=5)
    before = keepers()
    listener.gate.clear()
    worker = threading.Thread(target=listener, args=(ClassicMessage("m2"),))
    worker.start()
    wait_for(lambda: keepers() - before)
    listener.gate.set()
    worker.join()
    listener.close()


def test_memory_store_size_is_bounded_by_live_records() -> None:
    """Expired records are swept as new ones arrive: 30 000 short-lived claims leave at most
    twice the live records plus the sweep margin."""
    clock = ManualClock()
    store = MemoryDedupStore(clock=clock)
    for i in range(30_000):
        store.claim(Claim(DedupElement("app", "T", "", f"k{i}"), "o"), 1000)
        clock.advance(0.01)  # each record lives 100 claims
    assert len(store) <= 2 * 100 + SWEEP_MIN_GROWTH


def test_memory_store_records_leave_nothing_for_the_cyclic_gc() -> None:
    """Claimed and consumed records hold nothing the GC tracks once it has seen them: 20 000
    records add fewer than 200 tracked objects (kept as DedupElement and DedupStatus they
    added 40 000, and the GC's walks of them cost 0.9 us per fresh message)."""
    store = MemoryDedupStore()
    gc.collect()
    before = len(gc.get_objects())
    for i in range(20_000):
        claim = Claim(DedupElement("app", "T", "", f"k{i}"), f"o{i}")
        assert store.claim(claim, 60_000).claimed
        if i % 2:
            store.mark_consumed(claim, 60_000)
    gc.collect()
    assert len(store) == 20_000
    assert len(gc.get_objects()) - before < 200
    assert store.get_status(DedupElement("app", "T", "", "k1")) is DedupStatus.CONSUMED
    assert store.get_status(DedupElement("app", "T", "", "k2")) is DedupStatus.CONSUMING


def test_digest_cache_does_not_pin_large_keys() -> None:
    """Hashing 300 keys of 1 MiB keeps none of them alive (the cache takes small keys only)."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            element_digest(DedupElement("app", "T", "", str(i) + "x" * (1 << 20)))
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert retained < 4 << 20, f"{retained} bytes retained"
