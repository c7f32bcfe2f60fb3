"""A tiny but real benchmark for testing the harness: guess each room's passcode.

The environment checks the answer; on a wrong guess it reveals the right code, which the
episode's reflection keeps, so a later episode of the same room succeeds only if that
memory is retrieved and injected. Memory therefore helps exactly as the method intends.
`responder` is the matching scripted LLM for `ScriptedChatServer`.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM


def code(room: int) -> str:
    """The passcode of a room."""
    return str(int(hashlib.sha256(f"room{room}".encode()).hexdigest(), 16) % 9000 + 1000)


class Passcodes:
    """Rooms 1..rooms in `train`; the same rooms, asked differently, in `val`."""

    name = "passcodes"
    train_split = "train"
    eval_splits = ("val",)
    thread_safe = True

    def __init__(self, data: str | None = None, limit: int | None = None, rooms: int = 6, delay: float = 0.0,
                 **options: Any) -> None:
        self.rooms = list(range(1, rooms + 1))[:limit]
        self.delay = delay

    def tasks(self, split: str) -> list[Task]:
        phrasing = "What is the passcode of room {}?" if split == "train" else "Tell me the passcode for room {}."
        return [Task(f"{split}/room{r}", phrasing.format(r), payload=r) for r in self.rooms]

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        return self.grade(task, self.generate(task, memories, llm), llm)

    def generate(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> str:
        """The model's answer (one generation: the benchmark is a `SingleGeneration`, so self-rag applies)."""
        time.sleep(self.delay)
        block = "\n\n".join(m["experience"] for m in memories)
        return llm.chat([{"role": "system", "content": "Answer with the passcode only."},
                         {"role": "system", "content": f"Memories:\n{block}"},
                         {"role": "user", "content": task.query}]).strip()

    def grade(self, task: Task, answer: str, llm: LLM) -> Episode:
        """The room checks the code and, if wrong, reveals the right one."""
        ok = answer == code(task.payload)
        feedback = "correct" if ok else f"wrong: the passcode of room {task.payload} is {code(task.payload)}"
        return Episode(success=ok, steps=1, trajectory=f"> answer {answer}\n{feedback}", status="PASS" if ok else "FAIL")

    def close(self) -> None:
        pass


def responder(request: dict[str, Any]) -> str:
    """The scripted LLM: recalls codes from memories in the prompt, distils episodes faithfully."""
    system = request["messages"][0]["content"]
    text = "\n".join(str(m["content"]) for m in request["messages"])
    if system in (SCRIPT_SYSTEM, REFLECTION_SYSTEM):
        found = re.search(r"passcode of room (\d+) is (\d+)", text)
        return f"Remember: the passcode of room {found.group(1)} is {found.group(2)}." if found else "Answer again."
    room = re.search(r"room (\d+)", request["messages"][-1]["content"]).group(1)
    found = re.search(rf"passcode of room {room} is (\d+)", text)
    return found.group(1) if found else "0000"
