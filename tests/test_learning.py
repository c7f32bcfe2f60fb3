"""Learning with known answers: one tie rule for every method, luck that does not depend on what is
shown, the synthetic testbed's scenarios (through the real harness, no LLM), and resumes of every method."""

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
from memrl_cli.method.retrieval import RetrieveParams


def tie_bank(location: str) -> tuple[MemoryBank, list[int], list[int]]:
    """One intent (one vector): 5 failures stored first, then 3 successes."""
    bank = MemoryBank(location, "external:test:8")
    vector = np.eye(8)[0].tolist()
    results = bank.ingest_many([{"intent": "heat the apple", "experience": f"attempt {i}", "vector": vector,
                                 "outcome": "failure" if i < 5 else "success"} for i in range(8)])
    ids = [r.id for r in results]
    return bank, ids[:5], ids[5:]


@pytest.mark.parametrize("k2", [1, 3])
@pytest.mark.parametrize("selector", ["memrl", "memrl-conditioned"])
def test_tied_intent_successes_get_selected_after_rewards(bank_at, selector, k2):
    bank, failures, successes = tie_bank(bank_at("b"))
    params = RetrieveParams(k1=5, k2=k2, selector=selector)
    vector = np.eye(8)[0].tolist()
    showed_success = []
    with bank:
        for _ in range(9):  # the agent fails unless shown a success
            got = bank.retrieve("heat the apple", params, vector=vector)
            assert {c.memory_id for c in got.candidates} == set((failures + successes)[-5:])  # the newest five
            shown = {m["id"] for m in got.memories}
            showed_success.append(bool(shown & set(successes)))
            bank.reward(1.0 if showed_success[-1] else -1.0, retrieval_id=got.id)
    assert all(showed_success[-3:]), showed_success


@pytest.mark.parametrize("method", ["rag", "memrl", "memrl-conditioned", "memp", "self-rag"])
def test_ties_go_to_the_newest_memory_for_every_method(bank_at, method):
    """A repeated task's memories all have similarity 1.0: every method, at its own retrieval settings, shows the
    newest of them (with the old lowest-id rule, rag, memp and self-rag showed the three oldest forever)."""
    bank, failures, successes = tie_bank(bank_at("b"))
    params = BenchConfig(benchmark=ADAPTER, method=method).retrieve_params(0)
    with bank:
        got = bank.retrieve("heat the apple", params, vector=np.eye(8)[0].tolist())
    assert [m["id"] for m in got.memories] == successes[::-1]


@pytest.mark.parametrize("reward, chosen", [(1.0, "foreign"), (-1.0, "own untried")])
def test_transfer_record_carries_help_given_to_other_tasks(bank_at, reward, chosen):
    """A memory used twice for another task than its own (cos 0.7 to its intent) with `reward` carries
    that record to a third task (cos 0.49 to the second: the kernel gives it no weight) under
    `memrl-conditioned`, and beats the third task's untried memory iff it helped."""
    selector = "memrl-conditioned"
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
    assert transfer == {foreign: pytest.approx(2 * reward / 3), untried: 0.0}
    assert [m["id"] for m in got.memories] == [{"foreign": foreign, "own untried": untried}[chosen]]


def test_transfer_record_is_no_prior_at_the_memorys_own_task(bank_at):
    """Failures for another task lower a memory's utility there and for third tasks, not at its own task."""
    bank = MemoryBank(bank_at("b"), "external:test:8")
    own, second = np.eye(8)[0], 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[1]
    third = 0.7 * np.eye(8)[0] + np.sqrt(0.51) * np.eye(8)[2]
    params = RetrieveParams(k2=1, selector="memrl-conditioned", sim_mean=0.5, sim_std=0.5)
    with bank:
        [memory] = [r.id for r in bank.ingest_many([{"intent": "its own task", "experience": "x", "vector": own.tolist()}])]
        for _ in range(2):
            bank.reward(-1.0, retrieval_id=bank.retrieve("second task", params, vector=second.tolist()).id)
        utility = {name: bank.retrieve(name, params, vector=v.tolist(), record=False).candidates[0].utility
                   for name, v in (("its own task", own), ("third task", third))}
    assert utility["its own task"] == pytest.approx(0.0, abs=1e-6)
    assert utility["third task"] == pytest.approx(-2 / 3, abs=1e-6)


def test_ties_go_to_the_newest_memory_through_the_sqlite_vec_index(tmp_path):
    """sqlite-vec's KNN returns tied rows in its own order: the search reads past the tie, so the newest win."""
    bank = MemoryBank(str(tmp_path / "vec.db"), "external:test:8", index="vec")
    vector = np.eye(8)[0].tolist()
    with bank:
        ids = [r.id for r in bank.ingest_many([{"intent": "heat the apple", "experience": f"attempt {i}",
                                                "vector": vector} for i in range(12)])]
        got = bank.retrieve("heat the apple", RetrieveParams(k1=5, k2=3, lam=0.0), vector=vector)
    assert [c.memory_id for c in got.candidates] == ids[::-1][:5]


def test_grouped_recall_sees_the_whole_group(bank_at):
    """The `recall="groups"` switch: k1 counts intent groups, so all eight tied memories are candidates."""
    bank, failures, successes = tie_bank(bank_at("b"))
    with bank:
        got = bank.retrieve("x", RetrieveParams(k1=1, k2=3, recall="groups"), vector=np.eye(8)[0].tolist())
    assert {c.memory_id for c in got.candidates} == set(failures + successes)
    assert [m["id"] for m in got.memories] == successes[::-1]


def test_group_pool_keeps_the_most_similar(bank_at):
    """One group (cosines ≥ 0.9) whose newer members are less similar to the query: a pool of 2 keeps the
    two most similar, not the two newest; members get the group's similarity unless `member_similarity`."""
    bank = MemoryBank(bank_at("b"), "external:test:8")
    angles = [0.0, 0.1, 0.2, 0.3]  # cosines 1.0, 0.995, 0.98, 0.955 to the query
    vectors = [(np.cos(a) * np.eye(8)[0] + np.sin(a) * np.eye(8)[1]).tolist() for a in angles]
    with bank:
        ids = [r.id for r in bank.ingest_many([{"intent": f"task {i}", "experience": "x", "vector": v}
                                               for i, v in enumerate(vectors)])]
        grouped = bank.retrieve("q", RetrieveParams(k1=1, recall="groups", pool=2), vector=vectors[0])
        own = bank.retrieve("q", RetrieveParams(k1=1, recall="groups", pool=2, member_similarity=True),
                            vector=vectors[0])
    assert [c.memory_id for c in grouped.candidates] == [ids[1], ids[0]]  # the group's similarity: newest first
    assert [c.similarity for c in grouped.candidates] == pytest.approx([1.0, 1.0])
    assert [c.memory_id for c in own.candidates] == ids[:2]
    assert [c.similarity for c in own.candidates] == pytest.approx([1.0, np.cos(0.1)])


def test_luck_is_drawn_per_attempt_not_from_what_is_shown():
    """The testbed's agent draws its luck from the episode's seed: two methods showing different memories get
    the same draw; another attempt gets another draw; the `prompt` diagnostic depends on what is shown."""
    adapter = Synthetic(scenario="a", luck_seed=7)
    task = adapter.tasks("train")[0]
    shown_a, shown_b = [{"id": 1, "experience": "x"}], [{"id": 2, "experience": "y"}, {"id": 3, "experience": "z"}]
    assert adapter.luck(task, shown_a, seed=11) == adapter.luck(task, shown_b, seed=11) == adapter.luck(task, [], 11)
    assert adapter.luck(task, shown_a, seed=11) != adapter.luck(task, shown_a, seed=12)
    diagnostic = Synthetic(scenario="a", luck_seed=7, luck="prompt")
    assert diagnostic.luck(task, shown_a, seed=11) != diagnostic.luck(task, shown_b, seed=11)


def test_every_method_gets_the_same_draws(tmp_path):
    """Through the harness: at every place of the training stream, rag and memrl (which show different memories)
    get the same draw of the agent's luck (each memory's metadata records its episode's draw)."""
    draws = {}
    for method in ("rag", "memrl"):
        config = BenchConfig(benchmark=ADAPTER, method=method, epochs=3, batch_size=8, threshold=0.3, seed=3,
                             options={"scenario": "a"})
        run_benchmark(config, NO_LLM, runs_dir=str(tmp_path / method), workers=0)
        [run_dir] = (tmp_path / method).iterdir()
        with MemoryBank(str(run_dir / "bank.db"), index="numpy") as bank:
            rows = bank.conn.execute("SELECT task_id, metadata FROM memories").fetchall()
        draws[method] = {(task, json.loads(meta)["epoch"]): json.loads(meta)["luck"] for task, meta in rows}
    assert len(draws["rag"]) == 3 * 24 and draws["rag"] == draws["memrl"]


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


@pytest.mark.parametrize("method", ["memrl", "rag", "memp", *sorted(SELECTORS)])
@pytest.mark.slow
def test_methods_resume_with_identical_metrics(tmp_path, method):
    assert method in METHODS
    config = BenchConfig(benchmark=ADAPTER, method=method, epochs=3, batch_size=8, threshold=0.3,
                         eval_splits=["heldout"], options={"scenario": "c"})
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
    for key in ("accuracy", "csr", "eval_accuracy"):
        assert resumed[key] == full[key]
    with MemoryBank(str(run_dir / "bank.db"), index="numpy") as bank:
        params = [json.loads(p) for (p,) in bank.conn.execute("SELECT params FROM retrievals")]
    assert {p["selector"] for p in params} == {SELECTORS.get(method, "memrl")}


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
