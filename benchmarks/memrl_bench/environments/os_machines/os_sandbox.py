"""Throw-away Linux machines for the Lifelong Agent Bench OS tasks: one per sample, backend chosen once.

LLB runs every sample as root in a fresh Ubuntu container and runs each script with
`docker exec bash -c SCRIPT`: a new shell per script (cwd `/`, no shell state carried over),
while files, users and background processes persist until the container is killed.

`SandboxFactory` makes one such machine per sample; both backends give the same contract
(`os_machine.Sandbox`: `run(script) -> CommandResult`, `limit_hit()`, `close()`):

* `os_docker.DockerSandbox`: a container per sample, without network and with memory, process
  and CPU limits, from memrl's Debian image (`docker_images`: the rootfs of `os_rootfs` loaded
  with `docker import`, built on first use), used when a Docker daemon answers.
* `os_bwrap.BwrapSandbox`: no Docker. Per sample, a fresh overlay of a Debian rootfs made once
  with `debootstrap --variant=minbase` (`os_rootfs`), in namespaces of its own entered with
  `bwrap` (no network); one long-lived bwrap process holds them, so a background process started
  by one script is still there for the next one and for the check.

Either way scripts run as root with Docker's default capabilities minus CAP_MKNOD (no mounting,
no devices), within the sample's limits (bwrap: its cgroup, `os_cgroup`, and rlimits,
`os_machine.Limits`; Docker: the container's cgroup and ulimits, no address-space limit). The
check enters the machine from the host (`os_exec`, `os_enter.py`, as every bwrap script does) and
runs in the pristine image, with the agent's state only as data (`os_check_view`) and out of
reach of the agent's programs it runs (`os_check_guard`); a Docker machine does so only
where `DockerSandbox.untrusted_check` is None (root, a local daemon, the image's files on this
host), else its check runs through `docker exec` with the machine's own tools.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from memrl_bench.environments import docker_images
from memrl_bench.environments.os_machines.os_bwrap import BwrapSandbox, check_bwrap_tools
from memrl_bench.environments.os_machines.os_docker import DockerSandbox
from memrl_bench.environments.os_machines.os_machine import Limits, Sandbox
from memrl_bench.environments.os_machines.os_rootfs import ensure_rootfs
from memrl_cli.errors import MemrlError

DOCKER_IMAGE = "memrl/llb-os"  # memrl's own image (`memrl_bench.environments.docker_images`), built on first use


class SandboxFactory:
    """Makes one sandbox per sample with the backend chosen once.

    `backend`: "auto" (Docker if a daemon answers, else bwrap), "docker" or "bwrap".
    `rootfs`: the bwrap rootfs directory (built on first use; default `os_rootfs.default_rootfs_path()`).
    `image`: the Docker image; the default `DOCKER_IMAGE` is memrl's (`docker_images`, built on
    first use), any other must exist and have `bash` and `cat`.
    Picklable: the Docker client and the rootfs check are made lazily in each process.
    """

    def __init__(self, backend: str = "auto", timeout: float = 20.0, rootfs: str | Path | None = None,
                 image: str = DOCKER_IMAGE, limits: Limits = Limits()) -> None:
        if backend not in ("auto", "docker", "bwrap"):
            raise MemrlError(f"unknown LLB OS sandbox backend {backend!r}; choose auto, docker or bwrap")
        self.backend = backend
        self.timeout = float(timeout)
        self.rootfs = rootfs
        self.image = image
        self.limits = limits
        self._client: Any = None
        self._image_tag = image
        self._pristine: str | None = None
        self._rootfs_path: Path | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_pristine": None, "_rootfs_path": None}

    def resolve(self) -> str:
        """Pick the backend now ("docker" or "bwrap") and prepare it (image or rootfs)."""
        if self._client is not None:
            return "docker"
        if self._rootfs_path is not None:
            return "bwrap"
        if self.backend in ("auto", "docker"):
            self._client = docker_images.require_docker() if self.backend == "docker" else docker_images.docker_client()
            if self._client is not None:
                own = self.image == DOCKER_IMAGE
                self._image_tag = docker_images.ensure_image(self._client, "llb-os") if own else self.image
                self._pristine = docker_images.image_files(self._client, self._image_tag)
                return "docker"
        check_bwrap_tools()
        self._rootfs_path = ensure_rootfs(self.rootfs)
        return "bwrap"

    def create(self) -> Sandbox:
        """A fresh sandbox for one sample."""
        if self.resolve() == "docker":
            return DockerSandbox(self._client, self._image_tag, self.timeout, **asdict(self.limits),
                                 pristine=self._pristine)
        assert self._rootfs_path is not None
        return BwrapSandbox(self._rootfs_path, self.timeout, self.limits)
