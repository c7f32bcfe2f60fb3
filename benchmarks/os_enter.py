"""Enter a running LLB OS bwrap sandbox and run one script there, with limits and reduced capabilities.

Usage (as root, by `benchmarks.os_sandbox.BwrapSandbox`; stdlib only, run with `python -I -S`):

    python os_enter.py PID CAPS LIMITS_JSON CGROUP_PROCS_FILES_JSON -- PROGRAM ARG...

Every capability but the comma-separated CAPS numbers is dropped BEFORE the first file of the
sandbox is executed: `nsenter ... /usr/bin/setpriv` would run the sandbox's own `setpriv`, its
loader and its libraries, which the agent (root in its sandbox) can replace, with every
capability of the host's root. This process instead joins the cgroups (process and memory
limits), sets the rlimits, joins the namespaces of PID, forks once (so that the program is
inside the PID namespace), chroots to PID's root, drops the capabilities, and only then execs
PROGRAM (resolved inside the sandbox). The parent half waits and exits with the program's status.
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


def main(argv: list[str]) -> None:
    pid, caps, limits, cgroups = int(argv[0]), argv[1], json.loads(argv[2]), json.loads(argv[3])
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
    for cap in range(last_cap + 1):
        if cap not in keep and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(125)
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 or not _clear_inheritable(libc):
        os._exit(125)
    os.execve(program[0], program, {})


if __name__ == "__main__":
    main(sys.argv[1:])
