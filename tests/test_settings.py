"""The one configuration layer (benchmarks/memrl_bench/framework/settings.py) through `memrl bench`: flags > environment >
YAML > defaults for a bench setting and an LLM setting, one-line errors for a bad value from each
source with nothing written, and a `--help` that cannot drift from the settings it documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from benchmarks.testing.chat_server import ScriptedChatServer
from benchmarks.testing.toy_benchmark import responder

from memrl_bench.framework import session
from memrl_bench.framework.config import BenchConfig
from conftest import error_line, run_memrl
from memrl_bench.framework import settings
from memrl_cli.cli import app
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import LLMSettings, resolve_llm_settings
from memrl_cli.validators import finite, is_finite, is_whole, whole

TOY = "benchmarks.testing.toy_benchmark:Passcodes"
DEAD = "http://127.0.0.1:9/v1"  # nothing listens there
KEY = "sk-test-planted-key-000000000000"


def bench_params() -> dict[str, str]:
    """`memrl bench`'s options: parameter name → help text."""
    command = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    return {p.name: getattr(p, "help", None) or "" for p in command.params}


def test_the_bench_help_shows_each_setting_s_own_default_and_variable() -> None:
    fields = {f.name: f for f in BenchConfig.__dataclass_fields__.values()}
    shown = set()
    for name, text in bench_params().items():
        bracket = re.search(r"\[([^\[\]]+)\]\.?$", text)
        if name in fields and isinstance(fields[name].default, (int, float)) and bracket:
            assert float(bracket.group(1)) == fields[name].default, (name, text)
            shown.add(name)
        if name in settings.names(LLMSettings) and settings.env_var(LLMSettings, name):
            assert f"[env {settings.env_var(LLMSettings, name)}]" in text, (name, text)
    assert shown == {"epochs", "batch_size", "eval_every", "k1", "k2", "threshold", "epsilon", "alpha", "seed"}


def test_every_bench_option_is_a_setting_or_owned_by_the_session() -> None:
    """`session.run_from_cli` routes each option by its name; one it does not know would be lost."""
    owned = {"name", "method", "option", "task_types", "max_steps", "config", "local_llm", "workers", "runs_dir",
             "resume", "db", "as_json"}
    unknown = set(bench_params()) - session.BENCH_FIELDS - settings.names(LLMSettings) - owned
    assert not unknown


@pytest.fixture(scope="module")
def server():
    with ScriptedChatServer(responder) as s:
        yield s


def test_flags_beat_environment_beat_yaml_beat_defaults(server, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"bench:\n  epochs: 3\n  batch_size: 3\n  options: {{rooms: 3}}\n"
                      f"llm:\n  model: yaml-model\n  base_url: {DEAD}\n  temperature: 0.25\n  timeout: 7\n")
    done = run_memrl("bench", TOY, "--config", str(config), "--epochs", "1", "--model", "flag-model",
                     "--workers", "0", "--runs-dir", str(tmp_path / "runs"), "--json",
                     env={"MEMRL_MODEL": "env-model", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": KEY},
                     ok=True, timeout=300)
    run_dir = Path(json.loads(done.stdout)["bank"]).parent
    stored = json.loads((run_dir / "config.json").read_text())
    bench, llm = stored["config"], stored["llm"]
    assert bench["epochs"] == 1  # flag over YAML
    assert bench["batch_size"] == 3 and bench["options"]["rooms"] == 3  # YAML over default
    assert bench["k1"] == BenchConfig.k1 and bench["alpha"] == BenchConfig.alpha  # defaults
    assert llm["model"] == "flag-model"  # flag over environment and YAML
    assert llm["base_url"] == server.base_url  # environment over YAML (whose endpoint is dead)
    assert llm["temperature"] == 0.25 and llm["timeout"] == 7.0  # YAML over defaults
    assert llm["max_retries"] == LLMSettings().max_retries  # default
    agent = [r for r in server.requests if r["model"] == "flag-model"]
    assert agent and len(agent) == len(server.requests) and {r.get("temperature") for r in agent} == {0.25}


def test_the_library_resolves_in_the_same_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "llm.yaml"
    config.write_text("llm:\n  model: yaml-model\n  seed: 3\n")
    monkeypatch.setenv("MEMRL_MODEL", "env-model")
    assert resolve_llm_settings(config).model == "env-model"
    assert resolve_llm_settings(config, model="flag-model").model == "flag-model"
    monkeypatch.setenv("MEMRL_MODEL", "")  # empty counts as unset
    assert resolve_llm_settings(config).model == "yaml-model" and resolve_llm_settings(config).seed == 3


BAD = [  # (where, the YAML file's text or None, flags, environment, the error's words)
    ("flag", None, ["--epochs", "0"], {}, "epochs must be a whole number of at least 1, got 0"),
    ("flag", None, ["--temperature", "hot"], {}, "--temperature takes a number or `default`"),
    ("environment", None, [], {"OPENAI_BASE_URL": "127.0.0.1:8000/v1"},
     "LLM base URL must start with http:// or https://"),
    ("YAML bench:", "bench:\n  epochs: two\n", [], {}, "epochs must be a whole number of at least 1, got 'two'"),
    ("YAML bench:", "bench:\n  threshold: .nan\n", [], {}, "threshold must be a finite number"),
    ("YAML bench:", "bench:\n  epoch: 2\n", [], {}, "unknown bench settings epoch"),
    ("YAML llm:", "llm:\n  timeout: soon\n", [], {}, "LLM setting 'timeout' from"),
    ("YAML llm:", "llm:\n  concurrency: 0\n", [], {}, "LLM concurrency must be >= 1"),
    ("YAML llm:", "llm:\n  timeout: yes\n", [], {}, "LLM setting 'timeout' from"),
    ("YAML", "bench: [\n", [], {}, "is not valid YAML"),
]


@pytest.mark.parametrize(("where", "text", "flags", "env", "error"), BAD, ids=[f"{b[0]}: {b[4][:30]}" for b in BAD])
def test_a_bad_value_from_any_source_is_one_line_and_writes_nothing(tmp_path: Path, where, text, flags, env,
                                                                    error) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text or "bench:\n  epochs: 1\n")
    runs = tmp_path / "runs"
    done = run_memrl("bench", TOY, "--config", str(config), "--runs-dir", str(runs), "--workers", "0", *flags,
                     env={"OPENAI_BASE_URL": DEAD, "OPENAI_API_KEY": KEY, **env}, ok=False)
    assert error in error_line(done)
    assert not runs.exists()


def test_the_validators_refuse_bools_nan_and_fractions() -> None:
    assert is_whole(3) and not is_whole(True) and not is_whole(3.0)
    assert is_finite(0.5) and is_finite(2) and not any(map(is_finite, (True, float("nan"), float("inf"), "1")))
    assert finite("x", 2) == 2.0 and whole("n", 4, 1) == 4
    for check, value, message in ((finite, False, "x must be a finite number, got False"),
                                  (whole, 0, "x must be a whole number of at least 1, got 0")):
        with pytest.raises(MemrlError, match=re.escape(message)):
            check("x", value, *([1] if check is whole else []))
