"""The task streams: a seeded sample of a split, stratified by task type, and each episode's seed.

Both are pure functions of the run's seed and an episode's place in the stream (phase, split,
epoch, position), so a resumed run replays exactly the stream, and the ε-greedy draws, of an
uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
import random

from memrl_bench.framework.protocol import Task


def episode_seed(seed: int, phase: str, split: str, epoch: int, position: int) -> int:
    """A stable per-episode seed for ε-greedy, independent of batch timing and resumes."""
    digest = hashlib.sha256(f"{seed}/{phase}/{split}/{epoch}/{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def stratified_sample(tasks: list[Task], n: int | None, seed: int, split: str) -> list[Task]:
    """A seeded sample of `n` tasks, stratified by `Task.meta["task_type"]`, kept in stream order.

    Every type gets one task, and the rest is shared in proportion to the types' sizes (largest
    remainder); when `n` is below the number of types, `n` types drawn at random get one each.
    All tasks when `n` is None or not below the split's size. (The first N by id can be a single
    type: the first 200 ALFWorld training games by id are all `examine`.)
    """
    if n is None or n >= len(tasks):
        return list(tasks)
    rng = random.Random(episode_seed(seed, "limit", split, 0, 0))
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(str(task.meta.get("task_type", "")), []).append(i)
    types = sorted(groups)
    if n < len(types):  # fewer tasks than types: n distinct types, one task each
        quota = {t: 1 for t in rng.sample(types, n)}
    else:
        spare, rest = n - len(types), len(tasks) - len(types)
        shares = {t: spare * (len(groups[t]) - 1) / rest if rest else 0.0 for t in types}
        quota = {t: 1 + math.floor(shares[t]) for t in types}
        by_remainder = sorted(types, key=lambda t: (-(shares[t] - math.floor(shares[t])), t))
        for t in by_remainder[:n - sum(quota.values())]:
            quota[t] += 1
    chosen = sorted(i for t, k in quota.items() for i in rng.sample(groups[t], k))
    return [tasks[i] for i in chosen]
