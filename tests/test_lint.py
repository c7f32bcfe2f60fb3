"""Lint (ruff) and types (mypy) as CI runs them, with the settings in pyproject.toml; the failure
shows the tools' own report. Without a tool (not the dev extra) these skip, except under CI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import unavailable

ROOT = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` from the repository root; skipped (failed under CI) when not installed."""
    if importlib.util.find_spec(module) is None:
        unavailable(f"{module} is not installed (pip install -e '.[dev]')", module)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing() -> None:
    done = run_tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff check . found problems (fix them, or `ruff check --fix .`):\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_mypy_finds_nothing() -> None:
    done = run_tool("mypy")  # files and settings: [tool.mypy] in pyproject.toml
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"
