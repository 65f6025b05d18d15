"""The ``outbox`` mode's own accounting (issue 35), beside the exactly-once verdict on A that
:mod:`bench.soak.evidence` gives. Pure: unit-tested on synthetic records.

The mode: consumers of A (``TransactionalDedupListener``, each with a relay in its process)
write A's effect and send B through the outbox in one transaction; a relay process of its own
sends too; consumers of B (``TransactionalDedupListener`` keyed on the outbox's message key)
apply B's effect in their transaction. The relays write ``b_sent <broker id>`` for every
acknowledged send of B, B's consumers ``b_answer ack|later`` for every delivery of B.

What the mode must show, and fails on:

* every A applied once (the exactly-once verdict: no double apply);
* **no B for an A that did not commit**: every B row of the outbox and every B applied
  downstream belongs to an A whose effect committed (``b_without_a``);
* every B applied downstream **exactly once** (``b_double_applied``), while it may be
  delivered more than once: ``b_sent_twice`` counts the B a relay sent again (a relay killed
  between the broker's acknowledgement and its mark, a mark lost with the database, a lease
  that ran out), each delivered again with the same key and dropped downstream;
* every B of an applied A applied downstream by the end (else ``b_missing``: lost if the run
  drained to its deadline, else outstanding).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Iterable, Mapping, Sequence

from bench.soak.evidence import Effect, Event

#: B's key for A's key (the upstream handler's ``keys=``).
B_SUFFIX = ":B"


def b_key(a_key: str) -> str:
    return a_key + B_SUFFIX


def a_key(key: str) -> str:
    return key[: -len(B_SUFFIX)] if key.endswith(B_SUFFIX) else key


def account(
    a_effects: Iterable[Effect],
    b_effects: Iterable[Effect],
    b_events: Iterable[Event],
    outbox_rows: Mapping[str, str],
) -> Dict[str, Any]:
    """The outbox section of the mode's report. ``outbox_rows``: B key -> status of the run's
    rows of the outbox table."""
    a_applied = {e.key for e in a_effects}
    b_applied = Counter(a_key(e.key) for e in b_effects)
    sends = Counter(a_key(e.key) for e in b_events if e.kind == "b_sent")
    answers = [e for e in b_events if e.kind == "b_answer"]
    deliveries = Counter(a_key(e.key) for e in answers)
    rows = {a_key(k): status for k, status in outbox_rows.items()}
    without_a = sorted((set(rows) | set(b_applied)) - a_applied)
    missing = sorted(a_applied - set(b_applied))
    return {
        "a_applied": len(a_applied),
        "b_rows": len(rows),
        "b_rows_by_status": dict(Counter(rows.values())),
        "b_sent": len(sends),
        "b_sends": sum(sends.values()),
        "b_sent_twice": sum(1 for n in sends.values() if n > 1),
        "b_delivered": len(deliveries),
        "b_deliveries": sum(deliveries.values()),
        "b_delivered_twice": sum(1 for n in deliveries.values() if n > 1),
        "b_nacks": sum(1 for e in answers if e.detail == "later"),
        "b_applied": len(b_applied),
        "b_double_applied": sum(1 for n in b_applied.values() if n > 1),
        "b_without_a": len(without_a),
        "b_without_a_keys": without_a[:20],
        "b_missing": len(missing),
        "b_missing_keys": missing[:20],
    }


def failed(section: Mapping[str, Any]) -> Sequence[str]:
    """What in the section fails the run (empty: nothing)."""
    reasons = []
    if section["b_double_applied"]:
        reasons.append(f"{section['b_double_applied']} B applied twice downstream")
    if section["b_without_a"]:
        reasons.append(f"{section['b_without_a']} B without a committed A")
    return reasons


__all__ = ["B_SUFFIX", "a_key", "account", "b_key", "failed"]
