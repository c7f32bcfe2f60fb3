"""HLE's judge: the official judge prompt, the verdict parsed from the judge's reply, the judge client.

The judge is the agent's own client unless judge options name another model, endpoint or key
(`make_judge`). The agent's response is quoted into the prompt with its `correct:` labels renamed,
so a judge that repeats the response cannot hand `parse_judgement` a verdict the agent wrote.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from typing import Any

from memrl_bench.framework.llm import ChatClient, LLMSettings, resolve_llm_settings
from memrl_bench.framework.protocol import LLM
from memrl_cli.errors import MemrlError

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


def make_judge(llm: LLM, model: str | None, base_url: str | None, api_key_env: str | None,
               temperature: float | None = 0.0) -> LLM:
    """A separate ChatClient for the judge, inheriting the agent's settings where not overridden."""
    overrides: dict[str, Any] = {"temperature": temperature}
    if model is not None:
        overrides["model"] = model
    if base_url is not None:
        overrides["base_url"] = base_url
    if api_key_env is not None:
        overrides["api_key"] = judge_api_key(api_key_env)
    agent_settings = getattr(llm, "settings", None)
    if isinstance(agent_settings, LLMSettings):
        return ChatClient(replace(agent_settings, **overrides))
    return ChatClient(resolve_llm_settings(**overrides))


def judge_api_key(variable: str) -> str:
    """The judge's API key from the environment variable `variable`; a MemrlError when unset or empty."""
    key = os.environ.get(variable)
    if not key:
        raise MemrlError(f"HLE judge_api_key_env names {variable}, which is unset or empty: export the judge's API key")
    return key
