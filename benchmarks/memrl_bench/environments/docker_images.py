"""The Docker daemon and the images of the LLB Docker backends, built without an image registry.

Each image is a Debian root filesystem made with `debootstrap` (`os_rootfs.ensure_rootfs`,
cached under `~/.cache/memrl/`) and loaded with `docker import`, so only the Debian mirror is
needed, never Docker Hub:

* `llb-os`: the LLB OS sandbox (minbase plus `os_rootfs.EXTRA_PACKAGES`, the same rootfs as
  the bwrap backend's);
* `llb-db`: the LLB DBBench server (minbase plus `mariadb-server`).

An image is tagged `memrl/<name>:<version>`, the version being a hash of what goes into it
(suite, packages, import settings): a tag that exists is up to date, a change of contents makes
a new tag (and older tags of the same name are removed). Building is idempotent and happens on
first use; to build ahead of time (or see the tags):

    python -m memrl_bench.environments.docker_images [llb-os] [llb-db]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl_bench.environments.os_machines.os_machine import SANDBOX_PATH
from memrl_bench.environments.os_machines.os_rootfs import EXTRA_PACKAGES, ROOTFS_MARKER, SUITE, default_rootfs_path, ensure_rootfs
from memrl_cli.errors import MemrlError

_IMPORT_TIMEOUT = 900  # seconds the daemon may take to import one root filesystem
START_HINT = "start it as root (`dockerd &`, or `systemctl start docker`; `apt-get install docker.io`)"


@dataclass(frozen=True)
class ImageSpec:
    """What goes into one image: Debian packages on top of minbase, and `docker import` changes."""

    name: str
    packages: tuple[str, ...]
    changes: tuple[str, ...]

    @property
    def tag(self) -> str:
        """`memrl/<name>:<hash of the contents>`."""
        content = json.dumps({"suite": SUITE, "packages": self.packages, "changes": self.changes}, sort_keys=True)
        return f"memrl/{self.name}:{hashlib.sha256(content.encode()).hexdigest()[:12]}"

    @property
    def rootfs(self) -> Path:
        """The cached rootfs directory; llb-os shares the bwrap backend's."""
        base = default_rootfs_path(SUITE)
        return base if self.packages == EXTRA_PACKAGES else base.with_name(f"{base.name}-{self.name}")


IMAGES = {
    "llb-os": ImageSpec("llb-os", EXTRA_PACKAGES, (f"ENV PATH={SANDBOX_PATH}", 'CMD ["bash"]')),
    "llb-db": ImageSpec("llb-db", ("mariadb-server",), ('CMD ["bash"]',)),
}


def _connect(timeout: int) -> tuple[Any | None, str]:
    try:
        import docker
    except ImportError:
        return None, "the `docker` Python package is not installed"
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # no socket, daemon down, permission denied
        return None, str(exc).splitlines()[0][:200]
    return client, ""


def docker_client() -> Any | None:
    """A docker SDK client whose daemon answers a ping, or None."""
    return _connect(10)[0]


def require_docker() -> Any:
    """A docker SDK client, or a MemrlError saying why there is none and how to start the daemon."""
    client, reason = _connect(10)
    if client is None:
        raise MemrlError(f"no Docker daemon answers ({reason}); {START_HINT}")
    return client


def ensure_image(client: Any, name: str) -> str:
    """Return the tag of image `name` ("llb-os" or "llb-db"), building it first if it is missing.

    Needs root the first time (debootstrap); concurrent callers wait for one build (file lock).
    """
    import docker

    spec = IMAGES[name]
    if _has_image(client, spec.tag):
        return spec.tag
    rootfs = spec.rootfs
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    with open(rootfs.parent / f".docker-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _has_image(client, spec.tag):
            return spec.tag
        ensure_rootfs(rootfs, packages=spec.packages)
        repository, version = spec.tag.split(":")
        changes = [*spec.changes, f"LABEL memrl.image={name} memrl.version={version}"]
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", f"--exclude=./{ROOTFS_MARKER}", "-c", "."],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        assert tar.stdout is not None
        importer = docker.from_env(timeout=_IMPORT_TIMEOUT)
        try:
            importer.api.import_image(src=iter(lambda: tar.stdout.read(1 << 20), b""), repository=repository,
                                      tag=version, changes=changes, stream_src=True)
        except Exception as exc:
            raise MemrlError(f"docker import of {rootfs} failed: {exc}") from exc
        finally:
            tar.stdout.close()
            error = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
            if tar.wait() != 0 and _has_image(client, spec.tag):
                client.images.remove(spec.tag, force=True)
                raise MemrlError(f"could not read {rootfs} for docker import: {error.strip()[-300:]}")
        _remove_stale(client, name, spec.tag)
    return spec.tag


def image_files(client: Any, tag: str) -> str | None:
    """The host directory holding image `tag`'s files, or None where there is none here.

    A one-layer image (what `docker import` makes) on the overlay2 storage driver keeps its
    files in one directory, which the LLB-OS check uses as its pristine root (`os_docker`).
    """
    attrs = client.images.get(tag).attrs
    driver = attrs.get("GraphDriver") or {}
    files = (driver.get("Data") or {}).get("UpperDir")
    if driver.get("Name") != "overlay2" or len((attrs.get("RootFS") or {}).get("Layers") or []) != 1 or not files:
        return None
    return files if os.path.isdir(files) else None


def _has_image(client: Any, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _remove_stale(client: Any, name: str, keep: str) -> None:
    """Remove older versions of image `name` (those still used by a container stay)."""
    for image in client.images.list(name=f"memrl/{name}"):
        if keep not in image.tags:
            try:
                client.images.remove(image.id)
            except Exception:
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description="Build (or confirm) the Docker images of the LLB benchmarks.")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"images to build: {', '.join(IMAGES)} (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(IMAGES))
    if unknown:
        parser.error(f"unknown image {', '.join(unknown)}; choose from {', '.join(IMAGES)}")
    client = require_docker()
    for name in args.names or IMAGES:
        cached = _has_image(client, IMAGES[name].tag)
        started = time.monotonic()
        tag = ensure_image(client, name)
        print(f"{name}: {tag} {'cached' if cached else 'built'} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
