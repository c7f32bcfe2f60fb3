"""Enter a running LLB OS sandbox and run one script there, with limits and reduced capabilities.

Usage (as root, by `memrl_bench.environments.os_machines.os_bwrap.BwrapSandbox`, and by `os_docker.DockerSandbox` for the check;
stdlib only, run with `python -I -S`):

    python os_enter.py PID CAPS LIMITS_JSON CGROUP_PROCS_FILES_JSON trusted|untrusted -- PROGRAM ARG...
    python os_enter.py PID "" {} CGROUP_PROCS_FILES_JSON nest --

Every capability but the comma-separated CAPS numbers is dropped BEFORE the first file of the
sandbox is executed: `nsenter ... /usr/bin/setpriv` would run the sandbox's own `setpriv`, its
loader and its libraries, which the agent (root in its sandbox) can replace, with every
capability of the host's root. This process instead joins the cgroups (process and memory
limits), sets the rlimits, joins the namespaces of PID, forks once (so that the program is
inside the PID namespace), chroots to PID's root, drops the capabilities, and only then execs
PROGRAM (resolved inside the sandbox). The parent half waits and exits with the program's status.

`trusted` (for the check that grades the episode): PROGRAM, whose last argument is the check's
script, runs in the check's world (`os_check_view`: the pristine image, the agent's state only as
data, in a mount namespace of its own) with the check's credentials and seccomp filter
(`os_check_guard`: no process of the check, nor a program of the agent's that it runs, can
ptrace another or read its memory).

`nest` (once, when the machine starts; PID is the machine's first process) makes the PID
namespace the agent's scripts run in: a new one inside the machine's, with its own `/proc`, whose
first process (`_agent_init`, which only reaps orphans) it prints as seen from the host; the
agent's scripts then enter that process's namespaces. The check enters the machine's own PID
namespace: it sees the agent's processes (a task may be to leave one running), while no process
of the agent's can name, hence signal, `ptrace` or read the memory of, any process of the check.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys
from importlib import util
from types import ModuleType

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_V3 = 0x20080522
_CLONE_NEWNS = 0x20000
_CLONE_NEWPID = 0x20000000
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_PR_SET_DUMPABLE, _PR_SET_NAME = 4, 15
# The agent's /proc, as bwrap's --proc and Docker show theirs: these read-only, those hidden.
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
_PROC_MASKED = ("kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "acpi", "scsi", "asound")
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")  # mnt last: it changes how paths resolve
_RLIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE,
            "core": resource.RLIMIT_CORE}


def _sibling(name: str) -> ModuleType:
    """The module `name` of this file's directory (this runs as a script, with `-I -S`)."""
    spec = util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


os_check_guard, os_check_view = _sibling("os_check_guard"), _sibling("os_check_view")


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


def _agent_proc(libc: ctypes.CDLL) -> None:
    """Replace the machine's /proc, in this process's own mount namespace, by its PID namespace's.

    The agent's processes get the numbers the machine's namespace gives them (where the check
    looks them up, in a PID file the agent wrote): this process, the first, has its own number
    there, so the next one is number + 1 in both (the kernel's `ns_last_pid`, where it has one);
    no process of the machine's own namespace starts while the agent works.
    """
    machine_pid = os.readlink("/proc/self")  # the machine's /proc numbers a process as its namespace does
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    if libc.umount2(b"/proc", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "umount of /proc failed")
    _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if os.path.exists("/proc/sys/kernel/ns_last_pid"):
        with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
            handle.write(machine_pid)
    for entry in _PROC_READ_ONLY:
        if os.path.exists(f"/proc/{entry}"):
            _mount(libc, f"/proc/{entry}", f"/proc/{entry}", None, _MS_BIND | _MS_REC)
            _mount(libc, None, f"/proc/{entry}", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    for entry in _PROC_MASKED:
        if os.path.isdir(f"/proc/{entry}"):
            _mount(libc, "tmpfs", f"/proc/{entry}", "tmpfs", _MS_RDONLY)
        elif os.path.exists(f"/proc/{entry}"):
            _mount(libc, "/dev/null", f"/proc/{entry}", None, _MS_BIND)


def _agent_init(libc: ctypes.CDLL, reply: socket.socket) -> None:
    """The first process of the agent's PID namespace: set up its /proc, say its PID, then reap orphans."""
    try:
        _agent_proc(libc)
    except OSError as error:
        os.write(2, f"memrl: cannot start the agent's namespace: {error}\n".encode())
        os._exit(125)
    # The kernel gives the receiver this process's PID as its own namespace numbers it.
    reply.sendmsg([b"1"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", os.getpid(), 0, 0))])
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1 << 16)
    libc.prctl(_PR_SET_NAME, b"init", 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigtimedwait({signal.SIGCHLD}, 5)


def _nest(libc: ctypes.CDLL, root: int) -> None:
    """Start the agent's PID namespace (see the module docstring) and print its first process's PID."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    if os.fork() == 0:  # in the machine's PID namespace
        os.fchdir(root)  # in the machine's root before the copy of its mounts: the copy moves it along
        os.chroot(".")
        os.chdir("/")
        if libc.unshare(_CLONE_NEWPID | _CLONE_NEWNS) != 0:
            os._exit(125)
        if os.fork() == 0:
            mine.close()
            _agent_init(libc, theirs)
        os._exit(0)
    theirs.close()
    os.close(root)
    os.wait()
    mine.settimeout(10)
    try:
        _, ancillary, _, _ = mine.recvmsg(1, socket.CMSG_SPACE(12))
    except OSError:  # no word from it (it said why on stderr)
        ancillary = []
    for level, kind, data in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
            print(struct.unpack("iII", data)[0], flush=True)
            os._exit(0)
    os.write(2, b"memrl: the agent's namespace did not start\n")
    os._exit(125)


def main(argv: list[str]) -> None:
    pid, caps, limits, cgroups = int(argv[0]), argv[1], json.loads(argv[2]), json.loads(argv[3])
    mode = argv[4]
    trusted = mode == "trusted"
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
    if mode == "nest":
        _nest(libc, root)
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
            os_check_view.enter(libc, program[-1])
        except OSError as error:
            os.write(2, f"memrl: cannot build the check's world: {error}\n".encode())
            os._exit(125)
    for cap in range(last_cap + 1):
        if cap not in keep and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(125)
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 or not _clear_inheritable(libc):
        os._exit(125)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these, and exec would keep them ignored
        signal.signal(number, signal.SIG_DFL)
    if trusted:
        try:
            os_check_guard.guard(libc)  # still with the capabilities this needs (setgid, seccomp)
        except OSError as error:
            os.write(2, f"memrl: cannot guard the check: {error}\n".encode())
            os._exit(125)
    os.execve(program[0], program, {})


if __name__ == "__main__":
    main(sys.argv[1:])
