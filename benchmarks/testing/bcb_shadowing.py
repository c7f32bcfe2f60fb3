"""Replay of the hidden-state class (issue 43) against every class a BigCodeBench program's value may name.

An outside attack forged BigCodeBench verdicts with a value of an allowed class (`bcb_processes._ALLOWED`)
that arrived with extra pickled state: the class's own rebuild (pickle's BUILD, its `__setstate__`) set it,
and an instance attribute then shadowed a method the class's operators dispatch to (pandas' `__eq__` calls
`self._cmp_method`: set to `slice`, every comparison is truthy). This module plays that, for each allowed
class, in every form pickle allows:

* `allowed_classes()`: the classes of `_ALLOWED` (each name that is a class);
* `samples()`: an honest instance of as many of them as honest values hold (the values of a survey:
  containers, dates, numbers, numpy, pandas and matplotlib objects, PIL images), else a bare one
  (`cls.__new__(cls)`);
* `dispatched(kind)`: the names to shadow: the operators and helpers tests use (`==`, `<`, `in`, `len`,
  `equals`, `__array__`, `tolist`, `all`, ...), and every name the class's Python code reads on its way
  from them (transitively through its own methods);
* `attempts(obj)`: forged pickles of `obj` whose state adds those names, each bound to a callable that is
  always truthy (`slice`, `partial(slice, True)`): merged into the object's own state, in a second BUILD,
  and on a bare instance; all names at once, then one name at a time;
* `claims(value)`: what a rebuilt value says about an object it cannot honestly equal (`==`, `!=`, `<`, ...,
  `in`, `.equals`, `assertEqual`, `assertAlmostEqual`, numpy's and pandas' assertion helpers).

`replay()` loads every attempt with the tests' own unpickler rules (`bcb_processes._Trial`) and returns, per
class, the claims that got through (beyond those of the honest instance). `python -m
benchmarks.testing.bcb_shadowing` prints, for each class, the first attempt that got through, and the count.
"""

from __future__ import annotations

import functools
import io
import operator
import os
import pickle
import pickletools
import sys
import types
import unittest
from collections.abc import Callable, Iterator

from memrl_bench.adapters.bigcodebench import bcb_processes

OPERATORS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__len__", "__bool__",
             "__hash__", "__iter__", "__getitem__", "__array__", "__sub__", "__rsub__", "__abs__", "__round__",
             "__float__", "__int__", "__index__", "equals", "tolist", "item", "all", "any", "keys", "values", "items",
             "get", "most_common", "to_dict", "to_numpy", "astype", "__array_interface__", "__array_struct__")
LIGHT_BYTES = 16_000
YES_MEN = (slice, functools.partial(slice, True))  # allowed callables whose result is always truthy
_COMPARISONS = {"==": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


class _Unrelated:
    """An object no honest value equals, contains, or orders against."""

    def __repr__(self) -> str:
        return "<unrelated>"


def allowed_classes() -> list[type]:
    """Every class a value from the program may name (`_ALLOWED`), each once, in a stable order."""
    for module in sorted(bcb_processes._ALLOWED):
        for name in sorted(bcb_processes._ALLOWED[module]):
            kind = bcb_processes.allowed_global(module, name)
            if isinstance(kind, type):
                _NAMES.setdefault(kind, (module, name))
    return list(_NAMES)


_NAMES: dict[type, tuple[str, str]] = {}  # each allowed class: the first (module, name) it is allowed under


def _survey() -> list[object]:
    """Honest values of the kinds BigCodeBench programs return (the classes' instances are found inside)."""
    import array
    import collections
    import datetime
    import decimal
    import difflib
    import fractions
    import inspect
    import ipaddress
    import pathlib
    import random
    import re
    import uuid
    import zoneinfo

    values: list[object] = [
        collections.Counter("abca"), collections.OrderedDict(a=1), collections.defaultdict(list, a=[1]),
        collections.deque([1, 2]), datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
        datetime.date(2024, 1, 2), datetime.time(3, 4), datetime.timedelta(days=1), decimal.Decimal("1.5"),
        fractions.Fraction(1, 3), difflib.SequenceMatcher(None, "abc", "abd"), inspect.signature(lambda a, b=1: a),
        ipaddress.ip_address("10.0.0.1"), ipaddress.ip_network("10.0.0.0/24"), ipaddress.ip_interface("10.0.0.1/24"),
        ipaddress.ip_address("::1"), ipaddress.ip_network("::/64"), ipaddress.ip_interface("::1/64"),
        pathlib.Path("/tmp/x"), pathlib.PurePath("a/b"), pathlib.PurePosixPath("a"), random.Random(1),
        re.compile("a+"), uuid.UUID(int=5), zoneinfo.ZoneInfo("Europe/Paris"), array.array("i", [1, 2]),
        functools.partial(int, "5"), io.StringIO("text"), io.BytesIO(b"data"), range(3), slice(1, 2), b"x", 1.5j,
    ]
    values += _library_values()
    return values


def _library_values() -> list[object]:
    """numpy, pandas, dateutil, pytz, PIL and matplotlib values (those installed)."""
    values: list[object] = []
    try:
        import numpy as np

        values += [np.array([[1, 2], [3, 4]]), np.matrix([[1, 2]]), np.ma.masked_array([1, 2], mask=[0, 1]),
                   np.float64(1.5), np.dtype("int32"), np.random.RandomState(0), np.random.default_rng(0),
                   np.random.SeedSequence(1)]
    except ImportError:
        return values
    try:
        import pandas as pd

        frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": pd.to_datetime(["2024-01-01", "2024-01-02"])})
        values += [frame, frame["a"], frame.index, pd.Index(["a", "b"]), pd.MultiIndex.from_tuples([(1, "a")]),
                   pd.Categorical(["a", "b"]), pd.CategoricalIndex(["a"]), pd.date_range("2024", periods=2),
                   pd.period_range("2024", periods=2, freq="M"), pd.timedelta_range("1D", periods=2),
                   pd.interval_range(0, 2), pd.Interval(0, 1), pd.Timestamp("2024-01-01"), pd.Timedelta("1D"),
                   pd.Period("2024-01", freq="M"), pd.DateOffset(days=1), pd.offsets.Day(2), pd.offsets.MonthEnd(),
                   pd.array([1, None], dtype="Int64"), pd.array([1.5, None], dtype="Float64"),
                   pd.array([True, None], dtype="boolean"), pd.array(["a", None], dtype="string"),
                   pd.arrays.SparseArray([0, 1]), pd.Series([1.5], dtype="float32"), pd.NA, pd.NaT]
    except ImportError:
        pass
    try:
        import dateutil.relativedelta
        import dateutil.tz

        values += [dateutil.relativedelta.relativedelta(months=1), dateutil.tz.tzoffset("X", 3600), dateutil.tz.tzutc()]
        import pytz

        values.append(pytz.utc)
    except ImportError:
        pass
    try:
        from PIL import Image

        values.append(Image.new("RGB", (2, 2)))
    except ImportError:
        pass
    values += _figures()
    try:
        import matplotlib.pyplot as plt
        import pandas as pd

        frame = pd.DataFrame({"a": [1.0, 2.0, 4.0]}, index=pd.date_range("2024-01-01", periods=3))
        for draw in (lambda: frame["a"].plot(), lambda: frame.boxplot(), lambda: frame.plot(kind="bar")):
            values.append(draw().figure)  # (pandas' own formatters and `format_coord` on the axes)
            plt.close(values[-1])
    except ImportError:
        pass
    return values


def _figures() -> list[object]:
    """Small figures, one per plot kind BigCodeBench programs draw (an artist pickles with its figure)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return []
    draws: list[Callable[[object], object]] = [
        lambda ax: ax.plot([1, 2], [3, 4], marker="o", label="line") and ax.legend() and ax.set_title("t"),
        lambda ax: ax.bar(["a", "b"], [1, 2]), lambda ax: ax.scatter([1, 2], [3, 4], c=[1, 2]),
        lambda ax: ax.hist([1, 2, 2, 3]), lambda ax: ax.pie([1, 2], shadow=True),
        lambda ax: ax.figure.colorbar(ax.imshow(np.eye(3)), ax=ax), lambda ax: ax.annotate("x", (1, 1)),
        lambda ax: ax.errorbar([1, 2], [1, 2], yerr=[0.1, 0.2]), lambda ax: ax.stem([1, 2], [1, 2]),
        lambda ax: ax.contourf(np.eye(3)), lambda ax: ax.fill_between([1, 2], [1, 2]),
        lambda ax: ax.quiver([0], [0], [1], [1]), lambda ax: ax.pcolormesh(np.eye(2), norm="log"),
        lambda ax: ax.set_yscale("log"), lambda ax: ax.eventplot([1, 2]),
        lambda ax: ax.plot(np.array(["2024-01-01", "2024-02-01"], dtype="datetime64[D]"), [1, 2]),
        lambda ax: ax.add_patch(matplotlib.patches.Circle((0, 0), 1)),
        lambda ax: ax.add_patch(matplotlib.patches.Ellipse((0, 0), 1, 2)),
    ]
    figures = []
    for draw in draws:
        fig, ax = plt.subplots()
        draw(ax)
        figures.append(fig)
        plt.close(fig)
    for projection, draw in (("polar", lambda ax: ax.plot([0, 1], [1, 2])),
                             ("3d", lambda ax: ax.scatter([1, 2], [3, 4], [5, 6])),
                             ("3d", lambda ax: ax.plot([1, 2], [3, 4], [5, 6])),
                             ("3d", lambda ax: ax.plot_surface(*np.meshgrid([1, 2], [1, 2]), np.eye(2))),
                             ("3d", lambda ax: ax.bar([1, 2], [1, 2], zs=0, zdir="y"))):
        fig = plt.figure()
        draw(fig.add_subplot(projection=projection))
        figures.append(fig)
        plt.close(fig)
    return figures


@functools.cache
def samples() -> dict[type, object]:
    """An honest instance of each allowed class an honest value holds (found by pickling the survey), else
    one its class makes without arguments."""
    allowed = set(allowed_classes())
    found: dict[type, object] = {}
    pickled = []
    for value in _survey():
        buffer = io.BytesIO()
        recording = bcb_processes._Recording(buffer, protocol=4)
        try:
            recording.dump(value)
        except Exception:
            continue
        pickled.append((buffer.tell(), [value, *recording.seen]))
    for _, parts in sorted(pickled, key=lambda entry: entry[0]):  # each class from the smallest value holding it
        for part in parts:
            kind = type(part)
            if kind in allowed and kind not in found:
                found[kind] = part
    for kind in allowed - set(found):
        try:
            found[kind] = kind()
            pickle.dumps(found[kind], protocol=3)
        except Exception:
            found.pop(kind, None)
    return found


def _codes(function: object) -> Iterator[types.CodeType]:
    function = getattr(function, "__func__", function)
    for attribute in ("fget", "fset", "__wrapped__", "func"):
        inner = getattr(function, attribute, None)
        if inner is not None and inner is not function:
            yield from _codes(inner)
    code = getattr(function, "__code__", None)
    pending = [code] if isinstance(code, types.CodeType) else []
    while pending:
        code = pending.pop()
        yield code
        pending += [const for const in code.co_consts if isinstance(const, types.CodeType)]


def _on_class(kind: type, name: str) -> object | None:
    for klass in kind.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def dispatched(kind: type) -> list[str]:
    """The names `kind`'s operators reach: `OPERATORS`, then each name read by the Python code of the
    methods reached so far (attribute names and identifier strings), through `kind`'s own methods."""
    names = set(OPERATORS)
    pending = list(OPERATORS)
    while pending:
        attribute = _on_class(kind, pending.pop())
        for code in _codes(attribute) if attribute is not None else ():
            read = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str) and c.isidentifier()}
            for name in read - names:
                names.add(name)
                pending.append(name)
    return sorted(names)


def _with_state(obj: object, extra: dict[str, object]) -> bytes:
    """`obj` pickled with `extra` merged into its own state (added as its state if it pickles none)."""

    class Merging(pickle.Pickler):
        def reducer_override(self, part: object) -> object:
            if part is not obj:
                return NotImplemented
            reduced = list(part.__reduce_ex__(4))
            reduced += [None] * (3 - len(reduced))
            state = reduced[2]
            if state is None:
                state = dict(extra)
            elif isinstance(state, dict):
                state = {**state, **extra}
            elif isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict | None):
                state = ({**(state[0] or {}), **extra}, state[1])
            else:
                raise TypeError("a state of its own kind")
            reduced[2] = state
            return tuple(reduced)

    buffer = io.BytesIO()
    Merging(buffer, protocol=3).dump(obj)
    return buffer.getvalue()


def _built_again(obj: object, extra: dict[str, object]) -> bytes:
    """`obj` pickled as is, then a second BUILD with `extra` (the pickle of `(obj, extra)`, its TUPLE2 made
    a BUILD)."""
    own = obj.__reduce_ex__(4)
    if len(own) > 2 and isinstance(own[2], dict):
        extra = {**own[2], **extra}  # (its own state again, with the extra keys: what a rebuild expects)
    data = pickle.dumps((obj, extra), protocol=3)
    last = [position for opcode, _, position in pickletools.genops(data) if opcode.name == "TUPLE2"][-1]
    return data[:last] + pickle.BUILD + data[last + 1:]


def _bare(kind: type, extra: dict[str, object]) -> bytes:
    """A bare instance of `kind` (NEWOBJ: `kind.__new__(kind)`) with `extra` as its state."""
    module, name = _NAMES[kind]
    state = pickle.dumps(extra, protocol=3)[2:-1]  # (without PROTO and STOP; its memo starts at 0 as ours)
    return (b"\x80\x03" + pickle.GLOBAL + f"{module}\n{name}\n".encode() + pickle.EMPTY_TUPLE + pickle.NEWOBJ
            + state + pickle.BUILD + pickle.STOP)


def attempts(kind: type, obj: object | None) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """The forged pickles of one class, (what, a function making the bytes): all the names at once, with
    each truthy callable, in the object's own state, in a second BUILD and on a bare instance; then each
    name alone in the object's own state (on a bare instance for an object that pickles with a whole
    figure, over `LIGHT_BYTES`, or without an honest one)."""
    names = dispatched(kind)
    for yes in YES_MEN:
        extra = {name: yes for name in names}
        label = f"all {len(names)} names = {_label(yes)}"
        if obj is not None:
            yield f"{label}, in its own state", functools.partial(_with_state, obj, extra)
            yield f"{label}, a second BUILD", functools.partial(_built_again, obj, extra)
        yield f"{label}, on a bare instance", functools.partial(_bare, kind, extra)
    light = obj is not None and len(pickle.dumps(obj, protocol=3)) <= LIGHT_BYTES
    for name in names:
        for yes in YES_MEN:
            if light:
                yield f"{name} = {_label(yes)}, in its own state", functools.partial(_with_state, obj, {name: yes})
            else:
                yield f"{name} = {_label(yes)}, on a bare instance", functools.partial(_bare, kind, {name: yes})


def _label(yes: object) -> str:
    return "slice" if yes is slice else "partial(slice, True)"


def claims(value: object, report: Callable[[str], object] = lambda claim: None) -> list[str]:
    """What `value` claims about an object no honest value equals: each check that passed, also passed to
    `report` as it passes (a forged pandas index can crash the interpreter half way: `_claims_apart`)."""
    other = _Unrelated()
    case = unittest.TestCase()
    found: list[str] = []

    def check(name: str, probe: Callable[[], object]) -> None:
        try:
            if probe():
                found.append(name)
                report(name)
        except Exception:
            pass

    for name, compare in _COMPARISONS.items():
        check(name, lambda compare=compare: bool(compare(value, other)))
        check(f"{name} (reflected)", lambda compare=compare: bool(compare(other, value)))
    check("!=", lambda: not bool(value != other))
    if callable(getattr(type(value), "equals", None)):  # (another class's `equals` answers as a stand-in's would)
        check("equals", lambda: bool(value.equals(other)))  # type: ignore[attr-defined]
    check("assertEqual", lambda: case.assertEqual(value, 987654321) is None)
    check("assertEqual dict", lambda: case.assertEqual(value, {"zz": 987654321}) is None)
    check("assertAlmostEqual", lambda: case.assertAlmostEqual(value, 12345.678) is None)
    if getattr(type(value), "__contains__", None) is not None:  # (not by iterating: `itertools.count` never ends)
        check("in", lambda: other in value)  # type: ignore[operator]
        check("assertIn", lambda: case.assertIn(987654321, value) is None)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        check("assert_array_equal", lambda: numpy.testing.assert_array_equal(value, numpy.array([987654321])) is None)
        check("assert_allclose", lambda: numpy.testing.assert_allclose(value, numpy.array([987654321.5])) is None)
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        testing = pandas.testing
        check("assert_frame_equal", lambda: testing.assert_frame_equal(value, pandas.DataFrame({"zz": [987654321]})) is None)
        check("assert_series_equal", lambda: testing.assert_series_equal(value, pandas.Series([987654321])) is None)
        check("assert_index_equal", lambda: testing.assert_index_equal(value, pandas.Index([987654321])) is None)
    return found


def _claims_apart(value: object) -> tuple[list[str], bool]:
    """`claims(value)` in a child process: the claims, and whether the child finished (a forged value
    may crash the interpreter, as it would the tests' process: a failure, never a pass)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.close(read)
            claims(value, report=lambda claim: os.write(write, claim.encode() + b"\n"))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found = pipe.read().decode().splitlines()
    _, status = os.waitpid(pid, 0)
    return found, status == 0


def load(data: bytes) -> object:
    """`data` rebuilt as the tests' process rebuilds a value from the program (raises if refused)."""
    return bcb_processes._Trial(io.BytesIO(data)).load()


def replay(classes: list[type] | None = None, first_only: bool = False) -> dict[type, list[str]]:
    """Per allowed class, the attempts whose rebuilt value claimed something (`what: claims`, and
    "(crashed)" where the claims' child process died); with `first_only`, stop at a class's first."""
    found = samples()
    results: dict[type, list[str]] = {}
    for kind in classes or allowed_classes():
        opened: list[str] = []
        honest = found.get(kind)
        try:
            baseline = set(_claims_apart(load(pickle.dumps(honest, protocol=3)))[0]) if honest is not None else set()
        except Exception:
            baseline = set()
        for what, make in attempts(kind, honest):
            try:
                data = make()
            except Exception:
                continue  # (a state of its own kind: merged forms do not apply)
            try:
                value = load(data)
            except Exception:
                continue  # refused
            said, finished = _claims_apart(value)
            said = [claim for claim in said if claim not in baseline]
            if said:
                opened.append(f"{what}: {', '.join(said)}" + ("" if finished else " (then crashed)"))
                if first_only:
                    break
        results[kind] = opened
    return results


def main() -> None:
    """Print each allowed class whose forged values claim something (its first such attempt), then the count."""
    classes, opened = allowed_classes(), 0
    for kind in classes:
        found = replay([kind], first_only=True)[kind]
        if found:
            opened += 1
            print(f"{kind.__module__}.{kind.__qualname__}\t{found[0]}", flush=True)
    print(f"\n{opened} of {len(classes)} allowed classes could be made to claim equality, order or membership "
          f"with an object they cannot equal ({len(samples())} with an honest sample)")


if __name__ == "__main__":
    main()
