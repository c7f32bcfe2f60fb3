"""What a run shows of its summaries: a line per epoch while it runs, learning-curve plots, and the
methods' comparison (`<benchmark>-comparison.{png,md,json}`) after `memrl bench --method A,B,...`.

Summaries are `memrl_bench.framework.harness.run_benchmark`'s (`metrics.summarise` plus the run's
identity and token usage). The plots need the `plots` extra (matplotlib); without it they are
skipped with one line on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl_bench.framework.config import MEMORYLESS


def plot_learning_curves(summaries: list[dict[str, Any]], path: Path) -> None:
    """Accuracy (solid) and CSR (dashed) per epoch, one colour per run/method (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write(f"memrl: {path.name} not drawn: pip install 'memrl[plots]'\n")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, s in enumerate(summaries):
        colour = f"C{i}"
        epochs = [int(e) for e in s["accuracy"]]
        ax.plot(epochs, list(s["accuracy"].values()), "-o", color=colour, label=f"{s['method']} accuracy")
        ax.plot(epochs, list(s["csr"].values()), "--", color=colour, label=f"{s['method']} CSR")
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of tasks")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{summaries[0]['benchmark']}: runtime learning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def comparison_table(summaries: list[dict[str, Any]]) -> str:
    """The methods side by side (Markdown): accuracy per epoch, last-epoch accuracy, CSR, forgetting,
    the last evaluation, tokens. For `none` and `pass@k`, CSR after k epochs is pass@k (solved in any
    of k tries); an epoch a method did not play (pass@k once every task is solved) shows "–"."""
    epochs = sorted({e for s in summaries for e in s["accuracy"]})
    head = ["method", *[f"ep {e}" for e in epochs], "last acc", "CSR", "pass@k", "forgetting", "eval", "tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        evals = "; ".join(f"{split} {list(v.values())[-1]:.3f}" for split, v in s["eval_accuracy"].items() if v)
        cells = [s["method"], *[f"{s['accuracy'][e]:.3f}" if e in s["accuracy"] else "–" for e in epochs],
                 f"{s['last_epoch_accuracy']:.3f}", f"{s['final_csr']:.3f}",
                 f"{s['final_csr']:.3f}" if s["method"] in MEMORYLESS else "–",
                 f"{s['forgetting_rate']:.3f}", evals or "–", str(s["usage"].get("total_tokens", 0))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(summaries: list[dict[str, Any]], runs_dir: str) -> dict[str, str]:
    """`<benchmark>-comparison.{png,md,json}` in `runs_dir`: one plot, one table, every summary."""
    stem = Path(runs_dir) / f"{summaries[0]['benchmark'].replace(':', '_')}-comparison"
    paths = {"plot": f"{stem}.png", "table": f"{stem}.md", "summaries": f"{stem}.json"}
    plot_learning_curves(summaries, Path(paths["plot"]))
    Path(paths["table"]).write_text(f"# {summaries[0]['benchmark']}: runtime learning\n\n" + comparison_table(summaries))
    Path(paths["summaries"]).write_text(json.dumps(summaries, indent=2))
    return paths


def epoch_line(summary: dict[str, Any], epoch: int) -> str:
    """An epoch's accuracy and CSR, or why it played nothing (pass@k once every task is solved)."""
    if epoch not in summary["accuracy"]:
        return "nothing to play (every training task already solved)"
    return f"accuracy {summary['accuracy'][epoch]:.3f}  CSR {summary['csr'][epoch]:.3f}"


def progress_printer(stream: Any = sys.stderr) -> Callable[[str, dict[str, Any]], None]:
    """A plain progress callback: one line per finished epoch (for logs and non-terminals)."""
    def report(event: str, data: dict[str, Any]) -> None:
        if event == "epoch_done":
            s = data["summary"]
            e = data["epoch"]
            stream.write(f"epoch {e}: {epoch_line(s, e)}\n")
            stream.flush()
    return report
