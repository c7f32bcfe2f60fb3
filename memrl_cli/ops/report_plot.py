"""The utility analysis of a run drawn (`memrl report RUN --q`): needs matplotlib, the `plots` extra."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any


def plot_utility(report: dict[str, Any], path: str | Path) -> None:
    """Success rate by Q bin, one line per epoch (the paper's utility figure), as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for row in [*report["epochs"], {**report["overall"], "epoch": None}]:
        points = [((b["low"] + b["high"]) / 2, b["success_rate"]) for b in row["bins"] if b["success_rate"] is not None]
        if points:
            rho = row["spearman"]
            label = ("all epochs" if row["epoch"] is None else f"epoch {row['epoch']}") + \
                (f" (ρ {rho:+.2f})" if rho is not None else "")
            overall = row["epoch"] is None
            ax.plot(*zip(*points), marker="o", label=label, color="black" if overall else None,
                    linestyle="--" if overall else "-", linewidth=2 if overall else 1.5)
    ax.set_xlabel("Q of the selected memory when retrieved (bin centre)")
    ax.set_ylabel("episode success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("\n".join(textwrap.wrap(f"{report['benchmark']} / {report['method']}: utility vs success", 60)),
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
