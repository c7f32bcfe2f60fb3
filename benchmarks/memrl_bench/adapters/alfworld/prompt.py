"""What the ALFWorld agent is shown and how its reply is read, in the MemRL authors' layout.

The opening prompt is the system prompt, one worked example of the task's type, a memory block
(memories in full, grouped by outcome, inside the fixed memory delimiters), then the new task; the
agent answers "Thought: ...\\nAction: ..." and `parse_action` takes the command from that reply.
"""

from __future__ import annotations

from typing import Any

from memrl_bench.framework.protocol import delimited_memories

SYSTEM_PROMPT = """You are an agent in a household environment and must complete a task by interacting with it. First you get a description of the room and your goal. After each of your turns you get the observation that your last action produced.

In every turn, think about the current situation and plan what to do next, then give exactly one action. Your output must strictly follow this format:
Thought: <your thoughts>
Action: <your next action>

The available actions are:
1. go to {recep}
2. take {obj} from {recep}
3. move {obj} to {recep}
4. open {recep}
5. close {recep}
6. use {obj}
7. clean {obj} with {recep}
8. heat {obj} with {recep}
9. cool {obj} with {recep}
where {obj} and {recep} are objects and receptacles as the observations name them (e.g. "apple 1", "countertop 2").
If the environment answers "Nothing happens.", your action was invalid: try something else."""

EXAMPLE_PREFIX = "Here is an example of how to solve the task:\n"
TURN_PREFIX = "Now, it's your turn to solve a new task.\n"
MEMORY_INTRO = (
    "In addition to the example, here are memories of similar tasks from your past attempts. "
    "Each has a task, a script or reflection, and the trajectory of that attempt."
)
MEMORY_SECTIONS = (
    ("success", "--- SUCCESSFUL MEMORIES (Examples to follow) ---"),
    ("failure", "--- FAILED MEMORIES (Examples to avoid or learn from) ---"),
    ("unknown", "--- OTHER MEMORIES (outcome unknown) ---"),
)


def opening_messages(example: list[dict[str, str]], task_text: str, memories: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The opening prompt: system prompt, the type's example dialogue, the memory block, the new task."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for index, message in enumerate(example):
        content = message["content"]
        if index == 0:
            content = EXAMPLE_PREFIX + content
        messages.append({"role": message["role"], "content": content})
    block = memory_block(memories)
    if block:
        messages.append({"role": "system", "content": block})
    messages.append({"role": "user", "content": TURN_PREFIX + task_text})
    return messages


def memory_block(memories: list[dict[str, Any]]) -> str:
    """The system message that shows retrieved memories, grouped by outcome, in full ("" if none)."""
    if not memories:
        return ""
    parts = [MEMORY_INTRO]
    for outcome, title in MEMORY_SECTIONS:
        group = [m for m in memories if _outcome(m) == outcome]
        if not group:
            continue
        parts.append(title)
        for number, memory in enumerate(group, 1):
            parts.append(f"Memory {number}\nTask: {memory.get('intent', '').strip()}\n{memory.get('experience', '').strip()}")
    return delimited_memories("\n\n".join(parts))


def _outcome(memory: dict[str, Any]) -> str:
    outcome = memory.get("outcome")
    return outcome if outcome in ("success", "failure") else "unknown"


def parse_action(reply: str) -> str:
    """The command in a reply: the first line after its last "Action:"; `look` for an empty reply."""
    text = reply.strip()
    if "Action:" in text:
        text = text.rsplit("Action:", 1)[1].strip()
    text = text.splitlines()[0].strip() if text else ""
    return text or "look"
