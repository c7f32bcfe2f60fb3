"""Where the benchmark tests find their data: where the tool itself looks first, then `../shared/data/`
(this project's CI copy, see its README). A missing data set skips its tests with how to get it, and
fails them under CI (`conftest.unavailable`), which has that copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from conftest import unavailable as _unavailable

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

HOW_TO_GET = {
    "alfworld": "run `alfworld-download` (pip install -e '.[alfworld]'), or set ALFWORLD_DATA to the directory "
                "holding json_2.1.1",
    "bigcodebench": "set BIGCODEBENCH_DATA to a directory holding bigcodebench_full.jsonl and bigcodebench_hard.jsonl "
                    "(the Hugging Face bigcode/bigcodebench v0.1.4 rows, see docs/bigcodebench.md)",
    "llb": "set LLB_DATA to a directory holding LLB's db_{train,val}.json and os_interaction_{train,val}.json "
           "(see docs/llb.md)",
}


def _env(name: str) -> list[Path]:
    return [Path(os.environ[name]).expanduser()] if os.environ.get(name) else []


def alfworld() -> Path | None:
    """A directory holding json_2.1.1 ($ALFWORLD_DATA, ~/.cache/alfworld), else the shared archive of it."""
    for where in [*_env("ALFWORLD_DATA"), Path("~/.cache/alfworld").expanduser()]:
        if (where / "json_2.1.1").is_dir():
            return where
    archive = SHARED / "alfworld" / "json_2.1.1_full_with_traj.tar.xz"
    return archive if archive.is_file() else None


def alfworld_examples() -> Path | None:
    """The MemRL authors' few-shot ALFWorld examples, when this machine has them (else the adapter builds its own)."""
    for where in [*_env("ALFWORLD_EXAMPLES"), SHARED / "alfworld" / "alfworld_examples.json"]:
        if where.is_file():
            return where
    return None


def directory(benchmark: str, env: str, marker: str) -> Path:
    """The first of $`env` and ../shared/data/`benchmark` holding `marker` (else the shared path, for skip checks)."""
    candidates = [*_env(env), SHARED / benchmark]
    return next((where for where in candidates if (where / marker).is_file()), candidates[-1])


def missing(benchmark: str, looked: Path | None = None) -> str:
    """A skip reason: what is missing and how to get it."""
    where = f" (looked in {looked})" if looked is not None else ""
    return f"{benchmark} data not found{where}: {HOW_TO_GET[benchmark]}"


def unavailable(benchmark: str, looked: Path | None = None) -> NoReturn:
    """Skip the calling test for missing data, saying how to get it; under CI, fail it."""
    _unavailable(missing(benchmark, looked), f"{benchmark} data")


def needs(benchmark: str, path: Path) -> pytest.MarkDecorator:
    """Mark a test that reads the data file `path`: without it, `unavailable` (checked by conftest at setup)."""
    return pytest.mark.benchmark_data(benchmark, str(path))
