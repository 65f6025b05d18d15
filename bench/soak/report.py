"""The soak report as a markdown table and a chart of decisions and faults over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from bench.soak.plan import KINDS

COLUMNS = (
    ("keys", "keys"),
    ("sent", "sent"),
    ("delivered", "delivered"),
    ("applied_keys", "applied"),
    ("lost", "lost"),
    ("outstanding", "outstanding"),
    ("acked_not_applied", "acked, not applied"),
    ("dead_lettered", "dead-lettered"),
    ("delayed", "delayed"),
    ("delayed_delay", "delay of the delayed (median / max s)"),
    ("double_applied", "double applied"),
    ("double_applied_explained", "explained"),
    ("nacks", "nacks"),
    ("client_sendback_failures", "client send-back failures"),
    ("dlq", "DLQ"),
    ("send_retries", "send retries"),
    ("drain", "drain s (end)"),
    ("msgs_per_s", "msgs/s"),
    ("cpu", "consumer CPU ms/msg"),
    ("stalls", "stalls >= 1 s (longest s)"),
)
TIMELINE_STEP_S = 5.0


def _cell(result: Dict[str, Any], key: str) -> str:
    delay = result["delay"]
    derived = {
        "delayed": delay["delayed"],
        "delayed_delay": "-" if not delay["delayed"]
        else f"{delay['delayed_median_s']:.0f} / {delay['delayed_max_s']:.0f}",
        "nacks": sum(a["later"] for a in result["answers_by_kind"].values()),
        "drain": f"{result['drain_s']} ({result['drain_end']})",
        "cpu": result["cpu_ms_per_msg"].get("all"),
        "stalls": _stalls(result.get("stalls")),
    }  # fmt: skip
    value = derived[key] if key in derived else result[key]
    return f"{value:,}" if isinstance(value, int) else str(value)


def _stalls(stalls: Any) -> str:
    if not stalls:
        return "-"
    return f"{stalls['over_1s']:,} ({stalls['max_s']:.1f})"


def _kind(kind: str) -> str:
    return KINDS.get(kind, kind)


def _by_kind(table: Dict[str, Dict[str, int]]) -> str:
    parts = [
        f"{_kind(kind)}: " + ", ".join(f"{cause} {n}" for cause, n in causes.items())
        for kind, causes in table.items()
    ]
    return "; ".join(parts) or "none"


def table(report: Dict[str, Any]) -> str:
    """One row per mode; below, per mode, the missing keys by consumer kind and cause, the
    nacks per kind, the deadline and the faults; then each mode beside the control."""
    lines = [
        "| mode | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for mode, result in report["modes"].items():
        cells = [_cell(result, key) for key, _ in COLUMNS]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode, result in report["modes"].items():
        state = "lost" if result["final"] else "outstanding: the drain stopped early"
        nacks = ", ".join(
            f"{_kind(k)} {a['later']:,} of {a['ack'] + a['later']:,}"
            for k, a in result["answers_by_kind"].items()
        )
        causes = ", ".join(f"{k} {v}" for k, v in result["double_applied_causes"].items())
        faults = ", ".join(f"{f['kind']} {f['at_s']:.0f}s" for f in result["faults"])
        consumers = ", ".join(f"{n} {_kind(k)}" for k, n in result["consumers"].items())
        options = ", ".join(f"{k}={v}" for k, v in result["options"].items()) or "none"
        lines.append(
            f"- **{mode}** ({consumers}; options: {options}): missing ({state}): "
            f"{_by_kind(result['missing_by_kind'])}; nacks: {nacks or 'none'}; double "
            f"applied: {causes or 'none'}; deadline: {result['deadline']['rule']}; "
            f"faults: {faults}"
        )
        for key in result.get("unexplained_keys", []):
            appliers = result.get("double_applied_appliers", {}).get(key, [])
            notes = "; ".join(str(a["note"]) for a in appliers if a.get("note"))
            lines.append(f"  - unexplained `{key}`: {notes or 'no evidence'}")
    comparison = report.get("control") or {}
    if comparison:
        kinds = sorted({k for c in comparison.values() for k in c["missing_by_kind"]})
        lines += [
            "",
            "Beside the control (mode / control): missing keys per consumer kind, and per "
            "1,000 keys sent to that kind",
            "",
            "| mode | lost | outstanding | "
            + " | ".join(_kind(k) for k in kinds)
            + " | per 1,000 keys | nacks | same key indices |",
            "|---|" + "---:|" * (len(kinds) + 5),
        ]
        for mode, c in comparison.items():
            pair = " / ".join
            per_kind = [pair(map(str, c["missing_by_kind"].get(k, [0, 0]))) for k in kinds]
            rates = ", ".join(
                f"{_kind(k)} {pair(str(v) for v in rate)}"
                for k, rate in c["missing_per_1000_keys"].items()
            )
            lines.append(
                f"| {mode} | {pair(map(str, c['lost']))} | {pair(map(str, c['outstanding']))} | "
                + " | ".join(per_kind)
                + f" | {rates} | {pair(map(str, c['nacks']))} | {c['same_key_indices']} |"
            )
    return "\n".join(lines)


def chart(report: Dict[str, Any], path: Path) -> None:
    """Decisions per 5 s per mode, with a line where each fault struck."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(report["modes"].items())
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.6 * len(modes)), squeeze=False)
    colours = {"sigkill": "tab:red", "redis_kill": "tab:purple", "mysql_kill": "tab:brown",
               "postgres_kill": "tab:olive",
               "broker_restart": "tab:orange"}  # fmt: skip
    for ax, (mode, result) in zip(axes[:, 0], modes, strict=True):
        counts = result["timeline"]
        ax.bar([i * TIMELINE_STEP_S for i in range(len(counts))], counts,
               width=TIMELINE_STEP_S * 0.9, align="edge", color="tab:blue")  # fmt: skip
        for fault in result["faults"]:
            ax.axvline(fault["at_s"], color=colours.get(fault["kind"], "k"), linestyle="--")
            ax.text(fault["at_s"], max(counts, default=1), fault["kind"], rotation=90,
                    va="top", ha="right", fontsize=7)  # fmt: skip
        ax.set_title(f"{mode}: decisions per {TIMELINE_STEP_S:.0f} s", fontsize=9)
        ax.set_xlabel("seconds since the first send", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
