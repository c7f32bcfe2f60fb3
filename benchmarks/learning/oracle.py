"""Oracle ceilings of the synthetic testbed: a measurement device, not a retrieval method.

An oracle selector reads the true utility of every memory (`synthetic.utility`), which no real
method can, so it is not a `--method` and never reaches `memrl bench` or `memrl retrieve`. It
replays the harness's stream (same tasks, order, mini-batches, memory ids and the agent's luck
function) and, for each episode, shows up to k2 memories. It plays against the testbed's labelled
diagnostic judge, `luck="prompt"` (the same prompt repeats its outcome), not the per-attempt luck the
methods are compared under (docs/learning.md, Contest 1): there `expected_ceiling(replay=False)` is the
ceiling.

* the exact prompt (memories and order) that last won this task, if there is one: the agent is
  deterministic (the same prompt repeats its outcome), so a replayed win is certain;
* otherwise never a trap; the newest useful memories (up to k2 − 1), then the newest other memory,
  so the prompt changes whenever the bank does and every attempt is a fresh draw of the agent's luck;
* `oracle` chooses among every memory in the bank (the ceiling of any method: recall and
  selection together); `oracle-recall` only among grouped Phase A's candidates (the ceiling of
  Phase B given the recall every method here uses).

Without peeking at the luck, no selector can do better per episode: a task won before is won again
for certain; otherwise success has probability `p_good` when a useful memory is shown and no trap,
`p0` otherwise, and showing a useful memory now is also what makes one exist later. (Replaying a
first-batch win means showing nothing, which a selector cannot do once memories exist: the ceiling
is an upper bound.) In scenario a a useful memory exists only once the task was won, so the
expected ceiling of its epoch e is 1 − (1 − p0)^e (0.469 at epoch 6); `expected_ceiling` computes
every scenario's by Monte Carlo over the agent's luck (a memory is useful exactly when it is a
passed episode of the task's kind, `synthetic.utility`); `replay=False` gives the ceiling of an
agent that draws fresh luck every episode (a stochastic model).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from memrl_bench.framework.config import BenchConfig
from benchmarks.learning.synthetic import SCENARIOS, Synthetic, utility
from memrl_bench.framework.protocol import Task
from memrl_cli.bank import MemoryBank, MemoryInput

ORACLES = ("oracle", "oracle-recall")


def oracle_pick(scenario: str, task: Task, candidates: list[tuple[int, str]], k2: int) -> list[int]:
    """Ids to show for `task` among (id, memory text) candidates, by true utility (see the module doc)."""
    scored = [(mid, utility(scenario, task, text)) for mid, text in candidates]
    useful = sorted((mid for mid, u in scored if u == 1), reverse=True)
    others = sorted((mid for mid, u in scored if u >= 0), reverse=True)  # never a trap
    chosen = useful[:max(k2 - 1, 1)]
    chosen += [mid for mid in others if mid not in chosen][:k2 - len(chosen)]
    return chosen


def run_oracle(scenario: str, method: str, seed: int, epochs: int, runs_dir: str, k2: int = 3) -> dict[str, Any]:
    """One oracle run on the harness's stream: per-epoch accuracy and CSR, and the last epoch's useful rates."""
    if method not in ORACLES:
        raise ValueError(f"unknown oracle {method!r}; choose one of {', '.join(ORACLES)}")
    config = BenchConfig(benchmark="synthetic", method="memrl", epochs=epochs, batch_size=8, k2=k2, threshold=0.3,
                         seed=seed)  # the recall parameters of benchmarks.learning.table's runs
    params = config.retrieve_params(0)
    adapter = Synthetic(scenario=scenario, luck_seed=seed, luck="prompt")  # a deterministic agent: see the module doc
    tasks = adapter.tasks("train")
    accuracy: dict[int, float] = {}
    csr: dict[int, float] = {}
    solved: set[str] = set()
    won: dict[str, list[int]] = {}  # task id → the prompt (memory ids, in order) that last won it
    counts = {"existed": 0, "recalled": 0, "selected": 0}
    with tempfile.TemporaryDirectory(dir=runs_dir) as tmp, \
            MemoryBank(str(Path(tmp) / "bank.db"), config.embedder, index="numpy") as bank:
        vectors = dict(zip((t.id for t in tasks), bank.embedder.embed([t.query for t in tasks])))
        texts: dict[int, str] = {}
        for epoch in range(1, epochs + 1):
            wins = 0
            for start in range(0, len(tasks), config.batch_size):
                batch = tasks[start:start + config.batch_size]
                played = []
                for task in batch:
                    if method == "oracle":
                        ids = sorted(texts)
                    else:
                        ids = bank.recall(vectors[task.id], params)[0] if texts else []
                    replay = won.get(task.id)
                    shown = replay if replay is not None and (method == "oracle" or set(replay) <= set(ids)) \
                        else oracle_pick(scenario, task, [(i, texts[i]) for i in ids], k2)
                    episode = adapter.run_episode(task, [{"id": i, "experience": texts[i]} for i in shown],
                                                  None)  # type: ignore[arg-type]  # the scripted agent calls no model
                    played.append((task, episode))
                    if episode.success:
                        won[task.id] = shown
                    if epoch == epochs and any(utility(scenario, task, t) == 1 for t in texts.values()):
                        counts["existed"] += 1
                        counts["recalled"] += any(utility(scenario, task, texts[i]) == 1 for i in ids)
                        counts["selected"] += bool(episode.info["useful_shown"])
                results = bank.ingest_many([MemoryInput(intent=t.query, experience=f"TRAJECTORY:\n{e.trajectory}",
                                                        vector=vectors[t.id].tolist()) for t, e in played])
                texts.update({r.id: f"TRAJECTORY:\n{e.trajectory}" for r, (_, e) in zip(results, played)})
                wins += sum(e.success for _, e in played)
                solved |= {t.id for t, e in played if e.success}
            accuracy[epoch] = wins / len(tasks)
            csr[epoch] = len(solved) / len(tasks)
    return {"accuracy": accuracy, "csr": csr, "rates": {k: v / len(tasks) for k, v in counts.items()}}


def expected_ceiling(scenario: str, epochs: int = 6, batch_size: int = 8, trials: int = 20_000,
                     seed: int = 0, replay: bool = True) -> dict[int, float]:
    """The `oracle`'s expected accuracy per epoch, over fresh luck: a task won before is won again (with
    `replay`); otherwise it succeeds with `p_good` when a passed episode of its kind was stored in an
    earlier mini-batch, else with `p0`."""
    adapter = Synthetic(scenario=scenario)
    tasks = adapter.tasks("train")
    rng = random.Random(seed)
    wins = dict.fromkeys(range(1, epochs + 1), 0)
    for _ in range(trials):
        passed: set[str] = set()  # kinds with a passed episode in the bank
        won: set[str] = set()  # tasks won before
        for epoch in range(1, epochs + 1):
            for start in range(0, len(tasks), batch_size):
                batch = tasks[start:start + batch_size]
                ok = [(replay and t.id in won)
                      or rng.random() < (adapter.p_good if t.meta["kind"] in passed else adapter.p0) for t in batch]
                wins[epoch] += sum(ok)
                passed |= {t.meta["kind"] for t, success in zip(batch, ok) if success}
                won |= {t.id for t, success in zip(batch, ok) if success}
    return {epoch: n / (trials * len(tasks)) for epoch, n in wins.items()}


def main() -> None:
    """Print every scenario's expected last-epoch ceiling (6 epochs, batches of 8), deterministic and
    stochastic agent."""
    for scenario in SCENARIOS:
        print(f"{scenario}: {expected_ceiling(scenario)[6]:.3f} (fresh luck every episode: "
              f"{expected_ceiling(scenario, replay=False)[6]:.3f})")


if __name__ == "__main__":
    main()
