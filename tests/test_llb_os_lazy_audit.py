"""LLB-OS weak checks: the lazy-strategy audit, its committed list, and the adapter leaving those samples out.

The list (`memrl_bench/adapters/llb_os/lazy_checks.json`) is what `python -m benchmarks.perf.llb_os_lazy_audit
--write` found over the 500 samples; these tests replay it on a handful of samples in real bwrap sandboxes
(marked slow, as the other sandbox tests of tests/test_bench_llb_os.py) and check its format and the adapter
without any sandbox.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import bench_data  # noqa: E402
from benchmarks.perf.llb_os_lazy_audit import STRATEGIES, audit_task, excluded, lazy_scripts, run_paths
from memrl_bench.adapters.llb_os import weak_checks
from memrl_bench.adapters.llb_os.benchmark import LLBOperatingSystem
from memrl_bench.framework.reports import plan_printer, progress_printer
from memrl_cli.errors import MemrlError
from test_bench_llb_os import rootfs  # noqa: F401  (the session's shared Debian rootfs)

DATA = bench_data.directory("llb", "os_interaction_val.json")
needs_data = bench_data.needs("llb", DATA / "os_interaction_val.json")
WEAK = {"os/162": "exit0", "os/481": "delete"}  # the blind red team's two, and the strategy each check passes
KEPT = ("os/0", "os/5", "os/101")  # checks no lazy strategy passes
TRAIN = set(json.loads((DATA / "os_interaction_train.json").read_text())) if DATA.is_dir() else set()


def all_tasks() -> dict:
    adapter = LLBOperatingSystem(data=str(DATA), keep_weak_checks=True)
    return {task.id: task for split in ("train", "val") for task in adapter.tasks(split)}


def test_the_committed_list_is_what_the_audit_writes() -> None:
    committed = weak_checks.load()
    assert weak_checks.LIST_FILE.read_text() == weak_checks.document(committed)  # its format, byte for byte
    assert set(json.loads(weak_checks.LIST_FILE.read_text())["strategies"]) == set(STRATEGIES)
    for sample, strategy in WEAK.items():
        assert strategy in committed[sample]
    assert not set(KEPT) & set(committed)


def test_a_damaged_list_is_one_error(tmp_path) -> None:
    for text in ("not json", '{"excluded": {"os/1": ["guess"]}}', '{"excluded": {"os/1": []}}', "{}"):
        (tmp_path / "list.json").write_text(text)
        with pytest.raises(MemrlError, match="weak LLB OS checks"):
            weak_checks.load(tmp_path / "list.json")


def test_the_audit_finds_the_scripts_a_check_runs() -> None:
    check = ("[ -x ~/bin/run.sh ] && ~/bin/run.sh; bash backup.sh && if ./tool -q; then sh -e /opt/x.sh; fi\n"
             "grep -q a /etc/app/conf || /usr/local/bin/check.sh >/dev/null; out=$(/root/y)")
    assert run_paths(check) == ["/backup.sh", "/opt/x.sh", "/root/bin/run.sh", "/root/y", "/tool",
                                "/usr/local/bin/check.sh"]
    assert run_paths("grep -c x /var/log/a.log && test -f /tmp/b") == []
    assert run_paths("bash -c 'g=$(cat /etc/x)'; awk '!/^admin 660$/ {exit 1}' /f && sh -c '/opt/run'") == ["/opt/run"]


@needs_data
def test_the_adapter_never_yields_an_excluded_sample() -> None:
    committed = weak_checks.load()
    adapter = LLBOperatingSystem(data=str(DATA))
    played = {task.id for split in ("train", "val") for task in adapter.tasks(split)}
    everything = all_tasks()
    assert set(committed) <= set(everything) and not played & set(committed)
    assert played == set(everything) - set(committed)
    left_out = adapter.left_out()
    assert left_out is not None and sorted(left_out["ids"]["train"] + left_out["ids"]["val"]) == sorted(committed)
    assert f"leaves out {len(committed)} samples" in left_out["text"]
    assert LLBOperatingSystem(data=str(DATA), keep_weak_checks=True).left_out() is None


def test_every_progress_display_says_a_runs_note() -> None:
    for printer in (progress_printer, plan_printer):
        shown = io.StringIO()
        printer(shown)("note", {"text": "llb-os leaves out 2 samples"})
        assert shown.getvalue() == "memrl: note: llb-os leaves out 2 samples\n"


@needs_data
def test_the_lazy_scripts_touch_only_what_the_task_names() -> None:
    tasks = all_tasks()
    scripts = lazy_scripts(tasks["os/162"])
    assert scripts["nothing"] == "" and "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/check.sh" in scripts["exit0"]
    assert scripts["delete"].startswith("rm -rf -- /usr/local/bin/check.sh ")
    assert lazy_scripts(tasks["os/481"])["delete"].startswith("rm -rf -- /etc/app/configs ")  # not `configs.`
    assert lazy_scripts(tasks["os/481"])["exit0"] == ""  # its check runs no script of the agent's


@needs_data
@pytest.mark.slow
def test_the_excluded_checks_pass_their_lazy_strategy_and_a_kept_one_fails_every_one(rootfs) -> None:  # noqa: F811
    tasks = all_tasks()
    adapter = LLBOperatingSystem(data=str(DATA), backend="bwrap", rootfs=str(rootfs), keep_weak_checks=True)
    chosen = [tasks[i] for i in (*WEAK, *KEPT)]
    outcomes = [audit_task(adapter.sandboxes, task) for task in chosen]
    found = excluded(chosen, outcomes)
    assert {sample: strategies for sample, strategies in weak_checks.load().items() if sample in found} == found
    assert set(found) == set(WEAK) and all(WEAK[sample] in found[sample] for sample in WEAK)
    for task, outcome in zip(chosen[len(WEAK):], outcomes[len(WEAK):]):
        assert outcome == {strategy: False for strategy in STRATEGIES}, task.id


@needs_data
@pytest.mark.slow
def test_a_run_says_how_many_samples_it_leaves_out(rootfs, tmp_path) -> None:  # noqa: F811
    """Through the harness: the note before the run, and `left_out` in config.json and summary.json."""
    from benchmarks.testing.chat_server import ScriptedChatServer, distilling

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_bench.framework.llm import LLMSettings

    events: list[tuple[str, dict]] = []
    with ScriptedChatServer(distilling(lambda request: "Think: done.\n\nAct: finish")) as server:
        config = BenchConfig(benchmark="llb-os", epochs=1, batch_size=1, limit=1, eval_splits=["val"], eval_limit=1,
                             data=str(DATA), options={"backend": "bwrap", "rootfs": str(rootfs)})
        summary = run_benchmark(config, LLMSettings(model="scripted", base_url=server.base_url, api_key="test"),
                                runs_dir=str(tmp_path), workers=0, on_progress=lambda e, d: events.append((e, d)))
    committed = weak_checks.load()
    notes = [data["text"] for event, data in events if event == "note"]
    assert notes == [f"llb-os leaves out {len(committed)} samples (train {sum(1 for i in committed if i[3:] in TRAIN)}"
                     f", val {sum(1 for i in committed if i[3:] not in TRAIN)}) whose check a lazy strategy passes "
                     "(lazy_checks.json; --option keep_weak_checks=true plays them)"]
    assert [event for event, _ in events].index("note") < [event for event, _ in events].index("plan")
    stored = json.loads((Path(summary["run_dir"]) / "config.json").read_text())["left_out"]
    assert stored == summary["left_out"] and sorted(stored["ids"]["train"] + stored["ids"]["val"]) == sorted(committed)
