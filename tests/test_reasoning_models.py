"""Reasoning models and LLM failures: no temperature unless asked, a fail-fast parameter check,
and a run whose endpoint dies mid-way stops as `interrupted` and resumes to the same metrics.
All against a real Chat Completions server on 127.0.0.1 (benchmarks/testing/chat_server.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import conftest
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer, is_check
from benchmarks.testing.toy_benchmark import responder

from memrl_bench.framework.config import BenchConfig
from memrl_bench.framework.harness import run_benchmark
from memrl_cli.ops import inspection
from memrl_cli.ops import runs
from memrl_cli.bank import MemoryBank
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMError, LLMSettings, resolve_llm_settings

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
TESTS = Path(__file__).parent
REJECT = ("Unsupported value: 'temperature' does not support 0.3 with this model. "
          "Only the default (1) value is supported.")


def reasoning_model(request: dict) -> str | dict:
    """A gpt-5-mini-like endpoint: any temperature is a 400; otherwise the toy benchmark's LLM."""
    if "temperature" in request:
        return {"status": 400, "message": REJECT, "param": "temperature"}
    return "OK" if is_check(request) else responder(request)


def settings(server: ScriptedChatServer, **overrides: object) -> LLMSettings:
    values = dict(model="scripted", base_url=server.base_url, api_key="sk-test", retry_base_delay=0.01)
    values.update(overrides)
    return LLMSettings(**values)  # type: ignore[arg-type]


def test_no_temperature_is_sent_unless_set(tmp_path: Path):
    assert LLMSettings().temperature is None
    config = tmp_path / "llm.yaml"
    config.write_text("llm:\n  temperature: null\n")
    assert resolve_llm_settings(str(config)).temperature is None
    config.write_text("llm:\n  temperature: 0.6\n")
    assert resolve_llm_settings(str(config)).temperature == 0.6
    assert resolve_llm_settings(str(config), temperature=1.0).temperature == 1.0
    with ScriptedChatServer(reasoning_model, answer_checks=False) as server:
        assert ChatClient(settings(server)).chat([{"role": "user", "content": "room 1"}]) == "0000"
        assert "temperature" not in server.requests[-1]
        with pytest.raises(LLMError, match="rejects parameter 'temperature'=0.3.*temperature: null.*--temperature default"):
            ChatClient(settings(server, temperature=0.3)).chat([{"role": "user", "content": "room 1"}])


def test_check_sends_the_run_parameters_and_names_the_rejected_one():
    with ScriptedChatServer(reasoning_model, answer_checks=False) as server:
        with pytest.raises(MemrlError, match="test request with this run's LLM parameters failed.*'temperature'"):
            ChatClient(settings(server, temperature=0.3)).check()
        assert server.requests[-1]["temperature"] == 0.3
        assert ChatClient(settings(server, max_tokens=64)).check() == ["scripted-model"]
        assert server.requests[-1]["max_tokens"] == 64 and "temperature" not in server.requests[-1]


def cli_env() -> dict[str, str]:
    return conftest.cli_env(OPENAI_API_KEY="sk-test-key")


@pytest.mark.slow
def test_bench_fails_before_the_first_episode_when_the_model_rejects_temperature(tmp_path: Path):
    with ScriptedChatServer(reasoning_model, answer_checks=False) as server:
        base = [sys.executable, "-m", "memrl_cli", "bench", TOY, "--epochs", "1", "--threshold", "0.3", "--workers",
                "0", "--base-url", server.base_url, "--model", "scripted", "--option", "rooms=2"]
        rejected = subprocess.run([*base, "--temperature", "0.3", "--runs-dir", str(tmp_path / "a")], env=cli_env(),
                                  capture_output=True, text=True, timeout=120)
        assert rejected.returncode == 1
        lines = rejected.stderr.strip().splitlines()  # the bank line every bench starts with, then one error line
        assert len(lines) == 2 and lines[0].startswith("memrl: bank: ") and lines[1].startswith("memrl: error: "), lines
        assert "'temperature'" in rejected.stderr and "HTTP 400" in rejected.stderr
        assert not (tmp_path / "a").exists()  # nothing written: no run directory, no bank
        assert len(server.requests) == 1  # the check's single request, no episode
        unset = tmp_path / "unset.yaml"  # a config that leaves temperature unset (null): none is sent
        unset.write_text("bench:\n  epochs: 1\nllm:\n  temperature: null\n")
        ok = subprocess.run([*base, "--config", str(unset), "--runs-dir", str(tmp_path / "b"), "--json"], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["episodes"] == 2
        assert all("temperature" not in r for r in server.requests[1:])  # agent, script and reflection calls alike
        assert sum(r["messages"][0]["content"].startswith("You analyse a failed") for r in server.requests) == 2


def dying(after: int) -> tuple[ScriptedChatServer, threading.Event]:
    """A toy-benchmark server that crashes on its `after`-th chat request."""
    count = {"n": 0}
    lock = threading.Lock()
    died = threading.Event()

    def respond(request: dict) -> str | dict:
        with lock:
            count["n"] += 1
            if count["n"] == after:
                died.set()
                holder[0].die()
        return responder(request)

    holder = [ScriptedChatServer(respond)]
    return holder[0], died


def test_server_death_mid_run_leaves_an_interrupted_run_that_resumes_to_the_same_metrics(tmp_path: Path):
    config = BenchConfig(benchmark=TOY, method="memrl", epochs=3, batch_size=2, threshold=0.3, eval_splits=["val"],
                         options={"rooms": 4})
    with ScriptedChatServer(responder) as server:
        expected = run_benchmark(config, settings(server), runs_dir=str(tmp_path / "full"), workers=0)

    server, died = dying(after=20)  # eval 0 (4 calls), epoch 1 (8), then the last call of epoch 2
    with server:
        with pytest.raises(MemrlError, match="interrupted by an LLM error after .* committed batch.*--resume"):
            run_benchmark(config, settings(server, max_retries=1), runs_dir=str(tmp_path / "cut"), workers=0)
    assert died.is_set()
    run_dir = next((tmp_path / "cut").iterdir())
    with MemoryBank(str(run_dir / "bank.db"), create=False) as bank:
        run_id = run_dir.name
        assert runs.get_run(bank, run_id)["status"] == "interrupted"
        committed = runs.completed_batches(bank, run_id)
        assert 0 < len(committed) < 1 + 3 * 2 + 3  # eval 0, 6 training and 3 eval batches in all
        assert inspection.verify(bank)["ok"]

    with ScriptedChatServer(responder) as server:  # the endpoint is back (on another port)
        got = run_benchmark(config, settings(server), resume=str(run_dir), workers=0)
    for key in ("accuracy", "csr", "forgetting", "eval_accuracy", "last_epoch_accuracy", "final_csr", "episodes"):
        assert got[key] == expected[key], key
    with MemoryBank(got["bank"], create=False) as bank, MemoryBank(expected["bank"], create=False) as full:
        assert bank.count() == full.count()
        assert runs.get_run(bank, got["run_id"])["status"] == "finished"


def test_temperature_default_overrides_a_config_and_bad_values_are_one_line(tmp_path: Path, monkeypatch):
    from memrl_bench.framework.session import llm_endpoint, parse_temperature

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("MEMRL_MODEL", raising=False)
    config = tmp_path / "bench.yaml"
    config.write_text("llm:\n  temperature: 0.6\n  max_tokens: 512\n")
    flags = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    with llm_endpoint(str(config), flags, local_llm=False) as configured:
        assert (configured.temperature, configured.max_tokens) == (0.6, 512)
    with llm_endpoint(str(config), {**flags, "temperature": parse_temperature("default")}, local_llm=False) as unset:
        assert (unset.temperature, unset.max_tokens) == (None, 512)
    with llm_endpoint(str(config), {**flags, "temperature": parse_temperature("1")}, local_llm=False) as one:
        assert one.temperature == 1.0
    with pytest.raises(MemrlError, match="--temperature takes a number or `default`"):
        parse_temperature("hot")
