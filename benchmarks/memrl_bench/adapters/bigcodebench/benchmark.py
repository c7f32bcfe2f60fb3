"""BigCodeBench: write one Python function per task; its own unittest, run in a sandbox, grades it.

One LLM call per episode. The reply's code and the task's tests are run by
`benchmarks/memrl_bench/adapters/bigcodebench/bcb_check.py` (the checker) and `bcb_processes.py` (the tests and the program, each
in a process of its own) inside `memrl_bench.environments.sandbox` (bubblewrap: no network, read-only host,
time/memory/process limits), once `benchmarks/memrl_bench/adapters/bigcodebench/screen.py` has read it and not
refused it. Statuses: PASS, FAIL, TIMEOUT, SYNTAX_ERROR, RUNTIME_ERROR, REFUSED (the static screen
found the program touching the test machinery: a failure) and MISSING_LIBRARY (a module not
installed here: an environment error, reported apart, when the task needs it; the program's failure when
only the program imports it).
"""

from __future__ import annotations

import ast
import hmac
import json
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl_bench.adapters.bigcodebench import bcb_check
from memrl_bench.adapters.bigcodebench.screen import screen
from memrl_bench.framework.protocol import LLM, Episode, Task, delimited_memories
from memrl_bench.environments.sandbox import ISOLATIONS, SandboxResult, bwrap_path, run_sandboxed
from memrl_cli.errors import MemrlError

SUBSETS = ("full", "hard")
PROMPT_SPLITS = ("instruct", "complete")
HF_DATASETS = {"full": "bigcode/bigcodebench", "hard": "bigcode/bigcodebench-hard"}
HF_VERSION = "v0.1.4"
DATA_ENV = "BIGCODEBENCH_DATA"  # the data location when --data is not given (before Hugging Face)
TRAIN_RATIO = 0.7
AUTHORS_SPLIT_SEEDS = {"full": 123, "hard": 42}  # the seeds of MemRL's split_full_seed123 / split_hard_seed42
DETAIL_CHARS = 600
CHECKER = Path(__file__).with_name("bcb_check.py")
PROCESSES = CHECKER.with_name(bcb_check.PROCESSES_FILE)
VERDICT_MARKER = bcb_check.MARKER

SYSTEM_PROMPT = """You are an expert Python programmer. Solve the task with one complete, self-contained \
Python program: include every import, define the requested function with exactly the given name and \
signature, and do not add example usage, prints or tests. Reply with exactly one ```python code block.

The task may be preceded by memories of earlier attempts at similar tasks. A [SUCCESS] memory worked: \
reuse its approach and code where it fits the new task. A [FAILURE] memory did not pass its tests: \
learn from it and avoid repeating its mistake. An [UNKNOWN] memory is unverified. Memories describe \
other tasks: always solve the current task as stated."""

COMPLETE_TEMPLATE = """Complete the following function. Reply with the whole program (imports and the \
full function) in one ```python block.

```python
{prompt}```"""

_FENCE_PYTHON = re.compile(r"```[ \t]*(?:python3?|py)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE_ANY = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    """The result of evaluating one program against a task's tests."""

    status: str
    detail: str
    seconds: float = 0.0
    missing_module: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def extract_code(reply: str) -> str:
    """The first ```python block of `reply`, else its first fenced block, else the whole text."""
    for pattern in (_FENCE_PYTHON, _FENCE_ANY):
        match = pattern.search(reply)
        if match:
            return match.group(1).strip("\n") + "\n"
    return reply.strip("\n") + "\n"


def canonical_program(row: dict[str, Any]) -> str:
    """The reference solution as BigCodeBench checks it: the complete prompt, then the solution."""
    return row["complete_prompt"] + "\n" + row["canonical_solution"]


def prompt_imports(prompt: str) -> str:
    """The top-level import statements of a task's prompt (trusted: they come with the task)."""
    try:
        with warnings.catch_warnings():  # prompts hold docstrings with regex escapes
            warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
            body = ast.parse(prompt).body
    except SyntaxError:
        return ""
    return "\n".join(ast.unparse(node) for node in body if isinstance(node, (ast.Import, ast.ImportFrom)))


def format_memories(memories: list[dict[str, Any]]) -> str:
    """The memory block: every retrieved memory with its task and its experience, in full."""
    if not memories:
        return ""
    parts = ["# Memories of similar past tasks"]
    for index, memory in enumerate(memories, 1):
        outcome = str(memory.get("outcome") or "unknown").upper()
        parts.append(
            f"## Memory {index} [{outcome}] (similarity {float(memory.get('similarity') or 0.0):.2f})\n"
            f"Task:\n{memory.get('intent', '')}\n\nExperience:\n{memory.get('experience', '')}"
        )
    return delimited_memories("\n\n".join(parts))


def is_stdlib_only(libs: list[str]) -> bool:
    """Whether every library a task needs ships with Python."""
    return all(lib in sys.stdlib_module_names for lib in libs)


def python_readable_paths(python: str) -> list[str]:
    """Installation directories `python` needs inside the sandbox (its venv and base prefix)."""
    executable = Path(python)
    return sorted({str(executable.parent.parent), str(Path(os.path.realpath(executable)).parent.parent)})


class BigCodeBench:
    """The BigCodeBench adapter (`memrl bench bigcodebench`)."""

    name = "bigcodebench"
    train_split = "train"
    eval_splits: tuple[str, ...] = ("val",)

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        subset: str = "full",
        split: str = "instruct",
        split_file: str | None = None,
        timeout: float = 60,
        memory_mb: int = 4096,
        stdlib_only: bool = False,
        nproc: int = 1024,
        sandbox: str = "bwrap",
        python: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> None:
        if options:
            raise MemrlError(
                f"unknown bigcodebench option(s): {', '.join(sorted(options))}; known: subset, split, split_file, "
                "timeout, memory_mb, stdlib_only, nproc, sandbox, python, temperature, max_tokens, seed"
            )
        if subset not in SUBSETS:
            raise MemrlError(f"unknown BigCodeBench subset {subset!r}: use one of {', '.join(SUBSETS)}")
        if split not in PROMPT_SPLITS:
            raise MemrlError(f"unknown BigCodeBench prompt split {split!r}: use one of {', '.join(PROMPT_SPLITS)}")
        if sandbox not in ISOLATIONS:
            raise MemrlError(f"unknown sandbox {sandbox!r}: use one of {', '.join(ISOLATIONS)}")
        if sandbox == "bwrap":
            bwrap_path()  # fail now, not at the first episode
        self.subset = subset
        self.prompt_split = split
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.nproc = int(nproc)
        self.sandbox = sandbox
        self.python = python or sys.executable
        self.llm_params = {
            key: value for key, value in (("temperature", temperature), ("max_tokens", max_tokens)) if value is not None
        }
        rows, split_path = _load_rows(data, subset, split_file)
        splits = _split_ids(rows, split_path, AUTHORS_SPLIT_SEEDS[subset] if seed is None else int(seed))
        if stdlib_only:  # filtered after splitting, so the split is the whole set's
            rows = [row for row in rows if is_stdlib_only(row["libs"])]
        kept = {row["task_id"] for row in rows}
        self._splits = {name: [i for i in ids if i in kept] for name, ids in splits.items()}
        self._rows = {row["task_id"]: row for row in rows}
        self.limit = limit

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise MemrlError(f"unknown split {split!r} for bigcodebench: use one of {', '.join(self._splits)}")
        ids = self._splits[split][: self.limit] if self.limit is not None else self._splits[split]
        return [self._task(self._rows[task_id]) for task_id in ids]

    def _task(self, row: dict[str, Any]) -> Task:
        query = row["instruct_prompt"] if self.prompt_split == "instruct" else row["complete_prompt"]
        payload = {"test": row["test"], "entry_point": row["entry_point"], "libs": row["libs"],
                   "imports": prompt_imports(row["complete_prompt"])}
        return Task(id=row["task_id"], query=query, payload=payload)

    def messages(self, task: Task, memories: list[dict[str, Any]]) -> list[dict[str, str]]:
        """The chat messages of one episode: system prompt + memory block, then the task."""
        system = SYSTEM_PROMPT
        block = format_memories(memories)
        if block:
            system += "\n\n" + block
        user = task.query if self.prompt_split == "instruct" else COMPLETE_TEMPLATE.format(prompt=task.query)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        return self.grade(task, self.generate(task, memories, llm), llm)

    def generate(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> str:
        """The model's reply to the task with `memories` in the prompt (not yet evaluated)."""
        return llm.chat(self.messages(task, memories), **self.llm_params)

    def grade(self, task: Task, reply: str, llm: LLM) -> Episode:
        """The code in `reply` run against the task's tests in the sandbox."""
        code = extract_code(reply)
        verdict = self.evaluate(code, task.payload["test"], imports=task.payload.get("imports", ""))
        trajectory = (
            f"Task: {task.id}\n\nCode:\n```python\n{code}```\n\n"
            f"Evaluation: {verdict.status}" + (f"\n{verdict.detail}" if verdict.detail else "")
        )
        info: dict[str, Any] = {"eval_seconds": round(verdict.seconds, 3)}
        required = verdict.missing_module is not None and verdict.missing_module in task.payload["libs"]
        if verdict.missing_module:
            info["missing_module"] = verdict.missing_module
            info["module_required_by_task"] = required
        return Episode(
            success=verdict.passed,
            steps=1,
            trajectory=trajectory,
            status=verdict.status,
            # the environment's fault only when the task needs the module: one the program chose to import is
            # its own failure (else a program could dodge every negative reward under `skip_env_errors`)
            env_error=verdict.status == "MISSING_LIBRARY" and required,
            info=info,
        )

    def evaluate(self, code: str, test: str, screened: bool = True, imports: str = "") -> Verdict:
        """Run `code` against the unittest `test` in a fresh sandbox; classify the outcome.

        A program the static screen refuses (`bcb_screen`) never runs: REFUSED. `screened=False`
        skips the screen (tests of the run-time checks behind it). `imports`, the task prompt's
        import statements (`prompt_imports`), run before the tests, so that the modules the tests
        take from the program's namespace are the real ones, whatever the program bound there."""
        try:
            compile(code, "solution.py", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
            return Verdict("SYNTAX_ERROR", _short(f"{type(error).__name__}: {error}"))
        reasons = screen(code) if screened else []
        if reasons:
            return Verdict("REFUSED", _short("the program touches the test machinery or the interpreter's "
                                             "internals, so it was not run: " + "; ".join(reasons)))
        workdir = tempfile.mkdtemp(prefix="memrl-bcb-")
        try:
            Path(workdir, "solution.py").write_text(code, encoding="utf-8")
            Path(workdir, "tests.py").write_text(imports + "\n" + test if imports else test, encoding="utf-8")
            shutil.copy(CHECKER, Path(workdir, CHECKER.name))
            shutil.copy(PROCESSES, Path(workdir, PROCESSES.name))
            key = secrets.token_hex(32).encode()
            result = run_sandboxed(
                [self.python, "-I", "-B", CHECKER.name, "solution.py", "tests.py"],
                workdir,
                timeout=self.timeout,
                memory_mb=self.memory_mb,
                nproc=self.nproc,
                env=_program_env(workdir, self.python),
                readable=python_readable_paths(self.python),
                isolation=self.sandbox,
                input=key + b"\n",
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return _classify(result, key)

    def close(self) -> None:
        """Nothing to release: every evaluation cleans up its own sandbox."""


def _program_env(workdir: str, python: str) -> dict[str, str]:
    """The evaluated program's environment: `python` first on PATH (tasks run `python ...`), and
    BigCodeBench's TZ, thread counts and headless plot backend."""
    return {
        "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "TF_ENABLE_ONEDNN_OPTS": "0",
        "PYTHONHASHSEED": "0",
    }


def _classify(result: SandboxResult, key: bytes) -> Verdict:
    """Turn the sandbox outcome and the checker's signed verdict line into a Verdict.

    Only a line signed with this run's `key` (which the program under test never holds) counts;
    any other verdict line is a forgery and scores FAIL.
    """
    if result.timed_out or result.signal_name == "SIGXCPU":
        return Verdict("TIMEOUT", "time limit exceeded", result.duration)
    lines = [line[len(VERDICT_MARKER):] for line in result.stdout.splitlines() if line.startswith(VERDICT_MARKER)]
    signed = [payload for mac, _, payload in (line.partition(" ") for line in lines)
              if hmac.compare_digest(mac, bcb_check.sign(key, payload))]
    if len(signed) != len(lines):
        return Verdict("FAIL", "a verdict line not signed by the checker: the program forged its verdict",
                       result.duration)
    if not signed:
        reason = "out of memory" if result.out_of_memory else f"exit {result.signal_name or result.returncode}"
        return Verdict("RUNTIME_ERROR", _short(f"the checker ended without a verdict ({reason}) "
                                               f"{result.stderr.strip()[-DETAIL_CHARS:]}"), result.duration)
    verdict = json.loads(signed[-1])
    return Verdict(verdict["status"], _short(verdict["detail"]), result.duration, verdict.get("module"))


def _short(text: str) -> str:
    """The last DETAIL_CHARS characters of an error text (the end of a traceback says the most)."""
    text = text.strip()
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]


def _load_rows(data: str | None, subset: str, split_file: str | None) -> tuple[list[dict[str, Any]], Path | None]:
    """Task rows (libs parsed to lists) and the split file to use, from `data` or Hugging Face."""
    split_path = Path(split_file) if split_file else None
    if split_path is not None and not split_path.is_file():
        raise MemrlError(f"BigCodeBench split file {split_path} not found: fix --option split_file")
    data = data if data is not None else os.environ.get(DATA_ENV) or None
    if data is None:
        rows = _download_rows(subset)
    else:
        path = Path(data)
        jsonl = path / f"bigcodebench_{subset}.jsonl" if path.is_dir() else path
        if not jsonl.is_file():
            raise MemrlError(f"BigCodeBench data {jsonl} not found: pass --data with a bigcodebench_{subset}.jsonl "
                             "file or the directory holding it")
        with jsonl.open(encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        if split_path is None:
            candidates = sorted(jsonl.parent.glob(f"split_{subset}_seed*.json"))
            split_path = candidates[0] if len(candidates) == 1 else None
    for row in rows:
        if isinstance(row["libs"], str):
            row["libs"] = list(ast.literal_eval(row["libs"]))
    return rows, split_path


def _download_rows(subset: str) -> list[dict[str, Any]]:
    """Rows from the Hugging Face dataset, or a MemrlError naming both ways to get the data."""
    name = HF_DATASETS[subset]
    try:
        import datasets

        return [dict(row) for row in datasets.load_dataset(name, split=HF_VERSION)]
    except Exception as error:  # no `datasets`, no network, no such revision: all mean "no data"
        raise MemrlError(
            f"BigCodeBench data not available: pass --data PATH or set {DATA_ENV} (bigcodebench_{subset}.jsonl or its directory), "
            f"or allow downloading {name} ({HF_VERSION}) from Hugging Face ({type(error).__name__}: {error})"
        ) from error


def _split_ids(rows: list[dict[str, Any]], split_path: Path | None, seed: int) -> dict[str, list[str]]:
    """train/val task ids, in data order: from the split file, else the authors' seeded 70/30 split.

    The authors' procedure (it reproduces split_full_seed123.json and split_hard_seed42.json
    exactly): sort the ids, shuffle with `random.Random(seed)`, the first int(0.7·n) are train.
    """
    ids = [row["task_id"] for row in rows]
    if split_path is not None:
        spec = json.loads(split_path.read_text(encoding="utf-8"))
        if "train_ids" not in spec or "val_ids" not in spec:
            raise MemrlError(f"BigCodeBench split file {split_path} lacks train_ids/val_ids: use the MemRL split format")
        train, val = set(spec["train_ids"]), set(spec["val_ids"])
    else:
        shuffled = sorted(ids)
        random.Random(seed).shuffle(shuffled)
        cut = int(len(shuffled) * TRAIN_RATIO)
        train, val = set(shuffled[:cut]), set(shuffled[cut:])
    return {"train": [i for i in ids if i in train], "val": [i for i in ids if i in val]}
