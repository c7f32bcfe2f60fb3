"""The Debian root filesystem of the LLB OS machines, built once with debootstrap and cached.

`ensure_rootfs` makes `debootstrap --variant=minbase` plus `EXTRA_PACKAGES` at
`default_rootfs_path()` (or a given path) the first time, under a file lock, and marks it
finished; the bwrap backend mounts it read-only below each sample's overlay, and
`docker_images` loads it into memrl's Docker images.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from memrl_cli.errors import MemrlError

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the LLB scripts call beyond Debian's minimal base: addgroup (adduser), pgrep/ps
# (procps), file, vi with Vim script (vim; vim-tiny lacks `:call`), zsh (two initialisation
# scripts `apt-get install zsh`, which works offline once it is installed) and python3,
# which LLB's own Ubuntu image also ships.
EXTRA_PACKAGES = ("adduser", "procps", "file", "vim", "zsh", "python3")
ROOTFS_MARKER = ".memrl-rootfs.json"
INSTALL_HINT = "install them with `apt-get install bubblewrap debootstrap` (run as root)"


def default_rootfs_path(suite: str = SUITE) -> Path:
    """Where the shared rootfs lives: `$XDG_CACHE_HOME/memrl/rootfs-<suite>` (~/.cache by default)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "memrl" / f"rootfs-{suite}"


def rootfs_ready(path: Path, packages: tuple[str, ...] = EXTRA_PACKAGES) -> bool:
    """True when `path` holds a finished rootfs built by `ensure_rootfs` with `packages`."""
    try:
        marker = json.loads((path / ROOTFS_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("packages") == list(packages)


def ensure_rootfs(path: str | Path | None = None, suite: str = SUITE, mirror: str = MIRROR,
                  packages: tuple[str, ...] = EXTRA_PACKAGES) -> Path:
    """Return a ready Debian rootfs (minbase plus `packages`) at `path`, building it with debootstrap if needed.

    The build (a few minutes; downloads ~60 MB from the Debian mirror) happens once; a file
    lock makes concurrent callers wait for one build instead of racing.
    """
    target = Path(path).expanduser() if path else default_rootfs_path(suite)
    if rootfs_ready(target, packages):
        return target
    if os.geteuid() != 0:
        raise MemrlError(f"the LLB OS rootfs {target} does not exist and building it needs root; run once as root")
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise MemrlError(f"debootstrap is missing, needed to build the LLB OS rootfs; {INSTALL_HINT}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if rootfs_ready(target, packages):
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        command = [
            debootstrap, "--variant=minbase", "--include=" + ",".join(packages), suite, str(partial), mirror,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise MemrlError(f"debootstrap failed ({' | '.join(tail)}); check access to {mirror} and retry")
        (partial / ROOTFS_MARKER).write_text(
            json.dumps({"suite": suite, "mirror": mirror, "packages": list(packages), "built": time.time()})
        )
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target
