"""Learning with known answers: one tie rule for every method, luck that does not depend on what is
shown, the synthetic testbed's scenarios (through the real harness, no LLM), and resumes of every method."""

from __future__ import annotations

import json
from statistics import mean

import numpy as np
import pytest

from memrl_bench.framework.config import METHODS, SELECTORS, BenchConfig
from memrl_bench.framework.harness import run_benchmark
from benchmarks.learning.contest import ENDPOINTS, print_report, report, results_of, room, room_verdict, run_all
from benchmarks.learning.play import play
from benchmarks.learning.synthetic import (CHANGE_EPOCH, PLANT_EPOCH, PLANTED, SCENARIOS, Synthetic, choose, planter,
                                           plants, utility)
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


def test_utilities_of_the_new_regimes():
    """f copies its own failures; r's own failures help and a look-alike's mislead; s's passes from the other
    world mislead; p's planted records mislead their target only."""
    f0, r0, p0 = (Synthetic(scenario=x).tasks("train")[0] for x in "frp")  # each: put the apple in the drawer 1
    assert utility("f", f0, "episode of f0 (kind t0): FAIL") == -1
    assert utility("f", f0, "episode of f0 (kind t0): PASS") == 1
    assert utility("f", f0, "episode of f12 (kind t12): FAIL") == 0
    assert utility("r", r0, "episode of r0 (kind t0): FAIL") == 1
    assert utility("r", r0, "episode of r12 (kind t12): FAIL") == -1  # the apple in the cabinet 1: a look-alike
    assert utility("r", r0, "episode of r1 (kind t1): FAIL") == 0
    s0 = Synthetic(scenario="s").tasks("train")[0]  # heat the apple; s6 is another heat task (its kind)
    assert utility("s", s0, "episode of s6 (kind heat, world 0): PASS", now=0) == 1
    assert utility("s", s0, "episode of s6 (kind heat, world 0): PASS", now=1) == -1
    assert utility("s", s0, "episode of s6 (kind heat, world 1): PASS", now=1) == 1
    [(intent, planted), *_] = plants("p")
    assert intent == p0.query and utility("p", p0, planted) == -1
    assert utility("p", Synthetic(scenario="p").tasks("train")[2], planted) == 0
    assert len(plants("p")) == 12 * PLANTED and plants("a") == []


def success_rate(scenario: str, task_index: int, shown: list[str], attempts: int = 400) -> float:
    """The scripted agent's success rate at one task over `attempts` episode seeds (its real luck), showing these
    memories."""
    adapter = Synthetic(scenario=scenario, luck_seed=1)
    task = adapter.tasks("train")[task_index]
    memories = [{"id": i + 1, "experience": text} for i, text in enumerate(shown)]
    return mean(adapter.run_episode(task, memories, None, seed).success for seed in range(attempts))  # type: ignore[arg-type]


def test_in_r_the_same_tasks_failure_reflection_raises_success():
    """r (Reflexion): showing the task's own failed attempt raises success from p0 to p_good; a look-alike's
    failure (the same object, another place) misleads; a stranger's failure changes nothing."""
    p0, p_good = SCENARIOS["r"]
    alone = success_rate("r", 0, [])
    assert alone == pytest.approx(p0, abs=0.05)
    assert success_rate("r", 0, ["episode of r0 (kind t0): FAIL"]) == pytest.approx(p_good, abs=0.05)
    assert success_rate("r", 0, ["episode of r12 (kind t12): FAIL"]) == 0.0
    assert success_rate("r", 0, ["episode of r1 (kind t1): FAIL"]) == alone


def test_in_f_copying_a_failed_record_lowers_success():
    """f (experience-following): the task's own failed attempt, shown, is copied and fails; its pass helps; in a
    (the same stream) the same failure is neutral."""
    alone = success_rate("f", 0, [])
    assert alone > 0.05
    assert success_rate("f", 0, ["episode of f0 (kind t0): FAIL"]) == 0.0
    assert success_rate("f", 0, ["episode of f0 (kind t0): PASS", "episode of f0 (kind t0): FAIL"]) == 0.0
    assert success_rate("f", 0, ["episode of f0 (kind t0): PASS"]) > 0.8
    assert success_rate("a", 0, ["episode of a0 (kind t0): FAIL"]) == success_rate("a", 0, [])


def test_the_judges_see_the_whole_bank_or_phase_as_candidates():
    """`oracle` is rag over every memory (no threshold) showing k2; the others rag's k1 candidates, showing k2."""
    from benchmarks.learning.oracle import WHOLE_BANK, judge_settings

    assert judge_settings("oracle", 5, 3, 0.3) == ({"method": "rag", "k1": WHOLE_BANK, "k2": WHOLE_BANK,
                                                     "threshold": -1.0}, {"chooser": "oracle", "show": 3})
    for judge in ("oracle-recall", "no-failures", "newest"):
        chooser = "oracle" if judge == "oracle-recall" else judge
        assert judge_settings(judge, 5, 3, 0.3) == ({"method": "rag", "k1": 5, "k2": 5, "threshold": 0.3},
                                                    {"chooser": chooser, "show": 3})
    with pytest.raises(ValueError, match="unknown judge"):
        judge_settings("memrl", 5, 3, 0.3)


def test_choosers_pick_by_their_rule():
    """The oracle shows the useful memories, newest first, never a trap (here: no neutral one either);
    `no-failures` keeps the harness's order without failed episodes; `newest` the highest ids."""
    task = Synthetic(scenario="c").tasks("train")[0]  # c0-0, kind heat-0; c6-0 is its kin, c0-1 its twin
    memories = [{"id": i, "experience": text, "outcome": "failure" if "FAIL" in text else "success"} for i, text in [
        (1, "episode of c6-0 (kind heat-0): PASS"), (2, "episode of c0-1 (kind heat-1): PASS"),
        (3, "episode of c6-0 (kind heat-0): PASS"), (4, "episode of c0-0 (kind heat-0): FAIL"),
        (6, "episode of c3-0 (kind slice-0): PASS")]]
    ids = lambda chosen: [m["id"] for m in chosen]  # noqa: E731
    assert ids(choose("oracle", "c", task, memories, 3)) == [3, 1]
    assert ids(choose("no-failures", "c", task, memories, 3)) == [1, 2, 3]
    assert ids(choose("newest", "c", task, memories, 3)) == [6, 4, 3]


def test_the_oracle_is_the_ceiling_through_the_harness(tmp_path):
    """Through the real harness with the same luck: the oracle over the whole bank is at or above rag in every epoch
    of scenario f (where rag copies failures), and its recall-bound twin is between them."""
    runs = {m: play("f", m, 3, str(tmp_path), {"epochs": 3}) for m in ("rag", "oracle-recall", "oracle")}
    for e in (1, 2, 3):
        assert runs["oracle"]["accuracy"][e] >= runs["oracle-recall"]["accuracy"][e] >= runs["rag"]["accuracy"][e]
    assert runs["oracle"]["accuracy"][3] > runs["rag"]["accuracy"][3]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_whole_bank_oracle_is_at_or_above_rag_in_every_scenario(tmp_path, scenario):
    """With the same luck per attempt, the oracle over the whole bank wins every episode rag wins (so every epoch's
    accuracy is at or above rag's), and at or above the oracle over Phase A's candidates."""
    runs = {m: play(scenario, m, 101, str(tmp_path), {"epochs": 4}) for m in ("rag", "oracle-recall", "oracle")}
    for e in range(1, 5):
        assert runs["oracle"]["accuracy"][e] >= runs["oracle-recall"]["accuracy"][e]
        assert runs["oracle"]["accuracy"][e] >= runs["rag"]["accuracy"][e]


def test_planted_records_enter_the_bank_at_the_methods_initial_q(tmp_path):
    """p: before epoch PLANT_EPOCH the attacker's records are in the bank (intent = their target's), claiming a
    pass, at the initial Q of a success under the run's settings (here 0.4, a failure's being 0.1)."""
    summary = play("p", "memrl+q_init={success: 0.4, failure: 0.1}", 1, str(tmp_path), {"epochs": PLANT_EPOCH})
    with MemoryBank(summary["bank"], index="numpy") as bank:
        rows = bank.conn.execute("SELECT intent, outcome, q, visits FROM memories WHERE source = 'planted' "
                                 "ORDER BY id").fetchall()
        first_seen = bank.conn.execute(  # each planted record's Q the first time recall saw it
            "SELECT c.q FROM retrieval_candidates c JOIN memories m ON m.id = c.memory_id WHERE m.source = 'planted' "
            "AND c.retrieval_id = (SELECT MIN(retrieval_id) FROM retrieval_candidates WHERE memory_id = m.id)"
        ).fetchall()
        episodes_before = bank.conn.execute("SELECT COUNT(*) FROM memories WHERE source != 'planted' AND id < ?",
                                            (bank.conn.execute("SELECT MIN(id) FROM memories WHERE source = "
                                                               "'planted'").fetchone()[0],)).fetchone()[0]
    assert [r[0] for r in rows] == [intent for intent, _ in plants("p")]
    assert {r[1] for r in rows} == {"success"} and episodes_before == 24 * (PLANT_EPOCH - 1)
    assert len(first_seen) == len(rows) and {q for (q,) in first_seen} == {0.4}  # recalled at Q_init
    assert any(q != 0.4 for _, _, q, _ in rows)  # then rewarded: the method learns from them as from its own


def test_the_planter_writes_at_the_q_it_is_given_when_its_epoch_starts(tmp_path):
    """The attacker writes `plants` into the bank at the start of epoch PLANT_EPOCH only, at the Q it is given."""
    path = str(tmp_path / "bank.db")
    MemoryBank(path, "external:test:8").close()
    MemoryBank(path, create=False).close()
    plant = planter("p", path, 0.37)
    plant("epoch", {"epoch": PLANT_EPOCH - 1})
    plant("episode", {"epoch": PLANT_EPOCH})
    with MemoryBank(path, create=False) as bank:
        assert bank.conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0] == 0
    plant("epoch", {"epoch": PLANT_EPOCH})
    with MemoryBank(path, create=False) as bank:
        rows = bank.conn.execute("SELECT q, outcome, source FROM memories").fetchall()
    assert len(rows) == len(plants("p")) and set(rows) == {(0.37, "success", "planted")}
    planter("a", path, 0.37)("epoch", {"epoch": PLANT_EPOCH})  # no attacker in other scenarios
    with MemoryBank(path, create=False) as bank:
        assert bank.conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0] == len(plants("p"))


def test_the_environment_changes_in_s_at_its_epoch():
    """s finds an episode's epoch from its seed (the run's seed is the luck seed), and refuses a seed of another run."""
    from memrl_bench.framework.sampling import episode_seed

    adapter = Synthetic(scenario="s", luck_seed=5)
    assert adapter.epoch(episode_seed(5, "train", "train", CHANGE_EPOCH, 3)) == CHANGE_EPOCH
    assert adapter.epoch(episode_seed(5, "eval", "heldout", 2, 0)) == 2
    with pytest.raises(ValueError, match="luck_seed"):
        adapter.epoch(episode_seed(6, "train", "train", 1, 0))
    task = adapter.tasks("train")[0]
    stale = [{"id": 1, "experience": "episode of s6 (kind heat, world 0): PASS"}]
    seed = episode_seed(5, "train", "train", CHANGE_EPOCH, 0)
    assert adapter.run_episode(task, stale, None, seed).info["trap_shown"]  # type: ignore[arg-type]
    seed = episode_seed(5, "train", "train", CHANGE_EPOCH - 1, 0)
    assert adapter.run_episode(task, stale, None, seed).info["useful_shown"]  # type: ignore[arg-type]


def rows_of(values: dict[str, dict[str, list[float]]], seeds: int = 4) -> list[dict]:
    """Results rows (scenario → method → accuracy per epoch), the same curve on every seed but for a small wobble
    of every method but rag in scenario x."""
    return [{"scenario": scenario, "method": method, "seed": seed, "heldout_before": 0.0, "heldout_after": 0.0,
             "csr": 0.0, "accuracy": [a + 0.01 * (seed % 2) * (method != "rag" and scenario == "x") for a in curve]}
            for scenario, curves in values.items() for method, curve in curves.items() for seed in range(seeds)]


def test_auc_is_the_mean_accuracy_over_the_epochs():
    assert ENDPOINTS["auc"]({"accuracy": [0.1, 0.2, 0.6]}) == pytest.approx(0.3)
    assert ENDPOINTS["last_epoch"]({"accuracy": [0.1, 0.2, 0.6]}) == 0.6
    declaration = {"scenarios": ["x"], "methods": ["rag"], "testbed": {"epochs": 3}}
    got = report(declaration, rows_of({"x": {"rag": [0.1, 0.2, 0.6]}}))["by_scenario"]["x"]["rag"]
    assert got["auc"]["mean"] == pytest.approx(0.3) and got["last_epoch"]["mean"] == pytest.approx(0.6)


def test_a_scenario_without_room_is_reported_as_no_room_and_not_averaged(capsys):
    """x: the ceiling is above rag on every seed (room); y: the ceiling equals rag (no room). The mean room is
    x's alone, and the report says y has none."""
    declaration = {"name": "t", "scenarios": ["x", "y"], "methods": ["rag", "oracle"], "testbed": {"epochs": 2},
                   "room": {"reference": "rag", "ceilings": ["oracle"], "threshold": 0.02}}
    results = rows_of({"x": {"rag": [0.2, 0.4], "oracle": [0.4, 0.8]}, "y": {"rag": [0.3, 0.5], "oracle": [0.3, 0.5]}})
    found = room(declaration["room"], results, ["x", "y"])["oracle"]
    for endpoint, gap in (("last_epoch", 0.4), ("auc", 0.3)):
        assert found[endpoint]["with_room"] == ["x"] and found[endpoint]["no_room"] == ["y"]
        assert not found[endpoint]["cells"]["y"]["has_room"] and found[endpoint]["cells"]["y"]["mean"] == 0.0
        assert found[endpoint]["mean_room"]["mean"] == pytest.approx(gap + 0.005)  # x only, not (x + y) / 2
    assert room({**declaration["room"], "threshold": 0.5}, results, ["x", "y"])["oracle"]["auc"]["mean_room"] is None
    print_report(declaration, report(declaration, results), [0, 1, 2, 3])
    printed = capsys.readouterr().out
    assert "| y | +0.000 [+0.000, +0.000] | no room |" in printed
    assert "room in x; no room in y (not averaged)" in printed


def test_a_testbed_without_a_held_out_split_reports_it_as_not_measured(capsys):
    """ALFWorld's contest rows carry no held-out accuracy (None): the report says n/a for it, and the training
    endpoints and the room rule are computed as for the synthetic testbed."""
    declaration = {"name": "t", "scenarios": ["follow"], "methods": ["rag", "oracle"], "testbed": {"epochs": 2},
                   "room": {"reference": "rag", "ceilings": ["oracle"], "threshold": 0.02}}
    results = [{**r, "heldout_before": None, "heldout_after": None}
               for r in rows_of({"follow": {"rag": [0.25, 0.25], "oracle": [0.25, 0.5]}})]
    summary = report(declaration, results)
    assert summary["overall"]["rag"]["heldout"]["mean"] is None
    assert summary["overall"]["oracle"]["last_epoch"]["mean"] == pytest.approx(0.5)
    assert summary["room"]["oracle"]["last_epoch"]["with_room"] == ["follow"]
    print_report(declaration, summary, [0, 1, 2, 3])
    printed = capsys.readouterr().out
    assert "| rag | +0.250 [+0.250, +0.250] | +0.250 [+0.250, +0.250] | n/a |" in printed
    assert "| follow | oracle | 0.250 ±0.000 | 0.500 ±0.000 | n/a | n/a |" in printed


def test_a_contest_resumed_plays_only_the_runs_not_finished(tmp_path):
    """After a crash, `--resume` keeps the finished runs (read back from their directories) and plays the rest."""
    declaration = {"scenarios": ["a"], "methods": ["rag"], "testbed": {"epochs": 2, "batch_size": 8, "k1": 5, "k2": 3,
                                                                       "threshold": 0.3}}
    first = run_all(declaration, [1], str(tmp_path))
    done = results_of(tmp_path, 2)
    assert done == first
    both = run_all(declaration, [1, 2], str(tmp_path), done=done)
    assert len(list(tmp_path.glob("*/summary.json"))) == 2 and both[0] == first[0] and both[1]["seed"] == 2
    assert run_all(declaration, [1, 2], str(tmp_path), done=both) == both  # nothing left to play


def test_room_rule_asks_for_half_the_room_or_non_inferiority():
    """Where the ceiling leaves room, the method must capture half of it (interval above); where it leaves
    none, it must be non-inferior within the margin."""
    rows = []
    for seed in range(6):
        wobble = 0.01 * (seed % 3 - 1)
        for scenario, (rag, method, ceiling) in {"x": (0.3, 0.5 + wobble, 0.6), "y": (0.4, 0.4 + wobble, 0.4)}.items():
            rows += [{"scenario": scenario, "method": m, "seed": seed, "accuracy": [v, v]}
                     for m, v in (("rag", rag), ("new", method), ("oracle", ceiling))]
    rule = {"name": "t", "claim": "t", "kind": "room", "method": "new", "reference": "rag", "ceiling": "oracle",
            "endpoints": ["last_epoch", "auc"], "scenarios": ["x", "y"], "room": 0.02, "margin": 0.01, "share": 0.5}
    got = room_verdict(rule, rows)
    assert got["outcome"] == "holds" and [c["has_room"] for c in got["cells"]] == [True, True, False, False]
    assert got["cells"][0]["captured"] == pytest.approx(2 / 3)
    assert room_verdict({**rule, "share": 0.8}, rows)["outcome"] == "fails"


@pytest.mark.parametrize("scenario", list("abcde"))
def test_scenario_learns_through_the_harness(tmp_path, scenario):
    """Every scenario of Contest 1 runs end to end (seeded, so deterministic); the paper's method beats no memory.
    (In the regimes f, s, p and r a memory can mislead: there the method need not beat none.)"""
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
