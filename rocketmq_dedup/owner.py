"""Owner tokens: who holds a claim, unique across processes and hosts, and since when.

A token reads ``<12 random hex>.<pid>.<counter>@<epoch seconds>``: the random part and the pid
make it unique (and fork-safe: a child draws a new random part), the time lets an operator see
how long a claim has been held (``rocketmq-dedup stats``). Stores treat it as an opaque string.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Optional


class _OwnerTokens:
    """Unique claim tokens: a random per-process prefix plus a counter, stamped with the time."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = f"{os.urandom(6).hex()}.{os.getpid()}."
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter)}@{int(time.time())}"


new_owner_token = _OwnerTokens()


def claimed_at(owner: str) -> Optional[float]:
    """When the claim with this token was made (epoch seconds), or None for a token this
    library did not write (older versions, other programs)."""
    _, at, stamp = owner.rpartition("@")
    if not at or not stamp.isdigit():
        return None
    return float(stamp)
