"""Lifelong Agent Bench, OS interaction: multi-turn bash tasks graded by a check script.

One episode is one LLB sample in a fresh machine (`memrl_bench.environments.os_machines.os_sandbox`): the sample's
initialisation script runs, then the agent acts for at most `max_rounds` turns with LLB's
protocol (`Act: bash` + a ```bash block, or `Act: finish`), then the sample's evaluation
script runs; exit code 0 means success. As in LLB, the check runs however the episode ended
(finish, round limit or an unparsable reply). See docs/llb.md ("OS tasks").
"""

from __future__ import annotations

import re
from typing import Any

from memrl_bench.adapters import llb_common
from memrl_bench.adapters.llb_os import weak_checks
from memrl_bench.environments.os_machines.os_machine import CommandResult, Limits, Sandbox, SandboxError
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
from memrl_bench.framework.observation_cap import cap
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError

SPLIT_FILES = {"train": "os_interaction_train.json", "val": "os_interaction_val.json"}

# LLB's task requirement for os_interaction (chat_history_items/standard/os_interaction.json),
# with the round limit filled in from `max_rounds`; `llb_common.opening_messages` appends LLB's
# closing sentence ("Now, I will give you the question ...").
TASK_REQUIREMENT = """I will provide you with a task to perform on a Linux (Ubuntu) system. Your objective is to complete the task by executing the appropriate Bash commands.

### Interaction Rules:
1. **Thorough Analysis and Reasoning**:
    - Before performing any action, carefully analyze the task and explain your thought process.
    - Include a detailed explanation of the logic behind your choice of commands and approach.

2. **Action Choices**:
   - At the end of your reasoning, select **one and only one action** for each turn.
     - **"bash"**: When you need to execute a command or perform an operation, provide the corresponding Bash code. Structure your response as:
        Act: bash
        ```bash
        # Your Bash command(s) here
        ```
     - **"finish"**: When the task is complete and no further action is required, conclude with:
        Act: finish

3. **Other Guidelines**:
    - I will use "Act: bash" and "Act: finish" literally to determine whether your action is to execute commands or conclude the task.
    - Use the provided format accurately and consistently.
    - Ensure all Bash commands are compatible with Linux (Ubuntu) systems.
    - Avoid interactive operations (e.g., read, readline) in your Bash commands.

4. **Task Completion**:
    - The task will conclude either when you select the "finish" action or when the number of rounds reaches {max_rounds}.
    - The system will evaluate your performance to determine if the task was successfully completed."""
# MemRL's strict output block for LLB-OS (memrl/lifelongbench_eval/prompts.py), condensed.
STRICT_OUTPUT_FORMAT = """STRICT OUTPUT FORMAT (LLB-OS, do not violate):
1) End every reply with exactly ONE action line: `Act: bash` or `Act: finish`.
2) After `Act: bash`, put your commands in one ```bash fenced code block.
3) `Act: finish` ends the task: use it only when the task is done, as the last line."""

_ACTION = re.compile(r"Act:\s*(.+)")
_BASH_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)
TRUNCATION_MARKER = "\n[truncated because the output is too long]"

# Episode statuses.
CORRECT = "CORRECT"
INCORRECT = "INCORRECT"
ROUND_LIMIT = "ROUND_LIMIT"
FORMAT_ERROR = "FORMAT_ERROR"
ENV_ERROR = "ENV_ERROR"
LIMIT_STATUS = {"memory": "LIMIT_MEMORY", "processes": "LIMIT_PROCESSES", "disk": "LIMIT_DISK", "cpu": "LIMIT_CPU"}
_SIGXCPU_EXIT = 128 + 24  # bash's exit status when its command died of SIGXCPU
_FAILURE_STATUS = {"finish": INCORRECT, "round_limit": ROUND_LIMIT, "format_error": FORMAT_ERROR}


class LLBOperatingSystem:
    """LLB OS interaction tasks (350 train / 150 val; 322 / 140 without the weak checks) in per-sample sandboxes.

    Options: `max_rounds` agent turns (MemRL: 15); `command_timeout` seconds per script (LLB:
    20); `max_output_chars` cuts each observation as AgentBench does (0 keeps everything, as
    LLB itself does, up to `observation_cap.MAX_OBSERVATION_BYTES`, 16 KiB); `backend` "auto" |
    "docker" | "bwrap"; `rootfs` the bwrap rootfs
    directory (default ~/.cache/memrl/rootfs-bookworm, built on first use); `docker_image`
    the Docker image tag (built on first use). Limits of the sandbox, either backend (`os_machine.Limits`):
    `memory_mb` and `nproc` for the whole sample, `cpu_seconds` per process, `disk_mb` written;
    a failed episode that hit one ends as LIMIT_MEMORY, LIMIT_PROCESSES, LIMIT_CPU or LIMIT_DISK.
    `untrusted_check`: run on a Docker daemon where the check cannot be trusted (not on this
    machine, not as root, an image whose files are not here: the check would run with the agent's
    own tools, so a reward could be forged); refused by default, the episode's
    `info["untrusted_check"]` says why when allowed. The samples whose check a lazy strategy passes
    (`weak_checks`) are left out of both splits (`left_out` says which) unless `keep_weak_checks`.
    """

    name = "llb-os"
    train_split = "train"
    eval_splits: tuple[str, ...] = ("val",)

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        max_rounds: int = 15,
        command_timeout: float = 20,
        rootfs: str | None = None,
        backend: str = "auto",
        max_output_chars: int = 800,
        docker_image: str | None = None,
        memory_mb: int = Limits.memory_mb,
        nproc: int = Limits.nproc,
        cpu_seconds: int = Limits.cpu_seconds,
        disk_mb: int = Limits.disk_mb,
        untrusted_check: bool = False,
        keep_weak_checks: bool = False,
    ) -> None:
        if int(max_rounds) < 1:
            raise MemrlError(f"llb-os max_rounds must be >= 1, got {max_rounds}")
        if float(command_timeout) <= 0:
            raise MemrlError(f"llb-os command_timeout must be > 0 seconds, got {command_timeout}")
        self.max_rounds = int(max_rounds)
        self.command_timeout = float(command_timeout)
        self.max_output_chars = int(max_output_chars)
        self.data = llb_common.data_dir(data, tuple(SPLIT_FILES.values()))
        self.limit = int(limit) if limit is not None else None
        self.untrusted_check = bool(untrusted_check)
        self.weak_checks = {} if bool(keep_weak_checks) else weak_checks.load()
        image = {"image": docker_image} if docker_image else {}
        limits = Limits(int(memory_mb), int(nproc), int(cpu_seconds), int(disk_mb))
        if min(limits.memory_mb, limits.nproc, limits.cpu_seconds, limits.disk_mb) < 1:
            raise MemrlError(f"llb-os limits must be >= 1, got {limits}")
        self.sandboxes = SandboxFactory(backend=backend, timeout=self.command_timeout, rootfs=rootfs, limits=limits,
                                        **image)

    def tasks(self, split: str) -> list[Task]:
        """The samples of `split` ("train" or "val") in sample-index order, as `os/<key>` tasks."""
        if split not in SPLIT_FILES:
            raise MemrlError(f"llb-os has no split {split!r}; choose one of {sorted(SPLIT_FILES)}")
        path = self.data / SPLIT_FILES[split]
        tasks = []
        for key, sample in llb_common.load_samples(path, self.limit):
            if f"os/{key}" in self.weak_checks:
                continue
            try:
                evaluation = sample["evaluation_info"]
                payload = {
                    "init": _script(sample["initialization_command_item"]),
                    "check": _script(evaluation["evaluation_command_item"]),
                    "ground_truth": _script(evaluation["ground_truth_command_item"]),
                }
                instruction = str(sample["instruction"])
            except (KeyError, TypeError) as exc:
                raise MemrlError(f"{path}: sample {key} is not an LLB OS task (missing {exc})") from exc
            meta = {"split": split, "skills": list(sample.get("skill_list", []))}
            tasks.append(Task(id=f"os/{key}", query=instruction, payload=payload, meta=meta))
        return tasks

    def left_out(self) -> dict[str, Any] | None:
        """The samples `tasks` leaves out (`weak_checks`), per split, and why; None when none is."""
        ids = {split: [f"os/{key}" for key, _ in llb_common.load_samples(self.data / name, self.limit)
                       if f"os/{key}" in self.weak_checks] for split, name in SPLIT_FILES.items()}
        total = sum(map(len, ids.values()))
        if not total:
            return None
        counts = ", ".join(f"{split} {len(found)}" for split, found in ids.items())
        text = (f"llb-os leaves out {total} samples ({counts}) whose check a lazy strategy passes "
                f"({weak_checks.LIST_FILE.name}; --option keep_weak_checks=true plays them)")
        return {"text": text, "ids": ids}

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        """Play one sample in a fresh sandbox and grade it with its check script."""
        turns: list[tuple[str, str | None]] = []
        info: dict[str, Any] = {}
        try:
            sandbox = self.sandboxes.create()
        except SandboxError as exc:  # the environment's failure, never the agent's
            return _env_error(turns, info, str(exc))
        reason = getattr(sandbox, "untrusted_check", None)
        if reason and not self.untrusted_check:
            sandbox.close()
            raise MemrlError(f"llb-os: the check cannot be trusted on this Docker daemon ({reason}), so rewards could "
                             "be forged; run as root beside the daemon, use --option backend=bwrap, or accept it "
                             "with --option untrusted_check=true")
        try:
            init = sandbox.run(task.payload["init"])
            if init.timed_out or init.exit_code != 0:
                return _env_error(turns, info, f"initialisation failed (exit {init.exit_code}): {init.output[-300:]}")
            finish_reason = self._play(sandbox, task, memories, llm, turns, info)
            # The check runs with trusted tools (the agent may have replaced bash & co).
            check = sandbox.run(task.payload["check"], trusted=True)
            if getattr(sandbox, "untrusted_check", None):
                info["untrusted_check"] = sandbox.untrusted_check
            limit_hit = sandbox.limit_hit() or info.pop("cpu_limit_hit", None)
        except SandboxError as exc:
            return _env_error(turns, info, str(exc))
        finally:
            sandbox.close()
        success = check.exit_code == 0 and not check.timed_out
        info.update(finish_reason=finish_reason, check_exit_code=check.exit_code)
        if limit_hit:
            info["limit_hit"] = limit_hit
        status = CORRECT if success else LIMIT_STATUS.get(limit_hit or "", _FAILURE_STATUS[finish_reason])
        return Episode(success, len(turns), llb_common.render_trajectory(turns), status=status, info=info)

    def close(self) -> None:
        """Nothing to release: every sandbox is closed at the end of its episode."""

    def _play(
        self, sandbox: Sandbox, task: Task, memories: list[dict[str, Any]], llm: LLM,
        turns: list[tuple[str, str | None]], info: dict[str, Any],
    ) -> str:
        """The agent's turns (appended to `turns`); returns "finish", "round_limit" or "format_error"."""
        system = llb_common.system_prompt(memories, STRICT_OUTPUT_FORMAT)
        requirement = TASK_REQUIREMENT.format(max_rounds=self.max_rounds)
        messages = llb_common.opening_messages(system, requirement, task.query)
        for _ in range(self.max_rounds):
            reply = llm.chat(messages)
            action, script = parse_action(reply)
            if action != "bash":
                turns.append((reply, None))
                return "finish" if action == "finish" else "format_error"
            result = sandbox.run(script)
            if result.exit_code == _SIGXCPU_EXIT:
                info["cpu_limit_hit"] = "cpu"
            observation = self.observation(result)
            turns.append((reply, observation))
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        return "round_limit"

    def observation(self, result: CommandResult) -> str:
        """What the agent sees after a script, in LLB's words (cut to `max_output_chars`, and in any
        case to `observation_cap.MAX_OBSERVATION_BYTES`, the cut marked)."""
        if result.timed_out:
            return f"The command is marked as timeout since it did not finish within {self.command_timeout:g} seconds."
        output = result.output
        if 0 < self.max_output_chars < len(output):
            output = output[: max(0, self.max_output_chars - 20)] + TRUNCATION_MARKER
        return "The output of the OS:\n\n" + cap(output) if output else "The output of the OS is empty."


def parse_action(reply: str) -> tuple[str, str]:
    """LLB's parser: ("bash", script), ("finish", "") or ("invalid", "").

    The first `Act:` decides; a bash action runs all ```bash blocks joined by blank lines
    (an empty script when there is none, as in LLB). `Act: answer(...)` is invalid: LLB's OS
    task has no answer action, every sample is graded by its check script.
    """
    match = _ACTION.search(reply)
    if match is None:
        return "invalid", ""
    action = match.group(1).lower()
    if action.startswith("bash"):
        return "bash", "\n\n".join(_BASH_BLOCK.findall(reply))
    if action.startswith("finish"):
        return "finish", ""
    return "invalid", ""


def _env_error(turns: list[tuple[str, str | None]], info: dict[str, Any], reason: str) -> Episode:
    info["env_error"] = reason
    return Episode(False, len(turns), llb_common.render_trajectory(turns), status=ENV_ERROR, env_error=True, info=info)


def _script(item: dict[str, Any]) -> str:
    if item.get("command_name") != "bash":
        raise MemrlError(f"unsupported LLB command {item.get('command_name')!r}; only bash scripts are supported")
    return str(item["script"])
