"""Run a BigCodeBench program's tests in a process the program never runs in. Runs standalone, by path:
one file, because both processes run it in the sandbox outside any installed package, so it stays whole.

Usage (by `bcb_check.py`, beside it): `python -B -s bcb_processes.py tests REPORT_FD NONCE_FD SOLUTION.py
TESTS.py`; the tests' process starts `bcb_processes.py program SOCKET_FD ADDRESS` itself. Not `-I`: both
honour the sandbox's PYTHONHASHSEED (set orders as BigCodeBench's own harness has them), and the
program's process has its working directory on its path, as a script there would.

Two processes, a socket between them (`Channel`: length-prefixed pickles, requests both ways):

* the **tests' process** (`run_tests`; no code of the program's ever runs in it, non-dumpable; once
  the program may run, it loads code only from the installation: `_InstalledOnly`) runs the test
  file and each test as unittest would, and signs its report with the nonce. The program's names in
  the tests' namespace are stand-ins (`ProgramObject`; a class of the program's gets a class,
  `_ProgramClass`, so `issubclass` holds): calling one sends the call over the socket. What comes
  back is *data*: a restricted unpickler (`_TestsUnpickler`) rebuilds only what `allowed_global`
  admits, name by name (`_ALLOWED`: builtin containers and numbers, `collections`, `datetime`, numpy
  arrays, pandas frames, matplotlib figures, PIL images and their reconstructors), pickle's BUILD
  sets the state only of what the same load made, once, and no rebuilt object keeps hidden state
  (`_DataUnpickler`, `_no_hidden_state`: no instance attribute that hides its class's behaviour, no
  field its class's own pickling does not write); everything else of the program's arrives as
  another stand-in, which the tests can call, iterate, index or read attributes of, but which
  equals nothing but itself. The tests, their expected values and the report exist
  only in this process's memory: nothing the program reads, writes or returns reaches them.
* the **program's process** (`serve_program`, a session of its own) imports what the tests
  imported, runs the solution as module `__test__` and every call the tests send. What the tests
  pass that is not data (a mock, a callback, a StringIO, their Axes) stays in the tests' process:
  the program gets a stand-in (`TestsObject`, with the special methods the real object has) whose
  calls and attribute reads go back there, where the real object answers (`TestsChannel.apply`:
  public attributes; never what a mock's assertions read). Each call carries the tests' state
  along and brings the program's back (`_get_state`: the random generators, the working directory,
  the environment, `sys.path`); the active `unittest.mock` patches and a redirected stdout/stderr
  are mirrored on the program's side; its warnings, the arguments it changed in place and pyplot's
  current figure come back. A process the program forks connects to the tests' process on a unix
  socket of its own (`_serve_forks`), so a multiprocessing pool's workers reach the tests' mocks.
"""

from __future__ import annotations

import builtins
import importlib
import io
import os
import pickle
import socket
import random
import struct
import sys
import threading
import types
from collections.abc import Callable

if __package__:
    from . import bcb_check
else:  # a script beside bcb_check.py, in the sandbox's working directory (not on the path: `-I`)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "bcb_check", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bcb_check.py"))
    bcb_check = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(bcb_check)

# What the machinery calls, bound before any test or program code runs (either may patch the modules).
_getcwd, _chdir, _environ, _import_module = os.getcwd, os.chdir, os.environ, importlib.import_module
_random_state, _set_random_state = random._inst.getstate, random._inst.setstate
_dumps, _BytesIO, _Socket = pickle.dumps, io.BytesIO, socket.socket

MESSAGE_BYTES = 256 << 20  # one message's cap (a value the program returns, a call's arguments)
PROGRAM_MODULE = "__test__"
PROGRAM_FILE = "__test__.py"
TESTS_FILE = "__tests__.py"
_HEADER = struct.Struct("!Q")
_MODULE_HOOKS = frozenset({"load_tests", "setUpModule", "tearDownModule"})  # never copied to the tests' namespace
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
                    slice, range, type(Ellipsis), type(NotImplemented), pickle.PickleBuffer})
# Every global a value from the program may name (pickle's find_class), module -> names: the data
# classes and reconstructors that honest values of the standard library, numpy, pandas, matplotlib
# and PIL name (collected from the values of all 1140 reference solutions and a survey of plot kinds
# and dtypes, then read one by one: none runs code it is given, reads a file it is named, or hands
# out arbitrary attributes). Whole packages are not listed: pandas alone has a class whose
# constructor evaluates an expression (`pandas.core.computation.expr.Expr`, found by a red team).
_ALLOWED = {module: frozenset(names.split()) for module, names in {
    "builtins": "bool bytearray bytes complex dict enumerate float frozenset int iter list object range reversed set "
                "slice str tuple zip",
    "_codecs": "encode",
    "copyreg": "_reconstructor __newobj__ __newobj_ex__",
    "_io": "StringIO BytesIO",
    "array": "_array_reconstructor array",
    "collections": "Counter OrderedDict defaultdict deque",
    "datetime": "date datetime time timedelta timezone",
    "decimal": "Decimal",
    "difflib": "SequenceMatcher",
    "fractions": "Fraction",
    "functools": "partial",
    "inspect": "Parameter Signature _ParameterKind _empty",
    "ipaddress": "IPv4Address IPv4Interface IPv4Network IPv6Address IPv6Interface IPv6Network",
    "itertools": "count combinations cycle zip_longest",
    "pathlib": "Path PosixPath PurePath PurePosixPath",
    "random": "Random",
    "re": "_compile",
    "signal": "Signals",
    "socket": "AddressFamily SocketKind",
    "uuid": "UUID SafeUUID",
    "zoneinfo": "ZoneInfo",
    "dateutil.relativedelta": "relativedelta",
    "dateutil.tz.tz": "tzoffset tzutc tzlocal",
    "pytz": "_UTC _p",
    "PIL.Image": "Image",
    "PIL.PngImagePlugin": "PngImageFile",
    "PIL.JpegImagePlugin": "JpegImageFile",
    "numpy": "dtype matrix ndarray",
    "numpy._core.multiarray": "_reconstruct scalar",
    "numpy.core.multiarray": "_reconstruct scalar",
    "numpy._core.numeric": "_frombuffer",
    "numpy.core.numeric": "_frombuffer",
    "numpy.ma": "MaskedArray",
    "numpy.ma.core": "MaskedArray _mareconstruct",
    "numpy.random._pickle": "__bit_generator_ctor __generator_ctor __randomstate_ctor",
    "numpy.random._mt19937": "MT19937",
    "numpy.random._pcg64": "PCG64",
    "numpy.random.bit_generator": "SeedSequence __pyx_unpickle_SeedSequence",
    "numpy.random.mtrand": "RandomState",
    "numpy.random._generator": "Generator",
    "pyarrow.lib": "_restore_array py_buffer type_for_alias",
    "pandas": "ArrowDtype BooleanDtype Categorical CategoricalDtype CategoricalIndex DataFrame DateOffset DatetimeIndex "
              "DatetimeTZDtype Float32Dtype Float64Dtype Index Int8Dtype Int16Dtype Int32Dtype Int64Dtype Interval "
              "IntervalDtype IntervalIndex MultiIndex NA NaT Period PeriodDtype PeriodIndex RangeIndex Series "
              "SparseDtype StringDtype Timedelta TimedeltaIndex Timestamp UInt8Dtype UInt16Dtype UInt32Dtype "
              "UInt64Dtype",
    "pandas.core.frame": "DataFrame",
    "pandas.core.series": "Series",
    "pandas.arrays": "ArrowStringArray BooleanArray Categorical DatetimeArray FloatingArray IntegerArray IntervalArray "
                     "NumpyExtensionArray PeriodArray SparseArray StringArray TimedeltaArray",
    "pandas._libs.arrays": "__pyx_unpickle_NDArrayBacked",
    "pandas._libs.internals": "_unpickle_block",
    "pandas._libs.interval": "__pyx_unpickle_IntervalMixin",
    "pandas._libs.tslibs.nattype": "_nat_unpickle __nat_unpickle",
    "pandas._libs.tslibs.offsets": "_unpickle BusinessDay Day Hour Minute MonthBegin MonthEnd QuarterBegin QuarterEnd "
                                   "Second Week YearBegin YearEnd",
    "pandas._libs.tslibs.timedeltas": "_timedelta_unpickle",
    "pandas._libs.tslibs.timestamps": "_unpickle_timestamp",
    "pandas.core.indexes.base": "_new_Index",
    "pandas.core.indexes.datetimes": "_new_DatetimeIndex",
    "pandas.core.indexes.interval": "_new_IntervalIndex",
    "pandas.core.indexes.timedeltas": "_new_TimedeltaIndex",
    "pandas.core.internals.blocks": "new_block",
    "pandas.core.internals.managers": "BlockManager SingleBlockManager",
    "pandas.plotting._matplotlib.converter": "DatetimeConverter PandasAutoDateFormatter PandasAutoDateLocator "
                                             "PeriodConverter TimeSeries_DateFormatter TimeSeries_DateLocator "
                                             "_annual_finder _daily_finder _monthly_finder _quarterly_finder",
    "pandas.plotting._matplotlib.timeseries": "_format_coord",
    "matplotlib._enums": "CapStyle JoinStyle",
    "matplotlib.artist": "_XYPair _stale_axes_callback",
    "matplotlib.axes._axes": "Axes",
    "matplotlib.axes._base": "_PropCycle _process_plot_var_args",
    "matplotlib.axis": "Axis._format_with_dict Ticker XAxis XTick YAxis YTick",
    "matplotlib.backend_bases": "_key_handler _mouse_handler",
    "matplotlib.category": "StrCategoryConverter StrCategoryFormatter StrCategoryLocator UnitData",
    "matplotlib.cbook": "CallbackRegistry Grouper _OrderedSet _exception_printer",
    "matplotlib.collections": "FillBetweenPolyCollection LineCollection PathCollection PolyCollection QuadMesh "
                              "PolyQuadMesh EventCollection",
    "matplotlib.colorbar": "Colorbar _ColorbarAxesLocator _ColorbarSpine _remove_cbar_axes",
    "matplotlib.colorizer": "Colorizer",
    "matplotlib.colors": "BoundaryNorm LinearSegmentedColormap ListedColormap LogNorm Normalize TwoSlopeNorm",
    "matplotlib.container": "BarContainer ErrorbarContainer StemContainer",
    "matplotlib.contour": "QuadContourSet",
    "matplotlib.dates": "AutoDateFormatter AutoDateLocator DateFormatter _SwitchableDateConverter",
    "matplotlib.figure": "Figure _AxesStack",
    "matplotlib.font_manager": "FontProperties",
    "matplotlib.gridspec": "GridSpec GridSpecFromSubplotSpec SubplotParams SubplotSpec",
    "matplotlib.image": "AxesImage",
    "matplotlib.layout_engine": "PlaceHolderLayoutEngine",
    "matplotlib.legend": "Legend",
    "matplotlib.lines": "Line2D",
    "matplotlib.markers": "MarkerStyle",
    "matplotlib.offsetbox": "DrawingArea HPacker TextArea VPacker",
    "matplotlib.patches": "BoxStyle.Round Circle Ellipse FancyBboxPatch Polygon Rectangle Shadow Wedge",
    "matplotlib.path": "Path",
    "matplotlib.projections.polar": "PolarAffine PolarAxes PolarTransform RadialAxis RadialLocator RadialTick ThetaAxis "
                                    "ThetaFormatter ThetaLocator ThetaTick _AxisWrapper _ThetaShift _WedgeBbox",
    "matplotlib.quiver": "Quiver",
    "matplotlib.scale": "LinearScale LogScale LogTransform",
    "matplotlib.spines": "Spine Spines",
    "matplotlib.text": "Annotation Text",
    "matplotlib.ticker": "AutoLocator FixedFormatter FixedLocator FuncFormatter LogFormatterSciNotation LogLocator "
                         "MaxNLocator NullFormatter NullLocator ScalarFormatter",
    "matplotlib.transforms": "Affine2D AffineDeltaTransform Bbox BboxTransformFrom BboxTransformTo BlendedAffine2D "
                             "BlendedGenericTransform CompositeAffine2D CompositeGenericTransform IdentityTransform "
                             "LockableBbox ScaledTranslation TransformWrapper TransformedBbox TransformedPatchPath "
                             "TransformedPath",
    "mpl_toolkits.mplot3d.art3d": "Line3D Line3DCollection Patch3DCollection Path3DCollection Poly3DCollection",
    "mpl_toolkits.mplot3d.axes3d": "Axes3D",
    "mpl_toolkits.mplot3d.axis3d": "XAxis YAxis ZAxis",
}.items()}
# The methods a pickled matplotlib figure names (its callbacks, its transforms' caches): `getattr` in a
# value from the program gives these, of objects of allowed classes, and nothing else.
_METHODS = frozenset({"pick", "transform", "transform_affine", "transform_non_affine", "transform_path",
                      "transform_path_affine", "transform_path_non_affine", "get_affine", "inverted", "get_matrix",
                      "delaxes", "remove", "_unit_change_handler", "_remove_legend", "_findoffset", "_set_nothing",
                      "_button_press", "_button_release", "_on_move", "_get_view", "_set_view",
                      "_set_view_from_bbox", "drag_pan", "_cbar_cla"})
# The instance attributes in which honest values keep a bare callable their class does not define (the
# survey of `benchmarks/testing/bcb_shadowing.py` and the values of the 1140 reference solutions:
# matplotlib's artists, markers, colorbars, offset boxes, registries, a `FuncFormatter`'s function).
_CALLBACKS = frozenset({"_remove_method", "_marker_function", "_ax_remove", "_offset", "stale_callback",
                        "exception_handler", "func"})
# Methods of its class an honest value's instance replaces, and with what (name -> the method's name, or
# the allowed function a `functools.partial` calls): a colorbar's axes' `cla`, pandas' time-series axes'
# `format_coord`.
_REPLACED_METHODS = {"cla": "_cbar_cla", "format_coord": ("pandas.plotting._matplotlib.timeseries", "_format_coord")}
_NAMES_READ = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})  # of a tests' object
_ASKED = _NAMES_READ | {"__signature__", "__class__"}  # what a stand-in of the tests' asks for
_ARITHMETIC = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")
_SPECIAL_OPS = ("call", "iter", "next", "len", "bool", "getitem", "setitem", "delitem", "contains", "enter", "exit",
                "str", "repr", "int", "float", "index", "hash", "eq", "ne", "lt", "le", "gt", "ge", "fspath", "neg", "abs",
                *_ARITHMETIC, *(f"r{name}" for name in _ARITHMETIC))


def allowed_global(module: str, name: str) -> object | None:
    """The object `module.name` if a value from the program may name it (pickle's globals), else None:
    a name of `_ALLOWED`, `getattr` as `_method_of`, an exception class of the standard library, a
    numpy ufunc."""
    if (module, name) == ("builtins", "getattr"):
        return _method_of
    if type(module) is not str or type(name) is not str:
        return None
    top = module.partition(".")[0]
    if name in _ALLOWED.get(module, ()):
        found = _resolve(module, name)
        if (module, name) == ("pyarrow.lib", "_restore_array") and found is not None:
            return _validated_arrow(found)
        if module.startswith("PIL.") and module != "PIL.Image" and isinstance(found, type):
            return _rebuilt_only(found)
        return found
    if (top in sys.stdlib_module_names and module in sys.modules) or module == "numpy":
        found = _resolve(module, name) if "." not in name else None
        if isinstance(found, type) and issubclass(found, BaseException) and top in sys.stdlib_module_names:
            return found  # (an exception the program returns: its constructor only keeps its arguments)
        numpy = sys.modules.get("numpy")
        if module == "numpy" and numpy is not None and isinstance(found, numpy.ufunc):
            return found  # np.sin and the like, by name: computations
    return None


def _validated_arrow(restore: Callable[..., object]) -> Callable[..., object]:
    """pyarrow's array reconstructor, checking the buffers it was given (their offsets and lengths)."""
    def restored(*args: object) -> object:
        array = restore(*args)
        array.validate(full=True)
        return array
    return restored


_REBUILT_ONLY: dict[type, type] = {}


def _rebuilt_only(kind: type) -> type:
    """A subclass of `kind` (an image file's class) that pickle can rebuild (`__new__`, then its state)
    but that cannot be called: its constructor would open and parse a file it is named."""
    if kind not in _REBUILT_ONLY:
        def refuse(self: object, *args: object, **kwargs: object) -> None:
            raise pickle.UnpicklingError(f"a value of the program's calls {kind.__name__}")
        _REBUILT_ONLY[kind] = type(kind.__name__, (kind,), {"__init__": refuse, "__module__": kind.__module__})
    return _REBUILT_ONLY[kind]


def _method_of(obj: object, name: str) -> object:
    """`getattr` as a value from the program may use it: a method of `_METHODS` of an allowed object."""
    owner = obj if isinstance(obj, type) else type(obj)
    named = _named(owner)
    marker = named is not None and named[1] == "MarkerStyle" and type(name) is str and name.startswith("_set_")
    zone = named == ("zoneinfo", "ZoneInfo") and name == "_unpickle"  # (a time zone by its key)
    if not (type(name) is str and (name in _METHODS or marker or zone) and named
            and (owner is list or allowed_global(*named) is owner)):
        raise pickle.UnpicklingError(f"a value of the program's reads {name!r} of a {owner.__name__}")
    method = getattr(obj, name)
    if not isinstance(method, (types.MethodType, types.BuiltinMethodType, types.FunctionType)):
        raise pickle.UnpicklingError(f"{name!r} is not a method")
    return method


def _resolve(module: str, qualname: str) -> object | None:
    try:
        found: object = _import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    except (ImportError, AttributeError, ValueError):
        return None


def _named(obj: object) -> tuple[str, str] | None:
    """(module, qualname) under which `obj` (a class or a function) is found again, else None."""
    if obj in _TYPES_NAMED:
        return "types", _TYPES_NAMED[obj]
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    return (module, qualname) if _resolve(module, qualname) is obj else None


_TYPES_NAMED = {value: name for name, value in vars(types).items()
                if isinstance(value, type) and name[0].isupper() and value.__module__ == "builtins"
                and not hasattr(builtins, value.__name__)}


_LENDING = threading.Lock()


class ProgramGone(BaseException):
    """The program's process ended (or broke the protocol) while the tests waited for it."""


class Channel:
    """One end of the socket: requests, replies, and the objects this side lent the other (by number).

    A thread that sends a request holds the lock until its reply comes, serving the other side's
    requests that arrive meanwhile (a call the program makes back to a mock during the tests' call)."""

    def __init__(self, sock: socket.socket, side: str) -> None:
        self.sock = sock
        self._sendall, self._recv_into_bytes = sock.sendall, sock.recv
        self.side = side
        self.lock = threading.RLock()
        self.lent: dict[int, object] = {}
        self.numbers: dict[int, int] = {}
        self.context_out: Callable[[], object] = lambda: None  # the state sent with each message
        self.context_in: Callable[[object], None] = lambda state: None

    # ---- bytes
    def _send(self, data: bytes) -> None:
        self._sendall(_HEADER.pack(len(data)) + data)

    def _recv(self) -> bytes:
        header = self._exactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MESSAGE_BYTES:
            raise ProgramGone(f"a message of {size} bytes (over {MESSAGE_BYTES})")
        return self._exactly(size)

    def _exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._recv_into_bytes(min(left, 1 << 20))
            if not chunk:
                raise ProgramGone("the other process closed the channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    # ---- objects lent
    def lend(self, obj: object) -> int:
        """The number under which the other side names `obj` (kept alive here)."""
        with _LENDING:  # (the table is shared with the connections of forked processes)
            number = self.numbers.get(id(obj))
            if number is None or self.lent.get(number) is not obj:
                number = len(self.lent) + 1
                self.lent[number] = obj
                self.numbers[id(obj)] = number
            return number

    # ---- requests
    def request(self, number: int, op: str, *payload: object) -> object:
        """Ask the other side to apply `op` to its object `number`; its result (or exception)."""
        with self.lock:
            self._send(self.dumps(("request", number, op, payload, self.context_out())))
            while True:
                message = self.loads(self._recv())
                if message[0] == "request":
                    self._serve(message)
                    continue
                kind, value, state = message[0], message[1], message[2]
                self.context_in(state)
                if kind == "reply":
                    return value
                raise self.rebuild(value)

    def serve_forever(self) -> None:
        while True:
            with self.lock:
                message = self.loads(self._recv())
            self._serve(message, locked=False)

    def _serve(self, message: tuple, locked: bool = True) -> None:
        _, number, op, payload, context = message
        self.context_in(context)
        try:
            target = self.lent[number] if number else None
            value = self.apply(target, op, payload)
            reply = ("reply", value, self.context_out())
        except BaseException as error:  # the other side raises it again
            reply = ("error", self.describe(error), self.context_out())
        data = self._dumps_safely(reply)
        if locked:
            self._send(data)
        else:
            with self.lock:
                self._send(data)

    def _dumps_safely(self, reply: tuple) -> bytes:
        try:
            return self.dumps(reply)
        except Exception as error:  # a value that cannot cross: an exception the other side sees
            return self.dumps(("error", self.describe(error), self.context_out()))

    # ---- what each side defines
    def dumps(self, value: object) -> bytes:
        raise NotImplementedError

    def loads(self, data: bytes) -> tuple:
        raise NotImplementedError

    def apply(self, target: object, op: str, payload: tuple) -> object:
        raise NotImplementedError

    def describe(self, error: BaseException) -> tuple:
        classes = [_named(kind) for kind in type(error).__mro__]
        args = error.args if all(type(arg) in _PLAIN for arg in error.args) else tuple(map(_text, error.args))
        text = _traceback_text(error)
        extra = {"name": error.name} if isinstance(error, ImportError) and type(error.name) is str else {}
        return [name for name in classes if name], args, text[-4000:], extra

    def rebuild(self, description: tuple) -> BaseException:
        names, args, text, extra = description
        for module, qualname in names:
            if module not in sys.modules and module != "builtins":
                continue
            kind = _resolve(module, qualname)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                try:
                    error = kind(*args)
                except Exception:
                    error = kind.__new__(kind)
                    error.args = tuple(args)
                if isinstance(error, ImportError) and type(extra.get("name")) is str:
                    error.name = extra["name"]
                error.__notes__ = [f"raised in the {'program' if self.side == 'tests' else 'tests'}' process:\n{text}"]
                return error
        return Exception(text)


def _traceback_text(error: BaseException) -> str:
    """Where `error` was raised, without reading any source file (`open` may be a test's mock)."""
    lines, tb = [], error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        tb = tb.tb_next
    return "\n".join(["Traceback (most recent call last):", *lines, f"{type(error).__name__}: {_text(error)}"])


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _apply_op(target: object, op: str, payload: tuple) -> object:
    """`op` (a name of `_SPECIAL_OPS`, or getattr/setattr) applied to `target`."""
    if op == "call":
        args, kwargs = payload
        return target(*args, **kwargs)
    if op == "getattr":
        return getattr(target, payload[0])
    if op == "setattr":
        return setattr(target, payload[0], payload[1])
    if op == "iter":
        return iter(target)
    if op == "next":
        return next(target)
    if op == "len":
        return len(target)
    if op == "bool":
        return bool(target)
    if op == "getitem":
        return target[payload[0]]
    if op == "setitem":
        target[payload[0]] = payload[1]
        return None
    if op == "delitem":
        del target[payload[0]]
        return None
    if op == "contains":
        return payload[0] in target
    if op == "enter":
        return target.__enter__()
    if op == "exit":
        return target.__exit__(*payload)
    if op in ("str", "repr", "int", "float", "hash"):
        return {"str": str, "repr": repr, "int": int, "float": float, "hash": hash}[op](target)
    if op == "index":
        return target.__index__()
    if op == "fspath":
        return os.fspath(target)
    import operator

    if op in ("eq", "ne", "lt", "le", "gt", "ge", *_ARITHMETIC):
        return getattr(operator, op)(target, payload[0])
    if op in ("neg", "abs"):
        return getattr(operator, op)(target)
    if op.startswith("r") and op[1:] in _ARITHMETIC:
        return getattr(operator, op[1:])(payload[0], target)
    raise TypeError(f"no operation {op!r}")


# =========================================================================== the program's side


class TestsObject:
    """In the program's process: an object of the tests' (a mock, a callback, a StringIO). Its class
    (`_stand_in`) has the special methods the real object's class has, and only those."""

    __slots__ = ("_channel", "_number")

    def __init__(self, channel: Channel, number: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)

    def _ask(self, op: str, *payload: object) -> object:
        return self._channel.request(self._number, op, *payload)

    def __getattr__(self, name: str) -> object:
        if name in ("_channel", "_number"):  # a stand-in made without __init__ (a copy of one)
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __getattribute__(self, name: str) -> object:
        if name not in _ASKED:
            return object.__getattribute__(self, name)
        ask = object.__getattribute__(self, "_ask")
        if name == "__signature__":
            return ask("signature")
        if name == "__class__":  # what `isinstance` sees: the real object's class (a mock's spec)
            named = ask("class")
            found = _resolve(*named) if type(named) is tuple and len(named) == 2 else None
            return found if isinstance(found, type) else type(self)
        return ask("getattr", name)

    def __setattr__(self, name: str, value: object) -> None:
        self._ask("setattr", name, value)

    def __str__(self) -> str:
        return self._ask("str")

    def __repr__(self) -> str:
        return self._ask("repr")

    def __eq__(self, other: object) -> object:
        return self._ask("eq", other)

    def __ne__(self, other: object) -> object:
        return self._ask("ne", other)

    def __hash__(self) -> int:
        return self._ask("hash")


def _special(op: str, arity: int) -> Callable[..., object]:
    if op == "exit":
        return lambda self, *exc: self._ask("exit", None, None, None)
    if arity == 0:
        return lambda self: self._ask(op)
    if arity == 1:
        return lambda self, first: self._ask(op, first)
    return lambda self, first, second: self._ask(op, first, second)


# special method -> (operation, arguments): those a stand-in of the tests' has when its object has them
_SPECIALS = {"__call__": ("call", -1), "__iter__": ("iter", 0), "__next__": ("next", 0), "__len__": ("len", 0),
             "__bool__": ("bool", 0), "__getitem__": ("getitem", 1), "__setitem__": ("setitem", 2),
             "__delitem__": ("delitem", 1), "__contains__": ("contains", 1), "__enter__": ("enter", 0),
             "__exit__": ("exit", 3), "__int__": ("int", 0), "__float__": ("float", 0), "__index__": ("index", 0),
             "__fspath__": ("fspath", 0), "__lt__": ("lt", 1), "__le__": ("le", 1), "__gt__": ("gt", 1),
             "__ge__": ("ge", 1), "__neg__": ("neg", 0), "__abs__": ("abs", 0),
             **{f"__{name}__": (name, 1) for name in _ARITHMETIC}, **{f"__r{name}__": (f"r{name}", 1) for name in _ARITHMETIC}}
_STAND_INS: dict[frozenset, type] = {}


def _stand_in(specials: object) -> type:
    """The TestsObject class with the special methods named in `specials`."""
    names = frozenset(name for name in specials if name in _SPECIALS) if isinstance(specials, (list, tuple)) \
        else frozenset()
    if names not in _STAND_INS:
        methods: dict = {"__slots__": ()}
        for name in names:
            op, arity = _SPECIALS[name]
            methods[name] = (lambda self, *args, **kwargs: self._ask("call", args, kwargs)) if op == "call" \
                else _special(op, arity)
        _STAND_INS[names] = type("TestsObject", (TestsObject,), methods)
    return _STAND_INS[names]


class _DataUnpickler(pickle._Unpickler):
    """pickle's own unpickler, in Python so that its opcodes can be checked. BUILD (set an object's state)
    applies only to an object this load made (`__new__` of an allowed class, or a reconstructor's result),
    once, never to a class, a function, a module, an enum member or another object that exists beyond
    the value (a returned value's BUILD on `collections.Counter` itself set its `__eq__`: a second red
    team's forgery). And every object the load makes has no hidden state (`_no_hidden_state`): checked
    when built (also against the state its class pickles), and all of them once the value is rebuilt."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BytesIO, **options: object) -> None:
        super().__init__(file, **options)  # type: ignore[arg-type]
        self.made: dict[int, object] = {}  # (kept alive: their ids stay theirs)
        self.buildable: set[int] = set()
        self.built: set[int] = set()

    def load(self) -> object:
        value = super().load()
        for made in self.made.values():  # (a later opcode may have set attributes: SETITEMS, another's BUILD)
            _no_hidden_state(made)
            _unmasked(made)
        return value

    def _made(self, obj: object, build: bool = True) -> None:
        """`obj` was made by this load: checked at the end; its state may be set (`build`)."""
        if not _shared(obj):
            self.made[id(obj)] = obj
        if build:
            self.buildable.add(id(obj))

    def load_newobj(self) -> None:
        super().load_newobj()
        self._made(self.stack[-1])

    def load_newobj_ex(self) -> None:
        super().load_newobj_ex()
        self._made(self.stack[-1])

    def load_reduce(self) -> None:
        function = self.stack[-2]
        super().load_reduce()
        made = self.stack[-1]
        self._made(made, build=not isinstance(function, type) or not _shared(made))

    def load_build(self) -> None:
        target, state = self.stack[-2], self.stack[-1]
        if id(target) not in self.buildable or _shared(target) or id(target) in self.built:
            raise pickle.UnpicklingError(f"a value of the program's sets the state of a {type(target).__name__} "
                                         "it did not make, or sets it twice")
        self.built.add(id(target))
        given = _fields(state)  # (before the rebuild, which may consume the state)
        super().load_build()
        _no_hidden_state(target, given)

    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.BUILD[0]] = load_build


def _unmasked(obj: object) -> None:
    """A masked array rebuilt from the program's bytes, made plain: its masked entries become NaN and it has no
    mask, since numpy.testing's assertions skip masked entries (a fully masked array "equals" any value: a
    third red team's forgery); refused when its dtype has no NaN to stand for what it hides."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(obj, numpy.ma.MaskedArray):
        return
    hidden = numpy.ma.getmaskarray(obj)
    if not hidden.any():
        return
    if obj.dtype.kind not in "fc":
        raise pickle.UnpicklingError(f"a masked array of dtype {obj.dtype} hides entries it has no NaN for")
    obj.soften_mask()
    numpy.copyto(obj.data, numpy.nan, where=hidden)
    obj.mask = numpy.ma.nomask


def _no_hidden_state(obj: object, given: frozenset[str] = frozenset()) -> None:
    """Refuse `obj` (rebuilt from a value of the program's) if it carries state its class does not give
    it: an instance attribute that is not a plain name (`__dunder__`, not a string) or that hides
    behaviour of its class (`_hides`: what its operators and the tests' assertion helpers dispatch to);
    one that holds a bare callable (a class, function, method, partial, ufunc: behaviour, not data)
    where its class has none, unless under a name honest values keep callbacks in (`_CALLBACKS`); or,
    for the state `given` to its BUILD, a field that the class's own pickling of the rebuilt object
    does not write (`_fields` of its `__reduce_ex__`)."""
    kind = type(obj)
    try:
        attributes = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attributes = {}
    if type(attributes) is not dict:
        raise pickle.UnpicklingError(f"a value of the program's gives its {kind.__name__} a __dict__ of its own")
    for name, value in attributes.items():
        what, found = _CLASS_ATTRIBUTES.get((kind, name)) or _class_attribute(kind, name)
        if what == "data":
            hidden = name not in _CALLBACKS and _bare_callable(value)
        else:
            hidden = _hides(what, found, name, value)
        if hidden:
            raise pickle.UnpicklingError(f"a value of the program's sets {name!r} on its {kind.__name__}: "
                                         "not state of its class's")
    if given:
        try:
            reduced = kind.__reduce_ex__(obj, 4)
            own = _fields(reduced[2] if isinstance(reduced, tuple) and len(reduced) > 2 else None)
        except Exception as error:
            raise pickle.UnpicklingError(f"a rebuilt {kind.__name__} does not pickle: {error}") from None
        if not given <= own:
            raise pickle.UnpicklingError(f"a value of the program's gives its {kind.__name__} state its class does "
                                         f"not pickle: {sorted(given - own)[:5]}")


def _hides(what: str, found: object, name: str, value: object) -> bool:
    """Whether an instance attribute `name` = `value` hides what its class has under that name (`found`,
    of the kind `what`, `_class_attribute`): a method or any other callable, or a data descriptor (unless
    `_delegated`: the method of that name of another object, as matplotlib's `TransformWrapper` does, or
    what `_REPLACED_METHODS` allows); a class (unless `value` is a subclass of it: numpy's
    `MaskedArray._baseclass`); a descriptor that caches its value in the instance
    (`functools.cached_property`, matplotlib's tick lists) with anything callable; a special or
    non-string name, always. (A plain data default, `zorder = 0`, is the instance's to set.)"""
    if what == "class":
        return not (isinstance(value, type) and issubclass(value, found))  # type: ignore[arg-type]
    if what == "cache":
        return callable(value)
    if what == "behaviour":
        return not _delegated(name, value)
    return True  # ("special": not a plain name)


def _delegated(name: str, value: object) -> bool:
    """Whether `value`, in an instance attribute `name` that hides its class's method, is what honest values
    put there: the method of that name of another object (or of the name `_REPLACED_METHODS` gives),
    or a `functools.partial` of the allowed function `_REPLACED_METHODS` gives."""
    import functools

    replaced = _REPLACED_METHODS.get(name)
    if isinstance(value, types.MethodType):
        return value.__name__ in (name, replaced) and getattr(type(value.__self__), value.__name__, None) is value.__func__
    return type(value) is functools.partial and isinstance(replaced, tuple) and value.func is allowed_global(*replaced)


def _bare_callable(value: object) -> bool:
    """A class, function, method, `functools.partial` or numpy ufunc (not an object of a data class that
    happens to be callable, as a matplotlib formatter or colormap is)."""
    import functools

    return isinstance(value, (type, functools.partial, types.FunctionType, types.BuiltinFunctionType,
                              types.MethodType)) or type(value).__name__ == "ufunc"


_CLASS_ATTRIBUTES: dict[tuple[type, object], tuple[str, object]] = {}


def _class_attribute(kind: type, name: object) -> tuple[str, object]:
    """What `kind` (its MRO) has under the instance attribute `name`: ("data", a default or None), ("class",
    it), ("cache", a descriptor that caches in the instance), ("behaviour", a method, callable or data
    descriptor), or ("special", None) for a name that is not a plain string."""
    what, found = "data", None
    if type(name) is not str or (name.startswith("__") and name.endswith("__")):
        what = "special"
    else:
        for klass in kind.__mro__:
            found = vars(klass).get(name, _class_attribute)
            if found is _class_attribute:
                found = None
                continue
            descriptor = type(found)
            if isinstance(found, type):
                what = "class"
            elif callable(found) or isinstance(found, (classmethod, staticmethod)) \
                    or hasattr(descriptor, "__set__") or hasattr(descriptor, "__delete__"):
                what = "behaviour"
            elif hasattr(descriptor, "__get__"):
                what = "cache"
            break
    _CLASS_ATTRIBUTES[(kind, name)] = (what, found)
    return what, found


def _fields(state: object) -> frozenset[str]:
    """The field names a pickled state sets: a dict's keys, and those of the dicts directly inside a tuple
    (pickle's `(state, slotstate)`, pandas' `(data, dtype, attributes)`, io's `(..., __dict__)`)."""
    if type(state) is dict:
        return frozenset(map(str, state))
    parts = [part for part in state if isinstance(part, dict)] if isinstance(state, (tuple, list)) \
        else [state] if isinstance(state, dict) else []
    return frozenset(str(name) for part in parts for name in part)


def _shared(obj: object) -> bool:
    """Objects that exist beyond one value: classes, functions, modules, enum members, singletons."""
    import enum

    return isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                            types.MethodType, enum.Enum)) or obj is None or type(obj).__name__ in ("NAType", "NaTType")


class _Trial(_DataUnpickler):
    """Data only: its globals all allowed, nothing lent inside. Whether the tests' process would take a
    pickle, and how it loads what the tests unpickle themselves (`_data_only_loaders`)."""

    def find_class(self, module: str, name: str) -> object:
        found = allowed_global(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return found

    def persistent_load(self, pid: object) -> object:
        raise pickle.UnpicklingError("lent")


class _Recording(pickle.Pickler):
    """A plain pickler that keeps every object it pickled (`_ProgramPickler._crosses`)."""

    def __init__(self, file: io.BytesIO, protocol: int) -> None:
        super().__init__(file, protocol=protocol)
        self.seen: list = []

    def persistent_id(self, part: object) -> object:
        self.seen.append(part)
        return None


class _ProgramPickler(pickle.Pickler):
    """The program's values for the tests: allowed data by value, anything else lent (by number)."""

    def __init__(self, channel: Channel, file: io.BytesIO) -> None:
        super().__init__(file, protocol=4)
        self.channel = channel
        self.vouched: set[int] = set()
        self.kept: list = []

    def _crosses(self, obj: object) -> bool:
        """Whether `obj` pickles into what the tests' process takes (then its parts need no trial)."""
        buffer = _BytesIO()
        recording = _Recording(buffer, protocol=4)
        try:
            recording.dump(obj)
            _Trial(_BytesIO(buffer.getvalue())).load()
        except Exception:
            return False
        self.vouched.update(id(part) for part in recording.seen)
        self.kept.append(recording.seen)  # (ids stay unique while the parts live)
        return True

    def persistent_id(self, obj: object) -> object:
        kind = type(obj)
        if kind is float and obj != obj:  # np.nan itself: the tests' lists compare it by identity first
            return ("nan", "numpy" if obj is getattr(sys.modules.get("numpy"), "nan", None) else "")
        if kind in _PLAIN or id(obj) in self.vouched:
            return None
        if isinstance(obj, TestsObject):
            return ("yours", object.__getattribute__(obj, "_number"))
        if kind is types.ModuleType:
            return ("module", obj.__name__)
        name = _named(obj) if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) else None
        if name and allowed_global(*name) is obj:
            return None
        if kind is types.GeneratorType:
            return ("generator", self.channel.lend(obj))
        if self._crosses(obj):
            return None
        if isinstance(obj, type):
            bases = [_named(base) for base in obj.__mro__[1:] if _named(base)]
            return ("class", (self.channel.lend(obj), str(obj.__name__), bases))
        return ("lent", self.channel.lend(obj))


class _ProgramUnpickler(pickle.Unpickler):
    def __init__(self, channel: Channel, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.channel = channel

    def persistent_load(self, pid: tuple) -> object:
        kind, value = pid
        if kind == "yours":
            return self.channel.lent[value]
        if kind == "module":
            return _import_module(value)
        if kind == "lent":
            number, specials = value
            return _stand_in(specials)(self.channel, number)
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")


class ProgramChannel(Channel):
    def __init__(self, sock: socket.socket, module: types.ModuleType) -> None:
        super().__init__(sock, "program")
        self.module = module
        self.patched: dict[tuple, object] = {}
        self.stdout, self.stderr = sys.stdout, sys.stderr
        self.warned: list = []
        self.written: tuple | None = None
        self.figure: object = None
        self.figure_sent: tuple = ()
        self.context_in = self._take_context
        self.context_out = self._give_state

    def dumps(self, value: object) -> bytes:
        buffer = _BytesIO()
        _ProgramPickler(self, buffer).dump(value)
        return buffer.getvalue()

    def loads(self, data: bytes) -> tuple:
        return _ProgramUnpickler(self, data).load()

    def apply(self, target: object, op: str, payload: tuple) -> object:
        import warnings

        with warnings.catch_warnings(record=True) as caught:  # the tests' filters decide, in their process
            warnings.simplefilter("always")
            try:
                if target is None and op == "load":
                    return self._load(*payload)
                result = _apply_op(target, op, payload)
                if op == "call":
                    self.written = _mutable_arguments(*payload)
                    self.figure, self.figure_sent = _changed_figure(self.figure_sent)
                return result
            finally:
                self.warned = [(_named(item.category) or ("builtins", "UserWarning"), _text(item.message),
                                str(item.filename), int(item.lineno or 0)) for item in caught]

    def _load(self, source: str, preload: list) -> dict:
        """Import what the tests imported (`preload`), run the solution as module `__test__`; its names."""
        for name in preload:
            try:
                _import_module(name)
            except BaseException:  # (one that imports only as part of its package)
                pass
        exec(compile(source, PROGRAM_FILE, "exec"), self.module.__dict__)
        return {name: value for name, value in self.module.__dict__.items()
                if isinstance(name, str) and not (name.startswith("__") and name.endswith("__"))}

    def _take_context(self, context: dict | None) -> None:
        if not context:
            return
        _set_state(context["state"])
        wanted = {}
        for target, attribute, value in context["patches"]:
            owner = self._target(target)
            if owner is not None:
                wanted[(id(owner), attribute)] = (owner, attribute, value)
        for key in list(self.patched):
            if key not in wanted:
                owner, attribute, original = self.patched.pop(key)
                _restore(owner, attribute, original)
        for key, (owner, attribute, value) in wanted.items():
            if key not in self.patched:
                self.patched[key] = (owner, attribute, getattr(owner, attribute, _MISSING))
            try:
                setattr(owner, attribute, value)
            except (AttributeError, TypeError):
                pass
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and context.get("figures") is not None:  # those the tests closed: closed
            for number in set(pyplot.get_fignums()) - set(context["figures"]):
                pyplot.close(number)
        sys.stdout = context["stdout"] if context["stdout"] is not None else self.stdout
        sys.stderr = context["stderr"] if context["stderr"] is not None else self.stderr

    def _target(self, target: tuple) -> object:
        kind, module, qualname = target
        try:
            found = self.module if module == PROGRAM_MODULE else _import_module(module)
            for part in qualname.split(".") if qualname else ():
                found = getattr(found, part)
            return found
        except Exception:
            return None

    def _give_state(self) -> dict:
        warned, self.warned = self.warned, []
        written, self.written = self.written, None
        figure, self.figure = self.figure, None
        return {"state": _get_state(), "warned": warned, "written": written, "figure": figure}


_MISSING = object()


def _mutable_arguments(args: tuple, kwargs: dict) -> tuple:
    """A call's arguments that the call may have changed in place (lists, dicts, arrays, frames), to go
    back to the tests' originals."""
    def mutable(value: object) -> bool:
        if type(value) in (list, dict, set, bytearray):
            return True
        module = type(value).__module__ or ""
        return module.startswith(("numpy", "pandas.core")) and hasattr(value, "shape")

    return ([(index, value) for index, value in enumerate(args) if mutable(value)],
            [(key, value) for key, value in kwargs.items() if mutable(value)])


def _changed_figure(sent: tuple) -> tuple[object, tuple]:
    """pyplot's current figure if the program's process has one that changed since `sent` (its
    fingerprint: the figure, its axes' artist counts), for the tests' `plt.gca()`; and the new
    fingerprint. (A call that draws nothing sends nothing: a test may make a thousand calls.)"""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None or not pyplot.get_fignums():
        return None, ()
    figure = pyplot.gcf()
    fingerprint = (id(figure), tuple(len(axes.get_children()) for axes in figure.axes))
    return (figure if fingerprint != sent else None), fingerprint


def _restore(owner: object, attribute: str, original: object) -> None:
    try:
        if original is _MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)
    except (AttributeError, TypeError):
        pass


def _get_state() -> dict:
    """What a call shares with its caller: the random generators, the working directory, the environment."""
    state = {"random": _random_state(), "cwd": _cwd(), "environ": dict(_environ), "path": list(sys.path)}
    numpy = sys.modules.get("numpy.random.mtrand")
    if numpy is not None:
        try:
            state["numpy"] = numpy._rand.get_state()
        except Exception:
            pass
    return state


def _set_state(state: dict) -> None:
    _set_random_state(state["random"])
    if "numpy" in state:
        try:
            _import_module("numpy.random.mtrand")._rand.set_state(state["numpy"])
        except Exception:
            pass
    if state["cwd"] and state["cwd"] != _cwd():
        try:
            _chdir(state["cwd"])
        except OSError:
            pass
    environ = state["environ"]
    for key in [key for key in _environ if key not in environ]:
        del _environ[key]
    for key, value in environ.items():
        if _environ.get(key) != value:
            _environ[key] = value
    if type(state.get("path")) is list and state["path"] != sys.path:
        sys.path[:] = [entry for entry in state["path"] if type(entry) is str]


def _cwd() -> str | None:
    try:
        return _getcwd()
    except OSError:
        return None


def serve_program(fd: int, address: str) -> None:
    """The program's process: serve the tests' requests on socket `fd` until it closes. A process the
    program forks (a multiprocessing pool's worker) asks the tests' process on a connection of its own,
    to the unix socket `address`."""
    sock = _Socket(fileno=fd)
    module = types.ModuleType(PROGRAM_MODULE)
    module.__dict__.update({"__file__": PROGRAM_FILE, "__builtins__": builtins, "sys": sys, "os": os,
                            "environ": os.environ})
    sys.modules[PROGRAM_MODULE] = module
    channel = ProgramChannel(sock, module)

    def reconnect() -> None:
        child = _Socket(socket.AF_UNIX, socket.SOCK_STREAM)
        child.connect("\0" + address)
        channel.sock, channel._sendall, channel._recv_into_bytes = child, child.sendall, child.recv
        channel.lock = threading.RLock()

    os.register_at_fork(after_in_child=reconnect)
    try:
        channel.serve_forever()
    except ProgramGone:
        pass
    os._exit(0)


# =========================================================================== the tests' side


class ProgramObject:
    """In the tests' process: an object of the program's. Calls, attribute reads, iteration and
    indexing go to the program's process; it equals nothing but itself, whatever the program says."""

    __slots__ = ("_channel", "_number", "__weakref__")

    def __init__(self, channel: Channel, number: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)

    def _ask(self, op: str, *payload: object) -> object:
        channel = object.__getattribute__(self, "_channel")
        if channel.loading:
            raise pickle.UnpicklingError("a value of the program's asks to run the program's code to be rebuilt")
        return channel.request(object.__getattribute__(self, "_number"), op, *payload)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: object) -> None:
        self._ask("setattr", name, value)

    def __call__(self, *args: object, **kwargs: object) -> object:
        result = self._ask("call", args, kwargs)
        channel = object.__getattribute__(self, "_channel")
        written, channel.written = channel.written, None
        if type(written) is tuple and len(written) == 2:
            for index, value in written[0] if type(written[0]) is list else ():
                if type(index) is int and 0 <= index < len(args):
                    _write_back(args[index], value)
            for key, value in written[1] if type(written[1]) is list else ():
                if type(key) is str and key in kwargs:
                    _write_back(kwargs[key], value)
        return result

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self) -> int:
        value = self._ask("len")
        if type(value) is not int:
            raise TypeError("len() of the program's object is not an int")
        return value

    def __bool__(self) -> bool:
        return self._ask("bool") is True

    def __getitem__(self, key: object) -> object:
        return self._ask("getitem", key)

    def __enter__(self) -> object:
        return self._ask("enter")

    def __exit__(self, *exc: object) -> bool:
        self._ask("exit", None, None, None)
        return False  # the program's `__exit__` runs; it never swallows the tests' assertion errors

    def __str__(self) -> str:
        return _checked_str(self._ask("str"))

    def __repr__(self) -> str:
        try:
            return _checked_str(self._ask("repr"))
        except Exception:
            return "<an object of the program's>"

    def __fspath__(self) -> object:
        return _checked_str(self._ask("fspath"))

    __hash__ = object.__hash__


class _ProgramClass(type):
    """The metaclass of a program's class in the tests' process (`TestsChannel.program_class`)."""

    def __call__(cls, *args: object, **kwargs: object) -> object:
        return type.__getattribute__(cls, "_remote")(*args, **kwargs)

    def __getattr__(cls, name: str) -> object:
        return getattr(type.__getattribute__(cls, "_remote"), name)


def _write_back(original: object, value: object) -> None:
    """Make the tests' `original` (an argument of a call) what the program left its copy as."""
    try:
        if type(original) is list and type(value) is list or type(original) is bytearray and type(value) is bytearray:
            original[:] = value
        elif type(original) in (dict, set) and type(value) is type(original):
            original.clear()
            original.update(value)
        elif type(value) is type(original) and hasattr(original, "_update_inplace"):  # a pandas frame or series
            original._update_inplace(value)
        elif type(value) is type(original) and getattr(original, "shape", None) == getattr(value, "shape", ()):
            original[...] = value  # a numpy array
    except Exception:  # a copy that cannot go back: the original stays as the tests made it
        pass


def _pull(source: ProgramObject):
    """A generator of the tests' process yielding what the program's generator `source` yields."""
    while True:
        try:
            value = object.__getattribute__(source, "_ask")("next")
        except StopIteration:
            return
        yield value


def _checked_str(value: object) -> str:
    if type(value) is not str:
        raise TypeError("the program's object did not give a str")
    return value


def _lent(channel: Channel, obj: object) -> tuple:
    """A reference to the tests' object `obj`, with the special methods its class has."""
    kind = type(obj)
    return ("lent", (channel.lend(obj), [name for name in _SPECIALS if getattr(kind, name, None) is not None]))


class _TestsPickler(pickle.Pickler):
    """The tests' values for the program: data by value; mocks, callbacks, streams and anything
    that does not pickle lent (the program asks this process to act on them)."""

    def __init__(self, channel: Channel, file: io.BytesIO) -> None:
        super().__init__(file, protocol=4)
        self.channel = channel

    def persistent_id(self, obj: object) -> object:
        kind = type(obj)
        if kind in _PLAIN:
            return None
        if kind is ProgramObject:
            return ("yours", object.__getattribute__(obj, "_number"))
        if type(kind) is _ProgramClass or type(obj) is _ProgramClass:
            remote = type.__getattribute__(obj if isinstance(obj, type) else kind, "_remote")
            return ("yours", object.__getattribute__(remote, "_number"))
        if kind is types.ModuleType:
            return ("module", PROGRAM_MODULE if obj.__name__ == PROGRAM_MODULE else obj.__name__)
        if isinstance(obj, (types.MethodType, types.BuiltinMethodType)) \
                and not isinstance(getattr(obj, "__self__", None), (types.ModuleType, type, type(None))):
            return _lent(self.channel, obj)  # a method bound to an object: the object stays here
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            named = _named(obj)
            if named:
                return None if named[0] != PROGRAM_MODULE else _lent(self.channel, obj)
            try:  # a library's function pickle finds under another module name (numpy's reconstructors)
                _dumps(obj, protocol=4)
            except Exception:
                return _lent(self.channel, obj)
            return None
        if _lend_always(obj):
            return _lent(self.channel, obj)
        try:
            _dumps(obj, protocol=4)
        except Exception:
            return _lent(self.channel, obj)
        return None


def _lend_always(obj: object) -> bool:
    """Objects whose identity matters to the tests: mocks, streams, generators, their Axes, their own classes'."""
    mock = sys.modules.get("unittest.mock")
    if mock is not None and isinstance(obj, (mock.NonCallableMock, mock._ANY)):
        return True
    artist = sys.modules.get("matplotlib.artist")
    if artist is not None and isinstance(obj, artist.Artist):  # the tests' Axes: the program draws on it
        return True
    return isinstance(obj, (io.IOBase, types.GeneratorType, types.CoroutineType)) \
        or type(obj).__module__ == PROGRAM_MODULE


class _TestsUnpickler(_DataUnpickler):
    """Values from the program: only `allowed_global` names; what the program lent becomes a stand-in."""

    def __init__(self, channel: Channel, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.channel = channel

    def find_class(self, module: str, name: str) -> object:
        found = allowed_global(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"a value of the program's names {module}.{name}, which may not cross")
        return found

    def persistent_load(self, pid: tuple) -> object:
        if type(pid) is not tuple or len(pid) != 2:
            raise pickle.UnpicklingError("a malformed reference")
        kind, value = pid
        if kind == "yours" and type(value) is int and value in self.channel.lent:
            return self.channel.lent[value]
        if kind == "lent" and type(value) is int:
            return ProgramObject(self.channel, value)
        if kind == "generator" and type(value) is int:
            return _pull(ProgramObject(self.channel, value))
        if kind == "class" and type(value) is tuple and len(value) == 3 and type(value[0]) is int:
            return self.channel.program_class(*value)
        if kind == "module" and type(value) is str:
            return self.channel.module_named(value)
        if kind == "nan":
            numpy = sys.modules.get("numpy") if value == "numpy" else None
            return numpy.nan if numpy is not None else float("nan")
        raise pickle.UnpicklingError("a malformed reference")


class TestsChannel(Channel):
    def __init__(self, sock: socket.socket, module: types.ModuleType) -> None:
        super().__init__(sock, "tests")
        self.module = module
        self.loading = False
        self.written: object = None
        self.classes: dict[int, type] = {}
        self.context_out = self._give_context
        self.context_in = self._take_state
        self.patches: list = []
        self.stdout, self.stderr = sys.stdout, sys.stderr

    def dumps(self, value: object) -> bytes:
        buffer = _BytesIO()
        _TestsPickler(self, buffer).dump(value)
        return buffer.getvalue()

    def loads(self, data: bytes) -> tuple:
        self.loading = True
        try:
            message = _TestsUnpickler(self, data).load()
        finally:
            self.loading = False
        if type(message) is not tuple or not message or message[0] not in ("request", "reply", "error"):
            raise ProgramGone("a malformed message")
        return message

    def program_class(self, number: int, name: object, bases: object) -> type:
        """A class of the tests' process standing for the program's class `number`: a subclass of the
        first of its bases the tests have loaded (`issubclass` holds); calling it makes the instance in
        the program's process."""
        if number not in self.classes:
            found = [_resolve(*base) for base in bases if type(base) in (tuple, list) and len(base) == 2
                     and base[0] in sys.modules and base[0] != PROGRAM_MODULE] if type(bases) is list else []
            base = next((item for item in found if isinstance(item, type) and item is not object), None)
            remote = ProgramObject(self, number)
            try:
                made = _ProgramClass(str(name), (base,) if base else (), {"_remote": remote, "__module__": PROGRAM_MODULE})
            except Exception:  # a base that cannot be subclassed here
                made = _ProgramClass(str(name), (), {"_remote": remote, "__module__": PROGRAM_MODULE})
            self.classes[number] = made
        return self.classes[number]

    def module_named(self, name: str) -> object:
        """A module the program names: the tests' own copy of it."""
        if name == PROGRAM_MODULE:
            return self.module
        if name in sys.modules:
            return sys.modules[name]
        try:  # (the tests' process loads only the installation's code)
            return _import_module(name)
        except Exception as error:
            raise pickle.UnpicklingError(f"a value of the program's holds module {name}: {error}") from None

    def apply(self, target: object, op: str, payload: tuple) -> object:
        """What the program may ask of an object the tests lent it: public attributes and operations."""
        if target is None:
            raise PermissionError("no such object")
        if op == "signature":
            import inspect

            return inspect.signature(target)
        if op == "class":
            return _named(target.__class__) or ("builtins", "object")
        if op in ("getattr", "setattr"):
            name = payload[0]
            if type(name) is not str:
                raise AttributeError("an attribute name that is not a str")
            if _mocks_machinery(target, name):
                raise AttributeError(f"{name!r}: how the tests configure and check their mocks is not the program's "
                                     "to read, set or call")
            if op == "setattr" and (name in _VERIFYING or name.startswith(("assert", "_mock_"))):
                raise AttributeError(f"{name!r}: what the tests check their objects with is not the program's to set")
            if op == "setattr" and not _plain_value(payload[1]):
                raise AttributeError(f"{name!r}: the program sets only data on the tests' objects (a callable or a "
                                     "mock there would answer the tests' checks), and this is not the program's to set")
            if op == "getattr" and name.startswith("_") and not _readable(target, name, op):
                raise AttributeError(f"{name!r}: only public attributes of the tests' objects")
        elif op not in _SPECIAL_OPS:
            raise PermissionError(f"no operation {op!r}")
        return _apply_op(target, op, payload)

    def describe(self, error: BaseException) -> tuple:
        names, args, _, extra = super().describe(error)
        return names, args, "", extra  # the tests' traceback is none of the program's business

    def _give_context(self) -> dict:
        patches = []
        for patch in list(self.patches):
            target = _target_name(getattr(patch, "target", None))
            if target is not None:
                patches.append((target, patch.attribute, getattr(patch.target, patch.attribute, None)))
        stdout = sys.stdout if sys.stdout is not self.stdout else None
        stderr = sys.stderr if sys.stderr is not self.stderr else None
        pyplot = sys.modules.get("matplotlib.pyplot")
        figures = list(pyplot.get_fignums()) if pyplot is not None else None
        return {"state": _get_state(), "patches": patches, "stdout": stdout, "stderr": stderr, "figures": figures}

    def _take_state(self, state: object) -> None:
        if type(state) is not dict:
            return
        if type(state.get("state")) is dict:
            try:
                _set_state(state["state"])
            except Exception:  # a state the program made up: the tests go on with theirs
                pass
        self.written = state.get("written")
        import warnings

        for category, message, filename, lineno in state.get("warned") or ():
            kind = _resolve(*category) if type(category) is tuple and len(category) == 2 \
                and category[0] in sys.modules else None
            if not (isinstance(kind, type) and issubclass(kind, Warning)):
                kind = UserWarning
            warnings.warn_explicit(str(message), kind, str(filename), int(lineno))


_VERIFYING = frozenset({"called", "call_count", "call_args", "call_args_list", "mock_calls", "method_calls",
                        "__class__", "__dict__"})  # a mock's record of its calls: the program never writes it


def _mocks_machinery(target: object, name: str) -> bool:
    """Whether `name` is part of a mock's own machinery rather than of what it stands for: what its class
    defines (`configure_mock`, `attach_mock`, `reset_mock`, `return_value`, `side_effect`, the `assert_*`
    methods, `_get_child_mock`, ...), its record of calls and its private state (`_mock_*`, `_spec_*`).
    The tests configure and check a mock with these; the program, which only uses what the mock stands
    for, never names them (a mock's `configure_mock` once let it make the mock equal to anything)."""
    mock = sys.modules.get("unittest.mock")
    if mock is None or not isinstance(target, mock.NonCallableMock):
        return False
    return (name in _VERIFYING or name.startswith(("assert", "_mock_", "_spec_"))
            or hasattr(type(target), name) and not (name.startswith("__") and name.endswith("__")))


def _plain_value(value: object) -> bool:
    """Whether the program may set `value` on an object of the tests': data, not a callable (a stand-in of
    the program's, a function, a class) nor a mock, which would answer in place of what the tests check."""
    mock = sys.modules.get("unittest.mock")
    return not callable(value) and not (mock is not None and isinstance(value, mock.NonCallableMock))


def _readable(target: object, name: str, op: str) -> bool:
    """Whether the program may have `target`'s private or special attribute `name` (the tests' object):
    a function's name and docs; a mock's own attributes (those the test set, `__path__` included)."""
    if op == "getattr" and name in _NAMES_READ:
        return True
    mock = sys.modules.get("unittest.mock")
    if mock is None or not isinstance(target, mock.NonCallableMock):
        return False
    return not name.startswith("__") or name in object.__getattribute__(target, "__dict__")


def _target_name(target: object) -> tuple | None:
    if isinstance(target, types.ModuleType):
        return ("module", target.__name__, "")
    if isinstance(target, type):
        name = _named(target)
        return ("class", name[0], name[1]) if name else None
    return None


class _InstalledOnly:
    """The tests' imports: only code of the installation (the program writes the working directory and
    may have put it, or any directory, on the `sys.path` the tests see)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None:
            return None
        places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or ())
        if all(os.path.realpath(place).startswith(self.roots) for place in places):
            return spec
        raise ImportError(f"{name}: not from the installation (the tests' process loads nothing else)", name=name)


def _track_patches(channel: TestsChannel) -> None:
    """Keep `channel.patches` the list of `unittest.mock` patches active in the tests' process."""
    from unittest import mock

    enter, exit_ = mock._patch.__enter__, mock._patch.__exit__

    def tracked_enter(patch: object) -> object:
        result = enter(patch)
        channel.patches.append(patch)
        return result

    def tracked_exit(patch: object, *exc_info: object) -> object:
        if patch in channel.patches:
            channel.patches.remove(patch)
        return exit_(patch, *exc_info)

    mock._patch.__enter__ = tracked_enter
    mock._patch.__exit__ = tracked_exit


def start_program() -> tuple[TestsChannel, object]:
    """Start the program's process; the channel to it, and the process."""
    import subprocess

    import secrets

    mine, theirs = socket.socketpair()
    address = f"memrl-bcb-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen()
    child = subprocess.Popen(
        [sys.executable, "-B", "-s", os.path.abspath(__file__), "program", str(theirs.fileno()), address],
        stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
    theirs.close()
    channel = TestsChannel(mine, types.ModuleType(PROGRAM_MODULE))
    threading.Thread(target=_serve_forks, args=(listener, channel), daemon=True).start()
    return channel, child


def _serve_forks(listener: socket.socket, channel: TestsChannel) -> None:
    """Serve the connections of the processes the program forks, each on a thread: their requests
    reach the same objects of the tests' as the program's own; their state stays theirs."""
    while True:
        connection, _ = listener.accept()
        forked = TestsChannel(connection, channel.module)
        forked.lent, forked.numbers, forked.classes = channel.lent, channel.numbers, channel.classes
        forked.patches = channel.patches
        forked.context_in = lambda state: None
        threading.Thread(target=_serve_quietly, args=(forked,), daemon=True).start()


def _serve_quietly(channel: Channel) -> None:
    try:
        channel.serve_forever()
    except (ProgramGone, OSError):
        pass


# =========================================================================== the tests' run


def _trusted_roots() -> tuple[str, ...]:
    """Directories whose code is the interpreter's and the installed libraries' (read-only in the sandbox)."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    roots = {os.path.realpath(p) for p in prefixes} | {os.path.abspath(p) for p in prefixes}
    return tuple(sorted(root.rstrip("/") + "/" for root in roots))


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


def _type_name(kind: type) -> str:
    """A class's own name, read as the interpreter does (a metaclass cannot show another)."""
    return str(type.__dict__["__name__"].__get__(kind))


def _describe(error: BaseException) -> str:
    import traceback

    try:
        return bcb_check._tail("".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next)))
    except BaseException:  # an exception of the program's that cannot be shown
        return bcb_check._tail(f"{_type_name(type(error))} (its traceback could not be shown)")


def _missing_module(error: BaseException) -> str | None:
    """The top-level module name if `error` is an import of a module not installed here."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.split(".")[0]
    return top if not bcb_check._installed(top) else None


def _data_only_loaders() -> None:
    """In the tests' process, before any test runs: pickle's loaders rebuild data only, by the rules of a value
    from the program (`_Trial`), never code. A file the tests unpickle may be the program's: BigCodeBench/832's
    tests `pickle.load` what the program wrote, and a pickle that called `exec` ran the program's code here,
    beside the nonce (a third red team's forgery). Unpicklers other libraries build on pickle's Python one
    (pandas', joblib's) find only the same globals."""
    import _pickle

    def load(file: io.BufferedIOBase, **options: object) -> object:
        return _Trial(file, **options).load()  # type: ignore[arg-type]

    def loads(data: bytes, /, **options: object) -> object:
        return load(_BytesIO(data), **options)  # type: ignore[arg-type]

    for module in (pickle, _pickle):
        module.load, module.loads, module.Unpickler = load, loads, _Trial  # type: ignore[assignment,misc]
    pickle._Unpickler.find_class = _Trial.find_class  # type: ignore[method-assign]


def run_tests(report_fd: int, nonce_fd: int, solution_path: str, tests_path: str) -> None:
    """The tests' process: start the program's, run the tests, write the report signed with the nonce."""
    import hashlib
    import hmac
    import json

    nonce = os.read(nonce_fd, 256)
    os.close(nonce_fd)
    with open(tests_path, encoding="utf-8") as handle:
        tests = handle.read()
    with open(solution_path, encoding="utf-8") as handle:
        solution = handle.read()
    for path in (solution_path, tests_path):
        os.unlink(path)
    bcb_check._make_undumpable()
    _data_only_loaders()
    names = bcb_check.expected_tests(tests)
    report: dict = {"outcomes": {}}
    child = None
    try:
        channel, child = start_program()
        _run_all(channel, solution, tests, names, report)
    except BaseException as error:  # the program's module, or the test file's, did not load
        report["error"] = _describe(error)
        report["module"] = _missing_module(error)
    body = json.dumps(report, default=str).encode()
    os.write(report_fd, hmac.new(nonce, body, hashlib.sha256).hexdigest().encode() + b" " + body)
    if child is not None:
        child.kill()
    os._exit(0)


def _run_all(channel: TestsChannel, solution: str, tests: str, names: list[str], report: dict) -> None:
    """Run the test file (first, unless its module code needs the program's names), load the program
    with the modules the tests imported, run each test; outcomes into `report`."""
    from unittest import TestCase

    namespace = channel.module.__dict__
    namespace.update({"__name__": PROGRAM_MODULE, "__file__": TESTS_FILE, "__builtins__": builtins})
    sys.modules[PROGRAM_MODULE] = channel.module
    builtin_names = frozenset(vars(builtins))
    sys.meta_path.insert(sys.meta_path.index(next(finder for finder in sys.meta_path
                                                  if getattr(finder, "__name__", "") == "PathFinder")),
                         _InstalledOnly(_trusted_roots()))
    _track_patches(channel)
    code = compile(tests, TESTS_FILE, "exec")
    initial, before = dict(namespace), set(sys.modules)
    try:
        exec(code, namespace)
        deferred = False
    except NameError:  # a constant of the program's (OUTPUT_DIR): the tests run after the program loads
        namespace.clear()
        namespace.update(initial)
        deferred = True
    preload = [name for name in sys.modules if name not in before and name != PROGRAM_MODULE]
    program_names = channel.request(0, "load", solution, preload)
    if type(program_names) is not dict:
        raise ProgramGone("the program's names are not a dict")
    namespace.update({name: value for name, value in program_names.items() if type(name) is str
                      and name not in _MODULE_HOOKS and name not in builtin_names and name not in namespace})
    if deferred:
        exec(code, namespace)
    cases = namespace.get("TestCases")
    if not (isinstance(cases, type) and issubclass(cases, TestCase)):
        raise _NotAPass("the tests define no TestCases class deriving from unittest.TestCase")
    outcomes = report["outcomes"]
    cases.setUpClass()
    try:
        for name in names:
            try:
                _run_test(_entry(cases, name))
                outcomes[name] = "ok"
            except BaseException as error:
                outcomes[name] = "failed"
                report.setdefault("problem", f"{name}: {_describe(error)}")
                module = _missing_module(error)
                if module:
                    report["module"] = module
    finally:
        try:
            cases.tearDownClass()
        finally:
            cases.doClassCleanups()


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "tests":
    run_tests(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
elif __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "program":
    serve_program(int(sys.argv[2]), sys.argv[3])
