"""The Redis store's coalescer called from native threads (as librocketmq calls the listener):
every callback has a fresh Python thread state, so nothing per thread survives between calls;
the wakers of waiting callbacks are reused from the coalescer's free-list instead of being made
(an eventfd: two syscalls) and closed again on every callback."""

from __future__ import annotations

import ctypes
import gc
import os
import uuid
from typing import Any, List

import pytest
import redis

from rocketmq_dedup import DedupElement
from rocketmq_dedup.stores import coalesce
from rocketmq_dedup.stores.base import Claim
from rocketmq_dedup.stores.redis import RedisDedupStore
from tests.native import run_callbacks

THREADS, CALLS = 4, 100
WAKERS: List[Any] = [coalesce.LockWaker]
if hasattr(os, "eventfd"):
    WAKERS.insert(0, coalesce.EventFdWaker)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
@pytest.mark.parametrize("waker", WAKERS, ids=lambda w: w.__name__)
def test_native_callbacks_reuse_wakers(
    native_lib: ctypes.CDLL, redis_client: redis.Redis, waker: Any
) -> None:
    """4 native threads x 100 claims: every claim succeeds, callbacks that waited reused
    wakers (no more made than threads), and no file descriptor is left behind."""
    made: List[Any] = []
    waits: List[int] = []

    class CountedWaker(waker):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def wait(self) -> None:
            waits.append(1)
            super().wait()

    def factory() -> Any:
        made.append(CountedWaker())
        return made[-1]

    store = RedisDedupStore(redis_client, waker=factory)
    app = f"app-{uuid.uuid4().hex[:12]}"
    store.claim(Claim(DedupElement(app, "T", "", "warm-up"), "o"), 60_000)
    gc.collect()
    fds = open_fds()

    def claim(index: int) -> int:
        claimed = store.claim(Claim(DedupElement(app, "T", "", str(index)), "o"), 60_000).claimed
        return 0 if claimed else 1

    successes, _ = run_callbacks(native_lib, claim, THREADS, CALLS)
    assert successes == THREADS * CALLS
    assert len(waits) > len(made)  # callbacks waited, on wakers made for earlier callbacks
    assert len(made) <= THREADS
    kept = len(store.coalescer.spare_wakers())  # type: ignore[union-attr]
    made.clear()
    gc.collect()
    assert open_fds() <= fds + (kept if waker is coalesce.EventFdWaker else 0)
    store.close()
