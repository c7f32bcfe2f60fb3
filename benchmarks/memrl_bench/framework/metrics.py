"""Runtime-learning metrics, computed only from per-episode records (so anyone can recompute them).

Each record has at least: phase ("train" or "eval"), split, epoch, task_id, success, steps,
env_error. Definitions (epochs are numbered from 1; evaluation epoch 0 is before training):

- accuracy[e]: successes / episodes among the training episodes of epoch e.
- last_epoch_accuracy: accuracy of the last epoch played.
- csr[e] (cumulative success rate): share of training tasks solved in at least one epoch ≤ e.
- forgetting[e] (e ≥ 2): share of training tasks solved in epoch e−1 and failed in epoch e;
  forgetting_rate is its mean over epochs 2..E (0 with a single epoch).
- mean_steps[e]: mean agent steps over the training episodes of epoch e.
- eval_accuracy[split][e]: accuracy on a held-out split evaluated after epoch e (0 = before training).
- env_errors[e]: episodes that failed because of the environment, not the agent (counted as failures
  in accuracy, and reported apart).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def summarise(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """All metrics above from episode records."""
    train: dict[int, dict[str, bool]] = defaultdict(dict)
    steps: dict[int, list[int]] = defaultdict(list)
    env_errors: dict[int, int] = defaultdict(int)
    evals: dict[str, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["phase"] == "train":
            train[r["epoch"]][r["task_id"]] = bool(r["success"])
            steps[r["epoch"]].append(int(r["steps"]))
            env_errors[r["epoch"]] += int(bool(r.get("env_error")))
        else:
            evals[r["split"]][r["epoch"]].append(bool(r["success"]))
    epochs = sorted(train)
    tasks = {t for e in epochs for t in train[e]}
    accuracy = {e: sum(train[e].values()) / len(train[e]) for e in epochs}
    solved: set[str] = set()
    csr: dict[int, float] = {}
    for e in epochs:
        solved |= {t for t, ok in train[e].items() if ok}
        csr[e] = len(solved) / len(tasks)
    forgetting = {e: sum(1 for t, ok in train[e - 1].items() if ok and train[e].get(t) is False) / len(tasks)
                  for e in epochs if e - 1 in train}
    return {
        "epochs": epochs,
        "tasks": len(tasks),
        "accuracy": accuracy,
        "last_epoch_accuracy": accuracy[epochs[-1]] if epochs else None,
        "csr": csr,
        "final_csr": csr[epochs[-1]] if epochs else None,
        "forgetting": forgetting,
        "forgetting_rate": sum(forgetting.values()) / len(forgetting) if forgetting else 0.0,
        "mean_steps": {e: sum(s) / len(s) for e, s in steps.items() if s},
        "env_errors": dict(env_errors),
        "eval_accuracy": {split: {e: sum(v) / len(v) for e, v in sorted(by_epoch.items()) if v}
                          for split, by_epoch in evals.items()},
    }
