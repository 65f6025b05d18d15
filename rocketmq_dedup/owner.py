"""Owner tokens: who holds a claim, unique across processes and hosts, and since when.

A token reads ``<12 random hex>.<pid>.<counter>@<epoch seconds>[#<payload fingerprint>]``: the
random part and the pid make it unique (and fork-safe: a child draws a new random part), the
time lets an operator see how long a claim has been held (``rocketmq-dedup stats``), and the
optional fingerprint (16 hex digits) lets a duplicate's payload be compared with the first
one's. Stores treat it as an opaque string (at most 64 characters).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from typing import Optional


class _OwnerTokens:
    """Unique claim tokens: a random per-process prefix plus a counter, stamped with the time
    (its ``@<seconds>`` text made once a second: the cheapest of the ways measured, on the
    path of every message)."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.prefix = f"{os.urandom(6).hex()}.{os.getpid()}."
        self._counter = itertools.count(1)
        self._stamp = ""
        self._next_second = 0.0

    def next(self) -> str:
        """A new token."""
        now = time.time()
        if now >= self._next_second:
            second = int(now)
            self._stamp, self._next_second = f"@{second}", second + 1
        return f"{self.prefix}{next(self._counter)}{self._stamp}"

    __call__ = next


#: The process's tokens: ``owner_tokens.next()`` is a new one (looked up per call: a fork
#: replaces it).
owner_tokens = _OwnerTokens()


def new_owner_token() -> str:
    """A new owner token (see the module docstring); unique in this process and its forks."""
    return owner_tokens.next()


def fingerprint_of(payload: bytes) -> str:
    """The fingerprint of a payload: 64 bits of its SHA-256, in hex."""
    return hashlib.sha256(payload).hexdigest()[:16]


def with_fingerprint(owner: str, print_: str) -> str:
    """``owner`` carrying a payload fingerprint."""
    return f"{owner}#{print_}"


def fingerprint_in(owner: Optional[str]) -> Optional[str]:
    """The payload fingerprint a token carries, or None."""
    if not owner:
        return None
    _, mark, print_ = owner.rpartition("#")
    return print_ if mark else None


def claimed_at(owner: str) -> Optional[float]:
    """When the claim with this token was made (epoch seconds), or None for a token this
    library did not write (older versions, other programs)."""
    _, at, stamp = owner.partition("#")[0].rpartition("@")
    if not at or not stamp.isdigit():
        return None
    return float(stamp)
