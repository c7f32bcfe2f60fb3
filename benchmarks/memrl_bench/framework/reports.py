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


def plot_learning_curves(summaries: list[dict[str, Any]], path: Path) -> bool:
    """Draw `learning_curve_figure` to `path` (PNG); False (and one line on stderr) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write(f"memrl: {path.name} not drawn: pip install 'memrl[plots]'\n")
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = learning_curve_figure(summaries)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def learning_curve_figure(summaries: list[dict[str, Any]]) -> Any:
    """Accuracy (solid) and CSR (dashed) per epoch, one colour per run/method, epochs on whole-number ticks
    (a matplotlib Figure; needs the `plots` extra)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, s in enumerate(summaries):
        colour = f"C{i}"
        epochs = [int(e) for e in s["accuracy"]]
        ax.plot(epochs, list(s["accuracy"].values()), "-o", color=colour, label=f"{s['method']} accuracy")
        ax.plot(epochs, list(s["csr"].values()), "--", color=colour, label=f"{s['method']} CSR")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs 1, 2: never 1.0, 1.2, ...
    ax.set_ylabel("share of tasks")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{summaries[0]['benchmark']}: runtime learning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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


def write_comparison(summaries: list[dict[str, Any]], runs_dir: str) -> dict[str, str | None]:
    """`<benchmark>-comparison.{png,md,json}` in `runs_dir`: one plot (None without matplotlib), one table, every
    summary."""
    stem = Path(runs_dir) / f"{summaries[0]['benchmark'].replace(':', '_')}-comparison"
    table, every = f"{stem}.md", f"{stem}.json"
    plot = f"{stem}.png" if plot_learning_curves(summaries, Path(f"{stem}.png")) else None
    Path(table).write_text(f"# {summaries[0]['benchmark']}: runtime learning\n\n" + comparison_table(summaries))
    Path(every).write_text(json.dumps(summaries, indent=2))
    return {"plot": plot, "table": table, "summaries": every}


def epoch_line(summary: dict[str, Any], epoch: int) -> str:
    """An epoch's accuracy and CSR, or why it played nothing (pass@k once every task is solved)."""
    if epoch not in summary["accuracy"]:
        return "nothing to play (every training task already solved)"
    return f"accuracy {summary['accuracy'][epoch]:.3f}  CSR {summary['csr'][epoch]:.3f}"


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 epoch`, `2 epochs`."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _epochs(epochs: list[int]) -> str:
    """`1, 3` or `1-10` (consecutive)."""
    if len(epochs) > 2 and epochs == list(range(epochs[0], epochs[-1] + 1)):
        return f"{epochs[0]}-{epochs[-1]}"
    return ", ".join(map(str, epochs))


def plan_line(plan: dict[str, Any]) -> str:
    """Where a run is and how many episodes it plays, per phase (`harness.Run.plan`), in one line:
    `run runs/X: 15 episodes: training 3 per epoch × 2 epochs = 6; evaluation 3 per pass (...) × 3 passes (...) = 9`."""
    at_most = "at most " if plan["at_most"] else ""
    parts = [f"training {at_most}{plan['train']} per epoch × {_count(plan['epochs'], 'epoch')} = "
             f"{plan['train'] * plan['epochs']}"]
    passes = plan["eval_passes"]
    if plan["evals"]:
        per_pass = sum(plan["evals"].values())
        sampled = [split for split, n in plan["evals"].items() if n < plan["listed"].get(split, n)]
        which = "; ".join(f"{n} of {split}'s {plan['listed'][split]}" if split in sampled else f"all {n} of {split}"
                          for split, n in plan["evals"].items())
        more = "; --eval-limit all plays every one" if sampled else ""
        after = [e for e in passes if e]
        when = ", ".join((["before training"] if 0 in passes else [])
                         + ([f"after {'epoch' if len(after) == 1 else 'epochs'} {_epochs(after)}"] if after else []))
        parts.append(f"evaluation {per_pass} per pass ({which}{more}) × {_count(len(passes), 'pass', 'passes')} "
                     f"({when}) = {per_pass * len(passes)}")
    else:
        parts.append("no evaluation")
    done = f" ({plan['done']} already played)" if plan["done"] else ""
    return f"run {plan['run_dir']}: {at_most}{plan['total']} episodes{done}: {'; '.join(parts)}"


def batch_status(data: dict[str, Any], benchmark: str) -> tuple[str, str]:
    """A batch's phase and place (`train epoch 1/2, batch 1/3`, `eval valid_seen before training, batch 1/1`),
    and what happens until its first episode ends (`starting 4 workers, loading 8 alfworld games`)."""
    if data["phase"] == "train":
        phase = f"train epoch {data['epoch']}/{data['epochs']}"
    else:
        phase = f"eval {data['split']} {'before training' if data['epoch'] == 0 else 'after epoch ' + str(data['epoch'])}"
    if data["loading"]:
        doing = f"loading {data['size']} {benchmark} {'game' if data['size'] == 1 else 'games'}"
    else:
        doing = f"playing {_count(data['size'], 'episode')}"
    if data["starting"]:
        doing = f"starting {_count(data['starting'], 'worker')}, {doing}"
    return f"{phase}, batch {data['index'] + 1}/{data['batches']}", doing


def progress_printer(stream: Any = sys.stderr) -> Callable[[str, dict[str, Any]], None]:
    """A plain progress callback: a warning about the run (a judge the agent could influence), a note (tasks the
    benchmark leaves out), the run's plan, then one line per finished epoch (for logs and non-terminals)."""
    def report(event: str, data: dict[str, Any]) -> None:
        if event in ("warning", "note"):
            stream.write(f"memrl: {event}: {data['text']}\n")
        elif event == "plan":
            stream.write(f"memrl: {plan_line(data)}\n")
        elif event == "epoch_done":
            s = data["summary"]
            e = data["epoch"]
            stream.write(f"epoch {e}: {epoch_line(s, e)}\n")
        else:
            return
        stream.flush()
    return report


def plan_printer(stream: Any = sys.stderr) -> Callable[[str, dict[str, Any]], None]:
    """The run's warnings, notes and plan only (`--json`: stdout is the summary, stderr says what the run plays)."""
    printer = progress_printer(stream)
    return lambda event, data: printer(event, data) if event in ("warning", "note", "plan") else None


class LiveProgress:
    """A progress bar per run on a terminal (stderr): from the first second, what is happening (starting the
    offline model, reading tasks, checking the endpoint, loading games), then the run's total episodes, its
    phase and batch, and running accuracy (and CSR while training). Lines printed above it: the plan, epochs."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
        from rich.table import Column
        from rich.text import Text

        class Episodes(ProgressColumn):
            """`12/40 episodes` once the total is known; nothing before (never `0/?`)."""

            def render(self, task: Any) -> Text:
                return Text("" if task.total is None else f"{int(task.completed)}/{int(task.total)} episodes")

        self.bar = Progress(TextColumn("{task.description}", table_column=Column(ratio=1, overflow="fold")),
                            BarColumn(bar_width=16), Episodes(table_column=Column(no_wrap=True)),
                            TimeElapsedColumn(table_column=Column(no_wrap=True)), console=Console(stderr=True),
                            expand=True)
        self.row: Any = None  # the current run's row of the display
        self.fresh = False  # the row has no run yet (a status shown before the run started)

    def __enter__(self) -> "LiveProgress":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def status(self, text: str) -> None:
        """Show what happens now, on the current row (a new one if there is none yet)."""
        if self.row is None:
            self.row, self.fresh = self.bar.add_task(text, total=None), True
        else:
            self.bar.update(self.row, description=text)

    def reporter(self, label: str) -> Callable[[str, dict[str, Any]], None]:
        """The progress callback of one run (`label`: `alfworld/memrl`), on a row of its own."""
        if not self.fresh:
            self.row = self.bar.add_task(f"{label}: starting", total=None)
        self.fresh = False
        row, benchmark = self.row, label.split("/")[0]
        state: dict[str, Any] = {"ok": 0, "n": 0, "csr": None, "phase": "", "doing": "", "kind": None}

        def show() -> None:
            acc = f" · acc {state['ok'] / state['n']:.2f}" if state["n"] else ""
            csr = f" CSR {state['csr']:.2f}" if state["kind"] == "train" and state["csr"] is not None else ""
            self.bar.update(row, description=f"{label} · {state['phase']}{acc}{csr} · {state['doing']}")

        def report(event: str, data: dict[str, Any]) -> None:
            if event == "status":
                self.bar.update(row, description=f"{label}: {data['text']}")
            elif event in ("warning", "note"):
                self.bar.console.print(f"memrl: {event}: {data['text']}", soft_wrap=True, highlight=False)
            elif event == "plan":
                self.bar.console.print(f"memrl: {plan_line(data)}", soft_wrap=True, highlight=False)
            elif event == "start":  # the run's episode count, and those a resumed run already played
                self.bar.update(row, total=data["total"], completed=data["done"])
            elif event == "batch":
                if data["index"] == 0 or data["phase"] != state["kind"]:  # a new stream: its own running accuracy
                    state.update(ok=0, n=0, kind=data["phase"])
                state["phase"], state["doing"] = batch_status(data, benchmark)
                show()
            elif event == "episode":
                state["ok"] += int(data["success"])
                state["n"] += 1
                self.bar.update(row, advance=1)
                show()
            elif event == "epoch_done":
                s = data["summary"]
                state["csr"] = s["csr"].get(data["epoch"], state["csr"])
                self.bar.console.print(f"epoch {data['epoch']}: {epoch_line(s, data['epoch'])}", highlight=False)
        return report
