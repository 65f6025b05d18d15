"""Draw the Grafana dashboard's panels (rocketmq_dedup/ops/grafana) from the series
test_e2e_operations.py dumped from a real Prometheus: the picture in the README's "Operating it".

    .venv-classic/bin/python -m tests.e2e.render_dashboard \\
        /tmp/rocketmq-dedup/operations-<run>.json docs/operations-dashboard.png

Needs matplotlib (requirements-bench.txt, in .venv-classic after scripts/bench.sh).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Dict

UNITS = {"ops": "per second", "s": "seconds", "percentunit": "share of deliveries"}


def render(dump: Dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dump["panels"]
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.1 * rows), squeeze=False)
    for ax, (title, panel) in zip(axes.flat, panels.items(), strict=False):
        for series in panel["series"]:
            points = [(t, v) for t, v in series["points"] if not math.isnan(v)]
            if not points or not any(v for _, v in points):
                continue  # Grafana draws a flat zero line; left out to keep the legend short
            ax.plot(*zip(*points, strict=True), label=series["legend"], linewidth=1.6)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel(UNITS.get(panel["unit"], panel["unit"]), fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the consumer started", fontsize=8)
    fig.suptitle(
        f"rocketmq-dedup dashboard, application {dump['app']} (real data: "
        "tests/e2e/test_e2e_operations.py through the broker, scraped by Prometheus)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=80)


if __name__ == "__main__":
    render(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
