"""Where the proxy puts a task's receipt in an upstream's answer, in forms the `openai` client keeps.

- A JSON answer (a chat completion, a Responses API `response`): `"memrl": {"retrieval_id": N}` spliced
  in as the first member; every other byte as the upstream sent it (`model_extra["memrl"]` in the SDK).
- A streamed chat completion: the same member spliced into chunks clients read anyway, never a chunk of
  its own: the first chunk (whence `chat.completions.stream()`'s final completion has it), every chunk
  that carries a `finish_reason` (the last chunk with choices), and, when the client asked for
  `stream_options.include_usage`, the usage chunk. So every chunk without choices is one the client asked
  for, and `for chunk in stream: chunk.choices[0]...` works as against the upstream.
- A streamed response: the `memrl` member in the `response` object of `response.completed` (also
  `response.incomplete` and `response.failed`), the event the SDK's `get_final_response()` returns.

Every other event is passed on unchanged, as soon as it is complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable

FINAL_EVENTS = (b"response.completed", b"response.incomplete", b"response.failed")


def receipt(retrieval_id: int) -> dict[str, int]:
    """The receipt member's value."""
    return {"retrieval_id": retrieval_id}


def splice_receipt(content: bytes, retrieval_id: int) -> bytes:
    """A JSON object's bytes with `"memrl": {"retrieval_id": N}` as its first member, the rest untouched."""
    start = len(content) - len(content.lstrip())
    if content[start:start + 1] != b"{":
        return content
    member = json.dumps(receipt(retrieval_id)).encode()
    rest = content[start + 1:]
    comma = b"," if rest.strip() != b"}" else b""
    return content[:start + 1] + b'"memrl":' + member + comma + rest


def _data(event: bytes) -> bytes:
    """The `data:` payload of one SSE event (its data lines joined)."""
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines)


def _end(buffer: bytes) -> tuple[int, int]:
    """(end of the first complete event, start of the next) in `buffer`, (-1, -1) when none is complete."""
    ends = [(buffer.find(sep), len(sep)) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r")]
    found = [(at, size) for at, size in ends if at >= 0]
    if not found:
        return -1, -1
    at, size = min(found)
    return at, at + size


FINISH = re.compile(rb'"finish_reason"\s*:\s*(null|")')  # a choice's finish_reason: null, or a string
NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def finishes(data: bytes) -> bool:
    """Whether a chat chunk's JSON carries a choice with a (non-null) finish_reason."""
    return any(m.group(1) == b'"' for m in FINISH.finditer(data))


class ReceiptStream:
    """An upstream's SSE answer passed on event by event, with the receipt added (see the module doc).
    `on_response_id` is told the id of a streamed response (from its first event that carries one)."""

    def __init__(self, chunks: AsyncIterator[bytes], retrieval_id: int,
                 on_response_id: Callable[[str], None] | None = None) -> None:
        self.chunks = chunks
        self.retrieval_id = retrieval_id
        self.on_response_id = on_response_id
        self.chat = False  # a chat completion's chunks (known from the first event: one with `choices`)
        self.receipt_due = False  # a chat stream whose first chunk of its own (`chat.completion.chunk`) is yet to come
        self.added = False  # a response's final event carries the receipt
        self.first = True

    def _event(self, event: bytes, separator: bytes) -> bytes:
        data = _data(event)
        if data == b"[DONE]" or not data:
            return event + separator
        if self.chat:
            if self.receipt_due and b'"chat.completion.chunk"' in data:
                self.receipt_due = False
                return self._spliced(event) + separator
            if finishes(data) or (NO_CHOICES.search(data) and b'"usage"' in data):
                return self._spliced(event) + separator
            return event + separator
        if self.first or (self.on_response_id is not None and b'"response"' in data[:200]) \
                or any(kind in event[:60] or kind in data[:60] for kind in FINAL_EVENTS):
            try:
                parsed = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return event + separator
            if not isinstance(parsed, dict):
                return event + separator
            if self.first and parsed.get("object") == "chat.completion.chunk":
                self.first, self.chat = False, True
                return self._spliced(event) + separator
            if self.first and isinstance(parsed.get("choices"), list):  # Azure OpenAI's first chunk: `"object": ""`,
                self.first, self.chat, self.receipt_due = False, True, True  # no choices, its prompt_filter_results;
                return event + separator  # (the openai client's stream helpers skip it: the receipt goes on the next)
            self.first = False
            response = parsed.get("response")
            if isinstance(response, dict):
                if self.on_response_id is not None and isinstance(response.get("id"), str):
                    self.on_response_id(response["id"])
                    self.on_response_id = None
                if parsed.get("type", "").encode() in FINAL_EVENTS and not self.added:
                    self.added = True
                    parsed["response"] = {"memrl": receipt(self.retrieval_id), **response}
                    lines = [line for line in event.splitlines() if not line.startswith(b"data:")]
                    return b"\n".join(lines + [b"data: " + json.dumps(parsed).encode()]) + separator
        return event + separator

    def _spliced(self, event: bytes) -> bytes:
        """A chat chunk's event with the receipt as the first member of its JSON (its first data line)."""
        lines = event.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(b"data:"))
        prefix = b"data: " if lines[at].startswith(b"data: ") else b"data:"
        lines[at] = prefix + splice_receipt(lines[at][len(prefix):], self.retrieval_id)
        return b"\n".join(lines)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        buffer = b""
        async for chunk in self.chunks:
            buffer += chunk
            out = []
            while True:
                end, start = _end(buffer)
                if end < 0:
                    break
                out.append(self._event(buffer[:end], buffer[end:start]))
                buffer = buffer[start:]
            if out:
                yield b"".join(out)
        if buffer.strip():
            yield self._event(buffer.rstrip(b"\r\n"), b"\n\n")
        elif buffer:
            yield buffer
