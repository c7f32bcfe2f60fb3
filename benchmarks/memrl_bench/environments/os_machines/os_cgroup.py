"""The cgroups that cap an LLB OS machine's memory and processes, and tell which cap it hit.

`Cgroup.create` makes a pids + memory cgroup (v1 hierarchies or v2) for a bwrap sandbox;
`Cgroup.of_process` finds the cgroups a process already is in (a Docker container's).
`limit_hit` reads their event counters: a refused fork, an OOM kill.
"""

from __future__ import annotations

import time
from pathlib import Path

from memrl_bench.environments.os_machines.os_machine import Limits


class Cgroup:
    """A pids + memory cgroup for one sandbox (cgroup v1 hierarchies or v2), or None if not writable."""

    def __init__(self, directories: dict[str, Path]) -> None:
        self.directories = directories  # controller -> directory ("unified" for v2)

    @classmethod
    def create(cls, name: str, limits: Limits) -> Cgroup | None:
        memory = (limits.memory_mb + limits.disk_mb) * 1024 * 1024  # tmpfs pages count as memory
        base = Path("/sys/fs/cgroup")
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        if (base / "cgroup.controllers").exists():
            plan = {"unified": (base / name, {"pids.max": limits.nproc, "memory.max": memory})}
        else:
            plan = {"pids": (base / "pids" / own.get("pids", "/").lstrip("/") / name, {"pids.max": limits.nproc}),
                    "memory": (base / "memory" / own.get("memory", "/").lstrip("/") / name,
                               {"memory.limit_in_bytes": memory})}
        made: dict[str, Path] = {}
        try:
            for controller, (directory, settings) in plan.items():
                directory.mkdir()
                made[controller] = directory
                for key, value in settings.items():
                    (directory / key).write_text(str(value))
        except OSError:
            cls(made).remove()
            return None
        return cls(made)

    @classmethod
    def of_process(cls, pid: int) -> Cgroup | None:
        """The cgroups process `pid` is in (e.g. a Docker container's), or None if they are not visible here.

        Never `remove()` these: they belong to whoever made them.
        """
        base = Path("/sys/fs/cgroup")
        found: dict[str, Path] = {}
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            hierarchy = base / controllers.replace("name=", "") if controllers else base  # "" is cgroup v2
            if (hierarchy / path.lstrip("/") / "cgroup.procs").exists():
                found[controllers or "unified"] = hierarchy / path.lstrip("/")
        return cls(found) if found else None

    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories.values()]

    def limit_hit(self) -> str | None:
        """"processes" when a fork was refused, "memory" when the OOM killer ran, else None."""
        for directory in self.directories.values():
            for events, key, hit in (("pids.events", "max", "processes"), ("memory.events", "oom_kill", "memory"),
                                     ("memory.oom_control", "oom_kill", "memory")):
                try:
                    counts = dict(line.split() for line in (directory / events).read_text().splitlines())
                except (OSError, ValueError):
                    continue
                if int(counts.get(key, 0)) > 0:
                    return hit
        return None

    def remove(self) -> None:
        """Remove the cgroups (waiting briefly for the killed processes to leave them)."""
        for directory in self.directories.values():
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
