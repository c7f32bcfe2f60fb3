"""Enter a running LLB OS sandbox and run one script there, with limits and reduced capabilities.

Usage (as root, by `memrl_bench.environments.os_bwrap.BwrapSandbox`, and by `os_docker.DockerSandbox` for the check;
stdlib only, run with `python -I -S`):

    python os_enter.py PID CAPS LIMITS_JSON CGROUP_PROCS_FILES_JSON trusted|untrusted -- PROGRAM ARG...

Every capability but the comma-separated CAPS numbers is dropped BEFORE the first file of the
sandbox is executed: `nsenter ... /usr/bin/setpriv` would run the sandbox's own `setpriv`, its
loader and its libraries, which the agent (root in its sandbox) can replace, with every
capability of the host's root. This process instead joins the cgroups (process and memory
limits), sets the rlimits, joins the namespaces of PID, forks once (so that the program is
inside the PID namespace), chroots to PID's root, drops the capabilities, and only then execs
PROGRAM (resolved inside the sandbox). The parent half waits and exits with the program's status.

`trusted` (for the check that grades the episode): PROGRAM runs in a trusted view
of the sandbox, in a mount namespace of its own: the agent's files everywhere, except `/usr`
(the pristine rootfs's, read-only, with the agent's `/usr/local`, and in `/usr/bin` and
`/usr/sbin` the programs the agent added, never those it replaced), the top-level `bin`, `lib*`,
`sbin` links, `/etc/ld.so.cache` (the pristine ones, which the sandbox shows read-only at
`PRISTINE`) and `/etc/ld.so.preload` (empty). So the
agent cannot swap the shell, the tools, the loader or the libraries the check runs with.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_V3 = 0x20080522
_CLONE_NEWNS = 0x20000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_PRISTINE_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Under the pristine /usr, these show the agent's new programs too (a task may be to write
# /usr/bin/some_script, which its check then runs); a program the rootfs has is always its own.
_AGENT_PROGRAMS = ("bin", "sbin")
PRISTINE = "/dev/.memrl-pristine"  # the rootfs, bound read-only by BwrapSandbox
_VIEW = "/dev/.memrl-check"  # on the sandbox's own /dev tmpfs, never in the agent's overlay
_NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")  # mnt last: it changes how paths resolve
_RLIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE,
            "core": resource.RLIMIT_CORE}


def _last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        return int(handle.read())


def _clear_inheritable(libc: ctypes.CDLL) -> bool:
    """Empty the inheritable set: for root, exec grants (inheritable | bounding)."""
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} words
    if libc.capget(header, data) != 0:
        return False
    data[2] = data[5] = 0
    return libc.capset(header, data) == 0


def _mount(libc: ctypes.CDLL, source: str | None, target: str, kind: str | None, flags: int,
           options: str | None = None) -> None:
    if libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), flags,
                  options and options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source} on {target} failed")


def _trusted_view(libc: ctypes.CDLL) -> None:
    """Chroot into the trusted view described in the module docstring."""
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    source = PRISTINE
    os.makedirs(_VIEW, exist_ok=True)
    _mount(libc, "tmpfs", _VIEW, "tmpfs", 0)
    for entry in _PRISTINE_LINKS:
        if os.path.islink(f"{source}/{entry}"):
            os.symlink(os.readlink(f"{source}/{entry}"), f"{_VIEW}/{entry}")
    for entry in os.listdir("/"):
        path, target = "/" + entry, f"{_VIEW}/{entry}"
        if entry in _PRISTINE_LINKS or entry == "usr":
            continue
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.mkdir(target)
            _mount(libc, path, target, None, _MS_BIND | (0 if entry == "dev" else _MS_REC))
        else:
            open(target, "w").close()
            _mount(libc, path, target, None, _MS_BIND)
    os.mkdir(f"{_VIEW}/usr")
    _mount(libc, f"{source}/usr", f"{_VIEW}/usr", None, _MS_BIND | _MS_REC)
    _mount(libc, None, f"{_VIEW}/usr", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    if os.path.isdir("/usr/local") and not os.path.islink("/usr/local"):
        _mount(libc, "/usr/local", f"{_VIEW}/usr/local", None, _MS_BIND | _MS_REC)
    for directory in _AGENT_PROGRAMS:  # the pristine programs over the agent's (new ones show through)
        if os.path.isdir(f"/usr/{directory}") and not os.path.islink(f"/usr/{directory}"):
            _mount(libc, "overlay", f"{_VIEW}/usr/{directory}", "overlay",
                   _MS_RDONLY, f"lowerdir={source}/usr/{directory}:/usr/{directory}")
    etc = f"{_VIEW}/etc"
    if os.path.lexists(f"{etc}/ld.so.preload"):
        _mount(libc, "/dev/null", f"{etc}/ld.so.preload", None, _MS_BIND)
    if os.path.isfile(f"{source}/etc/ld.so.cache") and os.path.lexists(f"{etc}/ld.so.cache"):
        _mount(libc, f"{source}/etc/ld.so.cache", f"{etc}/ld.so.cache", None, _MS_BIND)
    os.chdir(_VIEW)
    os.chroot(".")
    os.chdir("/")


def main(argv: list[str]) -> None:
    pid, caps, limits, cgroups = int(argv[0]), argv[1], json.loads(argv[2]), json.loads(argv[3])
    trusted = argv[4] == "trusted"
    program = argv[argv.index("--") + 1:]
    keep = {int(cap) for cap in caps.split(",") if cap}
    libc = ctypes.CDLL(None, use_errno=True)
    last_cap = _last_cap()
    for path in cgroups:
        with open(path, "w") as handle:
            handle.write(str(os.getpid()))
    for name, value in limits.items():  # CPU: SIGXCPU at the soft limit, SIGKILL a second later
        resource.setrlimit(_RLIMITS[name], (int(value), int(value) + (name == "cpu")))
    fds = [os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY) for name in _NAMESPACES]
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    for fd in fds:
        if libc.setns(fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
        os.close(fd)
    child = os.fork()
    if child:
        os.close(root)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    os.fchdir(root)
    os.chroot(".")
    os.chdir("/")
    os.close(root)
    if trusted:
        try:
            _trusted_view(libc)
        except OSError as error:
            os.write(2, f"memrl: cannot build the trusted view for the check: {error}\n".encode())
            os._exit(125)
    for cap in range(last_cap + 1):
        if cap not in keep and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(125)
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 or not _clear_inheritable(libc):
        os._exit(125)
    os.execve(program[0], program, {})


if __name__ == "__main__":
    main(sys.argv[1:])
