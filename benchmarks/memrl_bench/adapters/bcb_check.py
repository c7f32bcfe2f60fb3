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
  into a private dict, so `__main__` holds nothing of it). Before any program code runs it reads
  the nonce, installs an audit hook that cannot be removed (`_audit_hook`), snapshots the namespaces
  of the modules the tests' outcome depends on, the `unittest` and `json` classes and `builtins`
  (`_Machinery`), reads and
  deletes both files. It then executes the solution as module `__test__` (so `if __name__ ==
  "__main__":` blocks stay idle), and the tests in a namespace of their own that holds the
  solution's names but not its module hooks, nor a name of a builtin (a global `open`), with the
  task prompt's own imports run first (the adapter puts them atop `TESTS.py`: a class the program
  names `os` is not the tests' `os`); unittest never looks up module-level
  hooks (no `setUpModule`/`tearDownModule`/`load_tests` of the program runs). It runs exactly the test methods found by
  `ast` through references taken before the solution ran; before each test it checks that the
  method is the one compiled from the test file and that nothing changed; after each test, and at
  the end, it checks again. The result object is a plain namespace of closures (no class to find).
  Every function of the solution the tests call is wrapped: a return value holding an object whose
  class takes a method the assertions call (comparisons, subtraction, abs, round, len, `in`,
  `__class__`) from anything but the installation's code for it (or `unittest.mock.ANY`) is flagged.
  The report goes on the pipe signed with the nonce (HMAC-SHA256 by OpenSSL's C function, bound
  before the program ran): the nonce itself never leaves the harness's memory, so a program that
  puts its own pipe in place of the report's and reads the report learns nothing to sign another.

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
# Audit events refused from anyone once the program runs; and those refused when program code asks.
_ALWAYS = frozenset({"sys.settrace", "sys.setprofile", "sys.addaudithook", "sys._current_frames",
                     "sys._current_exceptions", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                     "sys.monitoring.register_callback"})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "__code__", "f_back"})
# The modules whose code decides a test's outcome, snapshotted: a new name, or a name bound to another
# object, counts (except a name that was None: a lazy cache, such as unittest.mock's file_spec).
_STRICT_MODULES = frozenset({"unittest", "json", "builtins", "sys", "os", "io", "re", "abc", "types", "functools",
                             "contextlib", "collections", "traceback", "warnings", "difflib", "pprint", "inspect",
                             "logging", "linecache", "reprlib", "fnmatch", "signal", "_signal", "_thread", "threading"})
# Third-party assertion helpers the tests call (np.testing.assert_array_equal, pd.testing.assert_frame_equal):
# imported before the program runs when the test file names their package, and snapshotted as strictly.
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


def _class_members(test_source: str) -> set[str]:
    """Every name `TestCases` itself defines in `test_source`."""
    node = _test_class(test_source)
    if node is None:
        return set()
    names = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for item in node.body:
        targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _method_codes(code: object) -> dict[str, object]:
    """The code objects of `TestCases`' methods inside the compiled test module `code`."""
    for const in getattr(code, "co_consts", ()):
        if getattr(const, "co_name", None) == "TestCases":
            return {c.co_name: c for c in const.co_consts if hasattr(c, "co_name")}
    return {}


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


def _audit_hook(violations: list[str], own_file: str) -> object:
    """An audit hook that records (and refuses) what the program may not do once armed.

    Always refused: trace, profile and audit hooks, other threads' frames, the collector's object
    graph; code that would pass for the installation's (what decides whether program code asks,
    below, and whose methods a return value may use): compiling under an installed file's name
    anything but that file's content, making a code object under such a name, unmarshalling code
    other than importlib loading an installed file's compiled code, importlib's renaming of code
    (`_imp._fix_co_filename`) called by anyone else; ctypes beyond loading a library, unless the
    harness's own code asks (a library would call a foreign function or read an address for the
    program: a thread's target, a mock's side effect). Refused when program code asks (the first
    caller that is not a frame-returning helper of inspect, traceback, logging or asyncio comes
    from a file outside the installation): frames, tracebacks' frames, generators' and
    coroutines' frames, functions' code. Refused from anyone: opening a process's memory or
    descriptors under /proc.
    """
    import _thread
    import inspect
    import logging
    import re
    import traceback

    getframe, get_ident, realpath = sys._getframe, _thread.get_ident, os.path.realpath
    roots = _trusted_roots()
    import _imp
    import importlib._bootstrap_external as external

    compile_bytecode = external._compile_bytecode.__code__
    fix_co_filename = _imp._fix_co_filename
    proc = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?(mem|fd|fdinfo|map_files|environ)(/|$)").match
    helpers = {inspect.currentframe.__code__, inspect.stack.__code__, inspect.trace.__code__,
               inspect.getouterframes.__code__, inspect.getinnerframes.__code__, traceback.walk_stack.__code__,
               traceback.walk_tb.__code__, traceback.StackSummary.extract.__func__.__code__,
               traceback.StackSummary._extract_from_extended_frame_gen.__func__.__code__,
               logging.currentframe.__code__}
    busy: set[int] = set()

    def helper(code: types.CodeType) -> bool:
        """A frame-returning helper of the library: whoever called it asks (asyncio's, loaded later, by name)."""
        return code in helpers or (code.co_name == "_task_get_stack" and code.co_filename.startswith(roots)
                                   and code.co_filename.endswith("/asyncio/base_tasks.py"))

    def program_asks() -> bool:
        frame = getframe(2)  # 0: this function, 1: the hook, 2: whoever raised the event
        while frame is not None and helper(frame.f_code):
            frame = frame.f_back
        if frame is None:
            return False
        name = frame.f_code.co_filename
        return not (name == own_file or name.startswith("<frozen ") or name.startswith(roots))

    def installed_name(name: object) -> bool:
        """Whether a code object under this file name would pass for the installation's."""
        return isinstance(name, (str, bytes)) and _installed_file(os.fsdecode(name), roots)

    def file_holds(path: object, content: object, offset: int = 0) -> bool:
        """Whether the installation's file `path` holds exactly `content` (from `offset` on)."""
        if not isinstance(content, (bytes, bytearray, memoryview, str)) or not isinstance(path, (str, bytes)):
            return False
        path = os.fsdecode(path)
        if not path.startswith(roots) or not os.path.isfile(path):
            return False
        with open(path, "rb") as handle:
            on_disk = handle.read()[offset:]
        return on_disk == (content.encode() if isinstance(content, str) else bytes(content))

    def fix_filename(code: object, path: object) -> object:
        """importlib's own renaming of a freshly loaded module's code, and nobody else's."""
        frame = getframe(1)
        if frame is None or frame.f_code is not compile_bytecode:
            violations.append("_imp._fix_co_filename")
            raise RuntimeError("refused by the BigCodeBench harness: _imp._fix_co_filename")
        return fix_co_filename(code, path)

    _imp._fix_co_filename = fix_filename

    def harness_asks() -> bool:
        frame = getframe(2)
        return frame is not None and frame.f_code.co_filename == own_file

    def hook(event: str, args: tuple) -> None:
        if event in _ALWAYS or event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            refused = True  # a function's code swapped (the harness's own closures included)
        elif event == "open":
            path = args[0]
            refused = isinstance(path, (str, bytes)) and bool(proc(realpath(os.fsdecode(path))))
        elif event == "compile":  # code passing for the installation's must be the installation's file
            refused = len(args) > 1 and installed_name(args[1]) and not file_holds(args[1], args[0])
        elif event == "code.__new__":
            refused = len(args) > 1 and installed_name(args[1])
        elif event in ("marshal.loads", "marshal.load"):
            frame = getframe(1)
            refused = not (event == "marshal.loads" and frame is not None and frame.f_code is compile_bytecode
                           and file_holds(frame.f_locals.get("bytecode_path"), args[0], 16))
        elif event.startswith("ctypes.") and event != "ctypes.dlopen" or event == "sys._getframe" or (
                event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRIBUTES):
            ident = get_ident()
            if ident in busy:
                return
            busy.add(ident)
            try:
                # ctypes from anyone but the harness: a library called on the program's behalf (a
                # thread's target, a mock's side effect) would read or write any memory for it.
                refused = not harness_asks() if event.startswith("ctypes.") else program_asks()
            finally:
                busy.discard(ident)
        else:
            return
        if refused:
            violations.append(event if event != "open" else f"open {os.fsdecode(args[0])!r}")
            raise RuntimeError(f"refused by the BigCodeBench harness: {event}")

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

    def changes(self) -> list[str]:
        """What differs from the snapshot. Allowed: new submodules, warning registries, sys's streams,
        new builtins, names that were None (lazy caches; not threading's hooks)."""
        found = [f"sys.modules[{name!r}]" for name, module in self.modules.items() if sys.modules.get(name) is not module]
        found += [f"{package}.{attr}" for package, attr, module in self.attributes
                  if vars(sys.modules.get(package, sys)).get(attr) is not module]
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
        if any(owner.__module__.split(".")[0] == "test" for owner in kind.__mro__):  # CPython's test.support.ALWAYS_EQ...
            return f"an instance of {kind.__qualname__}, from CPython's regression-test helpers (the `test` package)"
        dataclass = False
        for owner in (*kind.__mro__, *type(kind).__mro__):
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


def _frameless_signal_handlers() -> None:
    """Signal handlers the program installs get None for the interrupted frame: Python hands a handler
    that frame with no audit event, and the harness's frames are below it (`_signal` is snapshotted
    afterwards, so putting the original function back counts as tampering)."""
    import _signal

    install = _signal.signal

    def signal(signalnum: int, handler: object) -> object:
        if callable(handler):
            program_handler = handler

            def handler(signum: int, frame: object) -> object:  # noqa: F811 (the program's, without the frame)
                return program_handler(signum, None)  # type: ignore[operator]
        return install(signalnum, handler)

    _signal.signal = signal


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


def harness(report_fd: int, nonce_fd: int, solution_path: str, tests_path: str) -> None:
    """Run the solution's tests (see module docstring) and write the report on `report_fd`."""
    import builtins
    import types
    import unittest
    import unittest.mock

    from _hashlib import hmac_digest  # C: a patched hmac or hashlib module never sees the key

    report_key = os.read(nonce_fd, 256)
    os.close(nonce_fd)
    write, encode, exit_now, function_type = os.write, _encoder(), os._exit, types.FunctionType
    violations: list[str] = []
    flagged: list[str] = []
    own_file = os.path.abspath(sys.argv[1])
    roots = _trusted_roots()
    sys.addaudithook(_audit_hook(violations, own_file))
    _frameless_signal_handlers()
    with open(tests_path, encoding="utf-8") as handle:
        tests = handle.read()
    for name in _ASSERTION_MODULES:  # loaded now, so that the snapshot below holds them before the program runs
        package = name.partition(".")[0]
        if re.search(rf"\b(import|from)\s+{package}\b", tests) and _installed(package):
            try:
                __import__(name)
            except ImportError:
                pass
    machinery = _Machinery()
    test_case, test_suite, suite_run = unittest.TestCase, unittest.TestSuite, unittest.TestSuite.run
    result_base = unittest.TestResult
    format_error, any_type = result_base._exc_info_to_string, type(unittest.mock.ANY)
    class_dict = type.__dict__["__dict__"].__get__
    mock = unittest.mock
    globals()["_GUARD_STATE"] = (roots, any_type, mock.DEFAULT, mock.NonCallableMock, mock.MagicProxy,
                                 mock._get_method("__eq__", None).__code__)  # read by `_guard` from here: in the tagged namespace
    machinery.watch("the harness's namespace", globals())
    if isinstance(globals().get("__builtins__"), dict):
        machinery.watch("the harness's builtins", globals()["__builtins__"])
    with open(solution_path, encoding="utf-8") as handle:
        solution = handle.read()
    for path in (solution_path, tests_path):  # the program finds no test file to read
        os.unlink(path)
    names = expected_tests(tests)
    members = _class_members(tests)
    protected = {name for name in dir(test_case) if callable(getattr(test_case, name, None))}
    builtin_names = frozenset(vars(builtins))  # a global `open` of the program's never reaches the tests

    def report(**fields: object) -> None:
        # Signed with the nonce, never carrying it: a program that reads the report on its way
        # (its own pipe put in place of the report's) learns nothing it could sign another with.
        body = encode(fields).encode()[:REPORT_BYTES]
        data = hmac_digest(report_key, body, "sha256").hex().encode() + b" " + body
        while data:
            data = data[write(report_fd, data):]
        exit_now(0)

    def tampering() -> list[str]:
        return [f"audit: {v}" for v in violations[:5]] + machinery.changes()

    module = types.ModuleType("__test__")
    module.__dict__.update({"__file__": PROGRAM_FILE, "__builtins__": builtins, "sys": sys, "os": os,
                            "environ": os.environ})
    sys.modules["__test__"] = module
    namespace: dict[str, object] = {}
    try:
        tests_code = compile(tests, TESTS_FILE, "exec")
        for source, stage, space in ((solution, "solution", module.__dict__), (tests, "tests", namespace)):
            try:
                if stage == "tests":
                    namespace.update({k: _guard(v, flagged) if isinstance(v, function_type)
                                      and v.__code__.co_filename == PROGRAM_FILE else v
                                      for k, v in module.__dict__.items()
                                      if not k.startswith("__") and k not in _MODULE_HOOKS and k not in builtin_names})
                    namespace.update({"__name__": "__test__", "__file__": TESTS_FILE, "__builtins__": builtins,
                                      "__warningregistry__": {}})  # warnings update it in place
                exec(compile(source, PROGRAM_FILE, "exec") if stage == "solution" else tests_code, space)
            except BaseException as error:  # the program may raise anything, SystemExit included
                report(stage=stage, error=_describe(error), module=_missing_module(error), tampered=tampering()[:20], flagged=flagged[:5])
            if stage == "tests":
                machinery.watch("the tests' namespace", namespace)
            changed = tampering()
            if changed:
                report(stage=stage, tampered=changed[:20], flagged=flagged[:5])
    except BaseException as error:  # a violation that escaped the program's own handlers
        report(stage="tests", error=_describe(error), tampered=tampering()[:20], flagged=flagged[:5])
    cases = namespace.get("TestCases")
    if not (isinstance(cases, type) and cases.__mro__[1:] == test_case.__mro__):
        report(stage="tests", error="the program defines no TestCases class deriving directly from unittest.TestCase")
    codes = _method_codes(tests_code)
    methods = {name: class_dict(cases).get(name) for name in names}
    outcomes: dict[str, str] = {}
    errors: list[BaseException] = []
    problem: list[str] = []

    def genuine(test: object, name: str) -> bool:
        """The test runs the method compiled from the test file, on an unchanged instance and class."""
        method = class_dict(cases).get(name)
        depth = 0
        while not isinstance(method, function_type) and depth < 10:  # decorators (mock.patch) wrap it
            method, depth = getattr(method, "__wrapped__", None), depth + 1
        while isinstance(method, function_type) and method.__code__ is not codes.get(name) and depth < 10:
            method, depth = getattr(method, "__wrapped__", None), depth + 1
        return (isinstance(method, function_type) and method.__code__ is codes.get(name)
                and class_dict(cases).get(name) is methods[name] and not set(vars(test)) & (protected | {name}))

    def note(test: object, kind: str, text: str) -> None:
        test = getattr(test, "test_case", test)  # a subtest's outcome is its test's
        name = getattr(test, "_testMethodName", None) or str(test)
        if outcomes.get(name, "ok") == "ok" or kind == "tampered":
            outcomes[name] = kind
        if not problem:
            problem.append(f"{name}: {text}")

    def start_test(test: object) -> None:
        name = getattr(test, "_testMethodName", "?")
        if tampering() or name not in methods or not genuine(test, name):
            note(test, "tampered", "the test machinery or the test method changed before it ran")

    def stop_test(test: object) -> None:
        if tampering():
            note(test, "tampered", "the test machinery changed while the test ran")

    def add_error(test: object, err: tuple, kind: str = "error") -> None:
        errors.append(err[1])
        note(test, kind, format_error(result, err, test))

    def add_sub_test(test: object, subtest: object, err: tuple | None) -> None:
        if err is not None:
            failed = issubclass(err[0], test.failureException)  # type: ignore[attr-defined]
            add_error(test, err, "fail" if failed else "error")

    # A run already entered, whose previous test class shares the tests' module: TestSuite never looks
    # up the module's setUpModule/tearDownModule; the test class's own tearDownClass is called below.
    result = types.SimpleNamespace(
        failfast=False, shouldStop=False, buffer=False, tb_locals=False, _testRunEntered=True,
        _previousTestClass=type("Previous", (), {"__module__": "__test__"}), _moduleSetUpFailed=False, errors=[], failures=[], skipped=[],
        expectedFailures=[], unexpectedSuccesses=[], testsRun=0, _original_stdout=sys.stdout,
        _original_stderr=sys.stderr, startTest=start_test, stopTest=stop_test,
        addSuccess=lambda test: outcomes.setdefault(test._testMethodName, "ok"),
        addError=add_error, addFailure=lambda test, err: add_error(test, err, "fail"), addSubTest=add_sub_test,
        addSkip=lambda test, reason: note(test, "skipped", f"skipped: {reason}"),
        addExpectedFailure=lambda test, err: note(test, "fail", "an expected failure is not a pass"),
        addUnexpectedSuccess=lambda test: note(test, "fail", "unexpected success"),
        _is_relevant_tb_level=lambda tb: "__unittest" in tb.tb_frame.f_globals,
        _exc_info_to_string=lambda err, test: format_error(result, err, test),
        _clean_tracebacks=lambda *args: result_base._clean_tracebacks(result, *args),
        _remove_unittest_tb_frames=lambda tb: result_base._remove_unittest_tb_frames(result, tb),
    )
    try:
        suite = test_suite([cases(name) for name in names])
        suite_run(suite, result)
        suite._tearDownPreviousClass(None, result)
    except BaseException as error:  # a violation raised where the tests could not catch it
        report(stage="run", error=_describe(error), tampered=tampering()[:20], flagged=flagged[:5])
    changed = tampering()
    changed += [f"TestCases.{name}" for name in sorted(set(class_dict(cases)) & protected - members)]
    if changed:
        report(stage="run", tampered=changed[:20], flagged=flagged[:5])
    missing = next(filter(None, map(_missing_module, errors)), None)
    report(stage="run", outcomes=outcomes, tests_run=len(outcomes), module=missing, flagged=flagged[:5],
           problem=_tail(problem[0] if problem else ""))


def _guard(function: object, flagged: list[str]) -> object:
    """`function` (the program's), whose return values are checked by `_equals_everything`.

    The check's parameters are read from the harness's namespace, and a flagged value is also
    written there: that namespace is version-tagged, so a program that reached this closure and
    emptied `flagged` still leaves the write behind (reported as a change of the namespace)."""
    def guarded(*args: object, **kwargs: object) -> object:
        try:
            value = function(*args, **kwargs)  # type: ignore[operator]
        except BaseException as error:  # unittest's own signals (_ShouldStop ends a test part as a success)
            if any(cls.__module__.split(".")[0] == "unittest" for cls in type(error).__mro__):
                reason = f"raised unittest's own {type(error).__name__}, a signal of the test machinery"
                flagged.append(f"{getattr(function, '__name__', '?')} {reason}")
                globals()["_FLAGGED"] = reason
                raise RuntimeError(reason) from None
            raise
        roots, any_type = _GUARD_STATE[:2]
        reason = _equals_everything(value, roots, any_type)
        if reason:
            flagged.append(f"{getattr(function, '__name__', '?')} returned {reason}")
            globals()["_FLAGGED"] = reason
        return value

    guarded.__wrapped__ = function  # type: ignore[attr-defined]
    guarded.__name__ = guarded.__qualname__ = str(getattr(function, "__name__", "guarded"))
    guarded.__doc__ = getattr(function, "__doc__", None)
    return guarded


def _describe(error: BaseException) -> str:
    import traceback

    return _tail("".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next)))


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
