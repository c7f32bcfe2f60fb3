"""The paper's baselines, as `memrl bench --method` values next to memrl, rag and none.

* `memp` — procedural memory as the MemP paper (Fang et al., 2025, arXiv 2508.06433) defines it:
  build = proceduralization (a script distilled from the trajectory, kept with it), retrieve =
  similarity of the task to the stored tasks (λ = 0, no utility), update = *validation* (only
  successful episodes add a memory) plus *adjustment* (when an episode that used memories fails,
  the top retrieved memory is revised in place from the failure). Q is never learned.
* `reflexion` — Reflexion (Shinn et al., 2023): no memory across tasks. A failed trial of a task
  leaves a verbal self-reflection on that task; the next trial of the same task (the next epoch:
  one trial per epoch, so `--epochs` is the number of trials) sees the task's most recent
  reflections, at most `REFLEXION_WINDOW` (the paper's bound of 1-3 kept in its memory).

Self-RAG (prompted reflection judgements in place of its trained critic) lives in
`memrl_bench.framework.self_rag`. pass@k is `--method pass@k` (the harness retries only unsolved tasks,
without memory); `none` over k epochs gives the same figure as its CSR after epoch k.
"""

from __future__ import annotations

from typing import Any

from memrl_cli.bank import MemoryBank
from memrl_bench.framework.experience import Chat, split_experience

REFLEXION_WINDOW = 3
ADJUST_SYSTEM = ("You maintain a procedure an agent followed on a task similar to a new one, where it failed. "
                 "Revise the procedure so that it would have avoided this failure: keep what still holds, correct "
                 "what misled the agent, at most 5 numbered steps. Output only the revised procedure.")


def adjust(llm: Chat, memory: dict[str, Any], task: str, trajectory: str) -> str:
    """MemP's adjustment: the retrieved memory's procedure revised in light of a failed episode."""
    procedure, kept_trajectory = split_experience(memory["experience"])
    user = (f"Procedure (learned on: {memory['intent']}):\n{procedure}\n\n"
            f"New task:\n{task}\n\nFailed trajectory:\n{trajectory}")
    revised = llm.chat([{"role": "system", "content": ADJUST_SYSTEM}, {"role": "user", "content": user}]).strip()
    return f"SCRIPT:\n{revised}\n\nTRAJECTORY:\n{kept_trajectory}" if kept_trajectory else f"SCRIPT:\n{revised}"


def reflexion_memories(bank: MemoryBank, task_id: str) -> list[dict[str, Any]]:
    """The task's own most recent self-reflections, newest first (Reflexion's episodic memory)."""
    rows = bank.store.recent_task_memories(task_id, REFLEXION_WINDOW)
    return [{"id": r[0], "intent": r[1], "experience": r[2], "outcome": r[3], "similarity": 1.0, "q": float(r[4]),
             "score": 0.0} for r in rows]
