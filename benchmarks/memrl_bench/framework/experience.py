"""Episode → memory text: a success is distilled into a short reusable script (kept with its
trajectory), a failure into a reflection on what went wrong (kept with the failed attempt).

Unlike the authors' code, the model sees the task together with the agent's own trajectory,
never the whole prompt with system text, few-shot examples and injected memories.
"""

from __future__ import annotations

from typing import Any, Protocol

SCRIPT_SYSTEM = ("You turn a successful agent episode into a reusable procedure. Write a concise, high-level "
                 "script of at most 5 numbered steps: generic enough to reuse on similar tasks, specific enough "
                 "to help, focused on the strategy and the key decisions. Output only the script.")
REFLECTION_SYSTEM = ("You analyse a failed agent episode. In a few sentences say what went wrong (wrong "
                     "assumptions, missed steps, invalid actions), what to do differently next time, and what "
                     "to avoid. Output only the reflection.")


class Chat(Protocol):
    """Anything with a Chat Completions `chat` method (e.g. `memrl_bench.framework.llm.ChatClient`)."""

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        """Return the assistant's reply."""
        ...


def distil(llm: Chat, task: str, trajectory: str, success: bool) -> str:
    """The experience text stored for an episode: SCRIPT or REFLECTION, then the trajectory.

    Both calls use the run's own sampling settings (the authors hard-coded temperature 0.3 for
    reflections, which reasoning models reject).
    """
    user = f"Task:\n{task}\n\nTrajectory:\n{trajectory}"
    if success:
        script = llm.chat([{"role": "system", "content": SCRIPT_SYSTEM}, {"role": "user", "content": user}])
        return f"SCRIPT:\n{script.strip()}\n\nTRAJECTORY:\n{trajectory}"
    reflection = llm.chat([{"role": "system", "content": REFLECTION_SYSTEM}, {"role": "user", "content": user}])
    return f"REFLECTION:\n{reflection.strip()}\n\nTRAJECTORY:\n{trajectory}"


def split_experience(experience: str) -> tuple[str, str]:
    """(script or reflection, trajectory) of a stored experience; the whole text if it has no such parts."""
    head, sep, trajectory = experience.partition("\n\nTRAJECTORY:\n")
    for label in ("SCRIPT:\n", "REFLECTION:\n"):
        if head.startswith(label):
            head = head[len(label):]
    return head, trajectory if sep else ""
