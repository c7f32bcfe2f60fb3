"""A scripted ALFWorld agent whose success depends on the memories it is shown (real games, real harness).

The agent plays a game's gold walkthrough only when a memory in its prompt carries that game's
own actions, or by luck (probability `p0`), drawn per attempt: from a hash of the seed, the game and
how many times this run played it before, never from the memories shown, so every method gets the
same draws (common random numbers), and a resumed run counts the attempts it already played.
Otherwise it tours the room's receptacles with `go to`, which never wins. The memories are the
harness's own distillation: the agent answers the script request of a successful episode with
the actions it played ("Actions: a | b | c"), a failed one's reflection request without them.
A memory therefore helps exactly its own game (its walkthrough), not a look-alike with a
similar intent, and a user can see from the receipts (`memrl report`) where learning stalls.

    python -m benchmarks.learning.alfworld_scripted --games 64 --epochs 5 --methods none,rag,memrl

runs each method through `run_benchmark` on a seeded sample of training games covering the six
task types and prints last-epoch accuracy, CSR and the report's existed/recalled/selected figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.learning.alfworld_modes import MODES, Rules, actions_line, check_mode
from benchmarks.learning.learned import LEARNED, POOL, LearnedSelector, places_of
from benchmarks.learning.oracle import CHOOSERS, JUDGES, judge_settings
from memrl_bench.adapters.alfworld.benchmark import AlfworldBenchmark
from memrl_bench.adapters.alfworld.prompt import MEMORY_INTRO, TURN_PREFIX
from memrl_bench.adapters.alfworld.data import SHORT_TYPES, list_games, load_walkthrough
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError
from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO.parent / "shared" / "data" / "alfworld" / "json_2.1.1_full_with_traj.tar.xz"
BENCHMARK = "benchmarks.learning.alfworld_scripted:AlfworldSample"
FOLLOW_THOUGHTS = ("I follow the plan that solved this task.", "My memory has the exact steps; I repeat them.",
                   "The remembered actions worked here before.", "I do what the successful attempt did.")
EXPLORE_THOUGHTS = ("I look for the object in the next receptacle.", "It may be somewhere else; I keep searching.",
                    "I check another place.", "I have not found it yet; I move on.")
PLACED_EPOCHS = 100  # the learned selector places an episode by its seed among this many epochs
REFLECTION = ("The agent walked from receptacle to receptacle without ever taking or handling the target "
              "object. Next time, find the object, take it, process it as the task says, and put it where asked.")


class AlfworldSample(AlfworldBenchmark):
    """ALFWorld with a seeded training stream: `games` games of distinct intents, spread over the task types.

    Options besides ALFWorld's: `games` (how many, default 64), `sample_seed` (default 0). Only games
    whose walkthrough fits in `max_steps` are drawn; evaluation splits are the adapter's own. For the
    judges (benchmarks/learning/oracle.py): `chooser` shows the agent only the `show` memories it picks,
    by the true utility of the agent's `mode` (benchmarks/learning/alfworld_modes.py). The chooser
    `learned` is the contestant of benchmarks/learning/learned.py: it picks by what it learned from the
    rewards of earlier mini-batches (of `batch_size`), placing each episode in its stream by its seed
    (`stream_seed` must be the run's seed); its episodes play one at a time in one process.
    """

    takes_seed = True  # the episode's seed, by which the learned selector places it (the agent's luck is its own)

    def __init__(self, data: str | None = None, limit: int | None = None, games: int = 64, sample_seed: int = 0,
                 mode: str = "plain", chooser: str | None = None, show: int = 3, batch_size: int = 32,
                 stream_seed: int = 0, **options: Any) -> None:
        super().__init__(data=data, limit=limit, **options)
        if int(games) < 1:
            raise MemrlError(f"games must be at least 1, got {games}")
        if chooser is not None and chooser not in (*CHOOSERS, LEARNED):
            raise MemrlError(f"unknown chooser {chooser!r}; choose one of {', '.join((*CHOOSERS, LEARNED))}")
        self.games, self.sample_seed = int(games), int(sample_seed)
        self.mode, self.chooser, self.show = check_mode(mode), chooser, int(show)
        self.batch_size, self.stream_seed = int(batch_size), int(stream_seed)
        self.selector = LearnedSelector(self.show) if chooser == LEARNED else None
        self.thread_safe = self.selector is None  # the learned selector's episodes play in the stream's order
        self._rules: Rules | None = None
        self._rules_lock = threading.Lock()
        self._train_size: int | None = None

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM, seed: int | None = None) -> Episode:
        """ALFWorld's episode, shown only the memories the judge's chooser (or the learned selector) picks."""
        if self.selector is not None:
            return self._learned_episode(task, memories, llm, seed)
        if self.chooser is not None:
            with self._rules_lock:
                if self._rules is None:
                    self._rules = Rules(self.tasks(self.train_split), self.mode)
            memories = self._rules.choose(self.chooser, task.query, memories, self.show)
        return super().run_episode(task, memories, llm)

    def _learned_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM, seed: int | None) -> Episode:
        """The learned selector's episode: it learns the earlier mini-batches' rewards, chooses, and keeps this one's
        reward for when the next mini-batch starts (as the harness commits its own)."""
        assert self.selector is not None
        if self._train_size is None:
            self._train_size = len(self.tasks(self.train_split))
        streams = (("train", "train", self._train_size),)  # the harness names every training stream "train"
        found = places_of(self.stream_seed, streams, PLACED_EPOCHS).get(seed)  # type: ignore[arg-type]
        if found is None:
            raise MemrlError("the learned selector places an episode by its seed: run it with stream_seed set to the "
                             "run's seed, on the training split only (run_methods does)")
        _, epoch, position = found
        batch = ("train", epoch, position // self.batch_size)
        self.selector.starting(batch)
        shown = self.selector.choose(task.query, memories)
        episode = super().run_episode(task, shown, llm)
        self.selector.observe(batch, task.query, shown, episode.success)
        return episode

    def tasks(self, split: str) -> list[Task]:
        """The seeded sample for the training split; other splits as ALFWorld lists them."""
        if split != self.train_split:
            return super().tasks(split)
        return sample_tasks(list_games(self.root, split, self.task_types), self.games, self.sample_seed,
                            self.max_steps, split)[: self.limit]


def sample_tasks(games: list[Any], count: int, seed: int, max_steps: int, split: str) -> list[Task]:
    """`count` games, round-robin over the task types in a seeded order, no two with the same intent."""
    rng = random.Random(seed)
    by_type: dict[str, list[Any]] = {}
    for game in games:
        by_type.setdefault(game.task_type, []).append(game)
    for pool in by_type.values():
        rng.shuffle(pool)
    chosen: list[Any] = []
    intents: set[str] = set()
    types = [t for t in SHORT_TYPES if t in by_type]
    while len(chosen) < count and any(by_type[t] for t in types):
        for task_type in types:
            pool = by_type[task_type]
            while pool and len(chosen) < count:
                game = pool.pop()
                if game.intent not in intents and len(load_walkthrough(game.path)) <= max_steps:
                    chosen.append(game)
                    intents.add(game.intent)
                    break
    rng.shuffle(chosen)
    return [Task(id=g.id, query=g.intent, payload=g.path, meta={"task_type": g.task_type, "split": split})
            for g in chosen]


def _draw(seed: int, *parts: str) -> float:
    digest = hashlib.sha256("\0".join((str(seed), *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


class ScriptedAgent:
    """A chat responder for `ScriptedChatServer` (see `scripted_agent`), with its per-game attempt counts."""

    def __init__(self, respond: Callable[[dict[str, Any]], str], attempts: dict[str, int]) -> None:
        self.respond = respond
        self.attempts = attempts  # task text → episodes of that game started in this run

    def __call__(self, request: dict[str, Any]) -> str:
        return self.respond(request)

    def start_run(self, played: dict[str, int] | None = None) -> None:
        """A new run (another method, or a resumed one that already played `played` episodes per task text)."""
        self.attempts.clear()
        self.attempts.update(played or {})


def scripted_agent(tasks: list[Task], p0: float = 0.2, seed: int = 0, mode: str = "plain") -> ScriptedAgent:
    """A chat responder for `ScriptedChatServer`: the agent's turns and the harness's distillation requests.

    The tasks' intents must be distinct: the agent knows which game it plays from the task text only.
    Its luck is drawn per attempt (the game's attempt number in the run); call `start_run` between runs.
    `mode` (benchmarks/learning/alfworld_modes.py): which shown memories help or mislead it.
    """
    attempts: dict[str, int] = {}
    current: dict[str, float] = {}  # task text → the draw of its episode in play
    lock = threading.Lock()
    rules = Rules(tasks, mode)
    plans = rules.plans
    if len(plans) != len(tasks):
        raise MemrlError("the scripted agent needs tasks with distinct intents")
    receptacles = {query: re.findall(r"\ban? ([a-z]+(?: [a-z]+)* \d+)", query.split("Your task is to:")[0])
                   for query in plans}

    def respond(request: dict[str, Any]) -> str:
        messages = request["messages"]
        if messages[0]["content"] == SCRIPT_SYSTEM:
            played = re.findall(r"^> Action: (.+)$", messages[1]["content"], flags=re.M)
            return ("1. Go to the receptacle that holds the object and take it.\n2. Process it as the task says.\n"
                    f"3. Put it where the task asks.\n{actions_line(played)}")
        if messages[0]["content"] == REFLECTION_SYSTEM:
            query = messages[1]["content"].partition("Task:\n")[2].partition("\n\nTrajectory:\n")[0]
            played = re.findall(r"^> Action: (.+)$", messages[1]["content"], flags=re.M)
            return rules.reflection(query, played, REFLECTION)
        start = max(i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].startswith(TURN_PREFIX))
        task_text = messages[start]["content"][len(TURN_PREFIX):]
        shown = "\n".join(m["content"] for m in messages[:start] if m["role"] == "system" and MEMORY_INTRO in m["content"])
        done = sum(1 for m in messages[start + 1:] if m["role"] == "assistant")
        with lock:
            if done == 0 or task_text not in current:  # an episode's first turn: its attempt's draw
                attempts[task_text] = attempts.get(task_text, 0) + 1
                current[task_text] = _draw(seed, task_text, str(attempts[task_text]))
            draw = current[task_text]
        plan = plans[task_text]
        utility = rules.utility(task_text, shown)
        if utility == -1:  # misled: it replays the failed attempt it is shown, or tours as a look-alike's plan fails
            tried = rules.tried(task_text, shown)
            if tried:
                return f"Thought: I repeat what I tried before.\nAction: {tried[done] if done < len(tried) else 'look'}"
        elif utility == 1 or draw < p0:
            thought = FOLLOW_THOUGHTS[int(draw * 1000) % len(FOLLOW_THOUGHTS)]
            return f"Thought: {thought}\nAction: {plan[done] if done < len(plan) else 'look'}"
        places = receptacles[task_text] or ["look"]
        offset = int(draw * 10**6) % len(places)
        place = places[(offset + done) % len(places)]
        thought = EXPLORE_THOUGHTS[(offset + done) % len(EXPLORE_THOUGHTS)]
        return f"Thought: {thought}\nAction: {'look' if place == 'look' else 'go to ' + place}"

    return ScriptedAgent(respond, attempts)


def run_methods(methods: list[str], *, games: int = 64, epochs: int = 5, p0: float = 0.2, seed: int = 0,
                sample_seed: int = 0, data: str | None = None, workers: int = 2, batch_size: int = 32,
                max_steps: int = 20, runs_dir: str | None = None, examples: str | None = None,
                train_split: str = "train", resume: bool = False, mode: str = "plain") -> list[dict[str, Any]]:
    """Play the sample with each method through `run_benchmark`; one row per method (summary and report).

    A method may be a judge of benchmarks/learning/oracle.py (`oracle`, `oracle-recall`, `no-failures`,
    `newest`): `rag` with the judge's candidate list, the agent shown what its chooser picks; or `learned`
    (benchmarks/learning/learned.py), played in one process (`workers` at most 1), never resumed. `mode` is
    the agent's (benchmarks/learning/alfworld_modes.py); `plain` leaves the settings as they always were.

    With `resume`, a method whose run in `runs_dir` (same settings) did not finish continues it
    from its last committed batch instead of starting over (`unfinished_run`).

    Each row: method, games, epochs, p0, accuracy per epoch, last-epoch accuracy, final CSR, the
    learning report's epochs, its last epoch's existed/recalled/selected, seconds, and the run
    directory (when `runs_dir` is given; otherwise the runs live in a temporary directory).
    """
    from benchmarks.testing.chat_server import ScriptedChatServer

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_bench.framework.llm import LLMSettings
    from memrl_cli.ops.report import learning_report

    data = data or str(ARCHIVE)
    options: dict[str, Any] = {"games": games, "sample_seed": sample_seed, "max_steps": max_steps,
                               "train_split": train_split}
    if examples:
        options["examples"] = examples
    if check_mode(mode) != "plain":
        options["mode"] = mode
    adapter = AlfworldSample(data=data, **options)
    tasks = adapter.tasks(adapter.train_split)
    adapter.examples()  # built once and cached before the workers start
    rows = []
    agent = scripted_agent(tasks, p0, seed, mode)
    with tempfile.TemporaryDirectory() as scratch, ScriptedChatServer(agent) as server:
        settings = LLMSettings(model="scripted-alfworld", base_url=server.base_url, api_key="test", max_retries=0,
                               timeout=120)
        for method in methods:
            settings_of, chooser = method_settings(method, batch_size, seed)
            config = BenchConfig(benchmark=BENCHMARK, epochs=epochs, batch_size=batch_size, data=data, seed=seed,
                                 options={**options, **chooser}, **settings_of)
            started = time.perf_counter()
            unfinished = unfinished_run(runs_dir, config) if resume and runs_dir and method != LEARNED else None
            agent.start_run(played_attempts(unfinished, tasks) if unfinished else None)
            summary = run_benchmark(config, settings, runs_dir=runs_dir or scratch,  # learned: one process, its state
                                    workers=min(workers, 1) if method == LEARNED else workers,
                                    resume=str(unfinished) if unfinished else None)
            report = learning_report(Path(summary["bank"]).parent)
            accuracy = list(summary["accuracy"].values())
            last = report["epochs"][-1]
            own = own_script_counts(Path(summary["bank"]).parent, tasks)
            rows.append({"method": method, "games": len(tasks), "epochs": epochs, "p0": p0,
                         "accuracy": summary["accuracy"], "last_epoch_accuracy": summary["last_epoch_accuracy"],
                         "auc": sum(accuracy) / len(accuracy), "mode": mode,
                         "final_csr": summary["final_csr"], "report": report["epochs"],
                         "last_existed": last["existed"], "last_recalled": last["recalled"],
                         "last_selected": last["selected"], "own_script": own,
                         "seconds": round(time.perf_counter() - started, 1),
                         "run_dir": str(Path(summary["bank"]).parent) if runs_dir else None})
    return rows


def method_settings(method: str, batch_size: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(BenchConfig settings, adapter options) of a method, a judge (benchmarks/learning/oracle.py) or `learned`
    (rag's wider recall of `POOL` candidates, of which the selector shows at most k2)."""
    from memrl_bench.framework.config import BenchConfig

    if method in JUDGES:
        return judge_settings(method, BenchConfig.k1, BenchConfig.k2, BenchConfig.threshold)
    if method == LEARNED:
        return ({"method": "rag", "k1": POOL, "k2": POOL},
                {"chooser": LEARNED, "show": BenchConfig.k2, "batch_size": batch_size, "stream_seed": seed})
    return {"method": method}, {}


def contest_run(mode: str, method: str, seed: int, testbed: dict[str, Any], runs_dir: str) -> dict[str, Any]:
    """One run of a declared contest on ALFWorld (benchmarks/learning/contest.py, a testbed of `kind: alfworld`):
    the contest's scenario is the agent's mode; `seed` seeds the luck, the harness and the sample of games.
    Paths in the testbed (`data`, `examples`) are relative to the repository. The row as the contest keeps it
    (no held-out split: None)."""
    data, examples = testbed.get("data"), testbed.get("examples")
    row, = run_methods([method], games=testbed["games"], epochs=testbed["epochs"], p0=testbed["p0"], seed=seed,
                       sample_seed=seed, data=str(REPO / data) if data else None, workers=0,
                       batch_size=testbed["batch_size"], max_steps=testbed["max_steps"], runs_dir=runs_dir,
                       examples=str(REPO / examples) if examples else None, mode=mode)
    return {"scenario": mode, "method": method, "seed": seed,
            "accuracy": [row["accuracy"][e] for e in range(1, testbed["epochs"] + 1)], "csr": row["final_csr"],
            "heldout_before": None, "heldout_after": None}


def played_attempts(run_dir: Path, tasks: list[Task]) -> dict[str, int]:
    """Episodes per task text that an unfinished run already committed (its episodes.jsonl): the attempts a
    resumed run starts counting from."""
    queries = {t.id: t.query for t in tasks}
    counts: dict[str, int] = {}
    path = run_dir / "episodes.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        query = queries.get(json.loads(line)["task_id"])
        if query is not None:
            counts[query] = counts.get(query, 0) + 1
    return counts


def own_script_counts(run_dir: Path, tasks: list[Task]) -> dict[str, int]:
    """Ground truth for the last epoch of a run: its wins, and how many of its episodes had a memory
    carrying their own game's actions (a success script of the same game) that existed in the bank
    when the episode's retrieval ran, was recalled (a Phase-A candidate), was selected (injected),
    and was selected in an episode that won."""
    from memrl_cli.ops import runs
    from memrl_cli.bank import MemoryBank
    from memrl_cli.ops.report import run_location, training_receipts

    run_id, location = run_location(run_dir)
    with MemoryBank(location, create=False) as bank:
        episodes = [e for e in runs.episodes(bank, run_id) if e["phase"] == "train"]
        texts = bank.store.experiences()
        created = bank.store.created_at(sorted(texts))
        receipts = training_receipts(bank, run_id)
    scripts = {m: set(text.splitlines()) for m, text in texts.items()}
    own_scripts = {t.id: {m for m, lines in scripts.items() if actions_line(load_walkthrough(t.payload)) in lines}
                   for t in tasks}
    last = max(e["epoch"] for e in episodes)
    counts = {"wins": 0, "existed": 0, "recalled": 0, "selected": 0, "selected_won": 0}
    for episode in (e for e in episodes if e["epoch"] == last):
        counts["wins"] += int(episode["success"])
        receipt = receipts.get(episode["retrieval_id"])
        if receipt is None:
            continue
        own = {m for m in own_scripts[episode["task_id"]] if created[m] <= receipt["created_at"]}
        counts["existed"] += bool(own)
        counts["recalled"] += bool(own & receipt["candidates"])
        counts["selected"] += bool(own & receipt["selected"])
        counts["selected_won"] += bool(own & receipt["selected"]) and bool(episode["success"])
    return counts


def unfinished_run(runs_dir: str, config: Any) -> Path | None:
    """The newest run directory under `runs_dir` with exactly `config`'s settings and no summary yet."""
    from dataclasses import asdict

    wanted = json.loads(json.dumps(asdict(config)))
    found = []
    for path in Path(runs_dir).glob("*/config.json"):
        try:
            stored = json.loads(path.read_text())["config"]
        except (OSError, ValueError, KeyError):
            continue
        if stored == wanted and not (path.parent / "summary.json").exists():
            found.append(path.parent)
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,rag,memrl",
                        help="Comma-separated methods, judges (oracle, oracle-recall, no-failures, newest) or the "
                             "research selector learned [none,rag,memrl].")
    parser.add_argument("--mode", default="plain", choices=MODES,
                        help="The agent's rule: plain, follow (failures and look-alikes mislead), reflect "
                             "(its own failure's reflection helps) [plain].")
    parser.add_argument("--games", type=int, default=64, help="Training games in the sample [64].")
    parser.add_argument("--epochs", type=int, default=5, help="Epochs [5].")
    parser.add_argument("--p0", type=float, default=0.2, help="Probability of success by luck [0.2].")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the luck and of the harness [0].")
    parser.add_argument("--sample-seed", type=int, default=0, help="Seed of the game sample [0].")
    parser.add_argument("--workers", type=int, default=2, help="Worker processes [2].")
    parser.add_argument("--batch-size", type=int, default=32, help="Episodes per mini-batch [32].")
    parser.add_argument("--max-steps", type=int, default=20, help="Agent turns per episode [20].")
    parser.add_argument("--data", default=None, help="ALFWorld data [the shared archive].")
    parser.add_argument("--examples", default=None, help="Few-shot examples file [built from training games].")
    parser.add_argument("--runs-dir", default=None, help="Keep the run directories here [a temporary directory].")
    parser.add_argument("--resume", action="store_true",
                        help="Continue each method's unfinished run in --runs-dir (same settings) instead of a new one.")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = parser.parse_args()
    if args.resume and not args.runs_dir:
        parser.error("--resume needs --runs-dir (where the unfinished runs are)")
    rows = run_methods([m.strip() for m in args.methods.split(",") if m.strip()], games=args.games,
                       epochs=args.epochs, p0=args.p0, seed=args.seed, sample_seed=args.sample_seed, data=args.data,
                       workers=args.workers, batch_size=args.batch_size, max_steps=args.max_steps,
                       runs_dir=args.runs_dir, examples=args.examples, resume=args.resume, mode=args.mode)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{rows[0]['games']} games x {args.epochs} epochs, p0 = {args.p0}, mode {args.mode}")
    print("method      last-epoch acc  AUC    CSR    existed recalled selected  own script e/r/s/won  accuracy per epoch"
          "  (last epoch)")
    for r in rows:
        curve = " ".join(f"{v:.2f}" for v in r["accuracy"].values())
        own = "/".join(str(r["own_script"][k]) for k in ("existed", "recalled", "selected", "selected_won"))
        print(f"{r['method']:<11} {r['last_epoch_accuracy']:>14.3f}  {r['auc']:.3f}  {r['final_csr']:.3f}  {r['last_existed']:>7} "
              f"{r['last_recalled']:>8} {r['last_selected']:>8}  {own:>20}  {curve}")


if __name__ == "__main__":
    main()
