"""A BigCodeBench program may not run code in the tests' process through a file the tests unpickle (red team 2).

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

TESTS = '''import unittest
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
HONEST = '''import pickle
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
FORGING = f'''def task_func(filename, data):
    with open(filename, 'wb') as handle:
        handle.write({b"cbuiltins" + chr(10).encode() + b"exec" + chr(10).encode() + b"(V" + _CODE.encode()
                      + chr(10).encode() + b"tR."!r})
    return None
'''


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> BigCodeBench:
    if shutil.which("bwrap") is None:
        unavailable("needs bubblewrap (apt-get install bubblewrap)", "bubblewrap")
    data = tmp_path_factory.mktemp("bcb") / "bigcodebench_full.jsonl"
    data.write_text("", encoding="utf-8")
    return BigCodeBench(data=str(data), timeout=60, memory_mb=1024)


def test_an_honest_program_passes(bench: BigCodeBench) -> None:
    assert bench.evaluate(HONEST, TESTS).status == "PASS"


@pytest.mark.parametrize("loader", ["pickle.load(handle)", "pickle.loads(handle.read())",
                                    "pickle.Unpickler(handle).load()", "pickle._Unpickler(handle).load()"])
def test_a_pickle_the_tests_load_cannot_forge_the_report(bench: BigCodeBench, loader: str) -> None:
    verdict = bench.evaluate(FORGING, TESTS.replace("pickle.load(handle)", loader))
    assert verdict.status != "PASS", "code unpickled in the tests' process wrote the report"
    assert bench.evaluate(HONEST, TESTS.replace("pickle.load(handle)", loader)).status == "PASS"
