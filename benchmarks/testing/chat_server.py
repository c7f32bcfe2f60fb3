"""A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script.

Tests use it instead of mocks: the real ``openai`` client talks to it over TCP.

``responder(request_json) -> str | dict`` decides each chat answer:

* ``"text"`` -> an assistant message with that content;
* ``{"content": "text", "delay": 1.5}`` -> the same, after sleeping ``delay`` seconds;
* ``{"tool_calls": [{"name": "f", "arguments": {...}}]}`` -> a call of each function (``content`` optional);
* ``{"status": 500, "message": "boom", "headers": {...}, "param": "temperature"}`` -> an HTTP
  error with an OpenAI-style error body (``param`` optional; ``delay`` also applies);
* raising an exception -> HTTP 500 with the exception text.

A request with ``"stream": true`` gets the answer as Server-Sent Events (chunked, one word per chunk); with
``"stream_options": {"include_usage": true}``, as OpenAI sends it: ``"usage": null`` on every chunk, then one
more chunk with no choices and the usage.

``POST /v1/responses`` (the Responses API) is answered from the same script: the responder gets the
request's JSON (``input``, not ``messages``) and its answer becomes a ``response`` object (a message
item, function-call items), or, streamed, the typed events the ``openai`` SDK parses
(``response.created`` ... ``response.completed``).

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
        requests: JSON bodies of every chat completion (and Responses API) request, in arrival order.
        embedding_requests: JSON bodies of every embeddings request.
        max_in_flight: highest number of chat requests being handled at the same time.
        sent: the exact bytes of every chat completion or response answer (a stream: its SSE body), in order.
        headers: the HTTP headers of every chat completion or response request (names lower-cased), in order.
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
            if "input" in body and "messages" not in body:
                return 200, self._response(body, answer), headers
            return 200, self._completion(body, str(answer.get("content", "")), answer.get("tool_calls")), headers
        finally:
            with self._lock:
                self._in_flight -= 1

    def _completion(self, body: dict, content: str, tool_calls: list[dict] | None = None) -> dict:
        prompt_tokens = _prompt_tokens(body)
        completion_tokens = _count_words(content)
        with self._lock:
            number = len(self._requests)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": [
                {"id": f"call_{number}_{i}", "type": "function",
                 "function": {"name": call["name"], "arguments": _arguments(call)}} for i, call in enumerate(tool_calls)]}
        return {
            "id": f"chatcmpl-scripted-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _response(self, body: dict, answer: dict) -> dict:
        """A Responses API `response` object: a message item (when there is content), then the function calls."""
        content = str(answer.get("content", ""))
        with self._lock:
            number = len(self._requests)
        output: list[dict[str, Any]] = []
        if content or not answer.get("tool_calls"):
            output.append({"type": "message", "id": f"msg_scripted_{number}", "status": "completed",
                           "role": "assistant",
                           "content": [{"type": "output_text", "text": content, "annotations": []}]})
        for i, call in enumerate(answer.get("tool_calls") or []):
            output.append({"type": "function_call", "id": f"fc_scripted_{number}_{i}", "call_id": f"call_{number}_{i}",
                           "name": call["name"], "arguments": _arguments(call), "status": "completed"})
        input_tokens = _input_tokens(body.get("input"))
        output_tokens = _count_words(content)
        return {
            "id": f"resp_scripted_{number}", "object": "response", "created_at": int(time.time()),
            "status": "completed", "model": body.get("model", self.model), "output": output,
            "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "temperature": 1.0, "top_p": 1.0, "error": None,
            "incomplete_details": None, "previous_response_id": body.get("previous_response_id"),
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "total_tokens": input_tokens + output_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
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
            # Headers and body are two writes: with Nagle's algorithm the body waits for the client's delayed
            # ACK (~40 ms on Linux), a stall no real API server has.
            disable_nagle_algorithm = True

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

            def _stream(self, completion: dict, headers: dict[str, str], body: dict) -> None:
                """The completion (or response) as Server-Sent Events, one chunk per word, each flushed as it is
                written."""
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    if completion.get("object") == "response":
                        events = [f"event: {kind}\ndata: {event}\n\n".encode()
                                  for kind, event in _response_events(completion)]
                    else:
                        usage = (body.get("stream_options") or {}).get("include_usage") is True
                        events = [f"data: {event}\n\n".encode() for event in _stream_events(completion, usage)]
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
                if path in ("/v1/chat/completions", "/v1/responses"):
                    with server._lock:
                        server._headers.append({k.lower(): v for k, v in self.headers.items()})
                    status, payload, headers = server._chat(body)
                    if server.dead:
                        self.close_connection = True
                        return
                    if body.get("stream") and status == 200:
                        self._stream(payload, headers, body)
                    else:
                        server._record_sent(json.dumps(payload).encode())
                        self._send(status, payload, headers)
                elif path == "/v1/embeddings":
                    self._send(*server._embeddings(body))
                else:
                    self._send(404, _error_body(f"no route POST {self.path}", "not_found"))

        return Handler


def _arguments(call: dict) -> str:
    arguments = call.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _input_tokens(items: Any) -> int:
    """Plausible input token count of a Responses API `input`: words in its texts."""
    if isinstance(items, str):
        return _count_words(items)
    total = 0
    for item in items if isinstance(items, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            total += _count_words(content)
        elif isinstance(content, list):
            total += sum(_count_words(p.get("text", "")) for p in content if isinstance(p, dict))
    return total


def _words(content: str) -> list[str]:
    words = [w + " " for w in content.split(" ")]
    words[-1] = words[-1][:-1]
    return [w for w in words if w]


def _stream_events(completion: dict, usage: bool = False) -> list[str]:
    """`data:` payloads of a streamed completion: a role chunk, one chunk per word (or per tool call), a finish
    chunk, with `usage` a usage chunk (no choices), [DONE]."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], **({"usage": None} if usage else {})}
    message = completion["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": w} for w in _words(message["content"] or "")]
    deltas += [{"tool_calls": [dict(call, index=i)]} for i, call in enumerate(message.get("tool_calls") or [])]
    events = [dict(base, choices=[{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    events.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": completion["choices"][0]["finish_reason"]}]))
    if usage:
        events.append(dict(base, choices=[], usage=completion["usage"]))
    return [json.dumps(e) for e in events] + ["[DONE]"]


def _response_events(response: dict) -> list[tuple[str, str]]:
    """(type, JSON) of a streamed Responses API answer, as OpenAI sends them: created, in_progress, each
    output item (a message's text one delta per word; a call's arguments in one delta), completed."""
    events: list[dict[str, Any]] = []
    pending = dict(response, status="in_progress", output=[], usage=None)
    events += [{"type": "response.created", "response": pending}, {"type": "response.in_progress", "response": pending}]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": dict(item, status="in_progress", content=[])})
            place = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(dict(place, type="response.content_part.added",
                               part={"type": "output_text", "text": "", "annotations": []}))
            events += [dict(place, type="response.output_text.delta", delta=w, logprobs=[]) for w in _words(text)]
            events.append(dict(place, type="response.output_text.done", text=text, logprobs=[]))
            events.append(dict(place, type="response.content_part.done", part=item["content"][0]))
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": dict(item, status="in_progress", arguments="")})
            place = {"item_id": item["id"], "output_index": index}
            events.append(dict(place, type="response.function_call_arguments.delta", delta=item["arguments"]))
            events.append(dict(place, type="response.function_call_arguments.done", arguments=item["arguments"]))
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [(e["type"], json.dumps(dict(e, sequence_number=n))) for n, e in enumerate(events)]


def is_check(body: dict) -> bool:
    """True for the single request `ChatClient.check()` sends."""
    from memrl_bench.framework.llm import CHECK_PROMPT

    return body.get("messages") == [{"role": "user", "content": CHECK_PROMPT}]


def _error_body(message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "code": None, "param": param}}


def distilling(responder: Callable[[dict], Any], reply: str = "Reuse what worked; avoid what failed.") -> Callable[[dict], Any]:
    """`responder` for the agent, plus a fixed answer to memrl's memory-building (script/reflection) requests."""
    from memrl_bench.framework.experience import REFLECTION_SYSTEM, SCRIPT_SYSTEM

    def respond(request: dict) -> Any:
        if request["messages"][0]["content"] in (SCRIPT_SYSTEM, REFLECTION_SYSTEM):
            return reply
        return responder(request)

    return respond
