"""The utility analysis of a run drawn (`memrl report RUN --q`): needs matplotlib, the `plots` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_utility(report: dict[str, Any], path: str | Path) -> None:
    """Success rate by Q bin, one line per epoch (the paper's utility figure), as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for row in report["epochs"]:
        points = [((b["low"] + b["high"]) / 2, b["success_rate"]) for b in row["bins"] if b["success_rate"] is not None]
        if points:
            rho = row["spearman"]
            label = f"epoch {row['epoch']}" + (f" (ρ {rho:+.2f})" if rho is not None else "")
            ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xlabel("Q of the selected memory when retrieved (bin centre)")
    ax.set_ylabel("episode success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{report['benchmark']} / {report['method']}: utility vs success")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
