"""Learning with known answers: grouped recall's tie test, the synthetic testbed's scenarios
(through the real harness, no LLM), and resumes of the improved methods."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memrl_bench.framework.config import METHODS, SELECTORS, BenchConfig
from memrl_bench.framework.harness import run_benchmark
from benchmarks.learning.oracle import expected_ceiling, oracle_pick
from benchmarks.learning.synthetic import SCENARIOS, Synthetic, utility
from benchmarks.learning.table import ADAPTER, NO_LLM, _pm, mean_se, non_inferiority, run
from memrl_cli.bank import MemoryBank
from memrl_cli.retrieve import RetrieveParams


def tie_bank(location: str) -> tuple[MemoryBank, list[int], list[int]]:
    """One intent (one vector): 5 failures stored first, then 3 successes."""
    bank = MemoryBank(location, "external:test:8")
    vector = np.eye(8)[0].tolist()
    results = bank.ingest_many([{"intent": "heat the apple", "experience": f"attempt {i}", "vector": vector,
                                 "outcome": "failure" if i < 5 else "success"} for i in range(8)])
    ids = [r.id for r in results]
    return bank, ids[:5], ids[5:]


@pytest.mark.parametrize("k2", [1, 3])
@pytest.mark.parametrize("selector", ["memrl", "calibrated", "ucb", "conditioned", "conditioned-z", "conditioned-n",
                                      "conditioned-nz", "conditioned-t", "conditioned-ts"])
def test_tied_intent_successes_get_selected_after_rewards(bank_at, selector, k2):
    bank, failures, successes = tie_bank(bank_at("b"))
    params = RetrieveParams(k1=5, k2=k2, selector=selector)
    vector = np.eye(8)[0].tolist()
    showed_success = []
    with bank:
        for _ in range(9):  # the agent fails unless shown a success
            got = bank.retrieve("heat the apple", params, vector=vector)
            assert {c.memory_id for c in got.candidates} == set(failures + successes)  # the whole group
            shown = {m["id"] for m in got.memories}
            showed_success.append(bool(shown & set(successes)))
            bank.reward(1.0 if showed_success[-1] else -1.0, retrieval_id=got.id)
    assert all(showed_success[-3:]), showed_success


@pytest.mark.parametrize("selector, chosen", [("conditioned-z", "foreign"), ("conditioned-nz", "own untried")])
def test_neutral_prior_ignores_q_earned_at_other_queries(bank_at, selector, chosen):
    """A memory whose Q was earned at a dissimilar query (cos 0.7) beats this task's untried memory under
    `conditioned-z` (its utility falls back on that Q) but not under `conditioned-nz` (it falls back on 0)."""
    bank = MemoryBank(bank_at("b"), "external:test:8")
    here, there = np.eye(8)[0], 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[1]
    params = RetrieveParams(k2=1, selector=selector, sim_mean=0.5, sim_std=0.5)
    with bank:
        [foreign] = [r.id for r in bank.ingest_many([{"intent": "other task", "experience": "x", "vector": there.tolist(),
                                                       "source": "other"}])]
        for _ in range(2):  # helped the other task twice: Q 0.51
            bank.reward(1.0, retrieval_id=bank.retrieve("other task", params, vector=there.tolist()).id)
        [failed] = [r.id for r in bank.ingest_many([{"intent": "this task", "experience": "y", "vector": here.tolist(),
                                                      "source": "own"}])]
        shown = bank.retrieve("this task", RetrieveParams(k2=1, sources=("own",)), vector=here.tolist())
        assert [m["id"] for m in shown.memories] == [failed]
        bank.reward(-1.0, retrieval_id=shown.id)  # failed this task once
        [untried] = [r.id for r in bank.ingest_many([{"intent": "this task", "experience": "z",
                                                       "vector": here.tolist(), "source": "own"}])]
        got = bank.retrieve("this task", params, vector=here.tolist())
    assert {c.memory_id for c in got.candidates} == {foreign, failed, untried}
    assert [m["id"] for m in got.memories] == [{"foreign": foreign, "own untried": untried}[chosen]]


@pytest.mark.parametrize("selector, reward, chosen", [("conditioned-t", 1.0, "foreign"),
                                                     ("conditioned-t", -1.0, "own untried"),
                                                     ("conditioned-n", 1.0, "own untried")])
def test_transfer_record_carries_help_given_to_other_tasks(bank_at, selector, reward, chosen):
    """A memory used twice for another task than its own (cos 0.7 to its intent) with `reward` carries
    that record to a third task (cos 0.49 to the second: the kernel gives it no weight) under
    `conditioned-t`, and beats the third task's untried memory iff it helped; `conditioned-n` ignores it."""
    bank = MemoryBank(bank_at("b"), "external:test:8")
    own, second = np.eye(8)[0], 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[1]
    third = 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[2]
    params = RetrieveParams(k2=1, selector=selector, sim_mean=0.5, sim_std=0.5)
    with bank:
        [foreign] = [r.id for r in bank.ingest_many([{"intent": "its own task", "experience": "x",
                                                       "vector": own.tolist()}])]
        for _ in range(2):
            bank.reward(reward, retrieval_id=bank.retrieve("second task", params, vector=second.tolist()).id)
        [untried] = [r.id for r in bank.ingest_many([{"intent": "third task", "experience": "z",
                                                       "vector": third.tolist()}])]
        got = bank.retrieve("third task", params, vector=third.tolist())
    assert {c.memory_id for c in got.candidates} == {foreign, untried}
    transfer = {c.memory_id: c.transfer for c in got.candidates}
    assert transfer == ({foreign: pytest.approx(2 * reward / 3), untried: 0.0} if selector == "conditioned-t"
                        else {foreign: 0.0, untried: 0.0})
    assert [m["id"] for m in got.memories] == [{"foreign": foreign, "own untried": untried}[chosen]]


def test_transfer_record_is_no_prior_at_the_memorys_own_task(bank_at):
    """Failures for another task lower a memory's utility there and for third tasks, not at its own task."""
    bank = MemoryBank(bank_at("b"), "external:test:8")
    own, second = np.eye(8)[0], 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[1]
    third = 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[2]
    params = RetrieveParams(k2=1, selector="conditioned-t", sim_mean=0.5, sim_std=0.5)
    with bank:
        [memory] = [r.id for r in bank.ingest_many([{"intent": "its own task", "experience": "x", "vector": own.tolist()}])]
        for _ in range(2):
            bank.reward(-1.0, retrieval_id=bank.retrieve("second task", params, vector=second.tolist()).id)
        utility = {name: bank.retrieve(name, params, vector=v.tolist(), record=False).candidates[0].utility
                   for name, v in (("its own task", own), ("third task", third))}
    assert utility["its own task"] == pytest.approx(0.0, abs=1e-6)
    assert utility["third task"] == pytest.approx(-2 / 3, abs=1e-6)


def test_recall_by_memories_freezes_on_the_oldest(bank_at):
    bank, failures, successes = tie_bank(bank_at("b"))
    params = RetrieveParams(k1=5, k2=3, recall="memories")
    recalled = []
    with bank:
        for _ in range(6):
            got = bank.retrieve("heat the apple", params, vector=np.eye(8)[0].tolist())
            recalled.append(frozenset(c.memory_id for c in got.candidates))
            bank.reward(-1.0, retrieval_id=got.id)
    assert all(len(r) == 5 for r in recalled)  # never the whole group
    if bank.store.kind == "sqlite":  # ties by ascending id: frozen on the five oldest, all failures
        assert set(recalled) == {frozenset(failures)}
    # (PostgreSQL returns tied rows in physical order, which rewards' updates change: it wanders instead)


def test_group_pool_keeps_the_newest(bank_at):
    bank, failures, successes = tie_bank(bank_at("b"))
    with bank:
        got = bank.retrieve("x", RetrieveParams(k1=1, k2=1, pool=4), vector=np.eye(8)[0].tolist())
    assert sorted(c.memory_id for c in got.candidates) == sorted((failures + successes)[-4:])


def test_known_utilities():
    task = Synthetic(scenario="c").tasks("train")[0]
    twin, kin = "c0-1", "c6-0"
    assert utility("c", task, f"episode of {twin} (kind heat-1): PASS") == -1
    assert utility("c", task, f"episode of {kin} (kind heat-0): PASS") == 1
    assert utility("c", task, f"episode of {kin} (kind heat-0): FAIL") == 0
    assert {t.meta["kind"] for t in Synthetic(scenario="e").tasks("train")} == {f"t{i}" for i in range(6)}


def test_oracle_shows_useful_memories_never_a_trap_and_always_something_new():
    task = Synthetic(scenario="c").tasks("train")[0]  # c0-0, kind heat-0; c6-0 is its kin, c0-1 its twin
    memories = [(1, "episode of c6-0 (kind heat-0): PASS"), (2, "episode of c0-1 (kind heat-1): PASS"),
                (3, "episode of c6-0 (kind heat-0): PASS"), (4, "episode of c0-0 (kind heat-0): FAIL"),
                (5, "episode of c6-0 (kind heat-0): PASS"), (6, "episode of c3-0 (kind slice-0): PASS")]
    assert oracle_pick("c", task, memories, 3) == [5, 3, 6]  # newest useful, then the newest other; never 2
    assert oracle_pick("c", task, memories[:2], 3) == [1]
    assert oracle_pick("c", task, [], 3) == []


def test_expected_ceiling_of_query_specific_utility_is_the_closed_form():
    p0, p_good = SCENARIOS["a"]
    assert expected_ceiling("a", trials=4000)[6] == pytest.approx(1 - (1 - p0) ** 6, abs=0.01)  # 0.469
    fresh = p0 + (p_good - p0) * (1 - (1 - p0) ** 5)  # 0.428: no replay, one fresh draw per earlier epoch
    assert expected_ceiling("a", trials=4000, replay=False)[6] == pytest.approx(fresh, abs=0.01)


def test_oracle_wins_again_every_task_it_won(tmp_path):
    ceiling = run("a", "oracle", 0, 3, str(tmp_path))
    assert ceiling["rates"]["existed"] > 0  # in a, a useful memory exists exactly when the task was won before
    assert ceiling["accuracy"][3] >= ceiling["rates"]["existed"] == ceiling["rates"]["recalled"]  # replayed wins
    assert not list(tmp_path.iterdir())  # its bank was temporary


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_learns_through_the_harness(tmp_path, scenario):
    """Every scenario runs end to end (seeded, so deterministic); the paper's method beats no memory."""
    learned = run(scenario, "memrl", 0, 4, str(tmp_path))
    baseline = run(scenario, "none", 0, 4, str(tmp_path))
    assert learned["accuracy"][4] >= baseline["accuracy"][4] + 0.1, (learned["accuracy"], baseline["accuracy"])
    assert learned["rates"]["selected"] > 0
    assert learned["rates"]["existed"] >= learned["rates"]["recalled"] >= learned["rates"]["selected"]


@pytest.mark.parametrize("method", sorted(SELECTORS))
@pytest.mark.slow
def test_improved_methods_resume_with_identical_metrics(tmp_path, method):
    assert method in METHODS
    config = BenchConfig(benchmark=ADAPTER, method=method, epochs=3, batch_size=8, threshold=0.3,
                         options={"scenario": "c"})
    full = run_benchmark(config, NO_LLM, runs_dir=str(tmp_path / "full"), workers=0)

    class Stop(Exception):
        pass

    def stop_after_four(event, data, seen=[0]):  # noqa: B006 - a counter across calls
        if event == "episode":
            seen[0] += 1
            if seen[0] == 4 * 8 + 3:  # in the fifth batch, after four committed
                raise Stop

    with pytest.raises(Stop):
        run_benchmark(config, NO_LLM, runs_dir=str(tmp_path / "cut"), workers=0, on_progress=stop_after_four)
    [run_dir] = (tmp_path / "cut").iterdir()
    resumed = run_benchmark(config, NO_LLM, resume=str(run_dir), workers=0)
    for key in ("accuracy", "csr"):
        assert resumed[key] == full[key]
    with MemoryBank(str(run_dir / "bank.db"), index="numpy") as bank:
        params = [json.loads(p) for (p,) in bank.conn.execute("SELECT params FROM retrievals")]
    assert {p["selector"] for p in params} == {SELECTORS[method]}


def test_a_tie_prints_as_a_tie():
    """Paired differences that cancel (as in a scenario where two methods win the same episodes) are 0,
    not float noise that prints as -0.000 and reads as a loss."""
    assert sum([0.1, 0.2, -0.3]) != 0.0
    assert mean_se([0.1, 0.2, -0.3])[0] == 0.0
    assert _pm(mean_se([0.1, 0.2, -0.3])).startswith("+0.000 ± ")


def test_non_inferiority_is_the_lower_bound_above_minus_the_margin():
    """Level within the margin holds; a mean above −margin with too wide an interval does not; a row
    that was not paired with a reference gets no verdict for it."""
    row = {"vs_memrl": mean_se([0.0, -0.02, 0.02, -0.01, 0.01]), "vs_rag": mean_se([-0.04, 0.0, -0.08, 0.04, -0.12])}
    verdicts = non_inferiority(row, margin=0.05)
    assert verdicts["memrl"]["holds"] and verdicts["memrl"]["lower_bound"] == pytest.approx(-2 * row["vs_memrl"][1])
    assert row["vs_rag"][0] > -0.05 and not verdicts["rag"]["holds"]
    assert non_inferiority({"vs_rag": (0.1, 0.01)}, margin=0.05).keys() == {"rag"}
    assert not non_inferiority({"vs_memrl": (-0.05, 0.0)}, margin=0.05)["memrl"]["holds"]  # a bound at −margin
