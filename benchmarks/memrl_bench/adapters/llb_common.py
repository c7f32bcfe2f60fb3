"""Pieces shared by the Lifelong Agent Bench adapters (`llb-db`, `llb-os`).

Data: each LLB task ships as JSON objects keyed by sample index ("0".."499"), split into a
train file and a val file. Prompts: LLB's multi-turn chat (task requirement as the first user
turn, "OK." from the agent, then the sample's instruction), with MemRL's system prompt that
carries the retrieved memories and ends with the task's strict output format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from memrl_bench.framework.protocol import delimited_memories
from memrl_cli.errors import MemrlError

DATA_ENV = "LLB_DATA"
DATA_HINT = (
    "get the Lifelong Agent Bench JSON files (Hugging Face dataset csyq/LifelongAgentBench, or the "
    "train/val splits shipped with MemTensor/MemRL under data/llb/) and pass --data DIR or set $LLB_DATA"
)

# MemRL's LLB system prompt (memrl/lifelongbench_eval/prompts.py: DEFAULT_SYSTEM_PROMPT).
SYSTEM_PROMPT = """You are an execution-focused AI agent solving database and operating-system tasks.

You may receive a [Retrieved Memory Context] block with past experiences from similar problems.
These are **references for learning**, not guaranteed solutions:
- [MEMORY TYPE] SUCCESS_PROCEDURE: A successful approach from a similar task—learn the pattern.
- [MEMORY TYPE] FAILURE_REFLECTION: A failed attempt with lessons—avoid similar mistakes.

Use the memories as inspiration, but always analyze your current task independently and
adapt your approach based on its specific requirements."""

# LLB's standard chat-history suffix (src/factories/chat_history_item/offline/construct.py).
REQUIREMENT_SUFFIX = "\n\nNow, I will give you the question that you need to solve."


def data_dir(data: str | os.PathLike[str] | None, files: tuple[str, ...]) -> Path:
    """The directory holding all of `files`, from `data` or $LLB_DATA; a MemrlError if absent."""
    raw = data if data is not None else os.environ.get(DATA_ENV)
    if raw is None:
        raise MemrlError(f"no LLB data directory given: {DATA_HINT}")
    directory = Path(raw).expanduser()
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise MemrlError(f"{directory} lacks {', '.join(missing)}: {DATA_HINT}")
    return directory


def load_samples(path: Path, limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """`(key, sample)` pairs of one split file, in numeric key order, the first `limit` of them."""
    try:
        samples = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MemrlError(f"cannot read LLB data {path}: {exc}") from exc
    if not isinstance(samples, dict):
        raise MemrlError(f"{path} is not an LLB split (expected a JSON object keyed by sample index)")
    ordered = sorted(samples.items(), key=lambda item: _key_order(item[0]))
    return ordered[:limit] if limit is not None else ordered


def _key_order(key: str) -> tuple[int, int, str]:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def memory_block(memories: list[dict[str, Any]]) -> str:
    """Retrieved memories as MemRL's `[Retrieved Memory Context]` block ("" when there are none)."""
    groups = (
        ("success", "=== SUCCESSFUL EXPERIENCES (Learn from these) ===", "SUCCESS", "procedure"),
        ("failure", "=== FAILED EXPERIENCES (Avoid these mistakes) ===", "FAILURE", "adjustment"),
        ("unknown", "=== OTHER EXPERIENCES (outcome unknown) ===", "EXPERIENCE", "procedure"),
    )
    lines: list[str] = []
    for outcome, header, label, kind in groups:
        chosen = [m for m in memories if m.get("outcome", "unknown") == outcome]
        if chosen:
            lines.append(f"\n{header}")
        for number, memory in enumerate(chosen, 1):
            lines.append(f"[{label} {number}] [TYPE: {kind}]\nTask: {memory['intent']}\n{memory['experience']}\n")
    return delimited_memories("\n".join(["[Retrieved Memory Context]", *lines])) if lines else ""


def system_prompt(memories: list[dict[str, Any]], output_format: str) -> str:
    """MemRL's order: base prompt, then the memory block, then the strict output format, last."""
    parts = [SYSTEM_PROMPT, memory_block(memories), output_format]
    return "\n\n".join(part for part in parts if part)


def opening_messages(system: str, requirement: str, instruction: str) -> list[dict[str, str]]:
    """System prompt, LLB's requirement turn, the agent's "OK.", then the sample's instruction."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": requirement + REQUIREMENT_SUFFIX},
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": instruction},
    ]


def render_trajectory(turns: list[tuple[str, str | None]]) -> str:
    """The agent's replies and what it observed after each, as plain text for the memory."""
    blocks = []
    for reply, observation in turns:
        blocks.append(f"Agent:\n{reply.strip()}")
        if observation is not None:
            blocks.append(f"Observation:\n{observation}")
    return "\n\n".join(blocks)
