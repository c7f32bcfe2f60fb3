"""How many LLB DBBench ground truths reproduce on this machine's server.

Runs each sample's ground-truth SQL in a fresh episode database and grades it exactly as an
episode would: the table hash for write tasks, the printed rows (as an agent would copy them
into its final answer) for SELECT tasks.

    python -m benchmarks.perf.llb_db_ground_truth --data ../shared/data/llb [--mysql-url URL]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from memrl_bench.adapters.llb_db.benchmark import SPLIT_FILES, LLBDatabase
from memrl_bench.adapters.llb_db.episode_database import EpisodeDatabase
from memrl_bench.adapters.llb_db.grading import direct_answer_matches
from memrl_bench.framework.protocol import Task


def reproduce(adapter: LLBDatabase, task: Task) -> tuple[bool, str]:
    """(reproduced?, what the server gave) for one task's ground-truth SQL."""
    answer = task.payload["answer_info"]
    database = EpisodeDatabase(adapter.address(), task.payload["table_info"])
    try:
        observation = database.execute(answer["sql"].strip().replace("\n", " "))
        if answer.get("md5"):
            graded = database.table_md5()
            return graded == answer["md5"], f"{observation} md5={graded}"
        return direct_answer_matches(observation, answer["direct"]), observation
    finally:
        database.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="directory holding db_train.json and db_val.json")
    parser.add_argument("--mysql-url", default=None)
    parser.add_argument("--server", default="auto", choices=("auto", "docker", "mariadb"))
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    adapter = LLBDatabase(data=args.data, mysql_url=args.mysql_url, server=args.server)
    try:
        tasks = [task for split in SPLIT_FILES for task in adapter.tasks(split)]
        started = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            results = list(pool.map(lambda task: reproduce(adapter, task), tasks))
        elapsed = time.monotonic() - started
        failures = [(task, detail) for task, (ok, detail) in zip(tasks, results) if not ok]
        for task, detail in failures:
            print(f"{task.id} [{task.meta['answer_type']}] {task.payload['answer_info']['sql'][:160]}\n    -> {detail[:200]}")
        print(f"reproduced {len(tasks) - len(failures)}/{len(tasks)} ground truths in {elapsed:.1f} s")
    finally:
        adapter.close()


if __name__ == "__main__":
    main()
