"""HLE's judge: the official judge prompt, the request for a structured verdict, the judge's client and endpoint.

The judge is the agent's own client unless a judge endpoint is configured ($MEMRL_JUDGE_BASE_URL, or
the `judge_base_url` option) or judge options name another model or key (`make_judge`). The agent's
response is quoted into the prompt with its verdict labels renamed (`verdict.neutralise`), the
verdict is asked for as structured output (`VERDICT_FORMAT`, a JSON object otherwise), and
`verdict.read_verdict` reads it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from memrl_bench.adapters.hle.verdict import FIELDS, neutralise
from memrl_bench.framework.llm import ChatClient, LLMError, LLMSettings, resolve_llm_settings
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

# What HLE's judge returns (its `ExtractedAnswer`), asked for as structured output where the endpoint supports it.
VERDICT_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "hle_judgement", "strict": True, "schema": {
    "type": "object", "additionalProperties": False, "required": list(FIELDS),
    "properties": {"extracted_final_answer": {"type": "string"}, "reasoning": {"type": "string"},
                   "correct": {"type": "string", "enum": ["yes", "no"]}, "confidence": {"type": "integer"}}}}}
# Said after HLE's prompt, for an endpoint without structured output (the same reply either way).
JSON_REPLY = ("\n\nReply with one JSON object and nothing else: its keys extracted_final_answer (a string), "
              'reasoning (a string), correct ("yes" or "no") and confidence (an integer from 0 to 100).')
ENV_JUDGE_BASE_URL = "MEMRL_JUDGE_BASE_URL"  # a judge endpoint that is not the agent's (the default when set)
ENV_JUDGE_API_KEY = "MEMRL_JUDGE_API_KEY"  # its key, when it differs from the agent's


def judge_prompt(question: dict[str, Any], response: str) -> str:
    """HLE's judge prompt filled with the question text, the response and the gold answer, then `JSON_REPLY`.

    Every verdict label in the response, in any form a reader sees through (`verdict.neutralise`), is
    renamed first, so a judge that quotes the response cannot hand `read_verdict` a verdict the agent wrote.
    """
    quoted = neutralise(response)
    return JUDGE_PROMPT.format(question=question["question"], response=quoted,
                               correct_answer=question["answer"]) + JSON_REPLY


def ask_judge(judge: LLM, prompt: str, structured: bool, **params: Any) -> tuple[str, bool]:
    """The judge's reply to `prompt`, and whether structured output is (still) to be asked for.

    With `structured`, the request asks for `VERDICT_FORMAT`; an endpoint that refuses the parameter
    (HTTP 400 or 422) is asked again without it, and `False` says to stop asking. Other failures raise.
    """
    messages = [{"role": "user", "content": prompt}]
    if structured:
        try:
            return judge.chat(messages, response_format=VERDICT_FORMAT, **params), True
        except LLMError as exc:
            if exc.status_code not in (400, 422):
                raise
    return judge.chat(messages, **params), False


def same_endpoint(one: str, other: str) -> bool:
    """Whether two base URLs name the same endpoint (scheme, host with loopback names as one, port, path)."""
    def key(url: str) -> tuple[str, str, int | None, str]:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        host = "loopback" if host in ("localhost", "::1") or host.startswith("127.") else host
        try:
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
        except ValueError:
            port = None
        return parts.scheme.lower(), host, port, parts.path.rstrip("/")

    return key(one) == key(other)


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
