"""`memrl proxy` as a real subprocess, driven by the real `openai` client against a scripted upstream: receipts
that keep the client's task id (header, metadata, the Responses API's conversation) and rewards by task id; a
task id reused after its reward opens a new task; task state that survives a restart (and expires); scopes
(header, metadata, `--scope`) that keep one user's memories from another's tasks; a locked or broken bank that
costs a call a bounded wait and never the call; streams with the usage chunk the client asked for."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from benchmarks.testing.chat_server import ScriptedChatServer
from openai import OpenAI
from served import learned_state, serving
from test_proxy import OVEN, tool_loop_responder

from memrl_cli.bank import MemoryBank

EGG = "heat an egg in the microwave, then serve it"
PLANTS = "water the plants on the balcony with the can"
MEMORIES = "<memrl-memories>"


def proxy(db: str, upstream: str, *extra: str, log: list[str] | None = None) -> Any:
    return serving("proxy", "--upstream", upstream, "--port", "0", "--db", db, "--k2", "1", *extra, log=log)


def client(url: str, **kwargs: Any) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="sk-client-key", max_retries=0, **kwargs)


def injected(request: dict) -> str:
    """The memory message a request carried upstream ("" without one)."""
    items = request.get("messages") or request.get("input") or []
    return "".join(str(m.get("content")) for m in items if isinstance(m, dict) and MEMORIES in str(m.get("content")))


@pytest.fixture
def bank(tmp_path: Path) -> str:
    """A bank with a memory for eggs, one for plants, and one for eggs in each of two users' scopes."""
    db = str(tmp_path / "bank.db")
    with MemoryBank(db) as b:
        b.ingest("heat an egg in the microwave", "SCRIPT: microwave 30 s", "success")
        b.ingest("water the plants on the balcony", "SCRIPT: fill the can, water each pot", "success")
        b.ingest("heat an egg in the microwave", "ALICE'S NOTE: her microwave runs hot, 20 s", "success",
                 scope="user:alice")
        b.ingest("heat an egg in the microwave", "BOB'S NOTE: his egg cups are in the drawer", "success",
                 scope="user:bob")
    return db


def q_values(db: str) -> dict[int, float]:
    with MemoryBank(db, create=False) as b:
        return {int(i): float(q) for i, q, _ in b.store.q_and_initial_q()}


def stored(db: str) -> list[tuple[int, str | None, str | None]]:
    """(id, task id, scope) of every receipt."""
    with MemoryBank(db, create=False) as b:
        return [(r["id"], r["task_id"], r["scope"]) for r in reversed(b.store.recent_receipts(1000))]


def test_each_task_is_rewarded_by_its_own_task_id(bank: str) -> None:
    """Two tasks named by the client (a header; metadata), answered, rewarded by their task ids: only each task's
    memory moves; the id used again after its reward opens a new task with its own memories (a ChatOpenAI with one
    X-Memrl-Task-Id for every ticket); the Responses API's conversation is a task id too."""
    with ScriptedChatServer(lambda request: "Done.") as model, proxy(bank, model.base_url) as url:
        chat = client(url)
        egg = chat.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": EGG}], extra_headers={"X-Memrl-Task-Id": "ticket-1"})
        plants = chat.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": PLANTS}], metadata={"memrl_task_id": "ticket-2"})
        assert (egg.headers["X-Memrl-Task-Id"], plants.headers["X-Memrl-Task-Id"]) == ("ticket-1", "ticket-2")
        assert "microwave 30 s" in injected(model.requests[0]) and "each pot" in injected(model.requests[1])
        assert "metadata" not in model.requests[1]  # memrl's key is not forwarded
        for task, reward in (("ticket-2", -1), ("ticket-1", 1)):
            done = httpx2.post(f"{url}/v1/memrl/rewards", json={"task": task, "reward": reward})
            assert done.status_code == 200 and len(done.json()["updated"]) == 1
        assert q_values(bank) == {1: 0.3, 2: -0.3, 3: 0.0, 4: 0.0}
        again = httpx2.post(f"{url}/v1/memrl/rewards", json={"task": "ticket-1", "reward": 1})
        assert again.status_code == 400 and "was already rewarded" in again.json()["error"]["message"]

        reused = chat.chat.completions.with_raw_response.create(  # the next ticket under the same id: a new task
            model="m", messages=[{"role": "user", "content": PLANTS}], extra_headers={"X-Memrl-Task-Id": "ticket-1"})
        assert reused.headers["X-Memrl-Retrieval"] == "3" and "each pot" in injected(model.requests[-1])
        conv = chat.responses.create(model="m", input=EGG, extra_body={"conversation": "conv_42"})
        assert conv.model_extra["memrl"] == {"retrieval_id": 4} and model.requests[-1]["conversation"] == "conv_42"
        done = httpx2.post(f"{url}/v1/memrl/rewards", json=[{"task": "ticket-1", "reward": 1},
                                                             {"task": "conv_42", "reward": -1}])
        assert done.status_code == 200 and [u["id"] for u in done.json()["updated"]] == [2, 1]
    assert stored(bank) == [(1, "ticket-1", None), (2, "ticket-2", None), (3, "ticket-1", None), (4, "conv_42", None)]


def test_a_restart_mid_task_keeps_one_receipt(bank: str) -> None:
    """The proxy stops between two calls of a task (a tool loop with no id; a named task; a Responses API
    continuation by previous_response_id): the restarted proxy continues each with the same receipt and the same
    memories; the same conversation from the start is still a new task; a task past `--task-hours` starts anew."""
    with ScriptedChatServer(tool_loop_responder) as model:
        messages: list[Any] = [{"role": "user", "content": EGG}]
        with proxy(bank, model.base_url) as url:
            first = client(url).chat.completions.create(model="m", messages=messages, tools=[OVEN])
            named = client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": PLANTS}],
                                                        extra_headers={"X-Memrl-Task-Id": "job-9"})
            started = client(url).responses.create(model="m", input=EGG + " (responses)",
                                                   tools=[dict(OVEN["function"], type="function")])
        call = first.choices[0].message
        messages += [call.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "30 s done"}]  # type: ignore[index]
        with proxy(bank, model.base_url) as url:
            second = client(url).chat.completions.create(model="m", messages=messages, tools=[OVEN])
            again = client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "more"}],
                                                        extra_headers={"X-Memrl-Task-Id": "job-9"})
            fc = started.output[0]
            continued = client(url).responses.create(model="m", previous_response_id=started.id, input=[
                {"type": "function_call_output", "call_id": fc.call_id, "output": "30 s done"}])  # type: ignore[union-attr]
            anew = client(url).chat.completions.create(model="m", messages=messages[:1], tools=[OVEN])
        assert second.model_extra["memrl"] == first.model_extra["memrl"] == {"retrieval_id": 1}
        assert again.model_extra["memrl"] == named.model_extra["memrl"] == {"retrieval_id": 2}
        assert continued.model_extra["memrl"] == started.model_extra["memrl"] == {"retrieval_id": 3}
        assert injected(model.requests[3]) == injected(model.requests[0]) != ""  # the same memories after the restart
        assert MEMORIES not in json.dumps(model.requests[5])  # already in the upstream's conversation
        assert anew.model_extra["memrl"] == {"retrieval_id": 4}

        with proxy(bank, model.base_url, "--task-hours", "0.0003") as url:  # about one second
            client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": PLANTS}],
                                                extra_headers={"X-Memrl-Task-Id": "job-10"})
        time.sleep(1.5)
        with proxy(bank, model.base_url, "--task-hours", "0.0003") as url:
            late = client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "more"}],
                                                       extra_headers={"X-Memrl-Task-Id": "job-10"})
        assert late.model_extra["memrl"] == {"retrieval_id": 6}  # expired: a new task
    assert [rid for rid, _, _ in stored(bank)] == [1, 2, 3, 4, 5, 6]


def test_a_scope_keeps_one_users_memories_from_anothers_tasks(bank: str) -> None:
    """Alice's memory never reaches a task of bob's (X-Memrl-Scope, metadata.memrl_scope), nor a task without a
    scope (which sees only the memories without one); `--scope` is the default of requests that name none; what a
    scoped request writes or rewards stays in its scope; a pattern is not a scope."""
    with ScriptedChatServer(lambda request: "Done.") as model:
        with proxy(bank, model.base_url, "--k2", "3") as url:
            chat = client(url)
            for extra in ({"extra_headers": {"X-Memrl-Scope": "user:bob"}}, {"metadata": {"memrl_scope": "user:bob"}},
                          {}):
                chat.chat.completions.create(model="m", messages=[{"role": "user", "content": EGG}], **extra)
                sent = injected(model.requests[-1])
                assert "ALICE'S NOTE" not in sent and "metadata" not in model.requests[-1], extra
                assert ("BOB'S NOTE" in sent) == bool(extra) and ("microwave 30 s" in sent) == (not extra), extra
            refused = httpx2.post(f"{url}/v1/chat/completions", headers={"X-Memrl-Scope": "user:*"},
                                  json={"model": "m", "messages": [{"role": "user", "content": EGG}]})
            assert refused.status_code == 400 and "pattern character" in refused.json()["error"]["message"]
            noted = httpx2.post(f"{url}/v1/memrl/memories", headers={"X-Memrl-Scope": "user:bob"},
                                json={"intent": "boil an egg", "experience": "BOB: 8 minutes"})
            assert noted.status_code == 200
            cross = httpx2.post(f"{url}/v1/memrl/rewards", headers={"X-Memrl-Scope": "user:bob"},
                                json={"retrieval_id": 3, "reward": 1})  # receipt 3 was retrieved without a scope
            assert cross.status_code == 400 and "not in scope user:bob" in cross.json()["error"]["message"]
        with proxy(bank, model.base_url, "--k2", "3", "--scope", "user:alice") as url:
            client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "boil an egg"}])
            sent = injected(model.requests[-1])
            assert "BOB" not in sent and "ALICE'S NOTE" in sent
    assert [scope for _, _, scope in stored(bank)] == ["user:bob", "user:bob", None, "user:alice"]
    with MemoryBank(bank, create=False) as b:
        assert b.store.memory_record(5)["scope"] == "user:bob"  # type: ignore[index]


def locked(db: str) -> sqlite3.Connection:
    """Another process's hold on the bank: its write lock (readers go on, in WAL mode)."""
    holder = sqlite3.connect(db, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO meta (key, value) VALUES ('held', '1')")  # a write: the lock is taken now
    return holder


def test_a_locked_bank_costs_a_bounded_wait_never_the_call(bank: str) -> None:
    """A writer holding the bank: the call is answered after one bank wait, without a receipt, saying why (no file
    path anywhere); the task's next call stores it. A reward meanwhile fails fast with 503, without the path either.
    (A bank that cannot be read at all: the call goes on without memories, the next test.)"""
    log: list[str] = []
    with ScriptedChatServer(lambda request: "Done.") as model, proxy(bank, model.base_url, "--bank-wait", "1",
                                                                    log=log) as url:
        chat = client(url)
        holder = locked(bank)
        try:
            began = time.monotonic()
            raw = chat.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": EGG}], extra_headers={"X-Memrl-Task-Id": "t1"})
            waited = time.monotonic() - began
            assert raw.parse().choices[0].message.content == "Done." and waited < 6, waited
            assert "x-memrl-retrieval" not in raw.headers and "microwave 30 s" in injected(model.requests[-1])
            assert raw.headers["X-Memrl-Warning"] == ("no receipt: the bank is busy: another process holds it; the "
                                                      "task's next call stores it")
            busy = httpx2.post(f"{url}/v1/memrl/rewards", json={"memory_ids": [1], "reward": 1})
            message = busy.json()["error"]["message"]
            assert busy.status_code == 503 and message == "the bank stayed locked by another writer for 1 s; try again"
        finally:
            holder.rollback()
            holder.close()
        later = chat.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "and serve it"}], extra_headers={"X-Memrl-Task-Id": "t1"})
        assert later.headers["X-Memrl-Retrieval"] == "1" and "x-memrl-warning" not in later.headers
        assert injected(model.requests[-1]) == injected(model.requests[-2])  # the same task, the same memories

    assert not [line for line in log if "Traceback" in line]
    assert [rid for rid, _, _ in stored(bank)] == [1]


@pytest.mark.postgres
def test_a_lost_bank_never_fails_the_call_nor_shows_where_it_was(pg_server_dsn: str) -> None:
    """The bank's PostgreSQL database goes away while the proxy runs (dropped, its sessions cut): calls go on
    without memories, saying so; the learning endpoints answer one line that does not say where the bank was."""
    from urllib.parse import urlsplit

    from benchmarks.testing.pg_server import drop_database, temporary_database

    with temporary_database(pg_server_dsn, "memrl_test") as url:
        with MemoryBank(url) as b:
            b.ingest("heat an egg in the microwave", "SCRIPT: microwave 30 s", "success")
        name = urlsplit(url).path.lstrip("/")
        log: list[str] = []
        with ScriptedChatServer(lambda request: "Done.") as model, proxy(url, model.base_url, log=log) as served:
            client(served).chat.completions.create(model="m", messages=[{"role": "user", "content": EGG}])
            assert "microwave 30 s" in injected(model.requests[-1])  # the bank works
            drop_database(pg_server_dsn, name)
            raw = client(served).chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": EGG + " again"}])
            assert raw.parse().choices[0].message.content == "Done." and injected(model.requests[-1]) == ""
            assert raw.headers["X-Memrl-Warning"] == "no memories: the bank cannot be used now"
            for path, body in (("rewards", {"memory_ids": [1], "reward": 1}),
                               ("memories", {"intent": "a", "experience": "b"})):
                answer = httpx2.post(f"{served}/v1/memrl/{path}", json=body)
                assert answer.status_code == 400 and name not in answer.text and "postgresql://" not in answer.text
                assert "the PostgreSQL bank" in answer.json()["error"]["message"]
        assert not [line for line in log if "Traceback" in line]


@pytest.mark.slow
def test_a_bank_that_does_not_answer_costs_a_bounded_wait() -> None:
    """The bank's PostgreSQL server stops answering (its processes stopped: a hung server, a dropped network):
    the call goes on without memories after the bank wait plus the step grace, not when the client gives up."""
    import os
    import signal
    import subprocess

    from benchmarks.testing.pg_server import LocalPostgres, temporary_database

    from memrl_cli.serving.proxy_state import STEP_GRACE

    with LocalPostgres() as server, temporary_database(server.dsn, "memrl_test") as url:
        with MemoryBank(url) as b:
            b.ingest("heat an egg in the microwave", "SCRIPT: microwave 30 s", "success")
        with ScriptedChatServer(lambda request: "Done.") as model, \
                proxy(url, model.base_url, "--bank-wait", "1") as served:
            client(served).chat.completions.create(model="m", messages=[{"role": "user", "content": EGG}])
            rows = [line.split() for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True,
                                                             text=True, check=True).stdout.splitlines()]
            server_pids = [server.pid, *(int(pid) for pid, parent in rows if int(parent) == server.pid)]
            for pid in server_pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                start = time.monotonic()
                raw = client(served, timeout=60).chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": EGG + " again"}])
                waited = time.monotonic() - start
            finally:
                for pid in server_pids:
                    os.kill(pid, signal.SIGCONT)
            assert raw.parse().choices[0].message.content == "Done." and injected(model.requests[-1]) == ""
            assert raw.headers["X-Memrl-Warning"] == "no memories: the bank did not answer"
            assert waited < 1 + STEP_GRACE + 20  # (not the client's 60 s: a bound, with room for a loaded machine)


def test_a_stream_carries_the_usage_chunk_the_client_asked_for(bank: str) -> None:
    """`stream_options.include_usage`: the client asked for the chunk without choices (the usage); it carries the
    receipt too, and is the only chunk without choices."""
    with ScriptedChatServer(lambda request: "Microwave it for 30 s.") as model, proxy(bank, model.base_url) as url:
        chunks = list(client(url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": EGG}], stream=True,
            stream_options={"include_usage": True}))
    assert [bool(c.choices) for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert chunks[-1].usage is not None and chunks[-1].model_extra["memrl"] == {"retrieval_id": 1}
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "Microwave it for 30 s."


def test_memories_endpoint_lists_its_fields(bank: str) -> None:
    before = learned_state(bank)
    with ScriptedChatServer(lambda request: "Done.") as model, proxy(bank, model.base_url) as url:
        answer = httpx2.post(f"{url}/v1/memrl/memories", json={"intent": "x", "experience": "y", "q": 9, "tags": []})
        assert answer.status_code == 400 and answer.json()["error"]["message"] == (
            "unknown field(s) q, tags; the fields are intent, experience, outcome, task_id, source, scope")
        answer = httpx2.post(f"{url}/v1/memrl/memories", json=["x"])
        assert "the fields intent, experience, outcome, task_id, source, scope" in answer.json()["error"]["message"]
    assert learned_state(bank) == before


def test_a_task_id_beyond_ascii_is_echoed_encoded_and_one_with_a_control_character_is_refused(bank: str) -> None:
    """The header echoes a task id as printable ASCII (`工单-7` percent-encoded), never failing the call after the
    upstream answered; an id with CR/LF (a header injection) is refused in one line, before the upstream."""
    with ScriptedChatServer(lambda request: "Done.") as model, proxy(bank, model.base_url) as url:
        answer = client(url).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": EGG}], metadata={"memrl_task_id": "工单-7"})
        assert answer.headers["X-Memrl-Task-Id"] == "%E5%B7%A5%E5%8D%95-7"
        refused = httpx2.post(f"{url}/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": EGG}],
            "metadata": {"memrl_task_id": "tick\r\nX-Injected: 1"}})
        assert refused.status_code == 400 and "without control characters" in refused.json()["error"]["message"]
        assert "X-Injected" not in refused.headers and len(model.requests) == 1
    assert [task for _, task, _ in stored(bank)] == ["工单-7"]


AZURE_CHUNKS = [  # a chat stream as Azure OpenAI sends it: first a chunk with no object name, no choices, its filters
    {"choices": [], "created": 0, "id": "", "model": "", "object": "",
     "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]},
    {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None, "index": 0}],
     "created": 1, "id": "c1", "model": "gpt-4o", "object": "chat.completion.chunk"},
    {"choices": [{"delta": {"content": "Done."}, "finish_reason": None, "index": 0}],
     "created": 1, "id": "c1", "model": "gpt-4o", "object": "chat.completion.chunk"},
    {"choices": [{"delta": {}, "finish_reason": "stop", "index": 0}],
     "created": 1, "id": "c1", "model": "gpt-4o", "object": "chat.completion.chunk"},
]


def test_an_azure_style_stream_carries_the_receipt(bank: str) -> None:
    """Azure OpenAI's first chunk names no object and has no choices (the openai client's stream helpers skip it):
    the stream is still known for a chat one, so the receipt rides on its first chunk of its own and its finishing
    chunk, and `chat.completions.stream()` gets it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Azure(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for chunk in AZURE_CHUNKS:
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Azure)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with proxy(bank, f"http://127.0.0.1:{upstream.server_port}/v1") as url:
            chunks = list(client(url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": EGG}], stream=True))
            with client(url).chat.completions.stream(model="m", messages=[{"role": "user", "content": EGG}]) as helper:
                list(helper)
                final = helper.get_final_completion()
    finally:
        upstream.shutdown()
    assert [(c.model_extra or {}).get("memrl") for c in chunks] == [None, {"retrieval_id": 1}, None, {"retrieval_id": 1}]
    assert final.model_extra["memrl"] == {"retrieval_id": 2} and final.choices[0].message.content == "Done."
