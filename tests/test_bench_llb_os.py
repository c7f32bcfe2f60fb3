"""LLB OS adapter: LLB's protocol, and episodes in real per-sample sandboxes.

The agent is a scripted Chat Completions server on 127.0.0.1. Sandbox tests (marked slow) use
the bwrap backend: a Debian rootfs built once with debootstrap (~1-1.5 min, shared by the whole
session through `rootfs`) and a fresh overlay per sample. They need root, `bubblewrap` and
`debootstrap` (apt-get install bubblewrap debootstrap); outside CI they skip without them.
The Docker backend is tested in tests/test_bench_llb_docker.py.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest
import bench_data  # noqa: E402
from benchmarks.testing import hostile
from benchmarks.testing.chat_server import ScriptedChatServer

from memrl_bench.adapters import llb_common
from memrl_bench.adapters.llb_os.benchmark import (
    CORRECT,
    ENV_ERROR,
    FORMAT_ERROR,
    INCORRECT,
    ROUND_LIMIT,
    STRICT_OUTPUT_FORMAT,
    LLBOperatingSystem,
    parse_action,
)
from memrl_bench.environments.os_machines.os_bwrap import BwrapSandbox
from memrl_bench.environments.os_machines.os_machine import MAX_CAPTURED_BYTES, CommandResult, Sandbox
from memrl_bench.environments.os_machines.os_rootfs import ensure_rootfs
from memrl_bench.environments.os_machines.os_sandbox import SandboxFactory
from memrl_bench.framework.observation_cap import MAX_OBSERVATION_BYTES
from memrl_bench.framework.protocol import Benchmark, Task
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMSettings

REPO = Path(__file__).resolve().parents[1]
DATA = bench_data.directory("llb", "os_interaction_val.json")  # where the tool finds it, else the developers' copy
needs_data = bench_data.needs("llb", DATA / "os_interaction_val.json")


def finish(_: str = "") -> str:
    return "Think: the task is complete.\n\nAct: finish"


def bash(script: str) -> str:
    return f"Think: run the commands.\n\nAct: bash\n\n```bash\n{script}\n```"


def scripted(plans: dict[str, list[str]]) -> Callable[[dict], str]:
    """Responder: for the task whose instruction is the 4th message, the next reply of its plan."""

    def respond(request: dict) -> str:
        messages = request["messages"]
        plan = plans[messages[3]["content"]]
        turn = sum(1 for message in messages[4:] if message["role"] == "assistant")
        return plan[min(turn, len(plan) - 1)]

    return respond


def client_for(server: ScriptedChatServer) -> ChatClient:
    return ChatClient(LLMSettings(model="scripted", base_url=server.base_url, api_key="sk-test", retry_base_delay=0.01))


# --------------------------------------------------------------------------- no sandbox needed


def test_parse_action_follows_llb() -> None:
    assert parse_action("Think: look.\n\nAct: bash\n\n```bash\nls /\n```") == ("bash", "ls /")
    two_blocks = "Act: bash\n```bash\ncd /tmp\n```\nand\n```bash\npwd\n```"
    assert parse_action(two_blocks) == ("bash", "cd /tmp\n\npwd")
    assert parse_action("Act: bash\nls") == ("bash", "")  # no block: LLB runs an empty script
    assert parse_action("Act:   Finish") == ("finish", "")
    assert parse_action("Act: answer(42)") == ("invalid", "")  # LLB's OS task has no answer action
    assert parse_action("Action: bash\n```bash\nls\n```") == ("invalid", "")
    assert parse_action("I am done.") == ("invalid", "")


@needs_data
def test_tasks_follow_the_splits() -> None:
    adapter = LLBOperatingSystem(data=str(DATA), keep_weak_checks=True)  # all 500 (tests/test_llb_os_lazy_audit.py)
    assert isinstance(adapter, Benchmark)
    train, val = adapter.tasks("train"), adapter.tasks("val")
    assert (len(train), len(val)) == (350, 150)
    assert (adapter.train_split, adapter.eval_splits) == ("train", ("val",))
    assert not {task.id for task in train} & {task.id for task in val}
    keys = [int(task.id.removeprefix("os/")) for task in train]
    assert keys == sorted(keys)
    first = train[0]
    assert first.query.startswith("Process all error logs in /var/log/app")
    assert set(first.payload) == {"init", "check", "ground_truth"} and "awk" in first.meta["skills"]
    limited = LLBOperatingSystem(data=str(DATA), limit=3, keep_weak_checks=True)
    assert [task.id for task in limited.tasks("val")] == [task.id for task in val[:3]]
    with pytest.raises(MemrlError, match="no split"):
        adapter.tasks("test")
    copy = pickle.loads(pickle.dumps(adapter))  # episodes run in worker processes
    assert copy.tasks("val") == val and copy.sandboxes.backend == "auto"


def test_missing_data_and_bad_options_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(MemrlError, match="os_interaction_train.json"):
        LLBOperatingSystem(data=str(tmp_path))
    with pytest.raises(MemrlError, match="backend"):
        SandboxFactory(backend="vm")
    if DATA.is_dir():
        with pytest.raises(MemrlError, match="max_rounds"):
            LLBOperatingSystem(data=str(DATA), max_rounds=0)


@needs_data
def test_observation_is_llb_text_and_truncated() -> None:
    adapter = LLBOperatingSystem(data=str(DATA), command_timeout=20, max_output_chars=100)
    assert adapter.observation(CommandResult(0, "", False)) == "The output of the OS is empty."
    assert adapter.observation(CommandResult(0, "hi\n", False)) == "The output of the OS:\n\nhi\n"
    assert "did not finish within 20 seconds" in adapter.observation(CommandResult(None, "", True))
    long = adapter.observation(CommandResult(0, "x" * 500, False))
    assert long.endswith("[truncated because the output is too long]") and long.count("x") == 80
    unlimited = LLBOperatingSystem(data=str(DATA), max_output_chars=0)
    assert unlimited.observation(CommandResult(0, "x" * 5000, False)).count("x") == 5000
    # Even uncut, an observation is capped (a script's captured output may reach 1 MiB), the cut marked.
    flood = unlimited.observation(CommandResult(0, "y" * MAX_CAPTURED_BYTES, False))
    assert flood.partition("…")[0].count("y") == MAX_OBSERVATION_BYTES
    assert flood.endswith(f"…[cut: {MAX_CAPTURED_BYTES} bytes, kept {MAX_OBSERVATION_BYTES}]")


# --------------------------------------------------------------------------- sandbox (bwrap)


def _require_sandbox_tools() -> None:
    missing = [tool for tool in ("bwrap", "debootstrap") if shutil.which(tool) is None]
    reason = None
    if missing:
        reason = f"{', '.join(missing)} not installed (apt-get install -y bubblewrap debootstrap)"
    elif os.geteuid() != 0:
        reason = "the bwrap OS sandbox needs root (overlay mounts)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def rootfs() -> Path:
    """The shared Debian rootfs (built with debootstrap on first use, then cached)."""
    _require_sandbox_tools()
    return ensure_rootfs()


@pytest.fixture
def adapter(rootfs: Path) -> Iterator[LLBOperatingSystem]:
    if not DATA.is_dir():
        bench_data.unavailable("llb", DATA)
    bench = LLBOperatingSystem(data=str(DATA), backend="bwrap", rootfs=str(rootfs), command_timeout=10)
    yield bench
    bench.close()


def fingerprint(root: Path) -> str:
    """Hash of every path, mode, size and mtime under `root` (detects any change to the rootfs)."""
    digest = hashlib.sha256()
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(subdirs + files):
            stat = os.lstat(os.path.join(directory, name))
            digest.update(f"{directory}/{name} {stat.st_mode} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# What the agent plants for the check: the loader's files (/etc/ld.so.preload naming a library
# whose constructor exits 0, /etc/ld.so.cache, ld.so.conf.d) as links to its own files, the
# alternatives behind the pristine /usr/bin/awk & co., Python's start-up files (sitecustomize,
# usercustomize, .pth in every site directory, a module in the working directory) and zsh's.
PLANTED_LINKS = r"""
set -e
printf '#!/bin/sh\nexit 0\n' > /tmp/.ok; chmod +x /tmp/.ok
for link in /etc/alternatives/*; do ln -sfn /tmp/.ok "$link"; done
for dir in /etc/python3.11 /usr/local/lib/python3.11/dist-packages /root/.local/lib/python3.11/site-packages; do
  mkdir -p $dir; echo 'import os; os._exit(0)' > $dir/sitecustomize.py
  cp $dir/sitecustomize.py $dir/usercustomize.py; echo 'import os; os._exit(0)' > $dir/forge.pth
done
echo 'import os; os._exit(0)' > /json.py
echo 'exit 0' > /tmp/.zshenv; ln -sf /tmp/.zshenv /etc/zsh/zshenv
echo /tmp > /tmp/.conf; ln -sf /tmp/.conf /etc/ld.so.conf.d/forge.conf
cp /tmp/.ok /tmp/.cache; ln -sf /tmp/.cache /etc/ld.so.cache
echo "$1" | base64 -d > /tmp/.forge.so; echo /tmp/.forge.so > /tmp/.preload
ln -sf /tmp/.preload /etc/ld.so.preload
"""


# A process the agent leaves running that kills every process whose command line names the target:
# a check `! COMMAND` whose COMMAND it kills (exit 137) would pass. The marker is built at run time,
# so that the scripts' own command lines never name it.
LEFTOVER_KILLER = r"""cat > /tmp/.watch.sh <<'EOF'
m=memrl-probe; while :; do for d in /proc/[0-9]*; do
  case "$(tr '\0' ' ' < $d/cmdline 2>/dev/null)" in *"$m-target"*) kill -9 "${d#/proc/}" 2>/dev/null;; esac
done; done
EOF
(setsid bash /tmp/.watch.sh </dev/null >/dev/null 2>&1 &); sleep 0.5"""
NEGATED_PROBE = """m=memrl-probe; ! sh -c 'sleep 2; exit 0' "$m-target" """


def assert_leftover_processes_cannot_reach_the_check(sandbox: Sandbox) -> None:
    """A process the agent left running can neither see nor signal the check's processes (which
    live in a PID namespace beside the sandbox's); the check still sees the agent's processes."""
    assert sandbox.run("sleep 60 & echo $! > /tmp/task.pid").exit_code == 0
    assert sandbox.run(LEFTOVER_KILLER).exit_code == 0
    assert sandbox.run(NEGATED_PROBE).exit_code == 0  # the killer works on the agent's own processes
    # The check sees the agent's processes, under the numbers the agent saw (LLB's val task 73).
    seen = sandbox.run("tr '\\0' ' ' < /proc/$(cat /tmp/task.pid)/cmdline", trusted=True)
    assert seen.output == "sleep 60 ", seen
    assert sandbox.run("pgrep -f watch.sh >/dev/null", trusted=True).exit_code == 0
    check = sandbox.run(NEGATED_PROBE, trusted=True)
    assert check.exit_code == 1, check  # the probe ran to its end: the killer never saw it
    assert sandbox.run("diff <(echo a) <(echo a) && cat /proc/self/status >/dev/null", trusted=True).exit_code == 0


def assert_the_check_ignores_planted_links(sandbox: Sandbox) -> None:
    """Plant PLANTED_LINKS in `sandbox`; the trusted check still runs the pristine programs."""
    cache = sandbox.run("sha256sum /etc/ld.so.cache").output
    library = hostile.preload_library()
    planted = sandbox.run(f"set -- {library}\n{PLANTED_LINKS}")
    assert planted.exit_code == 0, planted.output
    assert sandbox.run("exit 3").exit_code == 0  # the planted library works: the agent's shells now exit 0 at once
    check = sandbox.run("exit 3", trusted=True)
    assert check.exit_code == 3 and "forge" not in check.output, check.output
    found = sandbox.run("printf 'a b\\n' | awk '{print $2; exit 4}'", trusted=True)
    assert (found.exit_code, found.output) == (4, "b\n")  # the pristine alternatives: mawk
    python = sandbox.run("python3 -c 'import json, sys; print(json.dumps(sys.flags.no_site)); raise SystemExit(5)'",
                         trusted=True)
    assert (python.exit_code, python.output) == (5, "0\n")
    assert sandbox.run("zsh -c 'exit 6'", trusted=True).exit_code == 6
    assert sandbox.run("sha256sum /etc/ld.so.cache", trusted=True).output == cache
    for absent in ("/etc/ld.so.preload", "/etc/ld.so.conf.d/forge.conf"):  # as in the pristine image, though
        assert sandbox.run(f"test -e {absent} || test -L {absent}", trusted=True).exit_code == 1, absent  # named
    assert sandbox.run("readlink /etc/alternatives/awk", trusted=True).output == "/usr/bin/mawk\n"
    assert sandbox.run("test -L /etc/zsh/zshenv", trusted=True).exit_code == 1
    assert sandbox.run("test -f /json.py && test -x /tmp/.ok", trusted=True).exit_code == 0  # the agent's files show


# What the agent leaves for the check's world: its own NSS configuration, users and a group,
# files of its own in /etc and $HOME, programs (one the check names, one it does not), a
# directory in place of the /var/run link, and a program that tries to reach the check's shell.
AGENT_STATE = r"""
set -e
sed -i 's/^passwd:.*/passwd: x/' /etc/nsswitch.conf
groupadd team; useradd -m -G team alice
echo 'data of a task' > /etc/app.conf; echo 'X=1' >> /etc/environment; echo 'export MARK=1' >> /root/.bashrc
printf '#!/bin/sh\necho ran; exit 7\n' > /tmp/prog.sh; chmod +x /tmp/prog.sh; cp /tmp/prog.sh /tmp/other.sh
rm /var/run; mkdir -p /var/run/nscd; (sleep 60 & echo $! > /tmp/sleep.pid)
cat > /tmp/reach.py <<'EOF'
#!/usr/bin/python3
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
parent = os.getppid()
print("ptrace", libc.ptrace(16, parent, None, None), ctypes.get_errno())
for name in ("mem", "fd/1", "syscall", "environ"):
    try:
        with open(f"/proc/{parent}/{name}", "rb") as handle:
            handle.read(1)
        print(name, "read")
    except OSError as error:
        print(name, error.errno)
EOF
chmod +x /tmp/reach.py
"""


def assert_the_check_s_world_is_the_image_s(sandbox: Sandbox) -> None:
    """The check's world is the pristine image (its configuration, its /var/run link, a fresh /dev)
    with the agent's state as data: users and groups, the files the check names, read-only and
    runnable only where the check names them; no program it runs can reach the check's shell."""
    planted = sandbox.run(AGENT_STATE)
    assert planted.exit_code == 0, planted.output
    assert sandbox.run("id alice").exit_code == 1  # the agent's own NSS configuration: no users at all

    def check(script: str) -> CommandResult:
        return sandbox.run(script, trusted=True)

    assert check("grep -qx 'passwd: *files' /etc/nsswitch.conf && id -nG alice").output == "alice team\n"
    assert check("grep -q 'of a task' /etc/app.conf && grep -qx X=1 /etc/environment && grep -q MARK /root/.bashrc"
                 " && cd ~ && pwd").output == "/root\n"
    assert check("readlink /var/run /var/lock; test -c /dev/null && test -L /dev/fd").output == "/run\n/run/lock\n"
    ran = check("/tmp/prog.sh")
    assert (ran.exit_code, ran.output) == (7, "ran\n")  # a program the check names runs
    unnamed = check('p=/tmp/oth; test -x "${p}er.sh" || echo not-runnable; "${p}er.sh"')
    assert unnamed.exit_code == 126 and unnamed.output.startswith("not-runnable\n"), unnamed
    assert check("touch /tmp/x /etc/x 2>/dev/null || echo read-only").output == "read-only\n"
    # The agent's processes show, but not their files behind /proc (their root is the agent's world).
    seen = check("test -d /proc/$(cat /tmp/sleep.pid) && ls /proc/$(cat /tmp/sleep.pid)/root/ 2>&1 | head -1")
    assert "Permission denied" in seen.output, seen
    status = check("grep -E '^(Gid|CapEff|Seccomp):' /proc/self/status | tr -s '\\t' ' '").output
    assert status == "Gid: 0 65534 65534 65534\nCapEff: 00000000a00425fb\nSeccomp: 2\n", status
    reached = check("/tmp/reach.py; true").output.splitlines()  # its parent: the check's shell
    assert reached == ["ptrace -1 1", "mem 13", "fd/1 13", "syscall 1", "environ 13"], reached  # EPERM, EACCES


CHECK_ATTACKS = {"planted-links": assert_the_check_ignores_planted_links,
                 "leftover-processes": assert_leftover_processes_cannot_reach_the_check,
                 "agent-state-as-data": assert_the_check_s_world_is_the_image_s}


@pytest.mark.slow
@pytest.mark.parametrize("attack", list(CHECK_ATTACKS))
def test_the_agent_cannot_reach_the_check(rootfs: Path, attack: str) -> None:
    """Links planted on the loader's start-up files, processes left running, the agent's state: none
    reaches the check, which sees the agent's state only as data (bwrap)."""
    sandbox = BwrapSandbox(rootfs, timeout=20)
    try:
        CHECK_ATTACKS[attack](sandbox)
    finally:
        sandbox.close()


@pytest.mark.slow
def test_sandbox_keeps_state_between_scripts_not_shell_state(rootfs: Path) -> None:
    sandbox = BwrapSandbox(rootfs, timeout=2)
    try:
        first = sandbox.run("cd /tmp && export FOO=1 && touch made && id -u && hostname")
        assert (first.exit_code, first.output) == (0, "0\nllb-os\n")
        second = sandbox.run('pwd; echo "FOO=$FOO"; ls /tmp; echo oops >&2; exit 3')
        assert (second.exit_code, second.output) == (3, "/\nFOO=\nmade\noops\n")  # new shell, same files
        started = sandbox.run("(sleep 300 &); echo started")  # a background process outlives its script
        assert started.output == "started\n" and not started.timed_out
        assert "sleep 300" in sandbox.run("ps -eo args").output
        began = time.monotonic()
        slow = sandbox.run("echo partial; sleep 31")
        assert slow.timed_out and slow.exit_code is None and slow.output == "partial\n" and time.monotonic() - began < 5
        assert "sleep 31" not in sandbox.run("ps -eo args").output.replace("[sleep] <defunct>", "")  # killed
        workdir = sandbox._dir
    finally:
        sandbox.close()
    assert not workdir.exists()


@needs_data
@pytest.mark.slow
def test_ground_truth_agent_is_correct_and_idle_agent_is_not(adapter: LLBOperatingSystem) -> None:
    # os/11 writes a script into /usr/bin that its check runs: the trusted check must see it (a weak check, left
    # out of the benchmark, played here).
    train = {"os/0", "os/1", "os/2", "os/11"}
    every = LLBOperatingSystem(data=str(DATA), keep_weak_checks=True)
    tasks = [task for task in every.tasks("train") if task.id in train] + adapter.tasks("val")[:2]
    plans = {task.query: [bash(task.payload["ground_truth"]), finish()] for task in tasks}
    memories = [{"id": 1, "intent": "make a dir", "experience": "Agent:\nmkdir", "outcome": "success",
                 "similarity": 0.9, "q": 0.5, "score": 1.0}]
    with ScriptedChatServer(scripted(plans)) as server:
        llm = client_for(server)
        episodes = [adapter.run_episode(task, memories, llm) for task in tasks]
        requests = list(server.requests)
    for task, episode in zip(tasks, episodes):
        assert (episode.success, episode.status, episode.steps) == (True, CORRECT, 2), (task.id, episode)
        assert episode.info["finish_reason"] == "finish" and not episode.env_error
        assert episode.trajectory.startswith("Agent:\n") and "The output of the OS" in episode.trajectory
        assert task.query not in episode.trajectory  # only the agent's part, never the prompt
    system = requests[0]["messages"][0]["content"]
    assert system.index("[Retrieved Memory Context]") < system.index(STRICT_OUTPUT_FORMAT)
    assert requests[0]["messages"][1]["content"].endswith(llb_common.REQUIREMENT_SUFFIX)
    assert "rounds reaches 10" not in requests[0]["messages"][1]["content"]  # max_rounds default 15
    assert [m["role"] for m in requests[1]["messages"]][-2:] == ["assistant", "user"]

    with ScriptedChatServer(scripted({task.query: [finish()] for task in tasks})) as server:
        idle = [adapter.run_episode(task, [], client_for(server)) for task in tasks]
    assert [(e.success, e.status, e.steps) for e in idle] == [(False, INCORRECT, 1)] * len(tasks)


@needs_data
@pytest.mark.slow
def test_round_limit_format_error_and_broken_init(adapter: LLBOperatingSystem, rootfs: Path) -> None:
    task = adapter.tasks("train")[0]
    short = LLBOperatingSystem(data=str(DATA), backend="bwrap", rootfs=str(rootfs), max_rounds=2)
    with ScriptedChatServer(scripted({task.query: [bash("ls /var/log/app")]})) as server:
        limited = short.run_episode(task, [], client_for(server))
        assert len(server.requests) == 2
    assert (limited.success, limited.status, limited.steps) == (False, ROUND_LIMIT, 2)
    assert limited.trajectory.count("error_20231001.log") == 2

    # As in LLB, the check runs even after an unparsable reply: the work done so far counts.
    plan = [bash(task.payload["ground_truth"]), "All done, the logs are processed."]
    with ScriptedChatServer(scripted({task.query: plan})) as server:
        lucky = adapter.run_episode(task, [], client_for(server))
    assert (lucky.success, lucky.status, lucky.info["finish_reason"]) == (True, CORRECT, "format_error")
    with ScriptedChatServer(scripted({task.query: ["I think it is fine."]})) as server:
        lazy = adapter.run_episode(task, [], client_for(server))
    assert (lazy.success, lazy.status) == (False, FORMAT_ERROR)

    broken = Task(id="os/broken", query="q", payload={"init": "exit 7", "check": "true", "ground_truth": "true"})
    with ScriptedChatServer(scripted({"q": [finish()]})) as server:
        failed = adapter.run_episode(broken, [], client_for(server))
        assert server.requests == []
    assert (failed.success, failed.status, failed.env_error) == (False, ENV_ERROR, True)
    assert "exit 7" in failed.info["env_error"]


@needs_data
@pytest.mark.slow
def test_hostile_agent_cannot_reach_network_or_host_files(adapter: LLBOperatingSystem, rootfs: Path) -> None:
    connections: list[object] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def accept() -> None:
        while True:
            try:
                connections.append(listener.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    marker = f"memrl-llb-os-escape-{uuid.uuid4().hex}"
    watched = [Path("/tmp") / marker, REPO / marker, Path.home() / marker]
    before = fingerprint(rootfs)
    hostile = "\n".join([
        f"echo hi > /dev/tcp/127.0.0.1/{port}; echo tcp=$?",
        f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' 2>/dev/null; echo py=$?",
        *(f"echo pwned > {path}" for path in watched),
        f"mkdir -p {REPO} && echo pwned > {REPO / marker}",
        "mount -t tmpfs none /mnt 2>/dev/null || echo no-mount; mknod /dev/disk0 b 8 0 2>/dev/null || echo no-mknod",
        "echo pwned > /etc/motd; rm -rf /usr/share/doc; useradd -m intruder; echo done",
    ])
    task = Task(id="os/hostile", query="hostile", payload={"init": "true", "check": "true", "ground_truth": "true"})
    with ScriptedChatServer(scripted({"hostile": [bash(hostile), finish()]})) as server:
        episode = adapter.run_episode(task, [], client_for(server))
    time.sleep(0.5)
    listener.close()
    assert episode.status == CORRECT and "done" in episode.trajectory, episode.trajectory  # the script did run
    assert "tcp=1" in episode.trajectory and "py=1" in episode.trajectory
    assert connections == []
    for path in watched:
        assert not path.exists(), f"sandbox wrote {path} on the host"
    assert "no-mount" in episode.trajectory and "no-mknod" in episode.trajectory
    assert fingerprint(rootfs) == before
    assert (rootfs / "usr/share/doc").is_dir() and "intruder" not in (rootfs / "etc/passwd").read_text()


# One script per limit of `os_machine.Limits`, and the episode status it must end in (the task's
# check fails: the agent did not do the task). Run with LIMITED below: 256 MB, 64 processes,
# 2 s of CPU per process, 128 MB of disk.
LIMITED = {"memory_mb": 256, "nproc": 64, "cpu_seconds": 2, "disk_mb": 128, "command_timeout": 15}
LIMIT_SCRIPTS = {
    "LIMIT_PROCESSES": "python3 -c 'import os, time\nfor n in range(200):\n    if os.fork() == 0:\n"
                       "        time.sleep(20)\n        os._exit(0)' 2>&1 | tail -n 1",
    "LIMIT_MEMORY": "python3 -c 'x = bytearray(600 << 20)'",
    "LIMIT_DISK": "head -c 200M /dev/zero > /big",
    "LIMIT_CPU": "python3 -c 'while True: pass'",
}


def limit_statuses(adapter: LLBOperatingSystem) -> dict[str, tuple[str, str | None]]:
    """Play each of LIMIT_SCRIPTS as one episode of `adapter`: {expected: (status, info["limit_hit"])}."""
    task = adapter.tasks("train")[0]
    found = {}
    for expected, script in LIMIT_SCRIPTS.items():
        with ScriptedChatServer(scripted({task.query: [bash(script), finish()]})) as server:
            episode = adapter.run_episode(task, [], client_for(server))
        found[expected] = (episode.status, episode.info.get("limit_hit"))
    return found


def expected_limit_statuses() -> dict[str, tuple[str, str]]:
    return {status: (status, status.removeprefix("LIMIT_").lower()) for status in LIMIT_SCRIPTS}


@needs_data
@pytest.mark.slow
def test_each_limit_ends_the_episode_with_its_status(rootfs: Path) -> None:
    adapter = LLBOperatingSystem(data=str(DATA), backend="bwrap", rootfs=str(rootfs), **LIMITED)
    assert limit_statuses(adapter) == expected_limit_statuses()
