"""The cap on observations and answers (memrl_bench.framework.observation_cap), and HLE's use of it."""

from __future__ import annotations

import json
from pathlib import Path

from memrl_bench.framework.observation_cap import MAX_OBSERVATION_BYTES, cap, cut_marker


def test_short_text_is_unchanged_and_long_text_is_cut_and_marked() -> None:
    assert cap("hello") == "hello"
    exact = "é" * (MAX_OBSERVATION_BYTES // 2)  # exactly the limit, in 2-byte characters
    assert cap(exact) == exact
    flood = "x" * (100 << 20)
    cut = cap(flood)
    assert cut == "x" * MAX_OBSERVATION_BYTES + cut_marker(100 << 20, MAX_OBSERVATION_BYTES)
    assert cut.endswith(f"…[cut: {100 << 20} bytes, kept {MAX_OBSERVATION_BYTES}]")


def test_a_cut_never_splits_a_character_and_can_keep_the_end() -> None:
    text = "€" * 10  # 3 bytes each
    assert cap(text, 10) == "€€€" + cut_marker(30, 9)
    answer = "Explanation: " + "y" * 100 + "\nExact Answer: 42"
    kept = cap(answer, 40, tail=17)
    assert kept.endswith("\nExact Answer: 42") and kept.startswith("Explanation: ")
    assert f"[cut: {len(answer)} bytes, kept 40]" in kept


def test_hle_grades_and_remembers_a_capped_answer(tmp_path: Path) -> None:
    """A 4 MB answer is cut in the middle before the judge or the memory sees it; its answer line survives."""
    from memrl_bench.adapters.hle.benchmark import HLE

    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "6 x 7?", "answer": "42", "category": "Math",
                                "answer_type": "exactMatch"}) + "\n")
    bench = HLE(data=str(path))
    task = bench.tasks(bench.train_split)[0]
    response = "Explanation: " + "z" * (4 << 20) + "\nExact Answer: 42\nConfidence: 90%"
    episode = bench.grade(task, response, llm=None)  # type: ignore[arg-type]  # graded locally: no judge call
    assert episode.success and episode.info["graded_by"] == "local"
    assert len(episode.trajectory.encode()) < MAX_OBSERVATION_BYTES + 100
    assert f"…[cut: {len(response)} bytes, kept {MAX_OBSERVATION_BYTES}]" in episode.trajectory
