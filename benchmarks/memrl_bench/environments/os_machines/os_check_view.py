"""The world the LLB OS check runs in: the pristine image, with the agent's state only as data.

`enter(libc, script)` is called by `os_enter.py` for the check (stdlib only), in the machine's
namespaces and root (the agent's world), as root with every capability, before the check's first
program runs. It makes a mount namespace of the check's own and chroots into a view built from
the pristine image (read-only at `PRISTINE`, out of the agent's reach) and the agent's state:

* The system trees are the image's, read-only: the links `bin`, `sbin`, `lib*`, and `usr` and
  `etc`, where every entry the image has is its own. So every program, library, module and
  configuration file that a program of the check loads or reads on its own (the loader's, NSS's,
  PAM's, the shells' and the interpreters' start-up files, locales, gconv, terminfo ...) is the
  image's. The agent's state shows there only as files the check reads: in `etc` the account
  databases (`ACCOUNT_FILES`: the users and groups many checks inspect), and the paths the check's
  script names (`named_paths`) that the image lacks, or in `etc` names one of `ETC_DATA_FILES`;
  never the loader's files (`LOADER_PREFIX`), which every program reads. A file a check names
  could still steer a program of the image that reads it as configuration, but only towards the
  image's own code (no LLB check names such a file).
* `proc` is the machine's (the check sees the agent's processes), `dev` a fresh one (the device
  nodes, each checked, and the links into `/proc/self`), `run` and `sys` the image's, and so are
  `var/run` and `var/lock` (no socket of the agent's, nscd's say, answers a program of the check).
* Every other top-level entry is the agent's, `/root`, `/home`, `/tmp`, `/var`, `/opt` and what
  a task made: data, read-only, nosuid, nodev and noexec. Only a regular file the check's script
  names may run (a program the task asked for; `test -x` holds for no other file of the agent's).

The agent's links are copied, never followed, to build the view, and every agent entry is
opened without following links; every mount point lies in a tmpfs of the view's own on a
directory of the read-only `PRISTINE`, reached from a pinned working directory.
"""

from __future__ import annotations

import ctypes
import os
import posixpath
import re
import stat

PRISTINE = "/dev/.memrl-pristine"  # the image, shown read-only by the sandbox (os_machine.PRISTINE)
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SYSTEM_TREES = ("usr", "etc")
FRESH = ("proc", "dev", "run", "sys")
ACCOUNT_FILES = ("passwd", "group", "shadow", "gshadow")
# What the dynamic loader reads before any program runs (ld.so.preload, ld.so.cache ...): always
# the image's, even where the check names it (every program of the check would read it).
LOADER_PREFIX = "ld.so"
# Files of the image's /etc that a check may name to read them as the agent left them: state, which
# no program a check runs reads as configuration (the account files are always the agent's).
ETC_DATA_FILES = ("hostname", "hosts", "shells", "environment", "crontab", "motd", "issue", "timezone",
                  "subuid", "subgid")
RUN_LINKS = ("run", "lock")  # in var: the image's links into /run
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
_BASES = ("mnt", "media", "srv", "tmp")  # the view's tmpfs goes on the first of these of PRISTINE
# An absolute path (or ~/..., $HOME/...) in a script, up to the first character that ends a word
# or starts an expansion or a glob.
_NAMED = re.compile(r"(?:^|(?<=[\s'\"=(:<>|&;!`]))(~|\$HOME|\$\{HOME\})?(/[^\s'\"|&;<>()`$*?\[\]{}\\]*)")
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_DATA = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
_CLONE_NEWNS = 0x20000
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def named_paths(script: str) -> list[str]:
    """The absolute paths `script` names (`~` and `$HOME` as /root), normalised, sorted."""
    found = set()
    for match in _NAMED.finditer(script):
        home, path = match.groups()
        path = posixpath.normpath(("/root" if home else "") + path)
        if path != "/":
            found.add(path)
    return sorted(found)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, kind: str | None, flags: int,
           options: str | None = None) -> None:
    if libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), flags,
                  options and options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source} on {target} failed")


def _bind(libc: ctypes.CDLL, source: str, target: str, flags: int, recursive: bool = False) -> None:
    """Bind `source` on `target` (made first), then remount it with `flags` (read-only and more)."""
    _mount(libc, source, target, None, _MS_BIND | (_MS_REC if recursive else 0))
    _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | flags)


def _lstat(path: str, dir_fd: int | None = None) -> os.stat_result | None:
    try:
        return os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return None


def _place(libc: ctypes.CDLL, parent_fd: int, name: str, target: str, flags: int) -> None:
    """Show the agent's entry `name` of the directory `parent_fd` at `target` (absent there yet):
    a link copied, anything else bound with `flags`; nothing when the agent has no such entry."""
    found = _lstat(name, dir_fd=parent_fd)
    if found is None:
        return
    if stat.S_ISLNK(found.st_mode):
        os.symlink(os.readlink(name, dir_fd=parent_fd), target)
        return
    fd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _bind(libc, f"/proc/self/fd/{fd}", target, flags)
    finally:
        os.close(fd)


def _system_tree(libc: ctypes.CDLL, tree: str, wanted: list[list[str]], agent_root: int, layer: str) -> None:
    """Mount at `tree` (in the working directory) the image's tree with, over it, the agent's entries
    that `wanted` (paths inside the tree, as components) may show (see the module docstring).

    A read-only overlay of `layer` (a directory of the view's tmpfs: placeholders for the agent's
    entries, its links, whiteouts for the image's entries the agent removed) over the image's
    tree; the agent's entries are then bound on their placeholders as data.
    """
    _layer_dir(layer, os.stat(f"{PRISTINE}/{tree}"))
    binds: list[tuple[int, str]] = []
    try:
        for parts in wanted:
            agent = _open_dir(tree, agent_root)
            pristine, placed = f"{PRISTINE}/{tree}", layer
            for depth, name in enumerate(parts):
                theirs, ours = _lstat(name, dir_fd=agent) if agent is not None else None, _lstat(f"{pristine}/{name}")
                if (depth + 1 < len(parts) and theirs and ours and stat.S_ISDIR(theirs.st_mode)
                        and stat.S_ISDIR(ours.st_mode)):  # both have the directory: look inside it
                    if _lstat(f"{placed}/{name}") is None:
                        _layer_dir(f"{placed}/{name}", ours)
                    inner = _open_dir(name, agent)
                    _close(agent)
                    agent, pristine, placed = inner, f"{pristine}/{name}", f"{placed}/{name}"
                    continue
                over_pristine = tree == "etc" and depth == 0 and name in ACCOUNT_FILES + ETC_DATA_FILES
                if (ours is None or over_pristine) and _lstat(f"{placed}/{name}") is None:
                    binds += _layer_entry(f"{placed}/{name}", name, agent, theirs, ours is not None)
                break
            _close(agent)
        os.mkdir(tree)
        _mount(libc, "overlay", tree, "overlay", _MS_RDONLY, f"lowerdir={layer}:{PRISTINE}/{tree}")
        for fd, target in binds:
            _bind(libc, f"/proc/self/fd/{fd}", f"{tree}/{target[len(layer) + 1:]}", _DATA)
    finally:
        for fd, _ in binds:
            os.close(fd)


def _layer_dir(path: str, pristine: os.stat_result) -> None:
    """A directory of an overlay's layer, with the mode and owner of the image's that it shows."""
    os.mkdir(path)
    os.chmod(path, stat.S_IMODE(pristine.st_mode))
    os.chown(path, pristine.st_uid, pristine.st_gid)


def _layer_entry(place: str, name: str, agent: int | None, theirs: os.stat_result | None,
                 pristine_has_it: bool) -> list[tuple[int, str]]:
    """Make in the overlay's layer what shows the agent's entry `name` at `place`; the (fd, place)
    to bind there once the overlay is mounted."""
    if theirs is None or agent is None:
        if pristine_has_it:
            os.mknod(place, stat.S_IFCHR | 0o600, os.makedev(0, 0))  # a whiteout: the agent removed it
        return []
    if stat.S_ISLNK(theirs.st_mode):
        os.symlink(os.readlink(name, dir_fd=agent), place)
        return []
    fd = os.open(name, _PATH_FLAGS, dir_fd=agent)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.mkdir(place)
    else:
        open(place, "w").close()
    return [(fd, place)]


def _open_dir(name: str, parent: int | None) -> int | None:
    """The agent's directory `name` in `parent` (a real directory, not a link), open, or None."""
    if parent is None:
        return None
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _wanted(script: str, tree: str) -> list[list[str]]:
    """The paths inside the system tree `tree` (as components) that the check may see the agent's
    state at: the named ones (through the image's top-level links: /bin/x is /usr/bin/x), and in
    etc the account files."""
    paths = [path.split("/")[1:] for path in named_paths(script)]
    paths = [(os.readlink(f"{PRISTINE}/{parts[0]}").strip("/").split("/") + parts[1:])
             if parts[0] in SYSTEM_LINKS and os.path.islink(f"{PRISTINE}/{parts[0]}") else parts for parts in paths]
    wanted = [parts[1:] for parts in paths if parts[0] == tree and len(parts) > 1]
    if tree == "etc":
        wanted = [parts for parts in wanted if not parts[0].startswith(LOADER_PREFIX)]
        wanted += [[name] for name in ACCOUNT_FILES]
    return sorted(wanted)


def _fresh_dev(libc: ctypes.CDLL) -> None:
    """A /dev of the view's own: the machine's device nodes that are what their names say, links into
    /proc/self, an empty /dev/shm."""
    os.mkdir("dev")
    _mount(libc, "tmpfs", "dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name, (major, minor) in DEVICES.items():
        try:
            fd = os.open(f"/dev/{name}", _PATH_FLAGS)
        except OSError:
            continue
        try:
            found = os.fstat(fd)
            if stat.S_ISCHR(found.st_mode) and found.st_rdev == os.makedev(major, minor):
                open(f"dev/{name}", "w").close()
                _bind(libc, f"/proc/self/fd/{fd}", f"dev/{name}", _MS_NOSUID | _MS_NOEXEC)
        finally:
            os.close(fd)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"dev/{name}")
    os.mkdir("dev/shm")
    _mount(libc, "tmpfs", "dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=1777,size=16m")
    _mount(libc, None, "dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")


def _agent_var(libc: ctypes.CDLL, agent_root: int) -> None:
    """The agent's /var entries (when it is a directory), but for the image's links into /run."""
    os.mkdir("var")
    var = _open_dir("var", agent_root)
    try:
        for name in sorted(os.listdir(var)) if var is not None else []:
            if name not in RUN_LINKS:
                _place(libc, var, name, f"var/{name}", _DATA)
    finally:
        _close(var)
    for name in RUN_LINKS:
        if os.path.islink(f"{PRISTINE}/var/{name}"):
            os.symlink(os.readlink(f"{PRISTINE}/var/{name}"), f"var/{name}")


def _build(libc: ctypes.CDLL, script: str, agent_root: int, layers: str) -> None:
    """Build the view in the working directory (a tmpfs of its own; see the module docstring);
    `layers` is a directory out of the view for the overlays' layers."""
    for name in SYSTEM_LINKS:
        if os.path.islink(f"{PRISTINE}/{name}"):
            os.symlink(os.readlink(f"{PRISTINE}/{name}"), name)
    for tree in SYSTEM_TREES:
        _system_tree(libc, tree, _wanted(script, tree), agent_root, f"{layers}/{tree}")
    os.mkdir("proc")
    _bind(libc, "/proc", "proc", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, recursive=True)
    _fresh_dev(libc)
    for name in ("run", "sys"):
        if os.path.isdir(f"{PRISTINE}/{name}") and not os.path.islink(f"{PRISTINE}/{name}"):
            os.mkdir(name)
            _bind(libc, f"{PRISTINE}/{name}", name, _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _agent_var(libc, agent_root)
    taken = set(SYSTEM_LINKS + SYSTEM_TREES + FRESH) | {"var"}
    for name in sorted(os.listdir(agent_root)):
        if name not in taken:
            _place(libc, agent_root, name, name, _DATA)


def _runnable(libc: ctypes.CDLL, script: str) -> None:
    """In the view (the root now), let the agent's regular files that the script names run: each
    is bound on itself without noexec (still read-only, nosuid, nodev). Others are left as they are."""
    for path in named_paths(script):
        try:
            if stat.S_ISREG(os.stat(path).st_mode) and os.statvfs(path).f_flag & os.ST_NOEXEC:
                _bind(libc, path, path, _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        except OSError:
            continue


def enter(libc: ctypes.CDLL, script: str) -> None:
    """Enter a mount namespace of the check's own and chroot into its view (the module docstring)."""
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    agent_root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    # A tmpfs on a directory of the read-only PRISTINE (the agent can neither replace it nor plant a
    # link on its path), entered at once: from here on every mount point is named relative to it.
    # It holds the overlays' layers, and the view: a tmpfs of its own, whose root the check gets.
    base = next((f"{PRISTINE}/{name}" for name in _BASES
                 if os.path.isdir(f"{PRISTINE}/{name}") and not os.path.islink(f"{PRISTINE}/{name}")), None)
    if base is None:
        raise OSError(0, f"the pristine image has none of {', '.join(_BASES)} to build the view on")
    _mount(libc, "tmpfs", base, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700")
    os.chdir(base)
    if os.stat(".").st_dev == os.stat(PRISTINE).st_dev:
        raise OSError(0, "the view's tmpfs is not where it was mounted")
    os.mkdir("layers", 0o700)
    os.mkdir("root", 0o755)
    _mount(libc, "tmpfs", "root", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
    os.chdir("root")
    try:
        _build(libc, script, agent_root, f"{base}/layers")
    finally:
        os.close(agent_root)
    _mount(libc, None, ".", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "mode=0755")
    os.chroot(".")
    os.chdir("/")
    _runnable(libc, script)
