"""Self-RAG (Asai et al., 2023, arXiv 2310.11511) adapted to a frozen LLM, as `memrl bench --method self-rag`.

Self-RAG trains a model to emit *reflection tokens*: [Retrieve] (should I retrieve?), [IsRel]
(is this passage relevant?), [IsSup] (is my output supported by it?) and [IsUse] (how useful is
my output, 1-5). At inference it decides whether to retrieve, generates one continuation per
retrieved passage in parallel, and keeps the continuation with the best critique score. With a
frozen chat model each reflection token becomes one prompted judgement by the same model:

1. [Retrieve]: one call on the task; "No" → answer without memories (no critique needed).
2. [IsRel]: one call per retrieved memory (similarity retrieval, λ = 0, as `rag`); the
   irrelevant ones are dropped.
3. One candidate answer per relevant memory, each generated with that memory alone.
4. [IsSup] and [IsUse]: one call each per candidate (skipped when there is a single candidate:
   nothing to choose between); the candidate with the highest
   `W_SUP·s(IsSup) + W_USE·s(IsUse)` is kept (ties: the more similar memory).
5. The environment grades the chosen answer only, once: the choice never sees the reward.

Differences from the paper: discrete labels instead of token probabilities (no soft scores, no
retrieval threshold on p([Retrieve])), irrelevant memories are dropped instead of ranked last,
one segment per episode (the whole answer) instead of a segment-level beam, and the critic is
the agent's own model, not a trained one. It needs an episode that is a single generation
(`memrl_bench.framework.protocol.SingleGeneration`): a multi-step environment cannot produce parallel
candidates without playing the task several times, which would let the environment's verdict
pick the answer.
"""

from __future__ import annotations

import re
from typing import Any

from memrl_bench.framework.protocol import LLM, Episode, SingleGeneration, Task

RETRIEVE_SYSTEM = ("You decide whether an agent about to attempt a task should consult notes from its past episodes "
                   "(procedures and reflections left by earlier tasks). Answer Yes if such notes could help with this "
                   "task, No if it is done as well without them. Answer with one word: Yes or No.")
ISREL_SYSTEM = ("You judge whether a note from a past episode is relevant to a new task: it concerns the same or a "
                "closely similar task, or gives facts or a procedure that apply to it. Answer with one word: "
                "Relevant or Irrelevant.")
ISSUP_SYSTEM = ("You judge whether an answer to a task is supported by a note from a past episode: is what the answer "
                "relies on stated in, or does it follow from, the note? Answer with one of: Fully supported, "
                "Partially supported, No support.")
ISUSE_SYSTEM = ("You rate how useful an answer is as a response to a task, from 5 (complete and highly useful) to 1 "
                "(barely addresses it). Answer with one digit from 1 to 5.")
W_SUP, W_USE = 1.0, 0.5  # the Self-RAG paper's default critique weights (w_IsRel is moot: only relevant memories remain)
SUPPORT = {"fully": 1.0, "partially": 0.5, "no": 0.0}  # s(IsSup) = p(fully) + 0.5 p(partially), with hard labels


def applies(adapter: Any) -> bool:
    """True when `adapter` (class or instance) plays an episode as one generation the environment grades."""
    generate, grade = getattr(adapter, "generate", None), getattr(adapter, "grade", None)
    return callable(generate) and callable(grade) and bool(getattr(adapter, "uses_llm", True))


def _ask(llm: LLM, system: str, user: str) -> str:
    return llm.chat([{"role": "system", "content": system}, {"role": "user", "content": user}]).strip()


def _note(memory: dict[str, Any]) -> str:
    return f"Note (from a past episode on: {memory['intent']}):\n{memory['experience']}"


def wants_retrieval(llm: LLM, task: Task) -> bool:
    """[Retrieve]: anything but an answer starting with "No" retrieves (retrieval is the safe default)."""
    return not re.match(r"\W*no\b", _ask(llm, RETRIEVE_SYSTEM, f"Task:\n{task.query}"), re.IGNORECASE)


def is_relevant(llm: LLM, task: Task, memory: dict[str, Any]) -> bool:
    """[IsRel] of one memory for the task."""
    reply = _ask(llm, ISREL_SYSTEM, f"Task:\n{task.query}\n\n{_note(memory)}")
    return re.match(r"\W*relevant\b", reply, re.IGNORECASE) is not None


def support(llm: LLM, task: Task, memory: dict[str, Any], answer: str) -> float:
    """s([IsSup]) of an answer generated with `memory`: 1 fully, 0.5 partially, 0 otherwise."""
    reply = _ask(llm, ISSUP_SYSTEM, f"Task:\n{task.query}\n\n{_note(memory)}\n\nAnswer:\n{answer}").lower()
    return next((score for label, score in SUPPORT.items() if re.match(rf"\W*{label}\b", reply)), 0.0)


def usefulness(llm: LLM, task: Task, answer: str) -> float:
    """s([IsUse]) in [-1, 1]: the 1-5 rating mapped linearly (3 → 0), as the paper's weights (-1, -0.5, 0, 0.5, 1)."""
    found = re.search(r"[1-5]", _ask(llm, ISUSE_SYSTEM, f"Task:\n{task.query}\n\nAnswer:\n{answer}"))
    return (int(found.group()) - 3) / 2 if found else -1.0


def play(adapter: SingleGeneration, task: Task, memories: list[dict[str, Any]], llm: LLM) -> tuple[Episode, list[int]]:
    """One Self-RAG episode over `memories` (retrieved by similarity, best first).

    Returns the graded episode and the ids of the memories its answer was generated with (at most
    one); `episode.info["self_rag"]` records the decisions: retrieve, relevant ids, each candidate's score.
    """
    trace: dict[str, Any] = {"retrieve": bool(memories) and wants_retrieval(llm, task), "relevant": [],
                             "scores": {}}
    relevant = [m for m in memories if is_relevant(llm, task, m)] if trace["retrieve"] else []
    trace["relevant"] = [m["id"] for m in relevant]
    chosen: dict[str, Any] | None = None
    if not relevant:
        answer = adapter.generate(task, [], llm)
    else:
        candidates = [(m, adapter.generate(task, [m], llm)) for m in relevant]
        chosen, answer = candidates[0]
        if len(candidates) > 1:
            best = None
            for memory, text in candidates:
                score = W_SUP * support(llm, task, memory, text) + W_USE * usefulness(llm, task, text)
                trace["scores"][str(memory["id"])] = score
                if best is None or score > best:
                    best, chosen, answer = score, memory, text
    episode = adapter.grade(task, answer, llm)
    trace["chosen"] = chosen["id"] if chosen else None
    episode.info["self_rag"] = trace
    return episode, [chosen["id"]] if chosen else []
