"""An agent loop that learns through `memrl proxy` (docs/integrations.md); tests/test_proxy.py runs it.

    memrl proxy --upstream https://api.openai.com/v1 --db agent.db --lambda 0.7 &
    OPENAI_API_KEY=sk-... python docs/examples/learning_agent.py
"""

from __future__ import annotations

import os
from collections.abc import Callable

from openai import OpenAI


def episode(client: OpenAI, task: str, solved: Callable[[str], bool], model: str = "gpt-4o-mini") -> bool:
    """One task: the proxy injects the most useful memories; the environment judges; the receipt is rewarded."""
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": task}])
    answer = raw.parse().choices[0].message.content or ""
    success = solved(answer)  # the environment's verdict (tests, a checker), never the model's own claim
    receipt = int(raw.headers["X-Memrl-Retrieval"])
    client.post("/memrl/rewards", body={"retrieval_id": receipt, "reward": 1.0 if success else -1.0}, cast_to=object)
    if success:  # keep what worked, for the next similar task
        client.post("/memrl/memories", body={"intent": task, "experience": answer, "outcome": "success"}, cast_to=object)
    return success


if __name__ == "__main__":
    proxy = OpenAI(base_url=os.environ.get("MEMRL_PROXY", "http://127.0.0.1:8765/v1"))
    for _ in range(3):
        print(episode(proxy, "Write a Python one-liner that reverses a string s.", lambda a: "[::-1]" in a))
