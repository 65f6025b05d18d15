"""What a soak mode's records say: keys lost, keys applied more than once, and why.

Each key applied more than once is explained by the first application's evidence, or counted
as unexplained (a defect to fix, not a number to report):

* ``killed_before_mark``: the first applier was SIGKILLed after its effect and before its
  decision was reported (its CONSUMED mark never confirmed); the claim lapsed after the lease
  and a redelivery ran the handler again.
* ``record_lost_with_store``: the first application's CONSUMED mark was confirmed, then the
  store was killed within ``AOF_WINDOW_S`` (Redis with ``appendfsync everysec`` loses up to a
  second of writes), and the second application came after the restart.
* ``ran_without_dedup``: an application ran without dedup while the store was unreachable
  (``store_failure_policy="consume"``: outcome ``store_error_consumed``).
* ``mark_failed``: the handler succeeded but its CONSUMED mark failed (store outage): the
  message was acked, the claim lapsed after the lease, a later copy ran again.
* ``ambiguous_effect_commit``: writing the effect raised (MariaDB killed during the commit)
  although the row was committed; the handler failed, so the broker's retry ran it again.

In the control (``no-dedup``) every duplicate copy runs its handler: its double applies are
``no_dedup``, the point of having dedup, not a defect.

Each key not applied when the run ended (a *missing* key: lost if the run waited until its
deadline, else still outstanding, see :mod:`bench.soak.accounting`) is classified too, by what
the dedup layer answered for it:

* ``acked_without_effect``: some delivery of it was acked (``consumed`` or
  ``duplicate_consumed``) and no effect row exists: the one loss the dedup layer can cause, a
  defect that fails the run. (A ``store_error_consumed`` or ``no_key`` delivery ran the
  handler, so with no effect row its handler failed and the answer was RECONSUME_LATER.)
* ``not_redelivered_after_broker_restart``: every answer was "not consumed" (handler failure,
  duplicate in progress, store error), the last within ``NACK_WINDOW_S`` before a broker
  restart, and the message never came back.
* ``not_redelivered``: the same with no restart near: the retry was not due before the drain
  ended, or the client dropped it (rocketmq-client-cpp drops a message whose ``sendMessageBack``
  fails; the report counts those failures from the consumers' client logs).
* ``never_delivered``: the broker acked the send and no consumer ever decided it.
* ``dead_lettered``: it is in the group's ``%DLQ%`` topic (every retry answered
  RECONSUME_LATER): not lost, held by the broker for a human.

The causes but the first happened in the transport (the broker and its clients): the dedup
layer never acked these messages. They are reported, not failed on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Collection, Dict, Iterable, List, Optional, Sequence, Tuple

#: Redis ``appendfsync everysec``: a write is on disk within about a second; with margin.
AOF_WINDOW_S = 2.5
#: An effect_error counts for an application if it is this close to the row's time.
EFFECT_ERROR_WINDOW_S = 10.0

#: A nack this long before a broker restart may be lost with the restart (see the module doc).
NACK_WINDOW_S = 10.0
LOST_BY_BROKER = "not_redelivered_after_broker_restart"
#: The only loss the dedup layer can cause (see the module doc).
LOST_BY_DEDUP = "acked_without_effect"
DEAD_LETTERED = "dead_lettered"
#: Every cause of a missing key, in the report's order.
MISSING_CAUSES = (
    LOST_BY_DEDUP,
    LOST_BY_BROKER,
    "not_redelivered",
    "never_delivered",
    DEAD_LETTERED,
)
#: Outcomes whose answer is an ack whatever the handler did (the handler did not run, or it
#: succeeded; a ``consumed`` decision may end in ``:mark_ok``/``:mark_failed``).
ACKED = ("consumed", "duplicate_consumed")

CAUSES = (
    "killed_before_mark",
    "record_lost_with_store",
    "ran_without_dedup",
    "mark_failed",
    "ambiguous_effect_commit",
    "no_dedup",
)


@dataclass(frozen=True)
class Event:
    at: float
    pid: int
    key: str
    kind: str  # effect, effect_error, decision, answer
    detail: str


@dataclass(frozen=True)
class Effect:
    key: str
    pid: int
    at: float


@dataclass(frozen=True)
class Kill:
    kind: str  # sigkill, redis_kill, mysql_kill
    at: float
    pid: Optional[int] = None  # the consumer killed (sigkill)


@dataclass
class Verdict:
    keys: int
    applied_keys: int
    lost: List[str]  # the keys missing (not applied) when the run ended
    doubles: Dict[str, Optional[str]]  # key -> cause (None: unexplained)
    causes: Dict[str, int] = field(default_factory=dict)
    lost_causes: Dict[str, str] = field(default_factory=dict)  # key -> why it was not applied

    @property
    def unexplained(self) -> List[str]:
        return sorted(k for k, cause in self.doubles.items() if cause is None)


def parse_events(lines: Iterable[str]) -> List[Event]:
    """Evidence lines ``<time> <pid> <key> <kind> <detail>``; a torn last line is skipped."""
    events = []
    for line in lines:
        parts = line.split()
        if len(parts) != 5:
            continue
        try:
            events.append(Event(float(parts[0]), int(parts[1]), parts[2], parts[3], parts[4]))
        except ValueError:
            continue
    return events


def judge(
    keys: Sequence[str],
    effects: Sequence[Effect],
    events: Sequence[Event],
    kills: Sequence[Kill],
    store_kill: str,
    dead_lettered: Collection[str] = (),
    dedup: bool = True,
) -> Verdict:
    """The verdict on one mode: ``store_kill`` is the fault kind that restarts its store
    (``redis_kill`` or ``mysql_kill``); ``dead_lettered`` the keys found in the DLQ; ``dedup``
    False for the control (its double applies are ``no_dedup``)."""
    by_key: Dict[str, List[Effect]] = defaultdict(list)
    for effect in effects:
        by_key[effect.key].append(effect)
    events_by_key: Dict[str, List[Event]] = defaultdict(list)
    for event in events:
        events_by_key[event.key].append(event)
    killed = {k.pid: k.at for k in kills if k.kind == "sigkill" and k.pid is not None}
    store_kills = [k.at for k in kills if k.kind == store_kill]
    doubles: Dict[str, Optional[str]] = {}
    for key, applied in by_key.items():
        if len(applied) > 1:
            applied.sort(key=lambda e: e.at)
            doubles[key] = (
                explain(applied, events_by_key.get(key, []), killed, store_kills)
                if dedup
                else "no_dedup"
            )
    causes = {cause: 0 for cause in CAUSES}
    for cause in doubles.values():
        if cause is not None:
            causes[cause] += 1
    lost = sorted(set(keys) - set(by_key))
    applied_keys = len(set(keys) & set(by_key))
    restarts = [k.at for k in kills if k.kind == "broker_restart"]
    dead = set(dead_lettered)
    lost_causes = {
        key: DEAD_LETTERED if key in dead else why_lost(events_by_key.get(key, []), restarts)
        for key in lost
    }
    return Verdict(len(keys), applied_keys, lost, doubles, causes, lost_causes)


def why_lost(events: Sequence[Event], restarts: Sequence[float]) -> str:
    """Why a key was not applied (see the module doc; ``dead_lettered`` is found by
    :func:`judge`)."""
    decisions = [e for e in events if e.kind == "decision"]
    if not decisions:
        return "never_delivered"
    if any(e.detail.startswith(ACKED) for e in decisions):
        return LOST_BY_DEDUP
    last = max(e.at for e in decisions)
    if any(last <= at <= last + NACK_WINDOW_S for at in restarts):
        return LOST_BY_BROKER
    return "not_redelivered"


def explain(
    applied: Sequence[Effect],
    events: Sequence[Event],
    killed: Dict[int, float],
    store_kills: Sequence[float],
) -> Optional[str]:
    """The cause of a key's second application, from its first application's evidence."""
    first, second = applied[0], applied[1]
    decisions = [e for e in events if e.kind == "decision"]
    if any(e.detail.startswith("store_error_consumed") for e in decisions):
        return "ran_without_dedup"
    mine = [e for e in decisions if e.pid == first.pid and e.at >= first.at]
    if any(
        e.kind == "effect_error" and e.pid == first.pid and _near(e.at, first.at) for e in events
    ):
        return "ambiguous_effect_commit"
    consumed = [e for e in mine if e.detail.startswith("consumed")]
    if not consumed:
        if first.pid in killed and killed[first.pid] >= first.at:
            return "killed_before_mark"
        return None
    decided = consumed[0]
    if decided.detail.endswith(":mark_failed"):
        return "mark_failed"
    lost_with = [at for at in store_kills if decided.at - 0.5 <= at <= decided.at + AOF_WINDOW_S]
    if any(second.at > at for at in lost_with):
        return "record_lost_with_store"
    return None


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= EFFECT_ERROR_WINDOW_S


def summary(verdict: Verdict) -> Tuple[int, int]:
    """(double_applied, double_applied_explained)."""
    return len(verdict.doubles), len(verdict.doubles) - len(verdict.unexplained)
