"""Lifelong Agent Bench DBBench (`llb-db`): answer questions about, or modify, a MySQL table.

Each episode gets a fresh database `llb_<uuid>` holding the sample's table, created on the
run's shared server (`memrl_bench.environments.mysql.server`) and dropped afterwards, and two users of its
own: the agent's SQL runs as a user with rights on that database only, and the grader reads
the table as another user (`EpisodeDatabase`). The agent talks LLB's
protocol: `Action: Operation` with one ```sql block, whose result (or error) it sees next turn,
until `Action: Answer` with `Final Answer: ...`, at most `max_rounds` turns.

Grading is LLB's (`src/tasks/instance/db_bench/task.py`): for INSERT/UPDATE/DELETE tasks the
table's MD5 hash after the episode must equal the expected hash, whatever the final answer or
however the episode ended; for SELECT tasks the final answer must match the expected rows
under LLB's tuple parser with a 1e-6 float tolerance.

This module is the adapter (options, server, tasks, the episode loop); its parts are
`llb_db_prompt` (LLB's dialogue), `llb_db_episode_database` (the episode's database and users)
and `llb_db_grading` (LLB's checks); `llb_common` holds what it shares with `llb-os`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pymysql

from memrl_bench.adapters import llb_common
from memrl_bench.adapters.llb_db.episode_database import EpisodeDatabase
from memrl_bench.adapters.llb_db.grading import direct_answer_matches
from memrl_bench.adapters.llb_db.prompt import DB_OUTPUT_FORMAT, DB_REQUIREMENT, instruction_text, parse_action
from memrl_bench.environments.mysql import address as mysql_address
from memrl_bench.environments.mysql import server as mysql_server
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError

SPLIT_FILES = {"train": "db_train.json", "val": "db_val.json"}


class LLBDatabase:
    """The `llb-db` benchmark: 361 train / 139 val DBBench samples (`db_train.json`, `db_val.json`)."""

    name = "llb-db"
    train_split = "train"
    eval_splits = ("val",)

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        mysql_url: str | None = None,
        max_rounds: int = 15,
        server: str = "auto",
    ) -> None:
        self.data = llb_common.data_dir(data, tuple(SPLIT_FILES.values()))
        self.limit = None if limit is None else int(limit)
        self.max_rounds = int(max_rounds)
        if self.max_rounds < 1:
            raise MemrlError(f"max_rounds must be at least 1, got {max_rounds}")
        if server not in mysql_server.SERVER_KINDS:
            raise MemrlError(f"unknown server {server!r}: use one of {', '.join(mysql_server.SERVER_KINDS)}")
        self.server = server
        self._given = mysql_address.parse_mysql_url(mysql_url) if mysql_url else None
        self._address: mysql_address.ServerAddress | None = None
        self._acquired_pid: int | None = None

    def address(self) -> mysql_address.ServerAddress:
        """The server this process uses, acquiring the shared one on first call.

        The pid check makes a copy of the adapter in another process (fork, pickle) register
        that process as a user of its own.
        """
        if self._given is not None:
            return self._given
        if self._address is None or self._acquired_pid != os.getpid():
            self._address = mysql_server.acquire(self.server)
            self._acquired_pid = os.getpid()
        return self._address

    def tasks(self, split: str) -> list[Task]:
        """The samples of `split` ("train" or "val") in sample-index order."""
        if split not in SPLIT_FILES:
            raise MemrlError(f"unknown llb-db split {split!r}: use train or val")
        tasks = []
        for key, sample in llb_common.load_samples(self.data / SPLIT_FILES[split], self.limit):
            answer = sample["answer_info"]
            payload = {"instruction": sample["instruction"], "answer_info": answer, "table_info": sample["table_info"]}
            kind = "md5" if answer.get("md5") else "direct"  # a write (table hash) or a query (rows)
            meta = {"answer_type": kind, "task_type": kind, "skills": sample.get("skill_list", [])}
            tasks.append(Task(id=f"db/{key}", query=sample["instruction"], payload=payload, meta=meta))
        return tasks

    def run_episode(self, task: Task, memories: list[dict[str, Any]], llm: LLM) -> Episode:
        """Play one sample: fresh database, LLB's dialogue, LLB's grading, database dropped."""
        sample = task.payload
        try:
            database = EpisodeDatabase(self.address(), sample["table_info"])
        except pymysql.Error as exc:
            return Episode(False, 0, "", status="ENV_ERROR", env_error=True, info={"error": str(exc)})
        try:
            episode = self._play(database, sample, memories, llm)
        except pymysql.Error as exc:  # the server went away; agents' SQL errors never get here
            episode = Episode(False, 0, "", status="ENV_ERROR", env_error=True, info={"error": str(exc)})
        finally:
            with contextlib.suppress(pymysql.Error):
                database.drop()
        episode.info["database"] = database.name  # where it ran (gone now; `server_leftovers` checks)
        return episode

    def _play(self, database: EpisodeDatabase, sample: dict[str, Any], memories: list[dict[str, Any]], llm: LLM) -> Episode:
        system = llb_common.system_prompt(memories, DB_OUTPUT_FORMAT)
        requirement = DB_REQUIREMENT.format(max_rounds=self.max_rounds)
        messages = llb_common.opening_messages(system, requirement, instruction_text(sample))
        turns: list[tuple[str, str | None]] = []
        finish, answer = "round_limit", ""
        for _ in range(self.max_rounds):
            reply = llm.chat(messages)
            messages.append({"role": "assistant", "content": reply})
            action = parse_action(reply)
            if action.kind == "invalid":
                finish = "format_error"
                turns.append((reply, f"Episode ended: {action.reason}"))
                break
            if action.kind == "answer":
                finish, answer = "answer", action.content
                turns.append((reply, None))
                break
            observation = database.execute(action.content)
            turns.append((reply, observation))
            messages.append({"role": "user", "content": observation})
        expected_md5 = sample["answer_info"].get("md5")
        if expected_md5:
            graded = database.table_md5()
            success = graded == expected_md5
        else:
            graded = answer  # LLB grades an unanswered SELECT task as the empty answer
            success = direct_answer_matches(answer, sample["answer_info"]["direct"])
        status = "CORRECT" if success else {"answer": "INCORRECT", "round_limit": "ROUND_LIMIT",
                                            "format_error": "FORMAT_ERROR"}[finish]
        info = {"finish": finish, "answer_type": "md5" if expected_md5 else "direct", "graded": graded}
        return Episode(success, len(turns), llb_common.render_trajectory(turns), status=status, info=info)

    def close(self) -> None:
        """Stop using the shared server (the last user on the machine stops it)."""
        if self._address is not None and self._acquired_pid == os.getpid():
            mysql_server.release()
        self._address = self._acquired_pid = None
