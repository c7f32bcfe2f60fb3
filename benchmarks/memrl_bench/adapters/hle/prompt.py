"""What the HLE agent is shown: HLE's answer-format system prompt, the memory block, the question.

The system prompts are HLE's official ones (centerforaisafety/hle, run_model_predictions.py), one
for exact answers and one for multiple choice; memories follow in full, grouped by outcome, inside
the fixed memory delimiters; an image goes as an `image_url` part.
"""

from __future__ import annotations

from typing import Any

from memrl_bench.adapters.hle.data import EXACT_MATCH
from memrl_bench.framework.protocol import delimited_memories

# HLE's official answer-format system prompts (centerforaisafety/hle, run_model_predictions.py).
SYSTEM_EXACT_ANSWER = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your final answer}\n"
    "Exact Answer: {your succinct, final answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)
SYSTEM_MULTIPLE_CHOICE = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your answer choice}\n"
    "Answer: {your chosen answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)


def build_messages(question: dict[str, Any], memories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System answer format, then the memory block (if any), then the question (text, and image if any)."""
    system = SYSTEM_EXACT_ANSWER if question["answer_type"] == EXACT_MATCH else SYSTEM_MULTIPLE_CHOICE
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    block = memory_block(memories)
    if block:
        messages.append({"role": "system", "content": block})
    if question["image"]:
        content: str | list[dict[str, Any]] = [
            {"type": "text", "text": question["question"]},
            {"type": "image_url", "image_url": {"url": question["image"]}},
        ]
    else:  # a plain string: text-only servers (e.g. llama.cpp chat templates) reject content parts
        content = question["question"]
    messages.append({"role": "user", "content": content})
    return messages


def memory_block(memories: list[dict[str, Any]]) -> str:
    """Memories in full, successful ones first, then failed ones, then those of unknown outcome."""
    sections = (
        ("success", "=== Successful Memories ==="),
        ("failure", "=== Failed Memories (for caution) ==="),
        ("unknown", "=== Other Memories (outcome unknown) ==="),
    )
    parts = []
    for outcome, title in sections:
        chosen = [m for m in memories if (m.get("outcome") or "unknown") == outcome]
        if not chosen:
            continue
        entries = [f"[{i}] Question: {m['intent']}\n{m['experience']}" for i, m in enumerate(chosen, start=1)]
        parts.append(title + "\n" + "\n\n".join(entries))
    return delimited_memories("\n\n".join(parts))
