"""Humanity's Last Exam (HLE): expert questions, exact or multiple-choice answers, an LLM judge.

The data is user-supplied (cais/hle is gated): a parquet or JSONL file in the cais/hle schema.
One episode is one question: the agent answers once in HLE's Explanation / Answer / Confidence
format; the answer is graded by a local normalised match when that is decisive, otherwise by a
judge model with HLE's official judge prompt, whose verdict is read from a strict JSON object the
judge wrote (never from text the answer wrote). See docs/hle.md.

This module is the adapter (options, splits, the episode, who judges); its parts are `data` (the
question file), `prompt` (what the agent sees), `match` (local grading), `judge` (the
judge's prompt, request and client) and `verdict` (what counts as the judge's verdict).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from memrl_bench.adapters.hle.data import load_rows, select_questions, split_tasks
from memrl_bench.adapters.hle.judge import (ENV_JUDGE_API_KEY, ENV_JUDGE_BASE_URL, ask_judge, judge_api_key,
                                            judge_prompt, make_judge, same_endpoint)
from memrl_bench.adapters.hle.match import extract_answer, local_verdict
from memrl_bench.adapters.hle.prompt import build_messages
from memrl_bench.adapters.hle.verdict import VerdictUnreadable, read_verdict
from memrl_bench.framework.llm import LLMSettings
from memrl_bench.framework.observation_cap import cap
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError

_ANSWER_TAIL_BYTES = 4096  # what a cut response keeps of its end: the answer and confidence lines


class HLE:
    """HLE adapter: questions from a user-supplied cais/hle file, judged answers.

    `categories` keeps only those categories (a list or a comma-separated string); `sample`
    draws that many questions with `seed`; `val_fraction` moves that share of every category
    (seeded) to the "val" split; `text_only` drops questions with an image (for text-only
    models). `limit` caps every split. The judge is `judge_model` (default: the agent's) at
    `judge_base_url`, else $MEMRL_JUDGE_BASE_URL, else the agent's own endpoint (`grader` then says
    the reward is one the agent could influence); `judge_api_key_env` names the environment
    variable holding the judge's key (default: $MEMRL_JUDGE_API_KEY when set, else the agent's
    key). `local_match=False` sends every answer to the judge, as HLE's own evaluation does.
    """

    name = "hle"
    train_split = "train"
    eval_splits: tuple[str, ...] = ("val",)
    thread_safe = True  # one question per episode; the judge client is made under a lock

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        categories: str | list[str] | None = None,
        sample: int | None = None,
        seed: int = 0,
        val_fraction: float = 0.0,
        text_only: bool = False,
        judge_model: str | None = None,
        judge_base_url: str | None = None,
        judge_api_key_env: str | None = None,
        judge_max_tokens: int = 4096,
        judge_temperature: float | None = 0.0,
        local_match: bool = True,
    ) -> None:
        if not 0.0 <= float(val_fraction) < 1.0:
            raise MemrlError(f"HLE val_fraction must be in [0, 1), got {val_fraction}")
        if sample is not None and int(sample) < 1:
            raise MemrlError(f"HLE sample must be >= 1, got {sample}")
        self.judge_model = judge_model
        self.judge_base_url = judge_base_url or os.environ.get(ENV_JUDGE_BASE_URL) or None
        if judge_api_key_env is None and os.environ.get(ENV_JUDGE_API_KEY):
            judge_api_key_env = ENV_JUDGE_API_KEY
        self.judge_api_key_env = judge_api_key_env
        if judge_api_key_env is not None:
            judge_api_key(judge_api_key_env)  # fail before any episode, not in every one
        self.judge_max_tokens = int(judge_max_tokens)
        self.judge_temperature = None if judge_temperature is None else float(judge_temperature)
        self.local_match = _as_bool(local_match)
        self._judge_lock = threading.Lock()
        self._judge: LLM | None = None
        self._structured = True  # ask the judge for structured output until its endpoint refuses it
        rows = load_rows(data)
        if _as_bool(text_only):
            rows = [row for row in rows if not row["image"]]
        rows = select_questions(rows, _as_list(categories), sample, int(seed))
        self._splits = split_tasks(rows, float(val_fraction), int(seed))
        if limit is not None:
            self._splits = {split: tasks[: int(limit)] for split, tasks in self._splits.items()}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_judge_lock"] = None
        state["_judge"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._judge_lock = threading.Lock()

    def tasks(self, split: str) -> list[Task]:
        """The questions of `split` ("train" or "val"), in file order."""
        if split not in self._splits:
            raise MemrlError(f"HLE has no split {split!r}; choose one of {sorted(self._splits)}")
        return list(self._splits[split])

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        """Ask the question once with `memories` in the prompt, then grade the answer."""
        return self.grade(task, self.generate(task, memories, llm), llm)

    def generate(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> str:
        """The model's response to the question with `memories` in the prompt (not yet graded)."""
        return llm.chat(build_messages(task.payload, memories))

    def grade(self, task: Task, response: str, llm: LLM) -> Episode:
        """The response graded: locally when the answer is unambiguous, else by the judge (through `llm`).

        A response over `observation_cap.MAX_OBSERVATION_BYTES` is cut in the middle first (its
        last `_ANSWER_TAIL_BYTES`, the answer lines, kept; the cut marked): what the judge reads
        and what the memory keeps are bounded.
        """
        response = cap(response, tail=_ANSWER_TAIL_BYTES)
        question = task.payload
        extracted = extract_answer(response)
        info: dict[str, Any] = {
            "category": question["category"],
            "answer_type": question["answer_type"],
            "extracted_answer": extracted,
        }
        verdict = local_verdict(extracted, question["answer"], question["answer_type"]) if self.local_match else None
        if verdict is not None:
            info["graded_by"] = "local"
            return _episode(verdict, response, info)
        info["graded_by"] = "judge"
        try:
            judge_text, self._structured = ask_judge(self._judge_client(llm), judge_prompt(question, response),
                                                     self._structured, temperature=self.judge_temperature,
                                                     max_tokens=self.judge_max_tokens)
        except Exception as exc:  # the judge's endpoint failed: the environment's failure, never the agent's
            info["judge_error"] = f"{type(exc).__name__}: {exc}"
            return Episode(False, 1, response, status="JUDGE_ERROR", env_error=True, info=info)
        try:
            judgement = read_verdict(judge_text)
        except VerdictUnreadable as exc:  # the reply read the answer: a failure the answer may have caused
            info["judge_error"] = str(exc)
            return Episode(False, 1, response, status="JUDGE_UNREADABLE", info=info)
        info["judge"] = judgement
        return _episode(judgement["correct"] == "yes", response, info)

    def grader(self, agent: LLMSettings) -> dict[str, Any]:
        """Who judges the answers of an agent at `agent`: the judge's endpoint ("agent" when it is the agent's
        own, "separate" otherwise), base URL and model, whether the agent could influence the verdicts, and
        then a warning saying so and how to configure a separate judge."""
        base_url = self.judge_base_url or agent.base_url
        model = self.judge_model or agent.model
        own = same_endpoint(base_url, agent.base_url)
        described: dict[str, Any] = {"endpoint": "agent" if own else "separate", "base_url": base_url,
                                     "model": model, "influenceable": own, "local_match": self.local_match}
        if own:
            described["warning"] = (
                f"the HLE judge is the agent's own endpoint ({base_url}, model {model}): the endpoint that answers "
                "also writes the verdicts, a reward the agent could influence; set a separate judge with "
                f"{ENV_JUDGE_BASE_URL} (and {ENV_JUDGE_API_KEY}) or --option judge_base_url=URL")
        return described

    def close(self) -> None:
        """Nothing to release: the judge client holds no resources beyond its HTTP pool."""

    def _judge_client(self, llm: LLM) -> LLM:
        """The judge: the agent's own client unless judge options ask for another endpoint or model."""
        if self.judge_model is None and self.judge_base_url is None and self.judge_api_key_env is None:
            return llm
        with self._judge_lock:
            if self._judge is None:
                self._judge = make_judge(llm, self.judge_model, self.judge_base_url, self.judge_api_key_env,
                                         self.judge_temperature)
            return self._judge


def _episode(correct: bool, response: str, info: dict[str, Any]) -> Episode:
    return Episode(correct, 1, response, status="PASS" if correct else "FAIL", info=info)


def _as_list(categories: str | list[str] | None) -> list[str] | None:
    if categories is None:
        return None
    if isinstance(categories, str):
        return [part.strip() for part in categories.split(",") if part.strip()]
    return [str(category) for category in categories]


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise MemrlError(f"HLE expected a boolean option, got {value!r}")
    return bool(value)
