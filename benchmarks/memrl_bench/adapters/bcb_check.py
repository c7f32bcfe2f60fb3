"""Check one BigCodeBench program inside the sandbox and print an authenticated JSON verdict.

Usage: `python -I -B bcb_check.py SOLUTION.py TESTS.py`, with a secret key as the first line of
stdin. Two processes, so that the program under test never holds the verdict's channel:

* the **checker** (this process, `main`, isolated by `-I`: the working directory, which the
  program can write, is not on its path) never runs the program's code and imports nothing the
  report names. It reads the key, makes itself non-dumpable (no other process of its uid can read
  its memory or open its descriptors through /proc, nor ptrace it), counts the test methods of
  `TESTS.py` with `ast`, makes a fresh nonce, then starts the harness in a fresh interpreter that
  inherits neither stdin, stdout nor the key: its output goes to `program_output.txt`; a report
  pipe and a pipe holding the nonce are passed. Once the harness has exited, the checker decides
  and prints the verdict as the last stdout line, `MARKER <hmac-sha256 hex> <json>`, where the
  json is `{"status": PASS|FAIL|RUNTIME_ERROR|MISSING_LIBRARY, "detail": str, "tests": int,
  "module": str|null}`. A line the key did not sign is a forgery
  (`memrl_bench.adapters.bigcodebench` scores it FAIL); a report the nonce did not sign is one too.
* the **harness** (`harness`, in the child) runs from a namespace of its own (this file executed
  into a private dict, so `__main__` holds nothing of it) and reads and deletes both files. Its
  authority sits where no Python code of the program's can reach it:
  - the **enclave** (`_enclave`), a thread started before any program code runs, from a second
    private copy of this file that nothing the program can reach names. It alone reads the nonce;
    it never calls the program's code nor hands it anything; no frame on its stack can be had by
    anyone else (the audit hook). It watches the **runner**, straight-line code with one line per
    checkpoint (`_runner`) on the main thread, through `sys._current_frames`: at each checkpoint the
    runner parks (a byte on a pipe) and the enclave reads the runner's *current line*, checks the
    machinery (`_Watch`), then lets it go on. A test's "ok" line is only reached when that test's run
    returned: its outcome is the control flow of code the program cannot change, not a value it could
    write. A checkpoint the program makes the runner skip leaves its test unreported (a failure).
    The enclave signs the report with the nonce (HMAC-SHA256 by OpenSSL's C function) and ends the
    process.
  - the **audit hook** (`_audit_hook`, from the enclave's copy, installed before the program runs)
    refuses what would reach around that (its docstring lists it): other threads' frames, trace and
    profile hooks, frames of the main thread's stack (the tests', the runner's) or the enclave's or
    the harness's own to anyone but the harness or the tests, code passing for the installation's or
    the harness's, ctypes, native code loaded from outside the installation, cffi. Its state is its
    own: while it runs, code run inside it (a finalizer, a signal handler) gets no frame.
  - the **program's thread** (`_program_thread`): the solution's module code and every call the
    tests make to its functions run there, so that the program's frames lead down to that thread's
    loop only (libraries that read their caller's frames, as pandas' `query` does for `@` names,
    still work; sqlite3 connections are shared, signal handlers installed on the main thread).
  The test file runs first, before any program code (unless its module code needs the program's
  names: then after), so the tests hold the modules they imported before the program could replace
  them; the snapshot covers every module loaded then. The tests run in a namespace of their own that
  holds the solution's names but not its module hooks, nor a name of a builtin (a global `open`), with
  the task prompt's own imports first (the adapter puts them atop `TESTS.py`). Each test runs as
  unittest would (`_run_test`: setUp, the method, tearDown, cleanups; skipped or expected-to-fail
  is no pass) through references bound before the program ran; the enclave checks before and after
  each test that nothing changed (the strict modules, the unittest and json classes, the tests' and
  the harness's namespaces, version tags included, `sys.modules`, the tests' functions' closures,
  defaults and patches). A return value holding an object whose class takes a method the
  assertions call (comparisons, subtraction, abs, round, len, `in`, `__class__`) from anything but
  the installation's code for it (or `unittest.mock.ANY`) is flagged: the test fails
  (`_Flagged`, which `assertRaises` lets through, and a byte on the enclave's pipe).

The checker passes a program only if the nonce signed the harness's report, it reports every
expected test passed, and no tampering, audit violation or flagged value: 0 tests is never
PASS, an early exit (`sys.exit`, `os._exit`, a crash) leaves tests unreported.

This file runs standalone (stdlib only) with the candidate's interpreter; the sandbox copies it
into the working directory.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import re
import sys
import types
from collections.abc import Callable

MARKER = "@@BCB-VERDICT@@ "
DETAIL_CHARS = 2000
REPORT_BYTES = 1 << 20
OUTPUT_FILE = "program_output.txt"
PROGRAM_FILE = "__test__.py"  # the file name the solution's code carries (never a real path)
TESTS_FILE = "__tests__.py"
_MODULE_HOOKS = frozenset({"load_tests", "setUpModule", "tearDownModule"})  # never copied to the tests' namespace
_PR_SET_DUMPABLE = 4
_WATCHED_PACKAGES = ("unittest", "json")  # classes whose dicts are snapshotted too
# Audit events refused from anyone once the program runs (the enclave's own `_current_frames` aside), and
# the events the hook looks at (besides ctypes' and reads of the frame attributes below).
_ALWAYS = frozenset({"sys.settrace", "sys.setprofile", "sys.addaudithook", "gc.get_objects", "gc.get_referrers",
                     "gc.get_referents", "sys._current_exceptions", "sys.monitoring.register_callback"})
_WATCHED_EVENTS = _ALWAYS | {"sys._current_frames", "sys._getframe", "open", "import", "compile", "code.__new__",
                             "marshal.loads", "marshal.load", "object.__setattr__", "bcb.fix_co_filename", "bcb.signal",
                             "bcb.create_builtin"}
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "__code__"})  # (f_back raises no event)
_FLAG_MARK = "flagged: "  # a failed test's detail when a return value of the program's was flagged
# Modules whose code runs where the audit hook does not: cffi's backend (C calls), a second interpreter
# (`_xxsubinterpreters`: audit hooks are per interpreter), CPython's C test modules (`_testcapi` runs code
# in a subinterpreter, `_testinternalcapi` pokes at internals). Never loaded once the program may run.
_UNHOOKED_MODULES = ("_cffi_backend", "_xx", "xx", "_test", "_ctypes_test")
# What a mock `_patch` of a test method patches, and with what (watched: the program must not change it).
_PATCH_SETTINGS = ("getter", "attribute", "attribute_name", "new", "new_callable", "spec", "spec_set", "autospec")
# The modules whose code decides a test's outcome, snapshotted: a new name, or a name bound to another
# object, counts (except a name that was None: a lazy cache, such as unittest.mock's file_spec).
_STRICT_MODULES = frozenset({"unittest", "json", "builtins", "sys", "os", "io", "re", "abc", "types", "functools",
                             "contextlib", "collections", "traceback", "warnings", "difflib", "pprint", "inspect",
                             "logging", "linecache", "reprlib", "fnmatch", "signal", "_signal", "_thread", "threading"})
# Third-party assertion helpers the tests call (np.testing.assert_array_equal, pd.testing.assert_frame_equal):
# imported before the program runs when the tests imported their package, and snapshotted as strictly.
_ASSERTION_MODULES = ("numpy.testing", "numpy.testing._private.utils", "pandas.testing", "pandas._testing",
                      "pandas._testing.asserters")
_LAZY_MODULES = frozenset({"unittest", "unittest.mock"})  # set names lazily (IsolatedAsyncioTestCase, file_spec)
_HOOK_NAMES = frozenset({"_profile_hook", "_trace_hook"})  # threading's: None until a hook is set
_SYS_VOLATILE = frozenset({"stdout", "stderr", "stdin", "path", "argv", "last_type", "last_value", "last_traceback", "last_exc",
                           "tracebacklimit", "ps1", "ps2"})
# What the assertions call on the values they compare: comparisons, and assertAlmostEqual's
# subtraction, abs() and round(); `isinstance` reads __class__, assertIn __contains__, len() __len__.
_CHECKED = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__sub__", "__rsub__", "__abs__", "__round__",
            "__class__", "__contains__", "__len__")
# The harness: this file executed into a private namespace with a private copy of builtins.
_BOOTSTRAP = ("import sys; path = sys.argv[1]; exec(compile(open(path, encoding='utf-8').read(), path, 'exec'), "
              "{'__name__': '__bcb_harness__', '__builtins__': dict(vars(__builtins__))})")


# --------------------------------------------------------------------------- shared helpers


def sign(key: bytes, payload: str) -> str:
    """The hex HMAC-SHA256 of `payload` under `key`."""
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def _test_class(test_source: str) -> ast.ClassDef | None:
    for node in ast.parse(test_source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TestCases":
            return node
    return None


def expected_tests(test_source: str) -> list[str]:
    """Names of the `test*` methods of class `TestCases` in `test_source`, in file order."""
    node = _test_class(test_source)
    return [item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name.startswith("test")] if node else []


def _installed(module: str) -> bool:
    """Whether top-level `module` is installed, found without importing anything."""
    if not module.isidentifier():
        return False
    if module in sys.builtin_module_names:
        return True
    import importlib.machinery

    try:
        return importlib.machinery.PathFinder.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _tail(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]


# --------------------------------------------------------------------------- the harness (child)


def _trusted_roots() -> tuple[str, ...]:
    """Directories whose code is the interpreter's and the installed libraries' (read-only in the sandbox)."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    roots = {os.path.realpath(p) for p in prefixes} | {os.path.abspath(p) for p in prefixes}
    return tuple(sorted(root.rstrip("/") + "/" for root in roots))


class _Probe(Exception):
    """Raised and caught by the audit hook: its traceback holds the hook's own frame (found without `sys._getframe`)."""


def _audit_hook(violations: list[str], own_file: str, anchors: frozenset, enclave: int,
                originals: dict[str, object]) -> Callable[[str, tuple], None]:
    """An audit hook that records (and refuses) what the program may not do once armed.

    It lives in the enclave's namespace (nothing the program can reach names it) and keeps no
    state a frame of its own would expose: while it runs on a thread, a nested audit event of
    that thread passes only if it is the hook reading the very object it announced (`reading`),
    so code run inside the hook (a finalizer, a signal handler) gets no frame, no ctypes, no
    compiling or importing: only opening files, as everywhere.

    Refused from anyone: trace, profile and audit hooks, the collector's object graph, other
    threads' frames (but for the enclave's own code), opening a process's memory or descriptors
    under /proc (or a path it cannot read without running the program's code), loading native
    code from outside the installation, or modules whose code runs where the hook does not
    (`_UNHOOKED_MODULES`: cffi's backend, a second interpreter, CPython's C test modules),
    code that would pass for the installation's or the harness's (compiling under such a file
    name anything but that file's content, making code objects under it, unmarshalling but
    importlib's loading of an installed file, renaming code but importlib's own), swapping a
    function's code or a harness or test function's defaults, ctypes beyond loading a library
    unless the harness's own code asks. Refused when the program asks (the first caller that
    is not a frame-returning helper of inspect, traceback, logging or asyncio comes from a file
    outside the installation and the harness): frames, tracebacks', generators' and coroutines'
    frames, functions' code. Refused unless the harness or the tests ask (the first caller
    outside the installation is theirs): a frame on the main thread's or the enclave's stack, or
    one of the harness's own frames; the code of a test's or the harness's function (its
    constants are the tests' expected values), but to inspect reading a signature. It also does the work of the harness's stand-ins for
    `_imp._fix_co_filename`, `_imp.create_builtin` and `_signal.signal` (`originals`: the
    functions they replaced are the hook's alone), for the stand-ins only.
    """
    import _thread
    import inspect
    import logging
    import pathlib
    import traceback
    import types

    import importlib._bootstrap_external as external
    from importlib.machinery import BuiltinImporter, ModuleSpec

    get_ident, realpath, fsdecode, fspath = _thread.get_ident, os.path.realpath, os.fsdecode, os.fspath
    fix_co_filename, install_signal, frameless = originals["fix_co_filename"], originals["signal"], originals["frameless"]
    signal_code, create_builtin, create_code = originals["signal_code"], originals["create_builtin"], originals["create_code"]
    builtin_loaded = frozenset(name for name in sys.builtin_module_names if name in sys.modules)
    roots = _trusted_roots()
    compile_bytecode = external._compile_bytecode.__code__
    proc = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?(mem|fd|fdinfo|map_files|environ)(/|$)").match
    helpers = {inspect.currentframe.__code__, inspect.stack.__code__, inspect.trace.__code__,
               inspect.getouterframes.__code__, inspect.getinnerframes.__code__, traceback.walk_stack.__code__,
               traceback.walk_tb.__code__, traceback.StackSummary.extract.__func__.__code__,
               traceback.StackSummary._extract_from_extended_frame_gen.__func__.__code__,
               logging.currentframe.__code__}
    signature_readers = {inspect._signature_from_function.__code__, inspect._has_code_flag.__code__}
    path_types = (pathlib.PurePosixPath, pathlib.PosixPath, os.DirEntry)  # exact types: their path is the installation's
    owners = (types.FrameType, types.TracebackType, types.GeneratorType, types.CoroutineType,
              types.AsyncGeneratorType, types.FunctionType)
    ours = (own_file, TESTS_FILE)
    reading: dict[int, object] = {}  # thread -> None while the hook runs there, or the object it is reading

    def text(value: object) -> str:
        """An exact copy of a str (a subclass's own methods never run here), else ''."""
        return str.__str__(value) if issubclass(type(value), str) else ""

    def name_of(value: object) -> str | None:
        """A file name given as str or bytes (exact types), else None."""
        if type(value) is str:
            return value
        return fsdecode(value) if type(value) is bytes else None

    def read(owner: object, attribute: str) -> object:
        """`owner.attribute` read by the hook: the nested audit event names `owner`, and passes."""
        ident = get_ident()
        reading[ident] = owner
        try:
            return getattr(owner, attribute)
        finally:
            reading[ident] = None

    def filename(frame: object) -> str:
        return text(frame.f_code.co_filename) if frame is not None else ""

    def installed(name: str) -> bool:
        return name.startswith(roots) or name.startswith("<frozen ")

    def helper(code: types.CodeType) -> bool:
        """A frame-returning helper of the library: whoever called it asks (asyncio's, loaded later, by name)."""
        return code in helpers or (code.co_name == "_task_get_stack" and installed(text(code.co_filename))
                                   and text(code.co_filename).endswith("/asyncio/base_tasks.py"))

    def raiser() -> object:
        """The frame that raised the event being checked (the one below the hook's)."""
        try:
            raise _Probe
        except _Probe as probe:
            trace = probe.__traceback__
        frame = read(trace, "tb_frame")
        trace = None
        while frame.f_code is not hook_code:
            frame = frame.f_back
        return frame.f_back

    def asker(frame: object, past_installation: bool) -> object:
        """The first frame from `frame` down that is not a helper (nor, if asked, the installation's)."""
        while frame is not None and (helper(frame.f_code) or past_installation and installed(filename(frame))):
            frame = frame.f_back
        return frame

    def guarded(frame: object) -> bool:
        """A harness frame, or one on the main thread's stack (the tests') or the enclave's."""
        if filename(frame) == own_file:
            return True
        while frame is not None:
            if frame.f_code in anchors:
                return True
            frame = frame.f_back
        return False

    def file_holds(path: object, content: object, offset: int = 0) -> bool:
        """Whether the installation's file `path` holds exactly `content` (from `offset` on)."""
        path = name_of(path)
        if type(content) not in (bytes, str) or path is None or not path.startswith(roots) or not os.path.isfile(path):
            return False
        with open(path, "rb") as handle:
            on_disk = handle.read()[offset:]
        return on_disk == (content.encode() if type(content) is str else content)

    def refused_open(path: object) -> bool:
        if issubclass(type(path), int):
            return False  # a descriptor already open
        if type(path) in path_types:
            path = fspath(path)
        name = name_of(path)
        return name is None or bool(proc(realpath(name)))  # a path-like of the program's own: not read here

    def frame_request(event: str, args: tuple, ident: int) -> bool:
        """Whether to refuse handing out a frame (or a function's code)."""
        attribute = text(args[1]) if event == "object.__getattr__" and len(args) > 1 else ""
        if event == "object.__getattr__" and type(args[0]) not in owners:
            return False
        exposed = args[0] if event == "sys._getframe" else read(args[0], attribute)
        frame = raiser()
        if ident == enclave:
            return filename(frame) != own_file
        first = asker(frame, False)
        if first is not None and not (filename(first) == own_file or installed(filename(first))):
            return True  # the program asks
        if attribute == "__code__":  # the tests' code holds their expected values: read only by them, the
            # harness, or inspect for a signature (a callback of the tests' given to the program)
            return (text(exposed.co_filename) in ours and filename(asker(frame, True)) not in ours
                    and frame.f_code not in signature_readers)
        return exposed is not None and guarded(exposed) and filename(asker(frame, True)) not in ours

    def check(event: str, args: tuple, ident: int) -> bool:
        """Whether to refuse `event` (see `_audit_hook`)."""
        if event in _ALWAYS:
            return True
        if event == "sys._current_frames":
            return not (ident == enclave and filename(raiser()) == own_file)
        if event == "open":
            return refused_open(args[0])
        if event == "import":  # C with no audit hook, native code from elsewhere, a fresh copy of a builtin module
            native = args[1] if len(args) > 1 else None
            return (text(args[0]) in builtin_loaded or text(args[0]).startswith(_UNHOOKED_MODULES)
                    or native is not None and not installed(name_of(native) or ""))
        if event == "compile":
            name = name_of(args[1]) if len(args) > 1 else None
            if name is None or name in ours:  # (the harness compiled its own and the tests' before the hook)
                return True
            return installed(name) and not file_holds(name, args[0])
        if event == "code.__new__":
            name = name_of(args[1]) if len(args) > 1 else None
            return name is None or name in ours or installed(name)
        if event in ("marshal.loads", "marshal.load"):
            frame = raiser()
            return not (event == "marshal.loads" and frame is not None and frame.f_code is compile_bytecode
                        and file_holds(frame.f_locals.get("bytecode_path"), args[0], 16))
        if event == "bcb.fix_co_filename":  # importlib's own renaming of a freshly loaded module's code
            frame = raiser().f_back  # the harness's stand-in for _imp._fix_co_filename, then its caller
            if frame is None or frame.f_code is not compile_bytecode:
                return True
            fix_co_filename(args[0], args[1])
            return False
        if event == "bcb.create_builtin":  # a builtin module not loaded before the program ran, made here
            name = text(getattr(args[0], "name", None))
            if (raiser().f_code is not create_code or name in builtin_loaded or name.startswith(_UNHOOKED_MODULES)
                    or type(args[1]) is not list):
                return True
            args[1].append(create_builtin(ModuleSpec(name, BuiltinImporter, origin="built-in")))
            return False
        if event == "bcb.signal":  # the program's handler, installed without the interrupted frame
            if raiser().f_code is not signal_code:
                return True
            handler = args[1]
            install_signal(args[0], frameless(handler) if callable(handler) else handler)  # type: ignore[operator]
            return False
        if event == "object.__setattr__":
            attribute = text(args[1]) if len(args) > 1 else ""
            if attribute == "__code__":
                return True
            return (attribute in ("__defaults__", "__kwdefaults__") and type(args[0]) is types.FunctionType
                    and text(read(args[0], "__code__").co_filename) in ours)
        if event.startswith("ctypes."):
            return event != "ctypes.dlopen" and filename(raiser()) != own_file
        return frame_request(event, args, ident)

    def hook(event: str, args: tuple) -> None:
        if not (event in _WATCHED_EVENTS or event.startswith("ctypes.")
                or event == "object.__getattr__" and len(args) > 1 and text(args[1]) in _FRAME_ATTRIBUTES):
            return
        ident = get_ident()
        if ident in reading:  # raised while the hook runs on this thread
            if event == "object.__getattr__" and args[0] is reading[ident]:
                return  # the hook's own read
            if event == "open" and not refused_open(args[0]):
                return  # the hook reads installed files; nothing else it does raises an event it watches
            refused = True  # code run inside the hook (a finalizer, a signal handler): compiling, importing included
        else:
            reading[ident] = None
            try:
                refused = check(event, args, ident)
            finally:
                del reading[ident]
        if refused:
            named = {"open": 0, "compile": 1, "import": 0}.get(event)  # what was opened, compiled or imported
            violations.append(event if named is None else f"{event} {text(args[named]) or '?'}")
            raise RuntimeError(f"refused by the BigCodeBench harness: {event}")

    hook_code = hook.__code__
    return hook


class _Machinery:
    """A snapshot of the namespaces of the loaded modules of `_STRICT_MODULES` (builtins included) and of
    the `unittest` and `json` classes, with the version tags CPython bumps on every change of a class
    or of a dict: a change undone before a check still shows (`_Versions`)."""

    def __init__(self) -> None:
        self.versions = _Versions()
        self.modules = {name: module for name, module in sys.modules.items()
                        if name.split(".")[0] in _STRICT_MODULES or name in _ASSERTION_MODULES}
        # how the tests reach those helpers: `numpy.testing`, `pandas.testing` (the packages' own dicts change)
        self.attributes = [(name.rpartition(".")[0], name.rpartition(".")[2], module)
                           for name, module in self.modules.items() if name in ("numpy.testing", "pandas.testing")]
        watched = {name: module for name, module in self.modules.items() if name.split(".")[0] in _WATCHED_PACKAGES}
        for module in watched.values():  # warnings then update the registry in place, not the module's dict
            vars(module).setdefault("__warningregistry__", {})
        self.module_dicts = {name: dict(vars(module)) for name, module in self.modules.items()}
        self.classes = {(name, attr): (value, dict(vars(value)))
                        for name, module in watched.items() for attr, value in vars(module).items()
                        if isinstance(value, type) and value.__module__.split(".")[0] in _WATCHED_PACKAGES}
        # version tags: of the classes whose bases are all unittest's, json's or builtin (a change to
        # another base, such as a test patching collections.ChainMap, bumps its subclasses' tags too),
        # and of unittest's module namespaces (tests patch json's functions; nobody patches unittest)
        self.tagged = [(f"{module}.{attr}", cls) for (module, attr), (cls, _) in self.classes.items()
                       if all(base.__module__.split(".")[0] in (*_WATCHED_PACKAGES, "builtins") for base in cls.__mro__)]
        self.tagged += [(name, vars(module)) for name, module in watched.items()
                        if name.startswith("unittest.") and name not in _LAZY_MODULES]
        self.tags = [self.versions.read(obj) for _, obj in self.tagged]

    def watch(self, name: str, space: dict) -> None:
        """Also report any change of `space` (a namespace nothing honest writes to any more)."""
        self.tagged.append((name, space))
        self.tags.append(self.versions.read(space))

    def retag(self, space: dict) -> None:
        """Take `space`'s present version tag as its baseline (the harness itself has just written to it)."""
        self.tags = [self.versions.read(obj) if obj is space else tag for (_, obj), tag in zip(self.tagged, self.tags)]

    def changes(self) -> list[str]:
        """What differs from the snapshot. Allowed: new submodules, warning registries, sys's streams,
        new builtins, names that were None (lazy caches; not threading's hooks)."""
        modules = _modules()
        found = [f"sys.modules[{name!r}]" for name, module in self.modules.items() if modules.get(name) is not module]
        found += [f"{package}.{attr}" for package, attr, module in self.attributes
                  if vars(modules.get(package, sys)).get(attr) is not module]
        for name, before in self.module_dicts.items():
            now = vars(self.modules[name])
            volatile = _SYS_VOLATILE if name == "sys" else ()
            found += [f"{name}.{attr}" for attr, value in before.items() if now.get(attr, _GONE) is not value
                      and attr not in volatile and (value is not None or attr in _HOOK_NAMES)]
            if name != "builtins":
                found += [f"{name}.{attr} (added)" for attr, value in list(now.items())
                          if attr not in before and attr not in volatile and attr != "__warningregistry__"
                          and not (isinstance(value, type(sys)) and vars(value).get("__name__") == f"{name}.{attr}")]
        for (module, attr), (cls, before) in self.classes.items():
            now = vars(cls)
            changed = set(before) ^ set(now) | {key for key in before if key in now and now[key] is not before[key]}
            found += [f"{module}.{attr}.{key}" for key in sorted(changed)]
        found += [f"{name} (changed, then restored)" for (name, obj), tag in zip(self.tagged, self.tags)
                  if self.versions.read(obj) != tag]
        return found


class _Versions:
    """CPython's version tags: a class's `tp_version_tag` and a dict's `ma_version_tag`, which change at
    every modification and that Python code cannot set. Read through ctypes by the harness (the audit
    hook refuses ctypes to the program). Calibrated on throwaway objects; where the layout is not the
    expected one (another interpreter), every read is 0 and only the snapshots count."""

    _TYPE_OFFSET, _DICT_OFFSET = 384, 24  # CPython 3.11, 64-bit: PyTypeObject.tp_version_tag, PyDictObject.ma_version_tag

    def __init__(self) -> None:
        import ctypes

        self._uint, self._u64 = ctypes.c_uint, ctypes.c_uint64
        self.works = sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11) and self._calibrate()

    def _raw(self, obj: object) -> int:
        if isinstance(obj, type):
            getattr(obj, "_bcb_probe_", None)  # a lookup gives the class a tag if it has none
            return int(self._uint.from_address(id(obj) + self._TYPE_OFFSET).value)
        return int(self._u64.from_address(id(obj) + self._DICT_OFFSET).value)

    def _calibrate(self) -> bool:
        probe = type("Probe", (), {})
        space: dict[str, int] = {}
        before, again = self._raw(probe), self._raw(probe)
        probe.x = 1  # type: ignore[attr-defined]
        del probe.x  # type: ignore[attr-defined]
        first = self._raw(space)
        space["x"] = 1
        del space["x"]
        return before == again != 0 and self._raw(probe) not in (0, before) and self._raw(space) != first

    def read(self, obj: object) -> int:
        return self._raw(obj) if self.works else 0


_GONE = object()
_ON_MAIN: Callable[..., object] = NotImplemented  # `on_main` of `_program_thread`: set by `harness` before any use
# (roots, ANY's class, mock.DEFAULT, NonCallableMock, MagicProxy, the code of mock's magic-method wrapper):
# set by `harness` before the program runs.
_GUARD_STATE: tuple = ((), type(None), None, type(None), type(None), None)


def _equals_everything(value: object, roots: tuple[str, ...], any_type: type, budget: int = 10000) -> str:
    """Why `value` (a return value of the program) could pass an assertion with no logic, or ''.

    Walks lists, tuples, sets and dicts (through C-level methods, so the objects cannot lie about
    their content); flags `unittest.mock.ANY`, CPython's test helpers, and an object whose class,
    or metaclass, takes one of the methods the assertions call (`_CHECKED`) from anything but
    the installation's own code for that method (`_library_method`).
    """
    pending, seen = [value], 0
    while pending and seen < budget:
        item = pending.pop()
        seen += 1
        kind = type(item)
        if issubclass(kind, any_type):
            return "unittest.mock.ANY, which equals everything"
        mro = type.__dict__["__mro__"].__get__  # read as the interpreter does: a metaclass cannot show another
        if any(str(type.__dict__["__dict__"].__get__(owner).get("__module__", "")).split(".")[0] == "test"
               for owner in mro(kind)):  # CPython's test.support.ALWAYS_EQ...
            return f"an instance of {kind.__qualname__}, from CPython's regression-test helpers (the `test` package)"
        dataclass = False
        for owner in (*mro(kind), *mro(type(kind))):
            members = type.__dict__["__dict__"].__get__(owner)
            for name in _CHECKED:
                method = members.get(name)
                if method is None:
                    continue
                code = getattr(method, "__code__", None) if isinstance(method, types.FunctionType) else None
                if ("__dataclass_params__" in members and code is not None and code.co_filename == "<string>"
                        and code.co_name == name):
                    dataclass = True  # generated by dataclasses: compares the fields, walked below
                elif not _library_method(item, owner, name, method, roots):
                    return f"an instance of {owner.__qualname__}, a class whose {name} the program defines"
        if issubclass(kind, dict):
            pending += [element for pair in dict.items(item) for element in pair]
        elif issubclass(kind, list):
            pending += list.__iter__(item)
        elif issubclass(kind, tuple):
            pending += tuple.__iter__(item)
        elif issubclass(kind, (set, frozenset)):
            pending += (set if issubclass(kind, set) else frozenset).__iter__(item)
        elif dataclass:
            fields = type.__dict__["__dict__"].__get__(kind).get("__dataclass_fields__", {})
            pending += [getattr(item, name, None) for name in fields]
    return ""


def _library_method(item: object, owner: type, name: str, method: object, roots: tuple[str, ...]) -> bool:
    """Whether `method`, in `owner`'s own dict under `name`, is the installation's code for `name`.

    That is: a C slot of that name (or a compiled library's function of that name, in an
    installed module's class); or a Python function of the installation defined under that
    name in that class, in a module of its own, perhaps under a decorator of the installation's
    (or one of the few helpers the standard library installs under another name: total_ordering's,
    Fraction's), where the class is the one its module has at its name (a class of the program's
    cannot borrow `mock._ANY.__eq__`); or such a class's property of the installation's code; or
    unittest.mock's own magic method, not configured (a mock whose `__eq__` was given a return
    value equals everything). Anything else (the program's functions, `partialmethod`,
    `staticmethod`, other properties, callable objects) is not.
    """
    if type(method) in (types.WrapperDescriptorType, types.MethodDescriptorType, types.BuiltinFunctionType,
                        types.GetSetDescriptorType):
        return getattr(method, "__name__", None) == name
    _, _, _, mock_class, magic_proxy, mock_method_code = _GUARD_STATE
    if type(method) is magic_proxy:  # a magic method of a mock, made when first used
        children = object.__getattribute__(item, "__dict__").get("_mock_children", {})
        return _unconfigured_mock(children.get(name) if isinstance(children, dict) else None)
    if issubclass(type(method), mock_class):  # that magic method once made: the child mock itself
        return _unconfigured_mock(method)
    compiled = type.__dict__["__dict__"].__get__(type(method)).get("__get__")  # a class in C: its slot
    if (type(method).__name__ in ("cython_function_or_method", "fused_cython_function")  # compiled libraries'
            and type(compiled) is types.WrapperDescriptorType and compiled.__objclass__ is type(method)):
        homes = [sys.modules.get(place) for place in (getattr(method, "__module__", None), owner.__module__)]
        return (getattr(method, "__name__", None) == name and _importable_as_named(owner)
                and all(isinstance(getattr(home, "__file__", None), str) and home.__file__.startswith(roots)
                        for home in homes))
    if type(method) is property:  # a library class's own (a mock's `__class__`, for its spec)
        getter = method.fget
        return (isinstance(getter, types.FunctionType) and _installed_code(getter.__code__, roots)
                and _importable_as_named(owner))
    if not isinstance(method, types.FunctionType):
        return False
    code = method.__code__
    if code is mock_method_code and method.__closure__:  # mock's wrapper of a magic method set on a mock
        wrapped = dict(zip(code.co_freevars, (cell.cell_contents for cell in method.__closure__))).get("func")
        return _unconfigured_mock(wrapped) if issubclass(type(wrapped), mock_class) else False
    if not _installed_code(code, roots):
        return False
    base = code.co_filename.rsplit("/", 1)[-1]
    if (base == "functools.py" and code.co_name.startswith("_") and "_from_" in code.co_name
            or base == "fractions.py" and code.co_name in ("forward", "reverse")):
        return _importable_as_named(owner)
    inner = method
    for _ in range(5):  # a library's decorator (functools.wraps): the installation's code all the way in
        wrapped = inner.__dict__.get("__wrapped__")
        if wrapped is None:
            break
        if not (isinstance(wrapped, types.FunctionType) and _installed_code(wrapped.__code__, roots)):
            return False
        inner = wrapped
    # The module it was defined in, by its import name (pandas shows DataFrame as `pandas`'s,
    # collections.abc's classes live in `_collections_abc`).
    module = sys.modules.get(getattr(inner.__globals__.get("__spec__"), "name", None))
    return (inner.__code__.co_name == name and method.__qualname__ == f"{owner.__qualname__}.{name}"
            and module is not None and inner.__globals__ is getattr(module, "__dict__", None)
            and _importable_as_named(owner))


def _installed_file(name: str, roots: tuple[str, ...]) -> bool:
    """Whether a code object's file name is the installation's: under `roots`, or a module frozen into the interpreter."""
    return name.startswith((*roots, "<frozen "))


def _installed_code(code: types.CodeType, roots: tuple[str, ...]) -> bool:
    """Whether `code` is the installation's (`_installed_file`)."""
    return isinstance(code.co_filename, str) and _installed_file(code.co_filename, roots)


def _unconfigured_mock(child: object) -> bool:
    """Whether a mock's magic-method child (None: never made) still has mock's own behaviour."""
    if child is None:
        return True
    _, _, mock_default, mock_class, _, _ = _GUARD_STATE
    if not issubclass(type(child), mock_class):
        return False
    state = object.__getattribute__(child, "__dict__")
    effect = state.get("_mock_side_effect")
    default_effect = effect is None or (isinstance(effect, types.FunctionType)
                                        and effect.__code__.co_filename.rsplit("/", 1)[-1] == "mock.py")
    return state.get("_mock_return_value") is mock_default and state.get("_mock_wraps") is None and default_effect


def _importable_as_named(owner: type) -> bool:
    """Whether `owner` is the class found at its module and qualified name (read through dicts)."""
    found: object = sys.modules.get(owner.__module__)
    for part in owner.__qualname__.split("."):
        space = getattr(found, "__dict__", None) if isinstance(found, types.ModuleType) else (
            type.__dict__["__dict__"].__get__(found) if isinstance(found, type) else None)
        if not isinstance(space, (dict, types.MappingProxyType)):
            return False
        found = space.get(part)
    return found is owner


def _install_signal_handler(signalnum: int, handler: object) -> object:
    """Stand-in for `_signal.signal`: the audit hook installs the handler, wrapped so that it gets None
    for the interrupted frame (Python hands a handler that frame with no audit event, and the tests' and
    the harness's frames are below it); the original function is the hook's alone. A call from the
    program's thread is made on the main thread (`_ON_MAIN`), as Python requires."""
    return _ON_MAIN(_signal_through_the_hook, signalnum, handler)


def _signal_through_the_hook(signalnum: int, handler: object) -> object:
    import _signal

    previous = _signal.getsignal(signalnum)
    sys.audit("bcb.signal", signalnum, handler)
    return previous


def _create_builtin(spec: object) -> object:
    """Stand-in for `_imp.create_builtin`: the audit hook makes the module, unless a module of that name
    was loaded before the program ran (a fresh copy would hand out the originals the harness replaced,
    `_signal.signal` and `_imp._fix_co_filename`, which only the hook holds)."""
    made: list[object] = []
    sys.audit("bcb.create_builtin", spec, made)
    return made[0]


def _frameless_handler(handler: Callable[[int, object], object]) -> Callable[[int, object], object]:
    """`handler` (the program's), called with None for the frame."""
    def frameless(signum: int, frame: object) -> object:
        return handler(signum, None)

    return frameless


def _encoder() -> Callable[[object], str]:
    """A JSON encoder made only of C functions of builtin types, bound now: nothing the program can
    patch later (json's classes and functions, builtins) takes part in writing the report."""
    from _json import encode_basestring_ascii as quote

    kind_of, text, integer, listing, pairs = type, str.__str__, int.__repr__, (list, tuple), dict.items
    join, is_sub = ", ".join, issubclass

    def encode(value: object) -> str:
        kind = kind_of(value)
        if value is None or kind is bool:
            return "null" if value is None else "true" if value else "false"
        if kind is int:
            return integer(value)
        if is_sub(kind, str):
            return quote(text(value))
        if kind in listing:
            return "[" + join([encode(item) for item in value]) + "]"  # type: ignore[attr-defined]
        if kind is dict:
            return "{" + join([quote(text(key) if is_sub(kind_of(key), str) else "?") + ": " + encode(item)
                               for key, item in pairs(value)]) + "}"  # type: ignore[arg-type]
        return quote(kind.__name__)

    return encode


def _runner(count: int) -> tuple[str, dict[int, tuple[str, int]]]:
    """The runner's source and, for each line that parks it, which checkpoint that line is.

    Straight-line code (no loop: every checkpoint has a line of its own). A test's "ok" line is
    only reached when that test's run returned; the enclave reads the line the runner is on."""
    lines = ["def runner(park, prepare, load, begin, run, end, describe, missing):"]
    parks: dict[int, tuple[str, int]] = {}

    def emit(depth: int, text: str) -> None:
        lines.append("    " * depth + text)

    def park(depth: int, kind: str, index: int = -1) -> None:
        parks[len(lines) + 1] = (kind, index)
        emit(depth, "park()")

    def attempt(step: str, kind: str) -> None:
        emit(1, "try:")
        emit(2, step)
        emit(1, "except BaseException as error:")
        emit(2, "detail, module = describe(error), missing(error)")
        park(2, kind)
        emit(2, "return")

    attempt("entries, watch = prepare()", "tests_failed")
    park(1, "before_program")
    attempt("entries, added, later = load(entries)", "program_failed")
    park(1, "loaded")
    attempt("begin()", "class_failed")
    for index in range(count):
        park(1, "before", index)
        emit(1, "try:")
        emit(2, f"run(entries[{index}])")
        emit(1, "except BaseException as error:")
        emit(2, "detail, module = describe(error), missing(error)")
        park(2, "fail", index)
        emit(1, "else:")
        park(2, "ok", index)
    attempt("end()", "end_failed")
    park(1, "done")
    return "\n".join(lines) + "\n", parks


def _enclave(nonce_fd: int, report_fd: int, wake_fd: int, gate_fd: int, flag_fd: int, main_ident: int,
             runner_code: types.CodeType, parks: dict[int, tuple[str, int]], names: list[str],
             violations: list[str]) -> None:
    """The enclave thread: holds the nonce, watches the runner, writes the signed report, ends the process.

    Runs in the harness's second, private namespace and never calls the program's code (nor
    hands it anything): nothing on this thread's stack is reachable from the program. At each
    park of the runner (main thread) it reads the runner's line, checks the machinery at that
    checkpoint and lets the runner go on (one byte on the gate pipe). A test passes only if the
    runner was seen on its "ok" line with nothing changed: a park the program lets the runner
    skip leaves that test unreported, a failure."""
    import select

    from _hashlib import hmac_digest  # C: a patched hmac or hashlib module never sees the key

    key = os.read(nonce_fd, 256)
    os.close(nonce_fd)
    frames, wait, read, write, exit_now = sys._current_frames, select.select, os.read, os.write, os._exit
    encode = _encoder()
    runner = None
    handled: set[int] = set()
    outcomes: dict[str, str] = {}
    problem: list[str] = []
    tampered: list[str] = []
    flagged: list[str] = []
    missing: list[str] = []
    watch: _Watch | None = None

    def report(**fields: object) -> None:
        fields.update(flagged=flagged[:5], tampered=(tampered + [f"audit: {v}" for v in violations[:5]])[:20],
                      module=missing[0] if missing else None)
        body = encode(fields).encode()[:REPORT_BYTES]
        data = hmac_digest(key, body, "sha256").hex().encode() + b" " + body
        while data:
            data = data[write(report_fd, data):]
        exit_now(0)

    def drain(fd: int) -> bytes:
        try:
            return read(fd, 4096)
        except BlockingIOError:
            return b""

    def texts(*names: str) -> list[str]:
        """The runner's local variables `names`, each as an exact str ('' if not a str)."""
        values = runner.f_locals  # type: ignore[union-attr]
        return [str.__str__(value) if issubclass(type(value), str) else "" for value in map(values.get, names)]

    def changes() -> list[str]:
        if watch is None:
            return ["the checks before the program ran were skipped"]
        found = watch.changes()
        tampered.extend(change for change in found if change not in tampered)
        return found

    try:
        while True:
            wait([wake_fd, flag_fd], [], [], 0.05)
            drain(wake_fd)
            if drain(flag_fd) and not flagged:
                flagged.append("a flagged return value (the flag was caught by the tests)")
            top = frames().get(main_ident)
            found, frame = None, top
            while frame is not None:
                if frame.f_code is runner_code:
                    found = frame
                    break
                frame = frame.f_back
            if runner is None:
                runner = found
                if runner is None:
                    if top is None:
                        report(stage="run", error="the program ended the harness's main thread")
                    continue
            elif found is not runner:
                report(stage="run", outcomes=outcomes, tests_run=len(outcomes),
                       problem=problem[0] if problem else "the runner stopped before the last test")
            line = runner.f_lineno
            if line in handled or line not in parks:
                continue
            handled.add(line)
            kind, index = parks[line]
            name = names[index] if 0 <= index < len(names) else ""
            if kind in ("tests_failed", "program_failed", "class_failed", "end_failed", "fail"):
                detail, module = texts("detail", "module")
                if module and module not in missing:
                    missing.append(module)
                if detail.startswith(_FLAG_MARK):
                    flagged.append(detail[len(_FLAG_MARK):])
                if kind != "fail":
                    changes()
                    report(stage={"tests_failed": "tests", "program_failed": "solution"}.get(kind, "run"),
                           error=detail, outcomes=outcomes)
                outcomes[name] = "tampered" if outcomes.get(name) == "tampered" else "fail"
                if not problem:
                    problem.append(f"{name}: {detail}")
            elif kind == "before_program":
                watch = _Watch(runner.f_locals.get("watch"))
            elif kind == "loaded":
                if watch is not None:
                    watch.admit(runner.f_locals.get("added"), runner.f_locals.get("later"))
                changes()
            elif kind in ("before", "ok"):
                if changes():
                    outcomes[name] = "tampered"
                    if not problem:
                        problem.append(f"{name}: the test machinery or the test changed")
                elif kind == "ok" and name not in outcomes:
                    outcomes[name] = "ok"
            elif kind == "done":
                changes()
                report(stage="run", outcomes=outcomes, tests_run=len(outcomes),
                       problem=_tail(problem[0] if problem else ""))
            write(gate_fd, b".")
    except Exception as error:  # the program left something the checks cannot read: no pass
        report(stage="run", error=f"the harness's checks failed ({_type_name(type(error))})",
               outcomes=outcomes)


class _Watch:
    """What the enclave checks at each checkpoint: the machinery (`_Machinery`), every module loaded
    before the program ran (`sys.modules`), the namespaces the tests run from, the tests' own
    functions (closures, defaults, mock's patchings) and the test cases' instance attributes."""

    def __init__(self, spec: object) -> None:
        spec = spec if type(spec) is dict else {}
        self.machinery = _Machinery()
        spaces = spec.get("spaces", {})
        self.spaces = {label: (space, dict(space)) for label, space in spaces.items() if type(space) is dict}
        for label, (space, _) in self.spaces.items():
            self.machinery.watch(label, space)
        self.modules = dict(_modules())
        self._take_tests(spec)

    def _take_tests(self, spec: dict) -> None:
        """The tests' functions, test case instances and test class, as they are now (`spec` as in `__init__`)."""
        self.functions = [(label, function, _function_state(function)) for label, function in _test_functions(spec)]
        self.instances = tuple(spec.get("instances", ()))
        self.protected = frozenset(spec.get("protected", ()))
        self.cases = self._class_state(spec.get("cases"))

    def _class_state(self, cases: object) -> tuple:
        """The test class, its MRO, and its entries under unittest's method names and the tests' names."""
        if not isinstance(cases, type):
            return ()
        members = type.__dict__["__dict__"].__get__(cases)
        names = self.protected | {label.partition(".")[2] for label, _, _ in self.functions if label.startswith("TestCases.")}
        return cases, type.__dict__["__mro__"].__get__(cases), {name: members.get(name, _GONE) for name in names}

    def admit(self, added: object, later: object) -> None:
        """Take the names the harness put into the tests' namespace after the program ran (`added`: the
        program's; and the tests' own when their module code needed the program's names, `later`
        then describing the tests as `__init__`'s spec does) as the new baseline."""
        label = "the tests' namespace"
        if type(added) is not dict or label not in self.spaces:
            return
        space, before = self.spaces[label]
        if all(space.get(key, _GONE) is value for key, value in added.items()):
            self.spaces[label] = (space, {**before, **added})
            self.machinery.retag(space)
        if type(later) is dict:
            self._take_tests(later)

    def changes(self) -> list[str]:
        found = self.machinery.changes()
        modules = _modules()
        found += [f"sys.modules[{name!r}]" for name, module in self.modules.items() if modules.get(name) is not module]
        for label, (space, before) in self.spaces.items():
            found += [f"{label}: {key}" for key, value in before.items() if space.get(key, _GONE) is not value]
            found += [f"{label}: {key} (added)" for key in list(space) if key not in before]
        found += [f"{label} (its closure, defaults or patches)" for label, function, state in self.functions
                  if not _same(_function_state(function), state)]
        found += [f"a test case's {name}" for case in self.instances for name in list(vars(case)) if name in self.protected]
        if self.cases:
            cases, mro, entries = self.cases
            members = type.__dict__["__dict__"].__get__(cases)
            if not _same(type.__dict__["__mro__"].__get__(cases), mro):
                found.append("TestCases' bases")
            found += [f"TestCases.{name}" for name, value in entries.items() if members.get(name, _GONE) is not value]
        return found


def _modules() -> dict:
    """`sys.modules` if it is still a plain dict, else an empty one (everything then counts as changed)."""
    modules = vars(sys).get("modules")
    return modules if type(modules) is dict else {}


def _test_functions(spec: dict) -> list[tuple[str, types.FunctionType]]:
    """The functions the tests run: the test file's own and the test class's (mock.patch's wrappers), unwrapped."""
    found: list[tuple[str, types.FunctionType]] = []
    cases = spec.get("cases")
    members = type.__dict__["__dict__"].__get__(cases) if isinstance(cases, type) else {}
    space = spec.get("spaces", {}).get("the tests' namespace", {})
    for label, value in [*(("TestCases." + key, value) for key, value in members.items()), *space.items()]:
        depth = 0
        while type(value) is types.FunctionType and depth < 10:
            if label.startswith("TestCases.") or value.__code__.co_filename == TESTS_FILE:
                found.append((str(label), value))
            value, depth = value.__dict__.get("__wrapped__"), depth + 1
    return found


def _function_state(function: types.FunctionType) -> tuple:
    """What a function's behaviour depends on besides its code (which cannot change): defaults,
    closure cells, attributes and mock's patchings (each `_patch`'s attributes)."""
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            cells.append(_GONE)
    patchings = function.__dict__.get("patchings")
    patches = tuple(patchings) if type(patchings) is list else ()
    settings = tuple((*(vars(patch).get(name) for name in _PATCH_SETTINGS), tuple(dict(vars(patch).get("kwargs") or {}).items()))
                     for patch in patches)  # (`create` changes as mock patches a builtin: left out)
    return (function.__defaults__, tuple((function.__kwdefaults__ or {}).items()), tuple(cells),
            tuple(function.__dict__.items()), patches, settings)


def _same(first: tuple, second: tuple) -> bool:
    """Whether two states hold the very same objects (tuples compared element by element)."""
    if len(first) != len(second):
        return False
    for one, other in zip(first, second):
        if type(one) is tuple and type(other) is tuple:
            if not _same(one, other):
                return False
        elif one is not other:
            return False
    return True


def harness(report_fd: int, nonce_fd: int, solution_path: str, tests_path: str) -> None:
    """Run the solution's tests (see module docstring); the enclave writes the report on `report_fd`."""
    import _imp
    import _signal
    import _thread
    import builtins
    import types
    import unittest
    import unittest.mock

    own_file = os.path.abspath(sys.argv[1])
    with open(own_file, encoding="utf-8") as handle:  # the enclave's namespace: nothing the program reaches names it
        enclave_space: dict = {"__name__": "__bcb_enclave__", "__builtins__": dict(vars(builtins))}
        exec(compile(handle.read(), own_file, "exec"), enclave_space)
    with open(tests_path, encoding="utf-8") as handle:
        tests = handle.read()
    with open(solution_path, encoding="utf-8") as handle:
        solution = handle.read()
    for path in (solution_path, tests_path):  # the program finds no test file to read
        os.unlink(path)
    _make_undumpable()  # this process's memory and descriptors under /proc: not even its own to open
    names = expected_tests(tests)
    source, parks = _runner(len(names))
    scope: dict = {}
    exec(compile(source, own_file, "exec"), scope)
    runner = scope["runner"]
    tests_code = compile(tests, TESTS_FILE, "exec")
    wake_read, wake_write = os.pipe()
    gate_read, gate_write = os.pipe()
    flag_read, flag_write = os.pipe()
    for fd in (wake_read, wake_write, flag_read, flag_write):
        os.set_blocking(fd, False)
    violations: list[str] = []
    enclave = _thread.start_new_thread(enclave_space["_enclave"], (
        nonce_fd, report_fd, wake_read, gate_write, flag_read, _thread.get_ident(), runner.__code__, parks, names,
        violations))
    anchors = frozenset({sys._getframe().f_code, enclave_space["_enclave"].__code__})
    sys.addaudithook(enclave_space["_audit_hook"](violations, own_file, anchors, enclave, {
        "fix_co_filename": _imp._fix_co_filename, "signal": _signal.signal, "frameless": _frameless_handler,
        "signal_code": _signal_through_the_hook.__code__, "create_builtin": _imp.create_builtin,
        "create_code": _create_builtin.__code__}))
    _imp.create_builtin = _create_builtin
    _imp._fix_co_filename = _fix_co_filename
    enclave_space = {}
    call, on_main = _program_thread()
    globals()["_ON_MAIN"] = on_main
    _signal.signal = _install_signal_handler
    _shared_sqlite()
    mock = unittest.mock
    globals()["_GUARD_STATE"] = (_trusted_roots(), type(mock.ANY), mock.DEFAULT, mock.NonCallableMock, mock.MagicProxy,
                                 mock._get_method("__eq__", None).__code__)  # read by `_equals_everything`
    module = types.ModuleType("__test__")
    module.__dict__.update({"__file__": PROGRAM_FILE, "__builtins__": builtins, "sys": sys, "os": os,
                            "environ": os.environ})
    sys.modules["__test__"] = module
    namespace: dict[str, object] = {"__name__": "__test__", "__file__": TESTS_FILE, "__builtins__": builtins,
                                    "__warningregistry__": {}}  # warnings update the registry in place
    test_case = unittest.TestCase
    protected = frozenset(name for name in dir(test_case) if callable(getattr(test_case, name, None)))
    builtin_names = frozenset(vars(builtins))  # a global `open` of the program's never reaches the tests
    bound: list[type] = []

    spaces = {"the tests' namespace": namespace, "the harness's namespace": globals(),
              "the harness's builtins": globals()["__builtins__"]}
    deferred: list[bool] = []

    def bind() -> tuple[tuple, dict]:
        """What each test runs, bound now; and what the enclave watches."""
        for name in _ASSERTION_MODULES:  # loaded lazily by their packages: now, so that the enclave snapshots them
            if name.partition(".")[0] in sys.modules:
                try:
                    __import__(name)
                except ImportError:
                    pass
        cases = namespace.get("TestCases")
        if not (isinstance(cases, type) and cases.__mro__[1:] == test_case.__mro__):
            raise _NotAPass("the tests define no TestCases class deriving directly from unittest.TestCase")
        bound.append(cases)
        entries = tuple(_entry(cases, name) for name in names)
        return entries, {"spaces": spaces, "cases": cases, "instances": tuple(entry[0] for entry in entries),
                         "protected": protected}

    def prepare() -> tuple[tuple, dict]:
        """Run the test file before any of the program's code, unless its module code needs the program's names."""
        initial = dict(namespace)
        try:
            exec(tests_code, namespace)
        except NameError:  # a constant of the program's (OUTPUT_DIR): the tests run after the program
            namespace.clear()
            namespace.update(initial)
            deferred.append(True)
            return (), {"spaces": spaces}
        return bind()

    def load(entries: tuple) -> tuple[tuple, dict, dict | None]:
        """Run the program as module `__test__` on its thread; give the tests its names (functions guarded)."""
        call(exec, (compile(solution, PROGRAM_FILE, "exec"), module.__dict__), {})
        added = {key: _guard(value, call, flag_write) if type(value) is types.FunctionType
                 and value.__code__.co_filename == PROGRAM_FILE else value
                 for key, value in list(module.__dict__.items())
                 if type(key) is str and not key.startswith("__") and key not in _MODULE_HOOKS
                 and key not in builtin_names and key not in namespace}
        namespace.update(added)
        if not deferred:
            return entries, added, None
        exec(tests_code, namespace)
        entries, later = bind()
        return entries, {key: value for key, value in namespace.items() if not key.startswith("__")}, later

    def begin() -> None:
        bound[0].setUpClass()

    def end() -> None:
        try:
            bound[0].tearDownClass()
        finally:
            bound[0].doClassCleanups()
            if bound[0].tearDown_exceptions:
                raise bound[0].tearDown_exceptions[0][1]

    def describe(error: BaseException) -> str:
        return _FLAG_MARK + str(error.args[0]) if type(error) is _Flagged else _describe(error)

    def park() -> None:
        try:
            os.write(wake_write, b".")
        except OSError:
            pass
        os.read(gate_read, 1)

    try:
        runner(park, prepare, load, begin, _run_test, end, describe, _missing_module)
    finally:  # the enclave ends the process once it has reported
        forever = _thread.allocate_lock()
        forever.acquire()
        while True:
            try:
                forever.acquire()
            except BaseException:  # a signal handler of the program's raising here
                pass


class _Flagged(BaseException):
    """A return value (or exception) of the program's that would pass the tests with no logic: the test fails."""


class _NotAPass(Exception):
    """A test that cannot pass: skipped, expected to fail, or no test class."""


def _entry(cases: type, name: str) -> tuple:
    """What `_run_test` needs of one test, bound before the program runs (a class changed later changes nothing)."""
    case = cases(name)
    method = type.__dict__["__dict__"].__get__(cases).get(name)
    skipped = any(getattr(owner, flag, False) for owner in (cases, method)
                  for flag in ("__unittest_skip__", "__unittest_expecting_failure__"))
    return case, method, cases.setUp, cases.tearDown, "skipped, or expected to fail: not a pass" if skipped else ""


def _run_test(entry: tuple) -> None:
    """One test as unittest runs it (setUp, the method, tearDown, the cleanups); any failure is raised."""
    case, method, set_up, tear_down, reason = entry
    if reason:
        raise _NotAPass(reason)
    try:
        set_up(case)
        try:
            method(case)
        finally:
            tear_down(case)
    finally:
        failure = None
        while case._cleanups:
            function, args, kwargs = case._cleanups.pop()
            try:
                function(*args, **kwargs)
            except BaseException as error:
                failure = failure or error
        if failure is not None:
            raise failure


def _program_thread() -> tuple[Callable[[object, tuple, dict], object], Callable[..., object]]:
    """Start the thread the program's code runs on; return `call(function, args, kwargs)`, which runs a
    call of the main thread's there (other threads' calls run where they are, concurrently, as before)
    and returns its value or raises its exception, and `on_main(function, *args)`, which
    runs a function on the main thread for the program's (installing a signal handler). The
    program's frames lead down to that thread's loop only, never to the tests' or the harness's (a
    library that reads its caller's frame, as pandas' `DataFrame.query` does for `@` names, works)."""
    import _thread
    from _queue import SimpleQueue

    requests: SimpleQueue = SimpleQueue()
    to_main: SimpleQueue = SimpleQueue()  # a finished call (its box), or a function to run on the main thread
    get_ident = _thread.get_ident
    main = get_ident()

    def serve() -> None:
        while True:
            box = requests.get()
            try:
                box[3] = box[0](*box[1], **box[2])
            except BaseException as error:  # the program may raise anything, SystemExit included
                box[4] = error
            finally:
                to_main.put(box)
            box = None

    ident = _thread.start_new_thread(serve, ())

    def call(function: object, args: tuple, kwargs: dict) -> object:
        if get_ident() != main:  # a test's own thread, or a callback of the tests' on the program's thread
            return function(*args, **kwargs)  # type: ignore[operator]
        box = [function, args, kwargs, None, None]
        requests.put(box)
        while (message := to_main.get()) is not box:
            function, args, reply = message
            try:
                reply.put((function(*args), None))
            except BaseException as error:
                reply.put((None, error))
        error, box[4] = box[4], None
        if error is not None:
            raise error
        return box[3]

    def on_main(function: Callable[..., object], *args: object) -> object:
        if get_ident() != ident:
            return function(*args)
        reply: SimpleQueue = SimpleQueue()
        to_main.put((function, args, reply))
        value, error = reply.get()
        if error is not None:
            raise error
        return value

    return call, on_main


def _shared_sqlite() -> None:
    """sqlite3 connections a test opens also work on the program's thread (only one of the two runs at
    a time: the main thread waits for the program's calls)."""
    import sqlite3
    import sqlite3.dbapi2 as dbapi

    connect = dbapi.connect

    def shared(*args: object, **kwargs: object) -> object:
        if len(args) < 5:  # check_same_thread is the fifth parameter
            kwargs.setdefault("check_same_thread", False)
        return connect(*args, **kwargs)  # type: ignore[arg-type]

    sqlite3.connect = dbapi.connect = shared


def _guard(function: types.FunctionType, call: Callable[[object, tuple, dict], object], flag_fd: int) -> object:
    """`function` (the program's), run on the program's thread, whose return values are checked by
    `_equals_everything` (`_check_returned`). Its closure holds nothing a program could turn: the
    checks are read from the harness's namespace, which the enclave watches."""
    name = str(function.__name__)

    def guarded(*args: object, **kwargs: object) -> object:
        try:
            value = call(function, args, kwargs)
        except BaseException as error:
            _check_raised(name, error, flag_fd)
            raise
        _check_returned(name, value, flag_fd)
        return value

    guarded.__wrapped__ = function  # type: ignore[attr-defined]
    guarded.__name__ = guarded.__qualname__ = name
    guarded.__doc__ = function.__doc__
    return guarded


def _check_returned(name: str, value: object, flag_fd: int) -> None:
    """Raise `_Flagged` (not an `Exception`: `assertRaises` lets it through) if `value` would pass the
    tests with no logic, and write a byte on the enclave's flag pipe (a test catching everything still fails)."""
    roots, any_type = _GUARD_STATE[:2]
    reason = _equals_everything(value, roots, any_type)
    if reason:
        _flag(flag_fd, f"{name} returned {reason}")


def _check_raised(name: str, error: BaseException, flag_fd: int) -> None:
    """unittest's own signals (_ShouldStop, SkipTest) raised by the program are no answer."""
    kind = type(error)
    if any(str(type.__dict__["__dict__"].__get__(cls).get("__module__", "")).split(".")[0] == "unittest"
           for cls in type.__dict__["__mro__"].__get__(kind)):
        _flag(flag_fd, f"{name} raised unittest's own {_type_name(kind)}, "
                       "a signal of the test machinery")


def _flag(flag_fd: int, reason: str) -> None:
    try:
        os.write(flag_fd, b"!")
    except OSError:
        pass
    raise _Flagged(reason)


def _fix_co_filename(code: object, path: object, _audit: Callable[..., None] = sys.audit) -> None:
    """Stand-in for `_imp._fix_co_filename`: the audit hook does importlib's own renaming of code it just
    loaded (and refuses anyone else's: the original is not reachable from here)."""
    _audit("bcb.fix_co_filename", code, path)


def _type_name(kind: type) -> str:
    """A class's own name, read as the interpreter does (a metaclass cannot show another)."""
    return str(type.__dict__["__name__"].__get__(kind))


def _describe(error: BaseException) -> str:
    import traceback

    try:
        return _tail("".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next)))
    except BaseException:  # an exception of the program's that cannot be shown
        return _tail(f"{_type_name(type(error))} (its traceback could not be shown)")



def _missing_module(error: BaseException) -> str | None:
    """The top-level module name if `error` is an import of a module not installed here."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.split(".")[0]
    return top if not _installed(top) else None


# --------------------------------------------------------------------------- the checker (parent)


def authentic_report(raw: bytes, nonce: str) -> tuple[dict | None, bool]:
    """The harness's report (None: nothing, or nothing readable) and whether the nonce signed it."""
    mac, _, body = raw.partition(b" ")
    if not raw:
        return None, True
    expected = hmac.new(nonce.encode(), body, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, expected):
        return {}, False
    try:
        report = json.loads(body)
    except ValueError:
        return None, True
    return (report if isinstance(report, dict) else None), True


def decide(report: dict | None, names: list[str], exit_text: str, authentic: bool = True) -> dict:
    """The verdict from the harness's report (`authentic`: signed with the nonce) and the expected test names."""
    def verdict(status: str, detail: str, tests: int = 0, module: str | None = None) -> dict:
        return {"status": status, "detail": _tail(detail), "tests": tests, "module": module}

    if report is None:
        return verdict("RUNTIME_ERROR", f"the program ended before its tests reported ({exit_text})")
    if not authentic:
        return verdict("FAIL", "a report the harness did not sign with its nonce: the program forged its report")
    if report.get("flagged"):  # (its mark in the harness's namespace also shows as a change there)
        return verdict("FAIL", "a return value that passes equality tests with no logic: "
                       + "; ".join(map(str, report["flagged"])))
    if report.get("tampered"):
        return verdict("FAIL", "the program changed the test machinery: " + ", ".join(map(str, report["tampered"])))
    module = report.get("module")
    if module and _installed(str(module)):  # the harness's claim is checked here, not trusted (nothing imported)
        module = None
    if report.get("error"):
        status = "MISSING_LIBRARY" if module else "RUNTIME_ERROR"
        return verdict(status, str(report["error"]), 0, module)
    if not names:
        return verdict("RUNTIME_ERROR", "the tests define no test method: 0 tests is never a pass")
    outcomes = report.get("outcomes") if isinstance(report.get("outcomes"), dict) else {}
    failed = [name for name in names if outcomes.get(name) != "ok"]
    unreported = [name for name in names if name not in outcomes]
    if module:
        return verdict("MISSING_LIBRARY", str(report.get("problem", "")), len(outcomes), module)
    if not failed:
        return verdict("PASS", "", len(names))
    if any(outcomes.get(name) == "tampered" for name in names):
        return verdict("FAIL", f"the program changed the test machinery or a test method: {report.get('problem', '')}",
                       len(names))
    if unreported and len(unreported) == len(failed):
        return verdict("FAIL", f"{len(unreported)}/{len(names)} tests did not run: {', '.join(unreported[:5])}",
                       len(names) - len(unreported))
    return verdict("FAIL", f"{len(failed)}/{len(names)} tests failed; first: {report.get('problem', '')}", len(names))


def _make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid cannot ptrace us or open /proc/<pid>/fd|mem."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to harden
        pass


def _read_report(fd: int, child: object) -> bytes:
    """What the harness wrote on the pipe until it exited (forks left holding the pipe are ignored)."""
    import select

    os.set_blocking(fd, False)
    chunks, size = [], 0
    while size <= REPORT_BYTES:
        exited = child.poll() is not None  # type: ignore[attr-defined]
        if not exited:
            select.select([fd], [], [], 0.05)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            if exited:
                break
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def main(solution_path: str, tests_path: str) -> None:
    """Run the harness on the program, then print the signed verdict."""
    import secrets
    import signal
    import subprocess

    key = sys.stdin.buffer.readline().strip()
    _make_undumpable()
    with open(tests_path, encoding="utf-8") as handle:
        names = expected_tests(handle.read())
    nonce = secrets.token_hex(32)
    read_fd, write_fd = os.pipe()
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, nonce.encode())
    os.close(nonce_write)
    with open(OUTPUT_FILE, "wb") as output:
        child = subprocess.Popen(
            [sys.executable, "-B", "-c", _BOOTSTRAP, os.path.abspath(__file__), str(write_fd), str(nonce_read),
             solution_path, tests_path],
            stdin=subprocess.DEVNULL, stdout=output, stderr=output, pass_fds=(write_fd, nonce_read),
            start_new_session=True,
        )
    os.close(write_fd)
    os.close(nonce_read)
    raw = _read_report(read_fd, child)
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # what the program left running in its session
    except (ProcessLookupError, PermissionError):
        pass
    report, authentic = authentic_report(raw, nonce)
    exit_text = f"exit {code}" if code >= 0 else f"signal {-code}"
    payload = json.dumps(decide(report, names, exit_text, authentic))
    sys.stdout.write("\n" + MARKER + sign(key, payload) + " " + payload + "\n")
    sys.stdout.flush()
    os._exit(0)  # nothing of ours to tear down


if __name__ == "__bcb_harness__":  # the harness: this file executed into a private namespace
    harness(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
elif __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
