"""Humanity's Last Exam (HLE): expert questions, exact or multiple-choice answers, an LLM judge.

The data is user-supplied (cais/hle is gated): a parquet or JSONL file in the cais/hle schema.
One episode is one question: the agent answers once in HLE's Explanation / Answer / Confidence
format; the answer is graded by a local normalised match when that is decisive, otherwise by a
judge model with HLE's official judge prompt. See docs/hle.md.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import threading
import unicodedata
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from memrl_bench.framework.protocol import LLM, Episode, Task, delimited_memories
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMSettings, resolve_llm_settings

# HLE's official answer-format system prompts (centerforaisafety/hle, run_model_predictions.py).
SYSTEM_EXACT_ANSWER = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your final answer}\n"
    "Exact Answer: {your succinct, final answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)
SYSTEM_MULTIPLE_CHOICE = (
    "Your response should be in the following format:\n"
    "Explanation: {your explanation for your answer choice}\n"
    "Answer: {your chosen answer}\n"
    "Confidence: {your confidence score between 0% and 100% for your answer}"
)

# HLE's official judge prompt (centerforaisafety/hle, run_judge_results.py).
JUDGE_PROMPT = r"""Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {question}

[response]: {response}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {correct_answer}

reasoning: Explain why the extracted_final_answer is correct or incorrect based on [correct_answer], focusing only on if there are meaningful differences between [correct_answer] and the extracted_final_answer. Do not comment on any background to the problem, do not attempt to solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches the [correct_answer] given above, or is within a small margin of error for numerical problems. Answer 'no' otherwise, i.e. if there if there are any inconsistencies, ambiguity, non-equivalency, or if the extracted answer is incorrect.


confidence: The extracted confidence score between 0|\%| and 100|\%| from [response]. Put 100 if there is no confidence score available."""

EXACT_MATCH = "exactMatch"
MULTIPLE_CHOICE = "multipleChoice"
REQUIRED_COLUMNS = ("id", "question", "answer", "category")
OPTIONAL_COLUMNS = ("answer_type", "image")
HOW_TO_GET_HLE = (
    "HLE is gated: accept its terms at https://huggingface.co/datasets/cais/hle, log in with "
    '`huggingface-cli login`, then run `python -c "import datasets; '
    "datasets.load_dataset('cais/hle', split='test').to_parquet('hle.parquet')\"` and pass --data hle.parquet"
)
_EXPECTED = "expected columns id, question, answer, category, answer_type (exactMatch|multipleChoice), image (optional)"
_IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


class HLE:
    """HLE adapter: questions from a user-supplied cais/hle file, judged answers.

    `categories` keeps only those categories (a list or a comma-separated string); `sample`
    draws that many questions with `seed`; `val_fraction` moves that share of every category
    (seeded) to the "val" split; `text_only` drops questions with an image (for text-only
    models). `limit` caps every split. The judge is `judge_model` at
    `judge_base_url` (each defaults to the agent's); `judge_api_key_env` names the environment
    variable holding the judge's key when it differs from the agent's. `local_match=False`
    sends every answer to the judge, as HLE's own evaluation does.
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
        self.judge_base_url = judge_base_url
        self.judge_api_key_env = judge_api_key_env
        if judge_api_key_env is not None:
            _judge_api_key(judge_api_key_env)  # fail before any episode, not in every one
        self.judge_max_tokens = int(judge_max_tokens)
        self.judge_temperature = None if judge_temperature is None else float(judge_temperature)
        self.local_match = _as_bool(local_match)
        self._judge_lock = threading.Lock()
        self._judge: LLM | None = None
        rows = load_rows(data)
        if _as_bool(text_only):
            rows = [row for row in rows if not row["image"]]
        rows = _select(rows, _as_list(categories), sample, int(seed))
        self._splits = _split(rows, float(val_fraction), int(seed))
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
        """The response graded: locally when the answer is unambiguous, else by the judge (through `llm`)."""
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
            judge_text = self._judge_client(llm).chat(
                [{"role": "user", "content": judge_prompt(question, response)}],
                temperature=self.judge_temperature,
                max_tokens=self.judge_max_tokens,
            )
            judgement = parse_judgement(judge_text)
        except Exception as exc:  # a judge failure is the environment's, never the agent's
            info["judge_error"] = f"{type(exc).__name__}: {exc}"
            return Episode(False, 1, response, status="JUDGE_ERROR", env_error=True, info=info)
        info["judge"] = judgement
        return _episode(judgement["correct"] == "yes", response, info)

    def close(self) -> None:
        """Nothing to release: the judge client holds no resources beyond its HTTP pool."""

    def _judge_client(self, llm: LLM) -> LLM:
        """The judge: the agent's own client unless judge options ask for another endpoint or model."""
        if self.judge_model is None and self.judge_base_url is None and self.judge_api_key_env is None:
            return llm
        with self._judge_lock:
            if self._judge is None:
                self._judge = _make_judge(llm, self.judge_model, self.judge_base_url, self.judge_api_key_env,
                                          self.judge_temperature)
            return self._judge


def _make_judge(llm: LLM, model: str | None, base_url: str | None, api_key_env: str | None,
                temperature: float | None = 0.0) -> LLM:
    """A separate ChatClient for the judge, inheriting the agent's settings where not overridden."""
    overrides: dict[str, Any] = {"temperature": temperature}
    if model is not None:
        overrides["model"] = model
    if base_url is not None:
        overrides["base_url"] = base_url
    if api_key_env is not None:
        overrides["api_key"] = _judge_api_key(api_key_env)
    agent_settings = getattr(llm, "settings", None)
    if isinstance(agent_settings, LLMSettings):
        return ChatClient(replace(agent_settings, **overrides))
    return ChatClient(resolve_llm_settings(**overrides))


def _judge_api_key(variable: str) -> str:
    key = os.environ.get(variable)
    if not key:
        raise MemrlError(f"HLE judge_api_key_env names {variable}, which is unset or empty: export the judge's API key")
    return key


def _episode(correct: bool, response: str, info: dict[str, Any]) -> Episode:
    return Episode(correct, 1, response, status="PASS" if correct else "FAIL", info=info)


# -- data ---------------------------------------------------------------------------------


def load_rows(data: str | None) -> list[dict[str, Any]]:
    """Read and validate the question file; every row gets a data-URL `image` ("" if none)."""
    if data is None:
        raise MemrlError(f"HLE needs a question file: pass --data PATH (parquet or JSONL). {HOW_TO_GET_HLE}")
    path = Path(data).expanduser()
    if not path.is_file():
        raise MemrlError(f"HLE data file {path} does not exist. {HOW_TO_GET_HLE}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        rows = _read_jsonl(path)
    else:
        raise MemrlError(f"HLE data file {path} must end in .parquet or .jsonl. {HOW_TO_GET_HLE}")
    if not rows:
        raise MemrlError(f"HLE data file {path} holds no questions. {HOW_TO_GET_HLE}")
    missing = [column for column in REQUIRED_COLUMNS if column not in rows[0]]
    if missing:
        raise MemrlError(f"HLE data file {path} lacks column(s) {', '.join(missing)}; {_EXPECTED}. {HOW_TO_GET_HLE}")
    return [_clean_row(row, path, number) for number, row in enumerate(rows, start=1)]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        wanted = [name for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if name in names]
        table = pq.read_table(path, columns=wanted)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise MemrlError(f"cannot read HLE parquet file {path}: {exc}") from None
    return table.to_pylist()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MemrlError(f"HLE data file {path} line {number} is not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise MemrlError(f"HLE data file {path} line {number} is not a JSON object; {_EXPECTED}")
        rows.append(row)
    return rows


def _clean_row(row: dict[str, Any], path: Path, number: int) -> dict[str, Any]:
    missing = [column for column in REQUIRED_COLUMNS if row.get(column) in (None, "")]
    if missing:
        raise MemrlError(f"HLE data file {path} row {number} has empty {', '.join(missing)}; {_EXPECTED}")
    answer_type = row.get("answer_type") or EXACT_MATCH
    if answer_type not in (EXACT_MATCH, MULTIPLE_CHOICE):
        raise MemrlError(
            f"HLE data file {path} row {number} has answer_type {answer_type!r}; use exactMatch or multipleChoice"
        )
    return {
        "id": str(row["id"]),
        "question": str(row["question"]),
        "answer": str(row["answer"]),
        "answer_type": answer_type,
        "category": str(row["category"]),
        "image": image_data_url(row.get("image"), f"{path} row {number}"),
    }


def image_data_url(image: Any, where: str) -> str:
    """The image as a data URL: strings pass through; {'bytes': ...} (raw or base64) is encoded."""
    if image is None or image == "":
        return ""
    if isinstance(image, str):
        return image
    if isinstance(image, dict) and image.get("bytes"):
        raw = image["bytes"]
        if isinstance(raw, str):  # JSON cannot hold bytes, so JSONL files carry them as base64
            raw = base64.b64decode(raw)
        mime = next((kind for magic, kind in _IMAGE_TYPES if raw.startswith(magic)), "image/png")
        return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
    if isinstance(image, dict) and not image.get("bytes") and not image.get("path"):
        return ""
    raise MemrlError(f"HLE image in {where} is neither a data URL string nor {{'bytes': ...}}")


def _select(
    rows: list[dict[str, Any]], categories: list[str] | None, sample: int | None, seed: int
) -> list[dict[str, Any]]:
    """Keep `categories`, check ids are unique, then draw `sample` rows (kept in file order)."""
    if categories:
        known = sorted({row["category"] for row in rows})
        unknown = [category for category in categories if category not in known]
        if unknown:
            raise MemrlError(f"HLE categories {unknown} are not in the data; available: {known}")
        rows = [row for row in rows if row["category"] in categories]
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise MemrlError(f"HLE question id {row['id']!r} appears twice in the data; ids must be unique")
        seen.add(row["id"])
    if sample is not None and int(sample) < len(rows):
        chosen = set(random.Random(seed).sample(range(len(rows)), int(sample)))
        rows = [row for index, row in enumerate(rows) if index in chosen]
    return rows


def _split(rows: list[dict[str, Any]], val_fraction: float, seed: int) -> dict[str, list[Task]]:
    """Seeded per-category split: round(n * val_fraction) questions of every category go to val."""
    val_ids: set[str] = set()
    by_category: dict[str, list[str]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["id"])
    rng = random.Random(seed)
    for category in sorted(by_category):
        ids = by_category[category]
        rng.shuffle(ids)
        val_ids.update(ids[: round(len(ids) * val_fraction)])
    splits: dict[str, list[Task]] = {"train": [], "val": []}
    for row in rows:
        splits["val" if row["id"] in val_ids else "train"].append(_task(row))
    return splits


def _task(row: dict[str, Any]) -> Task:
    meta = {"category": row["category"], "task_type": row["category"], "answer_type": row["answer_type"],
            "has_image": bool(row["image"])}
    return Task(id=row["id"], query=row["question"], payload=row, meta=meta)


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


# -- prompt -------------------------------------------------------------------------------


def build_messages(question: dict[str, Any], memories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System answer format, then the memory block (if any), then the question (text, and image if any)."""
    system = SYSTEM_EXACT_ANSWER if question["answer_type"] == EXACT_MATCH else SYSTEM_MULTIPLE_CHOICE
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    block = memory_block(memories)
    if block:
        messages.append({"role": "system", "content": block})
    if question["image"]:
        content: str | list[dict[str, Any]] = [
            {"type": "text", "text": question["question"]},
            {"type": "image_url", "image_url": {"url": question["image"]}},
        ]
    else:  # a plain string: text-only servers (e.g. llama.cpp chat templates) reject content parts
        content = question["question"]
    messages.append({"role": "user", "content": content})
    return messages


def memory_block(memories: list[dict[str, Any]]) -> str:
    """Memories in full, successful ones first, then failed ones, then those of unknown outcome."""
    sections = (
        ("success", "=== Successful Memories ==="),
        ("failure", "=== Failed Memories (for caution) ==="),
        ("unknown", "=== Other Memories (outcome unknown) ==="),
    )
    parts = []
    for outcome, title in sections:
        chosen = [m for m in memories if (m.get("outcome") or "unknown") == outcome]
        if not chosen:
            continue
        entries = [f"[{i}] Question: {m['intent']}\n{m['experience']}" for i, m in enumerate(chosen, start=1)]
        parts.append(title + "\n" + "\n\n".join(entries))
    return delimited_memories("\n\n".join(parts))


# -- grading ------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(
    r"^[\s>*#_]*(?:final\s+)?(?:exact\s+)?answer[\s*_]*:[ \t*_]*(.*)$", re.IGNORECASE | re.MULTILINE
)
_CONFIDENCE_LINE = re.compile(r"^[\s>*#_]*confidence[\s*_]*:", re.IGNORECASE)
_BOXED = re.compile(r"^\\boxed\{(.*)\}$")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:e[+-]?\d+)?$")
_LETTER = re.compile(r"^[(\[]?([A-Z])[)\]]?[.:]?$")


def extract_answer(response: str) -> str | None:
    """The value of the last "Answer:" / "Exact Answer:" line (or the next line if it is empty)."""
    matches = list(_ANSWER_LINE.finditer(response))
    if not matches:
        return None
    last = matches[-1]
    value = last.group(1).strip()
    if not value:
        for line in response[last.end() :].splitlines():
            if _CONFIDENCE_LINE.match(line):
                break
            if line.strip():
                value = line.strip()
                break
    return value or None


def normalize_answer(text: str) -> str:
    """Case, whitespace, markdown/LaTeX wrapping, edge punctuation and simple numbers normalised."""
    value = re.sub(r"\s+", " ", _unwrap(unicodedata.normalize("NFKC", text))).casefold()
    value = value.rstrip(" .,;:!?\"'").lstrip(" \"'")
    return _canonical_number(value) or value


def _unwrap(text: str) -> str:
    """`text` without markdown bold/code marks, surrounding $...$ and a \\boxed{...}."""
    value = text.replace("**", "").replace("`", "").strip().strip("$").strip()
    boxed = _BOXED.match(value)
    return boxed.group(1).strip() if boxed else value


def _canonical_number(value: str) -> str | None:
    """Canonical form of a plain number ("1,000.50" -> "1000.5", "-0.0" -> "0"), else None."""
    if not value or not _NUMBER.match(value) or not any(ch.isdigit() for ch in value):
        return None
    try:
        number = Decimal(value.replace(",", ""))
    except InvalidOperation:
        return None
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def answer_letter(text: str) -> str | None:
    """The option letter when the answer is a letter alone ("B", "(B)", "B."), else None."""
    match = _LETTER.match(_unwrap(text))
    return match.group(1) if match else None


def local_verdict(extracted: str | None, gold: str, answer_type: str) -> bool | None:
    """True/False when a local comparison decides the grade, None when the judge must decide.

    exactMatch: a normalised match is correct; anything else goes to the judge (answers can be
    equivalent without being equal). multipleChoice: a bare option letter decides both ways
    when the gold answer is a letter too; longer answers go to the judge.
    """
    if extracted is None:
        return None
    if answer_type == EXACT_MATCH:
        return True if normalize_answer(extracted) == normalize_answer(gold) else None
    chosen, correct = answer_letter(extracted), answer_letter(gold)
    if chosen is None or correct is None:
        return None
    return chosen == correct


_VERDICT_LABEL = re.compile(r"\bcorrect(?=\W*:)", re.IGNORECASE)
QUOTED_LABEL = "correct (quoted from the response)"


def judge_prompt(question: dict[str, Any], response: str) -> str:
    """HLE's judge prompt filled with the question text, the response and the gold answer.

    Every `correct:` label in the agent's response (a line, or a JSON key) is renamed first, so
    a judge that quotes the response cannot hand `parse_judgement` a verdict the agent wrote.
    """
    response = _VERDICT_LABEL.sub(QUOTED_LABEL, response)
    return JUDGE_PROMPT.format(question=question["question"], response=response, correct_answer=question["answer"])


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_FIELD = {
    "extracted_final_answer": re.compile(r"extracted_final_answer\W*:\s*(.+)", re.IGNORECASE),
    "reasoning": re.compile(r"reasoning\W*:\s*(.+?)(?=\n\W*correct\W*:|\Z)", re.IGNORECASE | re.DOTALL),
    "correct": re.compile(r"(?:^|\n)\W*correct\W*:\W*(yes|no)\b", re.IGNORECASE),
    "confidence": re.compile(r"confidence\W*:\s*(\d+(?:\.\d+)?)", re.IGNORECASE),
}


def parse_judgement(text: str) -> dict[str, Any]:
    """The judge's verdict from JSON if it holds one, else from its labelled lines.

    Returns extracted_final_answer, reasoning, correct ("yes"/"no") and confidence (int or None).
    Raises ValueError when no yes/no verdict can be found.
    """
    found = _JSON_OBJECT.search(text)
    if found:
        try:
            data = json.loads(found.group(0))
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict) and str(data.get("correct", "")).strip().lower() in ("yes", "no"):
            return {
                "extracted_final_answer": str(data.get("extracted_final_answer", "")),
                "reasoning": str(data.get("reasoning", "")),
                "correct": str(data["correct"]).strip().lower(),
                "confidence": _confidence(data.get("confidence")),
            }
    verdict = _FIELD["correct"].search(text)
    if verdict is None:
        raise ValueError(f"judge reply has no 'correct: yes|no' verdict: {text[:200]!r}")
    fields = {name: pattern.search(text) for name, pattern in _FIELD.items()}
    return {
        "extracted_final_answer": fields["extracted_final_answer"].group(1).strip()
        if fields["extracted_final_answer"]
        else "",
        "reasoning": fields["reasoning"].group(1).strip() if fields["reasoning"] else "",
        "correct": verdict.group(1).lower(),
        "confidence": _confidence(fields["confidence"].group(1) if fields["confidence"] else None),
    }


def _confidence(value: Any) -> int | None:
    try:
        return int(float(str(value).strip().rstrip("%")))
    except (TypeError, ValueError):
        return None
