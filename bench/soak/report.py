"""The soak report as a markdown table and a chart of decisions and faults over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

COLUMNS = (
    ("keys", "keys"),
    ("sent", "sent"),
    ("delivered", "delivered"),
    ("applied_keys", "applied"),
    ("lost", "lost"),
    ("lost_by_dedup", "acked, not applied"),
    ("client_sendback_failures", "client send-back failures"),
    ("double_applied", "double applied"),
    ("double_applied_explained", "explained"),
    ("dlq", "DLQ"),
    ("send_retries", "send retries"),
    ("drain_s", "drain s"),
    ("msgs_per_s", "msgs/s"),
)
TIMELINE_STEP_S = 5.0


def table(report: Dict[str, Any]) -> str:
    """One row per mode; the causes of lost keys and double applies below."""
    lines = [
        "| mode | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for mode, result in report["modes"].items():
        cells = [f"{result[key]:,}" if isinstance(result[key], int) else str(result[key])
                 for key, _ in COLUMNS]  # fmt: skip
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode, result in report["modes"].items():
        lost = ", ".join(f"{k} {v}" for k, v in result["lost_causes"].items())
        causes = ", ".join(f"{k} {v}" for k, v in result["double_applied_causes"].items())
        faults = ", ".join(f"{f['kind']} {f['at_s']:.0f}s" for f in result["faults"])
        lines.append(
            f"- **{mode}**: lost: {lost or 'none'}; double applied: {causes or 'none'}; "
            f"faults: {faults}"
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
