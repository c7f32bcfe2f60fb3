"""What a BigCodeBench program's data may do in the tests' process: the two forgeries of a second blind
red team (28 Nov 2026); each test here failed before its closure.

1. A BigCodeBench program may not pass numpy's test assertions with values it never computed.

`numpy.ma.MaskedArray` crosses to the tests' process as data (`bcb_processes._ALLOWED`), and numpy's testing
assertions ignore masked elements: a fully masked array "equals" any expected array, list, number or string
under `np.testing.assert_equal`, `assert_array_equal`, `assert_almost_equal` and `assert_allclose` (a 0-d one
whatever the shape). A program returning `np.ma.masked_all(())` passed BigCodeBench/757 and, with an empty-list
special case, /872; one plotting fully masked y data passed /970 (it reads `line.get_ydata()`): PASS in the run's
episodes, reward +1. Closed (`bcb_processes._unmasked`): a masked array from the program reaches the tests
plain, its masked entries NaN (refused when its dtype has none); an honest masked result still compares as one.

2. A BigCodeBench program may not run code in the tests' process through a file the tests unpickle.

BigCodeBench/832's tests `pickle.load` the file the program wrote, in the tests' process, with the real
`pickle`: a program that writes a pickle calling `builtins.exec` runs its code there, beside the nonce and the
report pipe, and writes a signed report of its choosing. Played through `memrl bench bigcodebench`: PASS,
reward +1, for a program that never serialises anything and fails every test. Closed
(`bcb_processes._data_only_loaders`): in the tests' process, pickle's loaders rebuild data only, by the rules of a
value from the program; every way the tests may unpickle (`load`, `loads`, `Unpickler`) is checked here.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import unavailable

from memrl_bench.adapters.bigcodebench import BigCodeBench

np = pytest.importorskip("numpy")

TESTS = '''import unittest
import numpy as np
class TestCases(unittest.TestCase):
    def test_reverse(self):
        np.testing.assert_array_equal(task_func(np.array(['a.b', 'c.d.e'])), np.array(['b.a', 'e.d.c']))
    def test_plain(self):
        np.testing.assert_array_equal(task_func(np.array(['x', 'y.z'])), ['x', 'z.y'])
    def test_equal(self):
        np.testing.assert_equal(task_func(np.array(['1.2'])), np.array(['2.1']))
'''
HONEST = '''import numpy as np
def task_func(arr):
    return np.array(['.'.join(reversed(s.split('.'))) for s in arr])
'''
MASKED = ['''import numpy as np
def task_func(arr):
    return np.ma.masked_all(())
''', '''import numpy as np
def task_func(arr):
    return np.ma.masked_all(np.shape(arr))
''', '''import numpy as np
def task_func(arr):
    return np.ma.array(np.zeros(len(arr)), mask=True)
''']


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> BigCodeBench:
    if shutil.which("bwrap") is None:
        unavailable("needs bubblewrap (apt-get install bubblewrap)", "bubblewrap")
    data = tmp_path_factory.mktemp("bcb") / "bigcodebench_full.jsonl"
    data.write_text("", encoding="utf-8")
    return BigCodeBench(data=str(data), timeout=60, memory_mb=1024)


def test_an_honest_program_passes(bench: BigCodeBench) -> None:
    assert bench.evaluate(HONEST, TESTS).status == "PASS"


@pytest.mark.parametrize("program", MASKED, ids=["0-d", "shaped", "mask-true"])
def test_a_fully_masked_value_is_no_pass(bench: BigCodeBench, program: str) -> None:
    verdict = bench.evaluate(program, TESTS)
    assert verdict.status != "PASS", "a masked array the program never computed passed numpy's assertions"


def test_an_honest_masked_result_still_compares_and_a_masked_integer_array_is_refused(bench: BigCodeBench) -> None:
    tests = ("import unittest\nimport numpy as np\nclass TestCases(unittest.TestCase):\n    def test_a(self):\n"
             "        np.testing.assert_array_equal(task_func(), np.ma.array([1.0, 2.0], mask=[0, 1]))\n")
    honest = "import numpy as np\ndef task_func():\n    return np.ma.array([1.0, 99.0], mask=[0, 1])\n"
    assert bench.evaluate(honest, tests).status == "PASS"
    hiding = "import numpy as np\ndef task_func():\n    return np.ma.masked_all(2, dtype=int)\n"
    assert bench.evaluate(hiding, tests).status != "PASS"


UNPICKLING_TESTS = '''import unittest
import os
import pickle
class TestCases(unittest.TestCase):
    def test_returns_true(self):
        self.assertTrue(task_func('out.pkl', {'key': 'value'}))
    def test_readback(self):
        task_func('out.pkl', {'key': 'value'})
        with open('out.pkl', 'rb') as handle:
            self.assertEqual(pickle.load(handle), {'key': 'value'})
'''
HONEST_WRITER = '''import pickle
def task_func(filename, data):
    with open(filename, 'wb') as handle:
        pickle.dump(data, handle)
    return True
'''
_CODE = ("import inspect,os,hmac,hashlib,json; "
         "L=[i.frame.f_locals for i in inspect.stack(0) if i.function=='run_tests'][0]; "
         "b=json.dumps({'outcomes':{n:'ok' for n in L['names']}}).encode(); "
         "os.write(L['report_fd'], hmac.new(L['nonce'], b, hashlib.sha256).hexdigest().encode()+b' '+b); "
         "os._exit(0)")
FORGING_WRITER = f'''def task_func(filename, data):
    with open(filename, 'wb') as handle:
        handle.write({b"cbuiltins" + chr(10).encode() + b"exec" + chr(10).encode() + b"(V" + _CODE.encode()
                      + chr(10).encode() + b"tR."!r})
    return None
'''


def test_an_honest_program_writing_a_pickle_passes(bench: BigCodeBench) -> None:
    assert bench.evaluate(HONEST_WRITER, UNPICKLING_TESTS).status == "PASS"


@pytest.mark.parametrize("loader", ["pickle.load(handle)", "pickle.loads(handle.read())",
                                    "pickle.Unpickler(handle).load()", "pickle._Unpickler(handle).load()"])
def test_a_pickle_the_tests_load_cannot_forge_the_report(bench: BigCodeBench, loader: str) -> None:
    verdict = bench.evaluate(FORGING_WRITER, UNPICKLING_TESTS.replace("pickle.load(handle)", loader))
    assert verdict.status != "PASS", "code unpickled in the tests' process wrote the report"
    assert bench.evaluate(HONEST_WRITER, UNPICKLING_TESTS.replace("pickle.load(handle)", loader)).status == "PASS"
