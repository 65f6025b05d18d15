"""A PNG bar chart of msgs/s per case from a result: ``python -m bench.chart RESULT.json
OUT.png`` (or ``python -m bench --chart OUT.png``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

FAMILY_COLOURS = {
    "noop": "#9e9e9e",
    "memory": "#7e57c2",
    "redis": "#1e88e5",
    "powertools": "#fb8c00",
    "mysql": "#43a047",
    "e2e": "#e53935",
}


def colour(case: str) -> str:
    if "naive" in case:
        return "#90caf9" if case.startswith("redis") else "#a5d6a7"
    return FAMILY_COLOURS.get(case.split("_", 1)[0], "#616161")


def render(document: dict[str, Any], out: Path) -> None:
    """Draw one horizontal bar per case (median msgs/s, log scale, min..max whiskers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = document["cases"]
    names = list(cases)
    medians = [cases[n]["msgs_per_s"] for n in names]
    lows = [m - min(cases[n]["reps"]) for n, m in zip(names, medians, strict=False)]
    highs = [max(cases[n]["reps"]) - m for n, m in zip(names, medians, strict=False)]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.5))
    ax.barh(names, medians, xerr=[lows, highs], color=[colour(n) for n in names], capsize=3)
    for y, (value, high) in enumerate(zip(medians, highs, strict=False)):
        ax.text((value + high) * 1.15, y, f"{value:,.0f}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(m + h for m, h in zip(medians, highs, strict=False)) * 4)
    ax.invert_yaxis()
    ax.set_xlabel("messages per second (median; whiskers: min..max of the repetitions)")
    env = document.get("env", {})
    mode = "quick" if env.get("quick") else "full"
    ax.set_title(f"rocketmq-dedup benchmark ({mode}, {env.get('timestamp', '')})")
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chart", description=__doc__)
    parser.add_argument("result", type=Path, help="a JSON file written by python -m bench --json")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    render(json.loads(args.result.read_text()), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
