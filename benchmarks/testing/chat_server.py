"""A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script.

Tests use it instead of mocks: the real ``openai`` client talks to it over TCP.

``responder(request_json) -> str | dict`` decides each chat answer:

* ``"text"`` -> an assistant message with that content;
* ``{"content": "text", "delay": 1.5}`` -> the same, after sleeping ``delay`` seconds;
* ``{"status": 500, "message": "boom", "headers": {...}, "param": "temperature"}`` -> an HTTP
  error with an OpenAI-style error body (``param`` optional; ``delay`` also applies);
* raising an exception -> HTTP 500 with the exception text.

A request with ``"stream": true`` gets the answer as Server-Sent Events (chunked, one word per chunk).

memrl's endpoint check (``ChatClient.check()``: one user message ``CHECK_PROMPT``) is answered
"OK" by the server itself, so scripted responders need not know it; ``answer_checks=False``
hands it to the responder too (to reject its parameters, say).

``die()`` simulates a crashed server: from then on every connection, open ones included, is
dropped without an answer, and the port stops listening.

Example::

    with ScriptedChatServer(lambda req: "hello") as server:
        client = OpenAI(base_url=server.base_url, api_key="test")
        ...
        assert len(server.requests) == 1
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Responder = Callable[[dict], "str | dict"]


def _count_words(text: str) -> int:
    return len(text.split())


def _prompt_tokens(body: dict) -> int:
    """Plausible prompt token count: words in all message contents."""
    total = 0
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            total += _count_words(content)
        elif isinstance(content, list):
            total += sum(_count_words(part.get("text", "")) for part in content if isinstance(part, dict))
    return total


def embedding_vector(text: str, dim: int) -> list[float]:
    """Deterministic unit vector derived from SHA-256 of ``text`` (same text, same vector)."""
    values: list[float] = []
    counter = 0
    while len(values) < dim:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        for (word,) in struct.iter_unpack(">I", digest):
            values.append(word / 0xFFFFFFFF * 2.0 - 1.0)
        counter += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


class ScriptedChatServer:
    """OpenAI-compatible server (chat completions, models, embeddings) in a daemon thread.

    Attributes:
        base_url: ``"http://127.0.0.1:PORT/v1"``.
        requests: JSON bodies of every chat completion request, in arrival order.
        embedding_requests: JSON bodies of every embeddings request.
        max_in_flight: highest number of chat requests being handled at the same time.
        sent: the exact bytes of every chat completion answer (a stream: its SSE body), in order.
        headers: the HTTP headers of every chat completion request (names lower-cased), in order.
    """

    def __init__(self, responder: Responder, *, model: str = "scripted-model", embedding_dim: int = 16,
                 answer_checks: bool = True) -> None:
        self.responder = responder
        self.answer_checks = answer_checks
        self.model = model
        self.embedding_dim = embedding_dim
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._embedding_requests: list[dict] = []
        self._sent: list[bytes] = []
        self._headers: list[dict[str, str]] = []
        self._in_flight = 0
        self._max_in_flight = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self.dead = False

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict]:
        with self._lock:
            return list(self._requests)

    @property
    def embedding_requests(self) -> list[dict]:
        with self._lock:
            return list(self._embedding_requests)

    @property
    def sent(self) -> list[bytes]:
        with self._lock:
            return list(self._sent)

    @property
    def headers(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self._headers)

    def _record_sent(self, data: bytes) -> None:
        with self._lock:
            self._sent.append(data)

    @property
    def max_in_flight(self) -> int:
        with self._lock:
            return self._max_in_flight

    def start(self) -> "ScriptedChatServer":
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-chat-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def die(self) -> None:
        """Crash: drop every request from now on (no answer) and stop listening; safe from a responder."""
        self.dead = True
        threading.Thread(target=self.stop, daemon=True).start()

    def __enter__(self) -> "ScriptedChatServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- request handling -------------------------------------------------------------

    def _chat(self, body: dict) -> tuple[int, dict, dict[str, str]]:
        """Return (status, JSON payload, extra headers) for one chat request."""
        with self._lock:
            self._requests.append(body)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            try:
                answer: Any = "OK" if self.answer_checks and is_check(body) else self.responder(body)
            except Exception as exc:  # the script simulates a server crash
                return 500, _error_body(f"responder raised {type(exc).__name__}: {exc}", "server_error"), {}
            if isinstance(answer, str):
                answer = {"content": answer}
            if not isinstance(answer, dict):
                return 500, _error_body(f"responder returned {type(answer).__name__}", "server_error"), {}
            if answer.get("delay"):
                time.sleep(float(answer["delay"]))
            status = int(answer.get("status", 200))
            headers = {str(k): str(v) for k, v in answer.get("headers", {}).items()}
            if status != 200:
                message = answer.get("message", f"scripted HTTP {status}")
                return status, _error_body(message, "scripted_error", answer.get("param")), headers
            return 200, self._completion(body, str(answer.get("content", ""))), headers
        finally:
            with self._lock:
                self._in_flight -= 1

    def _completion(self, body: dict, content: str) -> dict:
        prompt_tokens = _prompt_tokens(body)
        completion_tokens = _count_words(content)
        with self._lock:
            number = len(self._requests)
        return {
            "id": f"chatcmpl-scripted-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _embeddings(self, body: dict) -> tuple[int, dict]:
        with self._lock:
            self._embedding_requests.append(body)
        inputs = body.get("input", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        if not all(isinstance(item, str) for item in inputs):
            return 400, _error_body("ScriptedChatServer embeds strings only", "invalid_request_error")
        data = [
            {"object": "embedding", "index": i, "embedding": embedding_vector(text, self.embedding_dim)}
            for i, text in enumerate(inputs)
        ]
        tokens = sum(_count_words(text) for text in inputs)
        return 200, {
            "object": "list",
            "data": data,
            "model": body.get("model", self.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _models(self) -> dict:
        return {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}],
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout); nothing left to answer

            def _stream(self, completion: dict, headers: dict[str, str]) -> None:
                """The completion as Server-Sent Events, one chunk per word, each flushed as it is written."""
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    events = [f"data: {event}\n\n".encode() for event in _stream_events(completion)]
                    server._record_sent(b"".join(events))
                    for data in events:
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _path(self) -> str:
                return self.path.split("?", 1)[0].rstrip("/")

            def do_GET(self) -> None:
                if server.dead:
                    self.close_connection = True
                    return
                if self._path() == "/v1/models":
                    self._send(200, server._models())
                else:
                    self._send(404, _error_body(f"no route GET {self.path}", "not_found"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError as exc:
                    self._send(400, _error_body(f"invalid JSON body: {exc}", "invalid_request_error"))
                    return
                path = self._path()
                if server.dead:  # the crash drops the connection without an answer
                    self.close_connection = True
                    return
                if path == "/v1/chat/completions":
                    with server._lock:
                        server._headers.append({k.lower(): v for k, v in self.headers.items()})
                    status, payload, headers = server._chat(body)
                    if server.dead:
                        self.close_connection = True
                        return
                    if body.get("stream") and status == 200:
                        self._stream(payload, headers)
                    else:
                        server._record_sent(json.dumps(payload).encode())
                        self._send(status, payload, headers)
                elif path == "/v1/embeddings":
                    self._send(*server._embeddings(body))
                else:
                    self._send(404, _error_body(f"no route POST {self.path}", "not_found"))

        return Handler


def _stream_events(completion: dict) -> list[str]:
    """`data:` payloads of a streamed completion: a role chunk, one chunk per word, a finish chunk, [DONE]."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    content = completion["choices"][0]["message"]["content"]
    words = [w + " " for w in content.split(" ")]
    words[-1] = words[-1][:-1]
    deltas = [{"role": "assistant", "content": ""}] + [{"content": w} for w in words if w]
    events = [dict(base, choices=[{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    events.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    return [json.dumps(e) for e in events] + ["[DONE]"]


def is_check(body: dict) -> bool:
    """True for the single request `ChatClient.check()` sends."""
    from memrl_bench.framework.llm import CHECK_PROMPT

    return body.get("messages") == [{"role": "user", "content": CHECK_PROMPT}]


def _error_body(message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "code": None, "param": param}}


def distilling(responder: Callable[[dict], Any], reply: str = "Reuse what worked; avoid what failed.") -> Callable[[dict], Any]:
    """`responder` for the agent, plus a fixed answer to memrl's memory-building (script/reflection) requests."""
    from memrl_cli.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM

    def respond(request: dict) -> Any:
        if request["messages"][0]["content"] in (SCRIPT_SYSTEM, REFLECTION_SYSTEM):
            return reply
        return responder(request)

    return respond
