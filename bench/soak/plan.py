"""The seeded plan of a soak mode: which keys are sent, which twice and when, to which consumer
kind, how long each handler takes, which fail their first attempt, and when each fault
strikes. Pure: the same seed gives the same plan, and a key's index the same fate in every
mode."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Sequence

DUPLICATED_SHARE = 0.30  # of the keys, sent more than once
CONCURRENT_SHARE = 1 / 3  # of those duplicates, sent within 10 ms of the first copy
LATE_COPY_S = (2.0, 6.0)  # the other duplicates: this long after the first copy
HANDLER_MS = (1, 20)
FAIL_FIRST_SHARE = 0.05


@dataclass(frozen=True)
class Send:
    """One copy of a key, ``at_s`` seconds after the producer starts."""

    at_s: float
    key: str
    copy: int


@dataclass(frozen=True)
class Fault:
    kind: str  # "sigkill", "redis_kill", "mysql_kill", "postgres_kill", "broker_restart"
    at_s: float


#: The consumer kinds a soak slot can run, and how the report names them.
KINDS = {"classic": "classic push", "grpc": "5.x push", "orderly": "classic orderly"}
#: Every mode's consumer processes, one slot each, the control's too (the same mix and the same
#: keys per kind everywhere: see SOAK.md). Each kind consumes its own topic and group.
DEFAULT_CONSUMERS = ("classic", "classic", "classic", "grpc")


def key_name(run_id: str, index: int) -> str:
    return f"{run_id}-{index:06d}"


def key_index(key: str) -> str:
    """The part of a key that is the same in every mode (``key_name``'s index): keys of
    different modes with one index share their plan, their handler time and their failure."""
    return key.rpartition("-")[2]


def kind_of(key: str, kinds: Sequence[str]) -> str:
    """The consumer kind whose channel (topic and group) ``key`` is sent to: slot ``index %
    len(kinds)``'s, the same in every mode, so each kind gets its share of the keys."""
    return kinds[int(key_index(key)) % len(kinds)]


def handler_ms(key: str) -> int:
    """How long the handler of ``key`` takes (1-20 ms), the same in every process and mode."""
    low, high = HANDLER_MS
    return low + _unit(key_index(key), "ms") % (high - low + 1)


def fails_first(key: str) -> bool:
    """Whether the handler of ``key`` fails on the message's first attempt (5 %), the same
    keys in every mode."""
    return _unit(key_index(key), "fail") % 10_000 < FAIL_FIRST_SHARE * 10_000


def _unit(key: str, salt: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest(), "big")


def sends(run_id: str, keys: int, send_s: float, seed: int) -> list[Send]:
    """Every copy to send, in time order: the first copies spread evenly over ``send_s``
    seconds; 30 % of the keys get a second copy, a third of those 0-10 ms after the first,
    the others 2-6 s after."""
    rng = random.Random(seed)
    plan = []
    for i in range(keys):
        key = key_name(run_id, i)
        at = send_s * i / keys
        plan.append(Send(at, key, 0))
        if rng.random() < DUPLICATED_SHARE:
            if rng.random() < CONCURRENT_SHARE:
                plan.append(Send(at + rng.uniform(0.0, 0.010), key, 1))
            else:
                plan.append(Send(at + rng.uniform(*LATE_COPY_S), key, 1))
    plan.sort(key=lambda s: (s.at_s, s.key, s.copy))
    return plan


#: The store kills of every run; a run with a PostgreSQL mode adds ``postgres_kill``.
STORE_KILLS = ("redis_kill", "mysql_kill")


def faults(
    send_s: float, seed: int, sigkills: int = 3, stores: Sequence[str] = STORE_KILLS
) -> list[Fault]:
    """The faults, at seeded moments while messages flow (between 10 % and 90 % of the send
    time), at least 3 s apart so each one's recovery is seen on its own: ``sigkills`` consumer
    kills and one kill of each store in ``stores``. The broker restart comes last: nothing
    flows for the 15-45 s it takes, and a fault then would hit no message."""
    rng = random.Random(seed ^ 0x5EED)
    kinds = ["sigkill"] * sigkills + list(stores)
    rng.shuffle(kinds)
    kinds.append("broker_restart")
    slots = len(kinds)
    span = 0.8 * send_s / slots
    return [
        Fault(kind, round(0.1 * send_s + span * i + rng.uniform(0.0, span * 0.5), 2))
        for i, kind in enumerate(kinds)
    ]
