"""`learned`: a research selector that learns from rewards which recalled memories help (issue 41, item 3).

Not a method of the product: a contestant of the synthetic testbed and of real ALFWorld games with the
scripted agent (as the judges of `oracle.py` are measurement devices), run through the real harness with
the same stream, luck and tie rule as every method (its recall is wider: `POOL`); it enters the product
only by winning a declared contest (docs/learning.md, Contest 2: it did not). Its state lives in the
run, not in the bank: a run of it cannot be resumed, and its episodes play in one process, in order.

What it may read is what the product has: each candidate's id, similarity to the query and recorded
outcome (success or failure), the query's text, and after the episode its reward. Never a memory's
text (the testbeds' texts name their hidden truth). It is designed from the mechanisms issue 41 found
in the paper's rule:

* **credit per query, not per memory**: the evidence for a memory is kept per (query, memory), so a
  look-alike's pass that misleads here keeps its good record for its own task (Q is one number per
  memory pooled over all queries);
* **generalisation by kind of record**: a memory with little evidence of its own leans on the record
  of its *cell* — its outcome (success / failure), whether it is the query's own intent (similarity at
  least `SAME`) and whether it is recent (within `RECENT` ids of the newest memory it has seen) — so
  what failures of the same task do here (copied, or a useful reflection), or what old records do
  after the world changed, is learned once for all of them (in the paper's rule a new memory starts at Q 0, below
  look-alikes with earned Q);
* **one kind of record per episode**: the memories shown share the best one's cell, so a reward
  teaches about one kind of record at a time (credit is not smeared across kinds shown together), and
  each estimates within `GAP` of the best (a record that failed here is not shown beside one that won);
* **measured against showing nothing**: a memory is shown only while its estimated success when shown
  beats the success of episodes shown nothing (first learned from the first mini-batch, whose bank is
  empty): a memory likely to hurt is left out, and the agent may see fewer memories or none;
* **recency**: evidence decays (`PAIR_DECAY`, `CELL_DECAY`), so what turned stale is unlearned after a
  failure or two rather than slowly;
* **optimism for the unknown**: a cell never tried starts at `PRIOR`, above a weak agent's success,
  so every kind of record is tried;
* **the harness's timing**: rewards are learned at the end of each mini-batch, when the harness writes
  its own (every episode of a batch is shown what was chosen before any of it played).

The candidates are a wider recall (`POOL` memories above the threshold, in rag's order), so a useful
memory past rag's top k1 can be shown when its evidence says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from memrl_bench.framework.sampling import episode_seed

LEARNED = "learned"  # its name as a contestant (benchmarks.learning.play)
POOL = 16  # candidates recalled (rag's order, above the threshold); the shown ones are at most k2
SAME = 1 - 1e-3  # similarity from which a memory is the query's own intent
PRIOR = 0.5  # the estimated success of a cell never tried (optimistic)
PRIOR_WEIGHT = 1.0  # pseudo-observations behind a cell's prior
PAIR_WEIGHT = 2.0  # pseudo-observations behind a (query, memory)'s prior, its cell's record
PAIR_DECAY = 0.5  # weight of a (query, memory)'s older evidence at each new one
CELL_DECAY = 0.9  # the same for a cell's
GAP = 0.2  # a memory is shown beside the best one only if its estimate is within this of the best's
RECENT = 24  # a memory is recent while fewer than this many ids separate it from the newest seen (an epoch here)


@dataclass
class Tally:
    """Discounted successes and trials."""

    wins: float = 0.0
    trials: float = 0.0

    def add(self, success: bool, decay: float) -> None:
        self.wins = decay * self.wins + float(success)
        self.trials = decay * self.trials + 1.0

    def mean(self, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        """The success rate, shrunk towards `prior` with `weight` pseudo-trials."""
        return (self.wins + weight * prior) / (self.trials + weight)


@lru_cache(maxsize=64)
def places_of(seed: int, streams: tuple[tuple[str, str, int], ...], epochs: int) -> dict[int, tuple[str, int, int]]:
    """Episode seed → (phase, epoch, position in its stream) for a run with this seed (the harness's `episode_seed`)
    whose streams are (phase, split, tasks) at epochs 0 to `epochs`: how an adapter playing the selector's
    choices tells which mini-batch an episode belongs to."""
    return {episode_seed(seed, phase, split, epoch, position): (phase, epoch, position)
            for epoch in range(epochs + 1) for phase, split, n in streams for position in range(n)}


def cell(memory: dict[str, Any], newest: int = 0) -> tuple[str, bool, bool]:
    """A memory's kind of record: its outcome, whether it is the query's own intent, whether it is recent."""
    return str(memory.get("outcome")), float(memory["similarity"]) >= SAME, memory["id"] > newest - RECENT


@dataclass
class LearnedSelector:
    """Chooses up to `show` of the candidates and learns from each episode's reward (one per run)."""

    show: int = 3
    pairs: dict[tuple[str, int], Tally] = field(default_factory=dict)
    cells: dict[tuple[str, bool, bool], Tally] = field(default_factory=dict)
    nothing: Tally = field(default_factory=Tally)
    pending: list[tuple[str, list[tuple[dict[str, Any], Any]], bool]] = field(default_factory=list)
    batch: Any = None
    newest: int = 0

    def estimate(self, query: str, memory: dict[str, Any]) -> float:
        """The estimated success of an episode of `query` shown `memory`: its own evidence for this query,
        shrunk towards its cell's record (itself shrunk towards `PRIOR`)."""
        kind = self.cells.get(cell(memory, self.newest), Tally()).mean(PRIOR)
        return self.pairs.get((query, memory["id"]), Tally()).mean(kind, PAIR_WEIGHT)

    def baseline(self) -> float:
        """The estimated success of an episode shown nothing."""
        return self.nothing.mean(0.0)

    def choose(self, query: str, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The candidates whose estimate beats showing nothing, best first (ties: rag's order), at most `show`."""
        self.newest = max([self.newest, *(m["id"] for m in candidates)])
        bar = self.baseline()
        ranked = sorted(((self.estimate(query, m), -i, m) for i, m in enumerate(candidates)),
                        key=lambda t: t[:2], reverse=True)  # best estimate first, ties in rag's order
        best = [(e, m) for e, _, m in ranked if e > bar]
        if best:  # one kind of record per episode: what it teaches about its kind is not blurred by another
            top, first = best[0][0], cell(best[0][1], self.newest)
            best = [(e, m) for e, m in best if cell(m, self.newest) == first and e >= top - GAP]
        return [m for _, m in best[:self.show]]

    def observe(self, batch: Any, query: str, shown: list[dict[str, Any]], success: bool) -> None:
        """An episode's reward, learned when the next mini-batch (`batch` changes) starts."""
        self.starting(batch)
        self.pending.append((query, [(m, cell(m, self.newest)) for m in shown], success))

    def starting(self, batch: Any) -> None:
        """A mini-batch is about to play: learn what the earlier ones taught."""
        if batch != self.batch:
            self.learn()
            self.batch = batch

    def learn(self) -> None:
        """Every pending reward into the tallies: shown nothing, each (query, memory) shown, each cell shown."""
        for query, shown, success in self.pending:
            if not shown:
                self.nothing.add(success, CELL_DECAY)
            for m, kind in shown:
                self.pairs.setdefault((query, m["id"]), Tally()).add(success, PAIR_DECAY)
            for kind in {kind for _, kind in shown}:
                self.cells.setdefault(kind, Tally()).add(success, CELL_DECAY)
        self.pending.clear()
