"""What a soak mode's records say: keys lost, keys applied more than once, and why.

**A key applied more than once** (several effect rows) is explained applier by applier: every
application after the first needs a cause of its own, found in the evidence of the appliers
before it and its own (:mod:`bench.soak.consumer` lists the lines). Each application is matched
to the thread that wrote it (its ``effect_begin`` line carries the row's time), and so to that
thread's claim (outcome, owner token, time), the renewals and the mark of that owner, a SIGKILL
of its process and the stalls its watchdog measured. A later application is explained when it
ran without dedup, or when the record of every earlier application was not there to refuse its
claim, for one of these causes (the cause reported is the one of the latest earlier applier):

* ``ran_without_dedup``: the application ran while the store was unreachable (its claim raised;
  ``store_failure_policy="consume"``: outcome ``store_error_consumed``), or an earlier one did
  and so left no record.
* ``killed_before_mark``: the earlier applier's process was SIGKILLed after its effect and
  before its CONSUMED mark (or before its deferred mark, ``mark deferred``, rode a round trip:
  the listener answers first); its claim lapsed one lease after its last renewal.
* ``mark_failed``: the earlier applier's handler succeeded but its CONSUMED mark failed (store
  outage): the message was acked and the claim lapsed after the lease.
* ``record_lost_with_store``: the earlier applier's last write (claim, renewal or mark) was
  confirmed within ``AOF_WINDOW_S`` before Redis was killed (``appendfsync everysec`` loses up
  to a second of writes), and the later claim came after the restart. (A MariaDB ``kill -9``
  loses no committed row: ``innodb_flush_log_at_trx_commit=2`` writes the log at each commit.)
* ``ambiguous_effect_commit``: writing the earlier effect raised (MariaDB killed during the
  commit) although the row was committed; its handler failed, so the claim was released and
  the broker's retry ran it again.
* ``lease_lapsed_under_stall``: the later claim came after the earlier claim's lease could have
  lapsed (one lease after its last confirmed write), before the earlier applier marked it, and
  the earlier applier's process was measured stalled (its watchdog, ``stall`` lines) for most
  of the time in which its LeaseKeeper should have renewed it or its mark should have landed.
* ``lease_lapsed_store``: the same, but the time is covered by the earlier applier's store
  calls failing or hanging (a renewal that raised, until the next one was due; store calls
  that took ``SLOW_CALL_S`` or more; a mark in flight; a renewal begun, ``renew_begin``, that
  never answered before its process was killed): the store did not answer in time.

Anything else is **unexplained**, with a note saying what the evidence showed, in particular a
claim that succeeded **while an earlier claim of the key was live** (before its earliest
possible lapse), or after an earlier CONSUMED mark was confirmed: a defect to fix, not a number
to report. In the control (``no-dedup``) every duplicate copy runs its handler: its double
applies are ``no_dedup``, the point of having dedup, not a defect.

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
from typing import Collection, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

#: Redis ``appendfsync everysec``: a write is on disk within about a second; with margin.
AOF_WINDOW_S = 2.5
#: The store kills that can lose confirmed writes (Redis's AOF, above; see the module doc).
LOSSY_STORE_KILLS = ("redis_kill",)
#: An effect_error counts for an application if it is this close to the row's time.
EFFECT_ERROR_WINDOW_S = 10.0
#: The soak's lease (``dedup_processing_expire_milli_seconds``), seconds; the LeaseKeeper
#: renews a held claim every third of it.
LEASE_S = 10.0
#: A store call this slow (seconds) counts as the store not answering in time.
SLOW_CALL_S = 1.0
#: A lapse is explained when stalls and slow store calls cover this share of the time in which
#: a renewal or the mark was due (the watchdog does not report gaps under its threshold).
COVERED_SHARE = 0.75
#: Matching an effect row's time to its ``effect_begin`` line (written with 4 decimals).
AT_TOLERANCE_S = 0.0002

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
#: Claim outcomes that hold the key (the ``claim`` line's first field).
CLAIMED = ("claimed", "taken_over")

WITHOUT_DEDUP = "ran_without_dedup"
CAUSES = (
    WITHOUT_DEDUP,
    "killed_before_mark",
    "mark_failed",
    "record_lost_with_store",
    "ambiguous_effect_commit",
    "lease_lapsed_under_stall",
    "lease_lapsed_store",
    "no_dedup",
)

Span = Tuple[float, float]  # (start, end), seconds since the epoch


@dataclass(frozen=True)
class Event:
    at: float
    pid: int
    key: str
    kind: str  # claim, renew, mark, release, effect_begin, effect, effect_error, decision,
    detail: str  # answer, stall (key "-")
    tid: int = 0  # the native thread that wrote it (0: not recorded)


@dataclass(frozen=True)
class Effect:
    key: str
    pid: int
    at: float


@dataclass(frozen=True)
class Kill:
    kind: str  # sigkill, redis_kill, mysql_kill, broker_restart
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
    #: key -> one entry per application: who applied it, its claim, and (after the first)
    #: its cause or what made it unexplained
    appliers: Dict[str, List[Dict[str, object]]] = field(default_factory=dict)

    @property
    def unexplained(self) -> List[str]:
        return sorted(k for k, cause in self.doubles.items() if cause is None)


def parse_events(lines: Iterable[str]) -> List[Event]:
    """Evidence lines ``<time> <pid> <thread id> <key> <kind> <detail>`` (or the older
    ``<time> <pid> <key> <kind> <detail>``); a torn last line is skipped."""
    events = []
    for line in lines:
        parts = line.split()
        try:
            if len(parts) == 6:
                at, pid, tid, key, kind, detail = parts
                events.append(Event(float(at), int(pid), key, kind, detail, int(tid)))
            elif len(parts) == 5:
                events.append(Event(float(parts[0]), int(parts[1]), *parts[2:]))
        except ValueError:
            continue
    return events


def fields(detail: str) -> Dict[str, str]:
    """A detail ``outcome,name=value,...`` as a dict (the outcome under ``""``)."""
    out: Dict[str, str] = {}
    for part in detail.split(","):
        name, eq, value = part.partition("=")
        if eq:
            out[name] = value
        else:
            out.setdefault("", part)
    return out


def span(event: Event) -> Span:
    """When the call an event reports ran: from its time less ``took`` to its time."""
    took = fields(event.detail).get("took")
    return (event.at - float(took), event.at) if took else (event.at, event.at)


@dataclass
class Applier:
    """One application of a key (an effect row) and its thread's evidence."""

    effect: Effect
    tid: Optional[int] = None
    claim: Optional[Event] = None
    outcome: str = "none"  # the claim's: claimed, taken_over, refused, error; none: no line
    owner: Optional[str] = None
    writes: List[Span] = field(default_factory=list)  # confirmed: claim, renewals, mark
    troubles: List[Span] = field(default_factory=list)  # store calls failed or slow, or in flight
    mark: Optional[Event] = None
    handler_end: Optional[float] = None  # its effect (or effect_error) line
    effect_error: bool = False
    without_dedup: bool = False
    killed_at: Optional[float] = None

    @property
    def marked(self) -> Optional[Span]:
        """When its CONSUMED mark ran, if it succeeded (a deferred one: unknown, see
        :attr:`mark_deferred`)."""
        if self.mark is not None and fields(self.mark.detail).get("") == "ok":
            return span(self.mark)
        return None

    @property
    def mark_deferred(self) -> bool:
        """Its CONSUMED mark was queued for a later round trip: it lands after the answer,
        unless the process is killed first."""
        return self.mark is not None and fields(self.mark.detail).get("") == "deferred"

    def describe(self) -> Dict[str, object]:
        return {
            "pid": self.effect.pid,
            "at": round(self.effect.at, 4),
            "claim": self.claim.detail if self.claim is not None else None,
            "claim_at": round(self.claim.at, 4) if self.claim is not None else None,
            "mark": self.mark.detail if self.mark is not None else None,
        }


@dataclass
class Context:
    """What every key's explanation shares: the lease, the kills, each process's stalls."""

    lease_s: float
    killed: Dict[int, float]  # pid -> when it was SIGKILLed
    lossy_kills: List[float]  # when the store was killed in a way that loses writes
    stalls: Dict[int, List[Span]]  # pid -> its watchdog's stalls


def stalls_by_pid(events: Iterable[Event]) -> Dict[int, List[Span]]:
    """pid -> the spans its watchdog measured stalled (``stall`` lines)."""
    out: Dict[int, List[Span]] = defaultdict(list)
    for event in events:
        if event.kind == "stall":
            gap = float(fields(event.detail).get("gap", "0"))
            out[event.pid].append((event.at - gap, event.at))
    return dict(out)


def judge(
    keys: Sequence[str],
    effects: Sequence[Effect],
    events: Sequence[Event],
    kills: Sequence[Kill],
    store_kill: str,
    dead_lettered: Collection[str] = (),
    dedup: bool = True,
    lease_s: float = LEASE_S,
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
    context = Context(
        lease_s,
        {k.pid: k.at for k in kills if k.kind == "sigkill" and k.pid is not None},
        [k.at for k in kills if k.kind == store_kill and k.kind in LOSSY_STORE_KILLS],
        stalls_by_pid(events),
    )
    doubles: Dict[str, Optional[str]] = {}
    appliers: Dict[str, List[Dict[str, object]]] = {}
    for key, applied in by_key.items():
        if len(applied) > 1:
            applied.sort(key=lambda e: e.at)
            if dedup:
                doubles[key], appliers[key] = explain(applied, events_by_key.get(key, []), context)
            else:
                doubles[key] = "no_dedup"
    causes: Dict[str, int] = defaultdict(int)
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
    return Verdict(len(keys), applied_keys, lost, doubles, dict(causes), lost_causes, appliers)


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


# -- one key applied more than once ----------------------------------------------------------


def explain(
    applied: Sequence[Effect], events: Sequence[Event], context: Context
) -> Tuple[Optional[str], List[Dict[str, object]]]:
    """The cause of a key's extra applications (None if any of them is unexplained), and each
    application's evidence and verdict. The appliers are taken in the order of their claims
    (an applier that claimed first may write its effect last): each one after the first must
    say why the records of those before it did not refuse its claim."""
    ordered = sorted(events, key=lambda e: e.at)
    appliers = sorted((applier_of(effect, ordered, context) for effect in applied), key=claim_time)
    described = [appliers[0].describe()]
    causes: List[Optional[str]] = []
    for i, later in enumerate(appliers[1:], start=1):
        cause, note = explain_later(later, appliers[:i], context)
        causes.append(cause)
        described.append({**later.describe(), "cause": cause, "note": note})
    if any(cause is None for cause in causes):
        return None, described
    return causes[-1], described


def claim_time(applier: Applier) -> float:
    """When the applier's claim returned (its effect's time if no claim line)."""
    return applier.claim.at if applier.claim is not None else applier.effect.at


def applier_of(effect: Effect, events: Sequence[Event], context: Context) -> Applier:
    """The evidence of the thread that wrote ``effect`` (``events``: its key's, in time
    order)."""
    applier = Applier(effect)
    begin = next(
        (
            e
            for e in events
            if e.kind == "effect_begin"
            and e.pid == effect.pid
            and abs(e.at - effect.at) <= AT_TOLERANCE_S
        ),
        None,
    )
    if begin is not None:
        applier.tid = begin.tid
    mine = [
        e
        for e in events
        if e.pid == effect.pid and (applier.tid is None or e.tid in (applier.tid, 0))
    ]
    claims = [e for e in mine if e.kind == "claim" and e.at <= effect.at + AT_TOLERANCE_S]
    if claims:
        applier.claim = claim = claims[-1]
        claim_fields = fields(claim.detail)
        applier.outcome = claim_fields.get("", "none")
        applier.owner = claim_fields.get("owner")
        applier.without_dedup = applier.outcome == "error"
        if applier.outcome in CLAIMED:
            applier.writes.append(span(claim))
    after = [e for e in mine if e.at >= effect.at - AT_TOLERANCE_S]
    ended = next((e for e in after if e.kind in ("effect", "effect_error")), None)
    if ended is not None:
        applier.handler_end = ended.at
        applier.effect_error = ended.kind == "effect_error"
    if applier.claim is None:  # (evidence without claim lines: the decision tells)
        decided = next((e for e in after if e.kind == "decision"), None)
        applier.without_dedup = decided is not None and decided.detail == "store_error_consumed"
    killed = context.killed.get(effect.pid)
    if applier.owner is not None:
        renewing: Optional[float] = None  # a renewal begun and not answered yet, since
        for event in events:
            if event.kind not in ("renew_begin", "renew", "mark"):
                continue
            said = fields(event.detail)
            if said.get("owner") != applier.owner:
                continue
            if event.kind == "renew_begin":
                renewing = event.at if renewing is None else renewing
                continue
            if event.kind == "renew":
                renewing = None
            outcome, call = said.get(""), span(event)
            if outcome == "error" and event.kind == "renew":  # no other try until the next
                applier.troubles.append((call[0], call[1] + context.lease_s / 3))  # renewal
            elif outcome == "error" or call[1] - call[0] >= SLOW_CALL_S:
                applier.troubles.append(call)
            if event.kind == "renew" and outcome == "ok":
                applier.writes.append(call)
            if event.kind == "mark" and applier.mark is None:
                applier.mark = event
                if outcome == "ok":
                    applier.writes.append(call)
                    applier.troubles.append(call)  # the record's fate was in flight
        if renewing is not None and killed is not None:  # in flight until its process died
            applier.troubles.append((renewing, killed))
    if killed is not None and killed >= effect.at:
        marked = applier.marked
        if marked is None or marked[1] > killed:
            applier.killed_at = killed
    applier.writes.sort()
    return applier


def explain_later(
    later: Applier, earlier: Sequence[Applier], context: Context
) -> Tuple[Optional[str], str]:
    """Why ``later`` applied the key again after ``earlier`` had claimed it: (cause, note),
    cause None when the evidence does not explain it."""
    if later.without_dedup:
        return WITHOUT_DEDUP, "its claim failed (store unreachable): ran without dedup"
    if later.outcome not in CLAIMED or later.claim is None:
        return None, f"applied after a claim that was {later.outcome}"
    cause: Optional[str] = None
    note = ""
    for before in earlier:
        cause, note = not_in_the_way(before, span(later.claim), context)
        if cause is None:
            return None, note
    return cause, note


def not_in_the_way(before: Applier, claim: Span, context: Context) -> Tuple[Optional[str], str]:
    """Why ``before``'s record did not refuse a later claim (``claim``: when it ran): (cause,
    note); cause None when it should have."""
    who = f"pid {before.effect.pid}"
    if before.without_dedup:
        return WITHOUT_DEDUP, f"{who} ran without dedup: no record"
    if before.outcome not in CLAIMED:
        return None, f"{who} applied after a claim that was {before.outcome}"
    if before.effect_error:
        return "ambiguous_effect_commit", f"{who}'s effect raised: its claim was released"
    lost = lost_with_store(before, claim, context)
    marked = before.marked
    if marked is not None and marked[1] <= claim[0]:
        if lost:
            return "record_lost_with_store", f"Redis was killed just after {who}'s mark"
        return None, f"claimed {claim[0] - marked[1]:.3f}s after {who}'s CONSUMED mark"
    verdict: Tuple[Optional[str], str] = (None, "")
    for at, confirmed in landings(before, claim):
        verdict = lapsed_at(before, at, confirmed, lost, context)
        if verdict[0] is not None:
            break
    return verdict


def landings(before: Applier, claim: Span) -> Iterator[Tuple[float, List[Span]]]:
    """The instants at which the later ``claim`` may have run (the server ran it at some moment
    of its call), each with the earlier applier's writes surely landed by then: the latest
    instant with the writes confirmed before the call began (the rule for a short call), the
    moment just before each write confirmed during the call, and the call's end with every
    write confirmed by then. A claim in flight for seconds (a MariaDB restart) may have run
    after the earlier claim lapsed, while that applier's renewal or mark hung."""
    writes = sorted(before.writes, key=lambda w: w[1])
    yield claim[1], [w for w in writes if w[1] <= claim[0]]
    for end in sorted({w[1] for w in writes if claim[0] < w[1] <= claim[1]}):
        yield end, [w for w in writes if w[1] < end]
    yield claim[1], [w for w in writes if w[1] <= claim[1]]


def lapsed_at(
    before: Applier, at: float, confirmed: List[Span], lost: bool, context: Context
) -> Tuple[Optional[str], str]:
    """Why ``before``'s record did not refuse a claim run at ``at``, its ``confirmed`` writes
    landed by then: (cause, note); cause None when it should have."""
    who = f"pid {before.effect.pid}"
    if before.marked is not None and before.marked in confirmed:
        return None, f"claimed after {who}'s CONSUMED mark had landed"
    lapse = confirmed[-1][0] + context.lease_s if confirmed else at  # earliest possible
    if at < lapse or not confirmed:
        if lost:
            return "record_lost_with_store", f"Redis was killed just after {who}'s last write"
        if not confirmed:
            return None, f"claimed while {who}'s own claim was in flight: both won"
        return None, (
            f"claimed while {who}'s claim was live ({lapse - at:.3f}s before it could lapse)"
        )
    if before.killed_at is not None and before.killed_at <= lapse:
        return "killed_before_mark", f"{who} was SIGKILLed after its effect, before its mark"
    if before.mark is not None and before.marked is None and not before.mark_deferred:
        return "mark_failed", f"{who}'s CONSUMED mark failed"
    cause, note = lapse_cause(before, confirmed[-1], lapse, context)
    if cause is None and lost:
        return "record_lost_with_store", f"Redis was killed just after {who}'s last write"
    return cause, note


def lost_with_store(before: Applier, claim: Span, context: Context) -> bool:
    """Whether ``before``'s record may have been lost with the store: killed within
    AOF_WINDOW_S after its last confirmed write, before the later ``claim``, and not written
    again between the restart and that claim."""
    for kill in context.lossy_kills:
        if kill >= claim[1]:
            continue
        written = [w for w in before.writes if w[0] <= kill + 0.5]
        rewritten = any(kill + 0.5 < w[0] and w[1] < claim[0] for w in before.writes)
        if written and kill - written[-1][1] <= AOF_WINDOW_S and not rewritten:
            return True
    return False


def lapse_cause(
    before: Applier, last: Span, lapse: float, context: Context
) -> Tuple[Optional[str], str]:
    """Why ``before``'s claim could lapse (at ``lapse``, a lease after its ``last`` confirmed
    write) before it was marked: from when its next renewal was due (a third of a lease after
    that write; its handler's end if that came first: the mark is due then, nothing renews
    after the handler) to the lapse, its process stalled (``lease_lapsed_under_stall``) or its
    store calls failed or hung (``lease_lapsed_store``), for COVERED_SHARE of that time. Else
    unexplained."""
    due = last[1] + context.lease_s / 3
    if before.handler_end is not None and last[1] <= before.handler_end < due:
        due = before.handler_end
    window = (due, lapse)
    length = max(lapse - due, 0.0)
    stalls = context.stalls.get(before.effect.pid, [])
    stalled = covered(stalls, window)
    troubled = covered(before.troubles, window)
    either = covered([*stalls, *before.troubles], window)
    said = (
        f"pid {before.effect.pid}'s claim could lapse {lapse - last[1]:.1f}s after its last "
        f"confirmed write; of the {length:.1f}s in which a renewal or its mark was due, "
        f"{stalled:.1f}s stalled, {troubled:.1f}s in failing or slow store calls"
    )
    if length == 0.0 or either < COVERED_SHARE * length:
        return None, said
    return ("lease_lapsed_under_stall" if stalled >= troubled else "lease_lapsed_store"), said


def covered(spans: Iterable[Span], window: Span) -> float:
    """Seconds of ``window`` inside the union of ``spans``."""
    low, high = window
    total, reach = 0.0, low
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, high)
        if end > start:
            total += end - start
            reach = end
    return total


def summary(verdict: Verdict) -> Tuple[int, int]:
    """(double_applied, double_applied_explained)."""
    return len(verdict.doubles), len(verdict.doubles) - len(verdict.unexplained)
