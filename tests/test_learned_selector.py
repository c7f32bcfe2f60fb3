"""The research selector `learned` (benchmarks/learning/learned.py): what it learns from rewards, when, and from
what it may read; and its run through the real harness on the testbed."""

from __future__ import annotations

from typing import Any

from benchmarks.learning.learned import RECENT, LearnedSelector, cell
from benchmarks.learning.play import play


def memory(mid: int, outcome: str = "success", similarity: float = 0.8) -> dict[str, Any]:
    """A candidate as the harness gives it, without its text: the selector must never need a memory's text."""
    return {"id": mid, "outcome": outcome, "similarity": similarity}


def play_batch(selector: LearnedSelector, batch: int, episodes: list[tuple[str, list[dict[str, Any]]]],
               wins: Any) -> list[list[int]]:
    """One mini-batch: every episode chooses before any reward is learned; `wins(query, shown)` is the reward."""
    selector.starting(batch)
    chosen = [(query, selector.choose(query, candidates)) for query, candidates in episodes]
    for query, shown in chosen:
        selector.observe(batch, query, shown, wins(query, shown))
    return [[m["id"] for m in shown] for _, shown in chosen]


def test_a_kind_of_record_that_always_fails_is_no_longer_shown():
    """Failures of the query's own intent always fail when shown (copied), successes win: after a few batches the
    selector shows the success and not the failures, new failures included (learned by their cell)."""
    selector = LearnedSelector(show=3)
    play_batch(selector, 0, [("q0", [])], lambda q, s: False)  # an empty bank: showing nothing fails
    wins = lambda q, shown: all(m["outcome"] == "success" for m in shown) and bool(shown)  # noqa: E731
    for batch in range(1, 6):
        candidates = [memory(10 * batch + 1, "failure", 1.0), memory(10 * batch + 2, "failure", 1.0),
                      memory(3, "success", 1.0)]
        shown = play_batch(selector, batch, [(f"q{batch}", candidates)], wins)
    assert shown == [[3]]


def test_rewards_are_learned_when_the_next_mini_batch_starts():
    """Within a mini-batch every episode is chosen on what earlier batches taught (as the harness writes rewards)."""
    selector = LearnedSelector(show=1)
    first = play_batch(selector, 0, [("q", [memory(1), memory(2)]), ("q", [memory(1), memory(2)])],
                       lambda q, s: False)
    assert first == [[1], [1]]  # the first episode's failure is not yet known to the second
    assert play_batch(selector, 1, [("q", [memory(1), memory(2)])], lambda q, s: True) == [[2]]


def test_evidence_is_kept_per_query():
    """A memory that misleads one query (a look-alike's pass) keeps its good record for another."""
    selector = LearnedSelector(show=1)
    play_batch(selector, 0, [("a", []), ("b", [])], lambda q, s: False)
    for batch in range(1, 4):
        play_batch(selector, batch, [("a", [memory(7), memory(8)]), ("b", [memory(7), memory(8)])],
                   lambda q, shown: (q == "a") == (shown[0]["id"] == 8))
    assert play_batch(selector, 4, [("a", [memory(7), memory(8)]), ("b", [memory(7), memory(8)])],
                      lambda q, s: True) == [[8], [7]]


def test_nothing_is_shown_when_every_candidate_is_below_showing_nothing():
    """Episodes shown nothing win half the time; every memory shown made the episode fail: the agent sees none."""
    selector = LearnedSelector(show=3)
    for batch in range(6):
        play_batch(selector, batch, [("x", []), ("y", []), ("z", [memory(5), memory(6)])],
                   lambda q, shown: not shown and q == "x")
    assert selector.choose("z", [memory(5), memory(6)]) == []


def test_cells_tell_outcome_own_intent_and_recency():
    assert cell(memory(100, "failure", 1.0), newest=100) == ("failure", True, True)
    assert cell(memory(100 - RECENT, "success", 0.9), newest=100) == ("success", False, False)


def test_learned_beats_rag_where_failed_records_are_copied(tmp_path):
    """Through the real harness, same stream and luck (scenario f, seed 3): rag keeps showing the failures of a
    task's own intent, which the agent copies; the learned selector stops showing them and ends above rag."""
    runs = {m: play("f", m, 3, str(tmp_path), {"epochs": 4}) for m in ("rag", "learned")}
    assert runs["learned"]["judge"] and not runs["rag"]["judge"]
    assert runs["learned"]["accuracy"][4] > runs["rag"]["accuracy"][4] + 0.2, (runs["learned"]["accuracy"],
                                                                               runs["rag"]["accuracy"])
