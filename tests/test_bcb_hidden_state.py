"""A BigCodeBench program's value is rebuilt without hidden state (issue 43, item 2).

An outside attack forged 6 of 40 stdlib tasks with one constant program: a value of an allowed class
(`bcb_processes._ALLOWED`) crossed to the tests' process with extra pickled state, the class's own rebuild
set it, and an instance attribute then shadowed a method its operators dispatch to (pandas' `__eq__` calls
`self._cmp_method`). The replay (benchmarks/testing/bcb_shadowing.py) tries that on every allowed class;
`python -m benchmarks.testing.bcb_shadowing` prints what gets through.
"""

from __future__ import annotations

import collections
import functools
import io
import pickle
import shutil

import bench_data
import pytest
from conftest import unavailable

from benchmarks.testing import bcb_shadowing
from memrl_bench.adapters.bigcodebench import bcb_processes
from memrl_bench.adapters.bigcodebench import BigCodeBench

# Some of the 28 classes the replay opened before the fix (their operators dispatch through the instance:
# `_cmp_method`, an instance's `__eq__`), and a few of their neighbours.
KNOWN = ("pandas.DataFrame", "pandas.Series", "pandas.Index", "pandas.RangeIndex", "pandas.arrays.IntegerArray",
         "pandas.arrays.ArrowStringArray", "pandas.Int64Dtype", "pandas.arrays.DatetimeArray", "pandas.Categorical",
         "collections.Counter", "collections.OrderedDict", "ipaddress.IPv4Network", "io.StringIO")


def _classes(names: tuple[str, ...]) -> list[type]:
    import importlib

    found = []
    for name in names:
        module, _, attribute = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attribute))
        except ImportError:
            continue
    return [kind for kind in found if kind in bcb_shadowing.allowed_classes()]


def test_honest_values_still_cross() -> None:
    """Every honest value of the survey (containers, dates, numpy, pandas, matplotlib figures of each plot
    kind, PIL images) is rebuilt as before: nothing honest is refused for its state."""
    refused = {}
    for value in bcb_shadowing._survey():
        try:
            bcb_processes._Trial(io.BytesIO(pickle.dumps(value, protocol=4))).load()
        except pickle.UnpicklingError as error:
            refused[type(value).__name__] = str(error)
    assert not [reason for reason in refused.values() if "state" in reason], refused


@pytest.mark.parametrize("obj, extra", [
    (collections.Counter("ab"), {"values": functools.partial(list, [7])}),  # the class's own method
    (collections.Counter("ab"), {"__class__": dict}),  # a special name
    (collections.Counter("ab"), {"most_common": slice, "elements": slice}),
])
def test_state_that_shadows_behaviour_is_refused(obj: object, extra: dict) -> None:
    for make in (bcb_shadowing._with_state, bcb_shadowing._built_again):
        with pytest.raises(pickle.UnpicklingError):
            bcb_shadowing.load(make(obj, extra))


def test_state_the_class_does_not_pickle_is_refused() -> None:
    """pandas rebuilds a frame from any keys its state holds (`NDFrame.__setstate__`): one its own pickling does
    not write is refused even where it shadows nothing, and so is a BUILD on an index, which pickles none."""
    pandas = pytest.importorskip("pandas")
    bcb_shadowing.allowed_classes()
    frame = pandas.DataFrame({"a": [1]})
    with pytest.raises(pickle.UnpicklingError, match="does not pickle"):
        bcb_shadowing.load(bcb_shadowing._with_state(frame, {"zz": 1}))
    with pytest.raises(pickle.UnpicklingError, match="does not pickle"):
        bcb_shadowing.load(bcb_shadowing._with_state(pandas.Index([1]), {"zz": 1}))
    with pytest.raises(pickle.UnpicklingError, match="twice"):
        bcb_shadowing.load(bcb_shadowing._built_again(frame, {}))
    assert bcb_shadowing.load(pickle.dumps(frame, protocol=4)).equals(frame)


def test_the_known_classes_claim_nothing() -> None:
    """The classes the attack opened before (pandas frames, series, indexes, arrays) and their neighbours: every
    attempt is refused or leaves a value that claims nothing (the replay's fast part)."""
    classes = _classes(KNOWN)
    assert len(classes) >= 5
    results = bcb_shadowing.replay(classes)
    assert {kind: found for kind, found in results.items() if found} == {}


@pytest.mark.slow
def test_no_allowed_class_can_be_made_to_claim_anything() -> None:
    """Every class on the allow-list, each name its operators reach shadowed by a callable that is always
    truthy, in every form pickle allows: refused, or harmless (no claim of equality, order, membership,
    `equals`, nor a passing assertion helper, against an object it cannot honestly equal)."""
    results = bcb_shadowing.replay()
    assert len(results) == len(bcb_shadowing.allowed_classes()) > 200
    assert {kind: found for kind, found in results.items() if found} == {}


_FORGED = ("import copyreg, pandas\n\nclass _Forged:\n    def __reduce__(self):\n"
           "        return copyreg._reconstructor, (pandas.Index, object, None), {'_cmp_method': slice}\n\n"
           "def task_func(*args):\n    return _Forged()\n")
_BY_VALUE = ("import sys\n_pickler = sys.modules['__main__']._ProgramPickler\n_original = _pickler.persistent_id\n"
             "_pickler.persistent_id = lambda self, obj: None if type(obj).__name__ == '_Forged' else _original(self, obj)\n")
_EQUAL_TEST = ("import unittest\nclass TestCases(unittest.TestCase):\n    def test_a(self):\n"
               "        self.assertEqual(task_func({'a': [1]}), {1: 1})\n"
               "    def test_b(self):\n        self.assertAlmostEqual(task_func(2.5), 2.5)\n")


@pytest.fixture(scope="module")
def bench() -> BigCodeBench:
    if shutil.which("bwrap") is None:
        unavailable("needs bubblewrap (apt-get install bubblewrap)", "bubblewrap")
    return BigCodeBench(data=str(bench_data.BIGCODEBENCH_SAMPLE), stdlib_only=True, timeout=30, memory_mb=1024)


@pytest.mark.parametrize("forced", [False, True], ids=["as-pickled", "sent-by-value"])
def test_a_value_with_hidden_state_fails_in_the_sandbox(forced: bool, bench: BigCodeBench) -> None:
    """The attack end to end: a pandas Index whose `_cmp_method` (what its `==` calls) is `slice`, so that it
    equals anything. Pickled as the program's process pickles values, it does not cross as data (it arrives
    as a stand-in, which equals nothing); forced through by the program's own pickler, the tests' process
    refuses it. Either way the tests fail; an honest program passes them."""
    pytest.importorskip("pandas")
    verdict = bench.evaluate(_FORGED + (_BY_VALUE if forced else ""), _EQUAL_TEST, screened=False)
    assert verdict.status == "FAIL", verdict
    assert ("not state of its class's" if forced else "2/2 tests failed") in verdict.detail, verdict
    honest = "def task_func(value):\n    return {1: 1} if isinstance(value, dict) else value\n"
    assert bench.evaluate(honest, _EQUAL_TEST).passed
