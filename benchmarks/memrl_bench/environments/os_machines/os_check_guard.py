"""What keeps the LLB OS check's processes out of reach of a program of the agent's that the check runs.

Some checks run a program the agent wrote (`/tmp/exit_monitor.sh`, `/usr/local/bin/check.sh`):
that code runs in the check's process tree, as root, beside the check's shell and tools. `guard`
(called by `os_enter.py` for the check, stdlib only, just before the check's first program runs,
while the process still holds its capabilities) makes two things hold for the whole tree:

* **Credentials nobody can match.** The check runs with real group 0 and effective and saved
  group `CHECK_GID` (its shell is started with `bash -p`, which keeps them; every program
  inherits them, and the check's world is read-only, so no file gets that group). The kernel lets
  a process `ptrace` another, read or write its memory (`/proc/PID/mem`, `process_vm_writev`),
  open its descriptors (`/proc/PID/fd`), its root or its executable, or take its descriptors
  (`pidfd_getfd`) only if the caller's real ids (or its filesystem ids, for the files of `/proc`)
  equal the target's real, effective *and* saved ids, or it holds `CAP_SYS_PTRACE`, which the
  sandbox never grants. No process of the tree has equal real and effective groups, so none can
  do any of it to another; and since the agent's processes run with group 0, no program of the
  check opens their files through `/proc` either (`/proc/PID/root` would lead to the agent's
  files outside the view, where none is noexec). Every program the check starts is
  non-dumpable and runs in glibc's secure mode (`AT_SECURE`: no `LD_*`, `GCONV_PATH`, `LOCPATH`,
  `TMPDIR` ... from the environment). A program that resets its groups (a shell started without
  `-p`, as the agent's `#!/bin/bash` scripts are) leaves the tree's ids and reaches none of its processes.
* **No ptrace at all.** A seccomp filter, inherited by every process and never removable, fails
  `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd` and `perf_event_open` with
  EPERM, and kills a process that makes a system call of another ABI (x32, i386), on x86-64 and
  arm64 (elsewhere the credentials alone hold).

Signals are not covered: a program of the agent's that the check runs may still kill or stop the
check's processes, which makes the check fail or time out (no check of LLB's passes because a
command it runs is killed while a program of the agent's runs).
"""

from __future__ import annotations

import ctypes
import os

CHECK_GID = 65534  # the check's effective and saved group (nogroup); its real group stays 0
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_EPERM = 1
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_X32_BIT = 0x40000000
# Per machine: (audit arch, the numbers of ptrace, process_vm_readv, process_vm_writev, pidfd_getfd,
# perf_event_open), from the kernel's syscall tables.
_DENIED = {
    "x86_64": (0xC000003E, (101, 310, 311, 438, 298)),
    "aarch64": (0xC00000B7, (117, 270, 271, 438, 241)),
}


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter for `machine` (`os.uname().machine`) as (code, jt, jf, k) instructions, or None."""
    if machine not in _DENIED:
        return None
    arch, numbers = _DENIED[machine]
    denied = [(_JEQ_K, 0, 0, number) for number in numbers]
    # seccomp_data: the system call's number at offset 0, the ABI's audit arch at offset 4.
    program = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, arch), (_RET_K, 0, 0, _RET_KILL_PROCESS), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":  # x32 numbers: the same system calls under another ABI
        program += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for index, (code, _, _, number) in enumerate(denied):
        program.append((code, len(denied) - index, 0, number))  # to the EPERM return below
    return program + [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO | _EPERM)]


def guard(libc: ctypes.CDLL) -> None:
    """Give this process (and so every process of the check) the credentials and the filter above."""
    os.setresgid(0, CHECK_GID, CHECK_GID)
    program = seccomp_program(os.uname().machine)
    if program is None:
        return
    instructions = (_Instruction * len(program))(*(_Instruction(*step) for step in program))
    filters = _Program(len(program), instructions)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(filters), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the check's seccomp filter was refused")
