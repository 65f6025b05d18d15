"""The soak's accounting beyond the verdict (:mod:`bench.soak.evidence`): delayed against lost,
which consumer kind each key went to, the answers (nacks) per kind, the busy span's throughput,
and each mode beside the control. Pure: unit-tested on synthetic evidence.

* **Lost or outstanding.** A key not applied when the run ended is *missing*. It is **lost**
  only if the run waited for it until its deadline (the full run: 5 minutes after the last
  fault) or, whatever the drain, if the dedup layer acked it without an effect (that message
  is not coming back). A run that stopped draining earlier (the quick run) reports its other
  missing keys as **outstanding**: still out, not lost. Keys found in the DLQ are
  ``dead_lettered``: held by the broker, neither.
* **Consumer kind of a key**: the kind (``classic``, ``grpc``, ``orderly``) whose topic and
  group it was sent to (:func:`bench.soak.plan.kind_of`: by its index, the same in every
  mode, the control's included): every delivery of a key goes to consumers of its kind.
* **Delay** of a key: its first application less the time its first copy's send succeeded.
  A key is **delayed** if that took longer than ``late_s``.
* **Stalls**: what the consumers' watchdogs measured (``stall`` lines): how often a process
  could not run Python for a second or more, the longest, and the worst few with their CPU
  use and the host's load.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from bench.soak.evidence import DEAD_LETTERED, LOST_BY_DEDUP, Effect, Event, fields
from bench.soak.plan import key_index

#: The kind of a pid the run does not know (a key's kind is always known).
NO_KIND = "none"
#: How a drain can end; the first two are final: what is missing then is lost.
FINAL_ENDS = ("all_applied", "deadline")
ENDS = (*FINAL_ENDS, "stopped", "idle")
#: Share of the keys applied that ends the busy span (msgs/s is measured over it).
BUSY_SHARE = 0.99


def missing_by_kind(
    missing: Mapping[str, str], key_kinds: Mapping[str, str]
) -> Dict[str, Dict[str, int]]:
    """{kind: {cause: keys}} of the missing keys (``missing``: key -> cause)."""
    table: Dict[str, Counter[str]] = defaultdict(Counter)
    for key, cause in missing.items():
        table[key_kinds.get(key, NO_KIND)][cause] += 1
    return {kind: dict(causes) for kind, causes in sorted(table.items())}


def answers_by_kind(events: Iterable[Event], kinds: Mapping[int, str]) -> Dict[str, Dict[str, int]]:
    """{kind: {"ack": n, "later": n}}: what each kind's consumers answered their client
    (``later``: RECONSUME_LATER, a nack)."""
    table: Dict[str, Counter[str]] = defaultdict(Counter)
    for event in events:
        if event.kind == "answer":
            table[kinds.get(event.pid, NO_KIND)][event.detail] += 1
    return {kind: {"ack": c["ack"], "later": c["later"]} for kind, c in sorted(table.items())}


def settle(missing: Mapping[str, str], drain_end: str) -> Dict[str, Any]:
    """What the missing keys count as (see the module doc)."""
    if drain_end not in ENDS:
        raise ValueError(f"unknown drain end {drain_end!r}")
    final = drain_end in FINAL_ENDS
    causes = Counter(missing.values())
    acked = causes[LOST_BY_DEDUP]
    transport = len(missing) - acked - causes[DEAD_LETTERED]
    return {
        "final": final,
        "lost": acked + (transport if final else 0),
        "outstanding": 0 if final else transport,
        "acked_not_applied": acked,
        "dead_lettered": causes[DEAD_LETTERED],
    }


def first_applied(effects: Iterable[Effect]) -> Dict[str, float]:
    """key -> the time of its first application."""
    first: Dict[str, float] = {}
    for effect in effects:
        if effect.key not in first or effect.at < first[effect.key]:
            first[effect.key] = effect.at
    return first


def delays(first_sent: Mapping[str, float], applied: Mapping[str, float]) -> Dict[str, float]:
    """key -> seconds from its first successful send to its first application (clock skew
    between processes clamped to 0)."""
    return {
        key: max(applied[key] - sent, 0.0) for key, sent in first_sent.items() if key in applied
    }


def delay_summary(key_delays: Mapping[str, float], late_s: float) -> Dict[str, Any]:
    """The delays of every applied key (median, p99, max) and of the delayed ones."""
    values = sorted(key_delays.values())
    late = [v for v in values if v > late_s]
    return {
        "median_s": _round(statistics.median(values)) if values else None,
        "p99_s": _round(_quantile(values, 0.99)),
        "max_s": _round(values[-1]) if values else None,
        "late_s": late_s,
        "delayed": len(late),
        "delayed_median_s": _round(statistics.median(late)) if late else None,
        "delayed_max_s": _round(late[-1]) if late else None,
    }


def busy_end(applied: Mapping[str, float], keys: int, start: float) -> Optional[float]:
    """When ``BUSY_SHARE`` of ``keys`` had been applied (None if they never were)."""
    need = math.ceil(BUSY_SHARE * keys)
    times = sorted(applied.values())
    if need == 0 or len(times) < need:
        return None
    return max(times[need - 1], start)


def throughput(decisions: Sequence[Event], start: float, end: Optional[float]) -> Dict[str, Any]:
    """Decisions per second over the busy span (the first send to ``end``; to the last
    decision when ``end`` is None)."""
    if end is None:
        end = max((e.at for e in decisions), default=start)
    span = end - start
    count = sum(start <= e.at <= end for e in decisions)
    return {"busy_s": round(span, 1), "msgs_per_s": round(count / span, 1) if span > 0 else 0.0}


def cpu_per_message(
    cpu_s: Mapping[int, float], decisions: Iterable[Event], kinds: Mapping[int, str]
) -> Dict[str, Optional[float]]:
    """Consumer CPU milliseconds per decision, per kind and ``all``."""
    count: Counter[str] = Counter(kinds.get(e.pid, NO_KIND) for e in decisions)
    spent: Dict[str, float] = defaultdict(float)
    for pid, seconds in cpu_s.items():
        spent[kinds.get(pid, NO_KIND)] += seconds
    out: Dict[str, Optional[float]] = {}
    for kind in sorted(set(spent) | set(count)):
        out[kind] = round(1000 * spent.get(kind, 0.0) / count[kind], 3) if count[kind] else None
    total = sum(count.values())
    out["all"] = round(1000 * sum(spent.values()) / total, 3) if total else None
    return out


def stall_summary(
    events: Iterable[Event], kinds: Mapping[int, str], start: float, worst: int = 5
) -> Dict[str, Any]:
    """The watchdogs' stalls: how many, how many of a second or more, their total and the
    longest; the ``worst`` longest with their process's kind, time (seconds since the first
    send), CPU seconds used meanwhile and the host's load."""
    stalls = []
    for event in events:
        if event.kind == "stall":
            said = fields(event.detail)
            gap = float(said.get("gap", "0"))
            stalls.append((gap, event, said))
    stalls.sort(key=lambda s: -s[0])
    return {
        "count": len(stalls),
        "over_1s": sum(gap >= 1.0 for gap, _, _ in stalls),
        "total_s": round(sum(gap for gap, _, _ in stalls), 1),
        "max_s": round(stalls[0][0], 2) if stalls else 0.0,
        "worst": [
            {"pid": e.pid, "kind": kinds.get(e.pid, NO_KIND), "at_s": round(e.at - gap - start, 1),
             "gap_s": round(gap, 2), "cpu_s": float(said.get("cpu", "nan")),
             "load": float(said.get("load", "nan"))}
            for gap, e, said in stalls[:worst]
        ],
    }  # fmt: skip


def compare(results: Mapping[str, Mapping[str, Any]], control: str) -> Dict[str, Any]:
    """Each mode beside the control: missing keys per kind and cause, lost, outstanding,
    nacks, the missing keys' rate per 1,000 keys of each kind, and how many key indices both
    miss (the plan gives a key index the same copies, handler time and failure in every
    mode). Empty without a control result."""
    theirs = results.get(control)
    if theirs is None:
        return {}
    out: Dict[str, Any] = {}
    for spec, mine in results.items():
        if spec == control:
            continue
        kinds = sorted(set(mine["missing_by_kind"]) | set(theirs["missing_by_kind"]))
        causes = sorted(
            {c for r in (mine, theirs) for by in r["missing_by_kind"].values() for c in by}
        )
        out[spec] = {
            "lost": [mine["lost"], theirs["lost"]],
            "outstanding": [mine["outstanding"], theirs["outstanding"]],
            "missing_by_kind": {k: [_kind_total(mine, k), _kind_total(theirs, k)] for k in kinds},
            "missing_per_1000_keys": {
                k: [_rate(mine, k), _rate(theirs, k)] for k in kinds if k != NO_KIND
            },
            "missing_by_cause": {
                c: [_cause_total(mine, c), _cause_total(theirs, c)] for c in causes
            },
            "nacks": [_nacks(mine), _nacks(theirs)],
            "same_key_indices": len(
                {key_index(k) for k in mine["missing_keys"]}
                & {key_index(k) for k in theirs["missing_keys"]}
            ),
        }
    return out


def _kind_total(result: Mapping[str, Any], kind: str) -> int:
    return sum(result["missing_by_kind"].get(kind, {}).values())


def _cause_total(result: Mapping[str, Any], cause: str) -> int:
    return sum(by.get(cause, 0) for by in result["missing_by_kind"].values())


def _rate(result: Mapping[str, Any], kind: str) -> Optional[float]:
    keys = result["keys_by_kind"].get(kind, 0)
    return round(1000 * _kind_total(result, kind) / keys, 2) if keys else None


def _nacks(result: Mapping[str, Any]) -> int:
    return sum(int(a["later"]) for a in result["answers_by_kind"].values())


def _quantile(values: List[float], q: float) -> Optional[float]:
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 2)
