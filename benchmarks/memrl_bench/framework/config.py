"""What decides a run's outcome: the methods (each one's default λ, Phase-B selector, whether it
remembers and learns a utility, and which benchmarks it applies to: `check_method`) and
`BenchConfig`, the settings stored with every run.

Each setting is one field of `BenchConfig` (type, default, check: `memrl_bench.framework.settings`); the
session (`memrl_bench.framework.session`) reads them from flags and YAML, and the harness
(`memrl_bench.framework.harness`) runs with them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memrl_bench.framework import self_rag
from memrl_cli import validators
from memrl_cli.errors import MemrlError
from memrl_cli.method.learning import check_reward
from memrl_cli.method.retrieval import RetrieveParams
from memrl_bench.framework.settings import check_all, setting

METHODS = {"memrl": 0.5, "rag": 0.0, "none": None}  # method → default λ (None: no memory at all)
METHODS["memp"] = 0.0  # baselines (benchmarks/memrl_bench/framework/baselines.py): MemP retrieves by similarity only
METHODS["reflexion"] = None  # Reflexion: the task's own reflections, no retrieval across tasks
METHODS["self-rag"] = 0.0  # Self-RAG (benchmarks/memrl_bench/framework/self_rag.py): similarity retrieval, then the model's own critique
METHODS["pass@k"] = None  # the authors' pass@k: no memory, each epoch retries only the tasks not yet solved
UNREWARDED = {"memp", "reflexion", "self-rag"}  # memory methods that learn no utility
MEMORYLESS = {"none", "pass@k"}
METHODS["memrl-conditioned"] = 0.5  # the one alternative Phase B kept (docs/method.md): its selector has its name
SELECTORS = {"memrl-conditioned": "memrl-conditioned"}  # method → Phase-B selector (others: the paper's `memrl`)
RECALL_SWITCHES = ("recall", "group_threshold", "pool", "member_similarity", "sim_stats")  # RetrieveParams fields
# Every departure from the paper's rule a run can switch on, with its value off (the paper's): the retrieval
# switches of `memrl_cli.method.retrieval.DEPARTURES`, plus the harness's own (docs/method.md's table lists them all).
HARNESS_DEPARTURES = {"dedup": False, "skip_env_errors": False}


def _at_least_1(name: str, value: Any) -> None:
    validators.whole(name, value, 1)


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise MemrlError(f"{name} must be true or false, got {value!r}")


EVERY = "all"  # `eval_limit: all`: every task of each evaluation split (the authors' full split)


def _eval_limit(name: str, value: Any) -> None:
    if value != EVERY:
        try:
            validators.whole(name, value, 1)
        except MemrlError:
            raise MemrlError(f"{name} must be a whole number of at least 1 or `{EVERY}`, got {value!r}") from None


def parse_eval_limit(text: str | None) -> int | str | None:
    """`--eval-limit`: a number of tasks, `all` (every task of each split), or None (not given)."""
    if text is None or text == EVERY:
        return text
    try:
        return int(text)
    except ValueError:
        raise MemrlError(f"--eval-limit takes a number of tasks or `{EVERY}`, got {text!r}") from None


def _eval_splits(name: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise MemrlError(f"{name} must be a list of split names")


def _options(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise MemrlError(f"{name} must be a mapping of adapter option names to values")


def _q_init(name: str, value: Any) -> None:
    if isinstance(value, dict) and set(value) != {"success", "failure"}:
        raise MemrlError(f"q_init must be a number or {{success: X, failure: Y}}, got {value!r}")
    for number in value.values() if isinstance(value, dict) else [value]:
        validators.finite(name, number)


@dataclass
class BenchConfig:
    """Everything that decides a run's outcome (stored with the run; no secrets).

    `q_init` is one number for every new memory or `{success: X, failure: Y}` by outcome (the
    authors' HLE runner: 1.0 / 0.0). `q_min` hides candidates whose Q is below it in Phase B
    (the authors' BCB/LLB: −0.8). `sim_mean`/`sim_std` fix z(sim)'s statistics (the authors'
    per-benchmark constants) instead of the candidates'. The departures from the paper's rule, each
    off by default: `recall`, `group_threshold`, `pool`, `member_similarity`, `sim_stats` (retrieval,
    `memrl_cli.method.retrieval.DEPARTURES`); `dedup` (an episode whose memory has the same intent and
    experience as a stored one adds none); `skip_env_errors` (an episode the environment failed is
    neither rewarded nor stored, instead of counting as a failure). `embedder` names the bank's embedding
    model (e.g. `openai:text-embedding-3-large`, the authors'). `config_file` records which
    YAML supplied the settings.
    """

    benchmark: str
    method: str = "memrl"
    epochs: int = setting(10, check=_at_least_1)
    batch_size: int = setting(32, check=_at_least_1)
    limit: int | None = setting(None, check=_at_least_1)
    eval_splits: list[str] = setting(factory=list, check=_eval_splits)
    eval_limit: int | str | None = setting(None, check=_eval_limit)
    eval_every: int = setting(1, check=_at_least_1)
    k1: int = setting(5, check=_at_least_1)
    k2: int = setting(3, check=_at_least_1)
    lam: float | None = None
    threshold: float = setting(0.5, check=validators.finite)
    epsilon: float = setting(0.0, check=validators.finite)
    alpha: float = setting(0.3, check=validators.finite)
    success_reward: float = setting(1.0, check=validators.finite)
    failure_reward: float = setting(-1.0, check=validators.finite)
    q_init: float | dict[str, float] = setting(0.0, check=_q_init)
    q_floor: float | None = setting(None, check=validators.finite)
    q_min: float | None = setting(None, check=validators.finite)
    sim_mean: float | None = setting(None, check=validators.finite)
    sim_std: float | None = setting(None, check=validators.finite)
    recall: str = "memories"
    group_threshold: float = setting(0.9, check=validators.finite)
    pool: int = setting(64, check=_at_least_1)
    member_similarity: bool = setting(False, check=_flag)
    sim_stats: str = "candidates"
    dedup: bool = setting(False, check=_flag)
    skip_env_errors: bool = setting(False, check=_flag)
    embedder: str | None = None
    seed: int = setting(0, check=validators.whole)
    data: str | None = None
    options: dict[str, Any] = setting(factory=dict, check=_options)
    config_file: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise MemrlError(f"unknown method {self.method!r}; choose {', '.join(METHODS)}")
        if self.lam is None:
            self.lam = METHODS[self.method]
        elif self.method in ("rag", "memp", "self-rag") and self.lam != 0:
            raise MemrlError(f"{self.method} is similarity-only retrieval (λ = 0); use --method memrl --lambda X "
                             "for another λ")
        if isinstance(self.eval_splits, str):
            self.eval_splits = [s.strip() for s in self.eval_splits.split(",") if s.strip()]
        check_all(self)
        check_reward(1.0, self.alpha)  # α in (0, 1]
        if self.uses_memory:
            self.retrieve_params(0)  # validates k1, k2, λ, threshold, ε

    def sampled_evaluation(self) -> BenchConfig:
        """A new run's settings with its evaluation bounded as its training is: with `limit` N and no
        `eval_limit`, a sample of N tasks of each evaluation split (`eval_limit: all` keeps every one).
        Stored with the run, so a resume plays the same games (a run stored with `limit` and no
        `eval_limit`, from before this rule, keeps its full splits)."""
        if self.eval_limit is None and self.limit is not None:
            return replace(self, eval_limit=self.limit)
        return self

    def eval_sample(self) -> int | None:
        """How many tasks of each evaluation split the run plays (None: all of them)."""
        return None if self.eval_limit in (None, EVERY) else int(self.eval_limit)  # type: ignore[arg-type]

    @property
    def uses_memory(self) -> bool:
        """False for the no-memory baselines (none, pass@k)."""
        return self.method not in MEMORYLESS

    @property
    def learns_q(self) -> bool:
        """True for the methods that reward the memories they injected (Q ← Q + α(R − Q))."""
        return self.uses_memory and self.method not in UNREWARDED

    def retrieve_params(self, seed: int) -> RetrieveParams:
        """Retrieval parameters for one episode (ε-greedy seeded per episode)."""
        return RetrieveParams(k1=self.k1, k2=self.k2, lam=float(self.lam or 0.0), threshold=self.threshold,
                              epsilon=self.epsilon, seed=seed, sim_mean=self.sim_mean, sim_std=self.sim_std,
                              q_min=self.q_min, selector=SELECTORS.get(self.method, "memrl"),
                              **{name: getattr(self, name) for name in RECALL_SWITCHES})

    def initial_q(self, success: bool) -> float:
        """Q of a new memory from an episode with this outcome."""
        if isinstance(self.q_init, dict):
            return float(self.q_init["success" if success else "failure"])
        return float(self.q_init)


def check_method(method: str, name: str, adapter: Any) -> None:
    """Refuse, in one line, a method the benchmark cannot run (`adapter`: its class or an instance)."""
    if method == "self-rag" and not self_rag.applies(adapter):
        raise MemrlError(f"self-rag does not apply to {name}: it needs an episode that is one LLM generation graded "
                         "afterwards (bigcodebench, hle), not a multi-step or LLM-free environment")

