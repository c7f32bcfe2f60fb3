"""Where the benchmark tests find their data: first where the tool itself looks (the adapters' own lookups:
`$ALFWORLD_DATA` or `~/.cache/alfworld` after `alfworld-download`, `$BIGCODEBENCH_DATA`, `$LLB_DATA`), then in
`../shared/data/` (the developers' and CI's copy, beside the repository). Tests that only play a few games or
tasks run on the small samples committed under tests/data/ (see its README) when the full data is missing.

A missing data set skips its tests with how to get it, and fails them under CI (`conftest.unavailable`), which
has the copy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from conftest import unavailable as _unavailable
from memrl_bench.adapters import llb_common
from memrl_bench.adapters.alfworld import data as alfworld_data
from memrl_bench.adapters.bigcodebench.benchmark import DATA_ENV as BIGCODEBENCH_ENV
from memrl_cli.errors import MemrlError

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"  # the developers' copy: a fallback, never the only place looked
SAMPLES = REPO / "tests" / "data"  # small samples committed with the tests (tests/data/README.md)
ALFWORLD_SAMPLE = SAMPLES / "alfworld" / "json_2.1.1_sample.tar.xz"
ALFWORLD_SAMPLE_EXAMPLES = SAMPLES / "alfworld" / "examples_from_walkthroughs.json"
BIGCODEBENCH_SAMPLE = SAMPLES / "bigcodebench"

HOW_TO_GET = {
    "alfworld": alfworld_data.HOW_TO_GET_DATA,
    "bigcodebench": f"set {BIGCODEBENCH_ENV} to a directory holding bigcodebench_full.jsonl and bigcodebench_hard.jsonl "
                    "(the Hugging Face bigcode/bigcodebench v0.1.4 rows, see docs/bigcodebench.md)",
    "llb": llb_common.DATA_HINT,
}


def _env(name: str) -> list[Path]:
    return [Path(os.environ[name]).expanduser()] if os.environ.get(name) else []


def alfworld() -> Path | None:
    """ALFWorld's full games: the directory holding json_2.1.1 where `memrl bench alfworld` finds it without
    --data ($ALFWORLD_DATA, else ~/.cache/alfworld), else the archive of them in ../shared/data."""
    try:
        return alfworld_data.resolve_data_dir(None)
    except MemrlError:
        archive = SHARED / "alfworld" / "json_2.1.1_full_with_traj.tar.xz"
        return archive if archive.is_file() else None


def alfworld_examples() -> Path | None:
    """The MemRL authors' few-shot ALFWorld examples ($ALFWORLD_EXAMPLES, else ../shared/data), if this machine has
    them: their licence is not stated, so they are not in the repository."""
    for where in [*_env("ALFWORLD_EXAMPLES"), SHARED / "alfworld" / "alfworld_examples.json"]:
        if where.is_file():
            return where
    return None


def directory(benchmark: str, marker: str) -> Path:
    """The directory of `benchmark`'s full data holding `marker`: where the tool looks ($BIGCODEBENCH_DATA,
    $LLB_DATA), else ../shared/data/`benchmark` (returned, missing, for the skip reason when neither has it)."""
    if benchmark == "llb":
        try:
            return llb_common.data_dir(None, (marker,))
        except MemrlError:
            pass
    else:
        found = [where for where in _env(BIGCODEBENCH_ENV) if (where / marker).is_file()]
        if found:
            return found[0]
    return SHARED / benchmark


def data_paths(scratch: Path) -> dict[str, str]:
    """The data of each benchmark the hostile tests attack, where the tests find it (BigCodeBench's: the full
    data, else the committed sample); HLE gets a file of its own in `scratch` (the shape of
    `benchmarks.perf.hostile.data_paths`)."""
    from benchmarks.testing import hostile

    bigcodebench = directory("bigcodebench", "bigcodebench_full.jsonl")  # else the sample: the attacks play 2 of its tasks
    if not (bigcodebench / "bigcodebench_full.jsonl").is_file():
        bigcodebench = BIGCODEBENCH_SAMPLE
    return {"bigcodebench": str(bigcodebench),
            "llb-os": str(directory("llb", "os_interaction_val.json")), "llb-db": str(directory("llb", "db_val.json")),
            "hle": hostile.hle_data(scratch)}


def missing(benchmark: str, looked: Path | None = None) -> str:
    """A skip reason: what is missing and how to get it."""
    if looked is not None and looked.is_relative_to(SHARED):
        where = f" (not where the tool looks, nor in the developers' copy {looked})"
    else:
        where = f" (looked in {looked})" if looked is not None else ""
    return f"{benchmark} data not found{where}: {HOW_TO_GET[benchmark]}"


def unavailable(benchmark: str, looked: Path | None = None) -> NoReturn:
    """Skip the calling test for missing data, saying how to get it; under CI, fail it."""
    _unavailable(missing(benchmark, looked), f"{benchmark} data")


def needs(benchmark: str, path: Path) -> pytest.MarkDecorator:
    """Mark a test that reads the data file `path`: without it, `unavailable` (checked by conftest at setup)."""
    return pytest.mark.benchmark_data(benchmark, str(path))
