"""The latency `memrl proxy` adds to a model call, against what it must do: embed the task and retrieve.

One run, on one bank (`--memories` memories, the default embedder): the scripted upstream of
benchmarks/testing/chat_server.py on loopback answers at once; one `openai` client (keep-alive) calls it
directly and through `memrl proxy` (a real subprocess) in alternation, `--calls` times each, every
proxied call a new task with a task text of its own (so each embeds and retrieves, with no query
cache). The floor is measured in the same run, interleaved, on the same bank in this process:
`bank.retrieve(text)` for as many fresh texts (embedding, both phases and the receipt: what the proxy
does for a task's first call).

Target (issue 33): p50(proxied) - p50(direct) <= p50(embedding + retrieval) + 5 ms.

    python -m benchmarks.perf.proxy_latency [--memories 500] [--calls 200] [--stream] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from openai import OpenAI

from benchmarks.testing.chat_server import ScriptedChatServer
from memrl_cli.bank import MemoryBank
from memrl_cli.method.retrieval import RetrieveParams

TARGET_SLACK_S = 0.005
TOPICS = ["heat an egg", "cool a tomato", "clean a mug", "put a book on the shelf", "slice bread", "find the keys",
          "water the plant", "wash a plate", "light the lamp", "open the window"]


def task(i: int, kind: str) -> str:
    """A task text of its own for call `i` (no two calls share one, so none hits the query cache)."""
    return f"{TOPICS[i % len(TOPICS)]} in room {i} ({kind}), then report back"


def seed_bank(db: str, memories: int) -> None:
    with MemoryBank(db) as bank:
        for i in range(memories):
            bank.ingest(f"{TOPICS[i % len(TOPICS)]} number {i}", f"SCRIPT: step one {i}; step two; done",
                        "success" if i % 3 else "failure")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat", encoding="ascii").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def proxy(db: str, upstream: str) -> Iterator[tuple[str, int]]:
    """`memrl proxy` on a free port, as a user runs it; its base URL and process id."""
    process = subprocess.Popen([sys.executable, "-m", "memrl_cli", "proxy", "--upstream", upstream, "--port", "0",
                                "--db", db], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines: list[str] = []
    for line in process.stderr:
        lines.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            break
    else:
        raise SystemExit(f"the proxy did not start: {''.join(lines)}")
    threading.Thread(target=lambda: [None for _ in process.stderr or []], daemon=True).start()
    try:
        yield found.group(1), process.pid
    finally:
        process.terminate()
        process.wait(15)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(memories: int, calls: int, stream: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "bank.db")
        seed_bank(db, memories)
        with ScriptedChatServer(lambda request: "Done: it worked.") as upstream, proxy(db, upstream.base_url) as (url, pid), \
                MemoryBank(db, create=False) as bank:
            direct = OpenAI(base_url=upstream.base_url, api_key="sk-test", max_retries=0)
            through = OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)

            def call(client: OpenAI, text: str) -> float:
                started = time.perf_counter()
                if stream:
                    for _ in client.chat.completions.create(model="m", stream=True,
                                                            messages=[{"role": "user", "content": text}]):
                        pass
                else:
                    client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
                return time.perf_counter() - started

            floor_cpu: list[float] = []

            def retrieval(text: str) -> float:
                started, cpu = time.perf_counter(), time.process_time()
                bank.retrieve(text, RetrieveParams())
                floor_cpu.append(time.process_time() - cpu)
                return time.perf_counter() - started

            first = {"direct": call(direct, task(-1, "first")), "proxied": call(through, task(-1, "first proxied"))}
            for i in range(5):  # warm-up: connections, the embedding model (here and in the proxy)
                call(direct, task(i, "warm-up"))
                call(through, task(i, "warm-up proxied"))
                retrieval(task(i, "warm-up floor"))
            timings: dict[str, list[float]] = {"direct": [], "proxied": [], "floor": []}
            floor_cpu.clear()
            proxy_cpu = cpu_seconds(pid)
            for i in range(calls):  # interleaved, so a busy machine slows all three alike
                timings["direct"].append(call(direct, task(i, "direct")))
                timings["proxied"].append(call(through, task(i, "proxied")))
                timings["floor"].append(retrieval(task(i, "floor")))
            proxy_cpu = (cpu_seconds(pid) - proxy_cpu) / calls
    floor = timings.pop("floor")
    p50 = {name: statistics.median(values) for name, values in timings.items()}
    added = p50["proxied"] - p50["direct"]
    budget = statistics.median(floor) + TARGET_SLACK_S
    return {
        "memories": memories, "calls": calls, "stream": stream,
        "direct_p50_s": p50["direct"], "proxied_p50_s": p50["proxied"],
        "direct_p90_s": percentile(timings["direct"], 0.9), "proxied_p90_s": percentile(timings["proxied"], 0.9),
        "first_direct_s": first["direct"], "first_proxied_s": first["proxied"], "added_p50_s": added, "embed_retrieve_p50_s": statistics.median(floor), "budget_s": budget,
        "ratio_added_to_budget": added / budget, "met": added <= budget,
        "proxy_cpu_per_call_s": proxy_cpu, "embed_retrieve_cpu_s": statistics.mean(floor_cpu),
        "load_average": os.getloadavg()[0], "cores": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=500)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stream", action="store_true", help="streamed calls (time to the end of the stream)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.memories, args.calls, args.stream)
    if args.json:
        print(json.dumps(result))
        return
    print(f"bank of {result['memories']} memories, {result['calls']} calls each"
          f"{' (streamed)' if result['stream'] else ''}")
    print(f"direct p50 {result['direct_p50_s'] * 1000:.1f} ms, via the proxy {result['proxied_p50_s'] * 1000:.1f} ms:"
          f" added {result['added_p50_s'] * 1000:.1f} ms")
    print(f"first call: direct {result['first_direct_s'] * 1000:.1f} ms, via the proxy "
          f"{result['first_proxied_s'] * 1000:.1f} ms (the embedding model is loaded at start-up)")
    print(f"embedding + retrieval p50 {result['embed_retrieve_p50_s'] * 1000:.1f} ms; budget (+5 ms) "
          f"{result['budget_s'] * 1000:.1f} ms; added/budget {result['ratio_added_to_budget']:.2f}: "
          f"{'met' if result['met'] else 'NOT MET'}")
    print(f"CPU per call: the proxy process {result['proxy_cpu_per_call_s'] * 1000:.1f} ms, embedding + retrieval "
          f"{result['embed_retrieve_cpu_s'] * 1000:.1f} ms (load average {result['load_average']:.1f} on "
          f"{result['cores']} cores)")


if __name__ == "__main__":
    main()
