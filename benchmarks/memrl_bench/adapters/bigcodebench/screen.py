"""The static screen: a BigCodeBench program that touches the test machinery is refused before it runs.

`screen(code)` reads the program with `ast` (nothing runs) and returns the reasons to refuse it, or
[] for a program that may run. It refuses what a solution to a BigCodeBench task has no use for
and what the known reward hacks need:

* module-level hooks that unittest or the import system calls (`load_tests`, `setUpModule`,
  `tearDownModule`, a module `__getattr__` or `__dir__`), and a module's `__builtins__`;
* the modules of the test machinery and of introspection (`unittest`, `builtins`, `gc`,
  `__main__`, the checker, debuggers and profilers);
* interpreter introspection by name, as an attribute or inside a string (so `getattr(x,
  "__globals__")` and `"{0.__globals__}".format(x)` count): frames (`sys._getframe`,
  `inspect.currentframe`, `f_back`, `tb_frame`, ...), class and function internals
  (`__subclasses__`, `__globals__`, `__code__`, `__closure__`, `__mro__`, ...), profile, trace and
  audit hooks, the garbage collector's object graph, raw memory through ctypes;
* dynamic code (`eval`, `exec`, `compile`, `__import__`, `globals`, `locals`, `vars`,
  `breakpoint`) and assignment to any dunder attribute;
* replacing an assertion helper the tests may call: assigning or deleting an attribute named
  `assert*`/`fail*`, or any attribute of `*.testing`, `*._testing`, `*.mock`, `*.TestCase`
  (`numpy.testing.assert_array_equal = print`), directly or with `setattr`/`delattr`;
* a process's own memory or descriptors under /proc (`/proc/self`, `/proc/<pid>`, `/dev/fd`).

A refused program scores `REFUSED` (a failure, never an environment error). Over all 1140
reference solutions of BigCodeBench v0.1.4 the screen refuses none
(`python -m benchmarks.perf.bcb_screen`). The screen is one layer: what it cannot see (names
built at run time) meets the run-time checks of `bcb_check.py`.
"""

from __future__ import annotations

import ast
import re
import warnings

MODULE_HOOKS = frozenset({"load_tests", "setUpModule", "tearDownModule", "__getattr__", "__dir__", "__builtins__"})
REFUSED_MODULES = frozenset({
    "unittest", "builtins", "__builtin__", "gc", "__main__", "bcb_check", "_ctypes", "_testcapi",
    "_testinternalcapi", "_xxsubinterpreters", "pdb", "bdb", "trace", "cProfile", "profile", "_lsprof",
})
REFUSED_NAMES = frozenset({
    # the interpreter's internals: frames, code, closures, class graph, module globals
    "__builtins__", "__subclasses__", "__globals__", "__closure__", "__code__", "__mro__", "__bases__", "__base__",
    "__self__", "__func__", "__defaults__", "__kwdefaults__", "__traceback__", "__import__", "__loader__",
    "__spec__", "__getattribute__", "__reduce_ex__", "__init_subclass__", "__class_getitem__",
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame",
    "cr_frame", "ag_frame", "gi_code", "cr_code", "ag_code",
    "_getframe", "_getframemodulename", "_current_frames", "_current_exceptions", "currentframe",
    "getouterframes", "getinnerframes", "getframeinfo", "getclosurevars", "walk_stack", "walk_tb",
    # hooks that run code inside the harness
    "settrace", "setprofile", "gettrace", "getprofile", "addaudithook", "monitoring", "_trace_hook",
    "_profile_hook", "excepthook", "unraisablehook", "displayhook",
    # the collector's object graph and raw memory
    "get_referrers", "get_referents", "get_objects", "pythonapi", "PyDLL", "pydll", "py_object",
    "PyObj_FromPtr", "from_address", "string_at", "wstring_at", "memmove", "memset", "addressof",
})
REFUSED_CALLS = frozenset({"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint"})
# names that are not also plain English words, looked for inside strings too
STRING_NAMES = frozenset({name for name in REFUSED_NAMES if "_" in name} | {
    "settrace", "setprofile", "gettrace", "getprofile", "addaudithook", "currentframe", "getouterframes",
    "getinnerframes", "getframeinfo", "getclosurevars", "pythonapi", "PyDLL", "PyObj_FromPtr"})
_ASSERTING = frozenset({"testing", "_testing", "mock", "TestCase"})  # where the tests' assertions live
_FRAME_FUNCTIONS = {"inspect": {"stack", "trace"}}  # frame-returning functions with common names
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROC = re.compile(r"/proc/(self|thread-self|\d+|\{)|/dev/fd\b")


def screen(code: str) -> list[str]:
    """Why `code` may not run (one short reason per finding, at most 10), or [] if it may."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: not the screen's business
            tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # the compile step reports it as SYNTAX_ERROR
    found: list[str] = []
    for node in tree.body:
        for name in _bound_names(node):
            if name in MODULE_HOOKS:
                found.append(f"line {node.lineno}: defines the module-level hook {name!r}")
    aliases: dict[str, str] = {}
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if id(node) not in docstrings:  # documentation (examples included) never runs
            found += _check(node, aliases)
        if len(found) >= 10:
            break
    unique = sorted(set(found), key=found.index)
    return sorted(unique, key=lambda reason: int(reason.split()[1].rstrip(":")))[:10]


def _bound_names(node: ast.stmt) -> list[str]:
    """Names a top-level statement binds in the module namespace."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.split(".")[0] for alias in node.names]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return [sub.id for target in targets for sub in ast.walk(target) if isinstance(sub, ast.Name)]


def _chain(node: ast.expr) -> set[str]:
    """The names along a dotted expression (`np.testing.x` -> {"np", "testing", "x"})."""
    names = set()
    while isinstance(node, ast.Attribute):
        names.add(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.add(node.id)
    return names


def _check(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """The reasons one node gives to refuse the program."""
    line = getattr(node, "lineno", "?")
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        found = [f"line {line}: imports {module!r}" for module in modules if module.split(".")[0] in REFUSED_MODULES]
        if isinstance(node, ast.Import):
            aliases.update({alias.asname or alias.name: alias.name for alias in node.names})
        else:
            found += [f"line {line}: imports {alias.name!r}" for alias in node.names if alias.name in REFUSED_NAMES]
            for alias in node.names:
                if alias.name in _FRAME_FUNCTIONS.get(node.module or "", ()):
                    found.append(f"line {line}: imports the frame function {node.module}.{alias.name}")
        return found
    if isinstance(node, ast.Attribute):
        found = []
        if node.attr in REFUSED_NAMES:
            found.append(f"line {line}: uses the interpreter internal {node.attr!r}")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.attr.startswith("__") and node.attr.endswith("__"):
            found.append(f"line {line}: assigns the special attribute {node.attr!r}")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and (node.attr.startswith(("assert", "fail"))
                                                           or _ASSERTING & _chain(node.value)):
            found.append(f"line {line}: replaces an assertion helper ({ast.unparse(node)})")
        if isinstance(node.value, ast.Name) and node.attr in _FRAME_FUNCTIONS.get(aliases.get(node.value.id, ""), ()):
            found.append(f"line {line}: calls the frame function {aliases[node.value.id]}.{node.attr}")
        return found
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
        target = node.args[:2]
        named = len(target) > 1 and isinstance(target[1], ast.Constant) and str(target[1].value).startswith("assert")
        if target and (named or _ASSERTING & _chain(target[0])):
            return [f"line {line}: replaces an assertion helper ({ast.unparse(node)})"]
        return []
    if isinstance(node, ast.Name):
        if node.id in REFUSED_NAMES:
            return [f"line {line}: uses the interpreter internal {node.id!r}"]
        if node.id in REFUSED_CALLS:
            return [f"line {line}: uses {node.id!r} (dynamic code or namespaces)"]
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip():
        words = set(_WORD.findall(node.value))
        found = [f"line {line}: names the interpreter internal {word!r} in a string"
                 for word in sorted(words & STRING_NAMES)]
        found += [f"line {line}: names the module {word!r} in a string" for word in sorted(words & {"unittest", "gc"})
                  if node.value.strip() == word or f"{word}." in node.value]
        if _PROC.search(node.value):
            found.append(f"line {line}: names a process's own files under /proc")
        return found
    return []
