"""Lifelong Agent Bench DBBench (`llb-db`): answer questions about, or modify, a MySQL table.

Each episode gets a fresh database `llb_<uuid>` holding the sample's table, created on the
run's shared server (`memrl_bench.environments.mysql_server`) and dropped afterwards, and two users of its
own: the agent's SQL runs as a user with rights on that database only, and the grader reads
the table as another user (`EpisodeDatabase`). The agent talks LLB's
protocol: `Action: Operation` with one ```sql block, whose result (or error) it sees next turn,
until `Action: Answer` with `Final Answer: ...`, at most `max_rounds` turns.

Grading is LLB's (`src/tasks/instance/db_bench/task.py`): for INSERT/UPDATE/DELETE tasks the
table's MD5 hash after the episode must equal the expected hash, whatever the final answer or
however the episode ended; for SELECT tasks the final answer must match the expected rows
under LLB's tuple parser with a 1e-6 float tolerance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

import pymysql

from memrl_bench.adapters import llb_common
from memrl_bench.environments import mysql8_compat, mysql_address, mysql_server
from memrl_bench.framework.protocol import LLM, Episode, Task
from memrl_cli.errors import MemrlError

# LLB's DBBench requirement (src/factories/chat_history_item/offline/task_requirement.py); the
# round limit, hard-coded there, is this adapter's `max_rounds`.
DB_REQUIREMENT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose one of the two actions: Operation or Answer.

To do operation, the format should be like this:
Action: Operation
```sql
SELECT * FROM table WHERE condition;
```
You MUST put SQL in markdown format without any other comments. Your SQL should be in one line.
I will use "Action: Operation" literally to match your SQL.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If the SQL is not executed successfully, the response will be the error message.
Otherwise, the response will be the raw MySQL response.
For SELECT queries, the response will be the result of the query, such as [(1, 'John Doe', 'HR'), (2, 'Jane Smith', 'IT'), ...], where each tuple represents a row and the elements are the values of the columns in the row.
For SQL such as INSERT, UPDATE, and DELETE, the response will be an empty list [] indicating that the SQL was executed successfully.

If you have obtain the answer by interacting with the database, and you MUST commit your final answer using the format like this:
Action: Answer
Final Answer: [(1, 'John Doe', 'HR'), (2, 'Jane Smith', 'IT'), ...]
DO NOT write this pattern unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If the question is about querying the database, then after done operation, your answer field should be the result of the query.
We note that the column names will not be displayed in the result, and you need to ensure both the orders of the columns and rows are correct.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
Once you commit your answer or the number of rounds reaches {max_rounds}, the task will be finished and the system will judge whether you pass the task or not."""

# MemRL's LLB_DB_STRICT_OUTPUT_FORMAT_CONSTRAINT, the last block of the system prompt.
DB_OUTPUT_FORMAT = """STRICT OUTPUT FORMAT (LLB-DB, do not violate):
1) After your reasoning, include exactly ONE action line:
   - Action: Operation
   - Action: Answer
2) If Action: Operation, put exactly ONE SQL statement in the FIRST fenced code block using ```sql, on a single line. Do not add any extra text after that block.
3) If Action: Answer, include `Final Answer: ...` on the next line and do not add extra text after that."""

SPLIT_FILES = {"train": "db_train.json", "val": "db_val.json"}
STATEMENT_TIMEOUT = 30  # seconds a MariaDB statement may run (max_statement_time)
_CLIENT_ERRORS = 2000  # MySQL error codes from 2000 up are the client's (connection lost...): the environment's


# --------------------------------------------------------------------------- LLB's protocol


@dataclass(frozen=True)
class Action:
    """One parsed agent reply: kind is "operation", "answer" or "invalid"."""

    kind: str
    content: str = ""
    reason: str = ""


def parse_action(reply: str) -> Action:
    """LLB's `DBBench._parse_agent_response`: the first `Action:` line decides."""
    action = re.search(r"Action: (Operation|Answer)", reply)
    if action is None:
        return Action("invalid", reason='Can not find action in agent response. Pattern: "Action: (Operation|Answer)"')
    if action.group(1) == "Operation":
        sql = re.search(r"```sql\n([\s\S]*?)\n```", reply)
        if sql is None:
            return Action("invalid", reason=r'Can not find SQL in agent response. Pattern: "```sql\n([\s\S]*?)\n```"')
        return Action("operation", sql.group(1).strip().replace("\n", " "))
    answer = re.search(r"\nFinal Answer:(.*)", reply)
    if answer is None:
        return Action("invalid", reason=r"Can not find final answer in agent response. Pattern: \nFinal Answer:(.*)")
    return Action("answer", answer.group(1).strip())


def instruction_text(sample: dict[str, Any]) -> str:
    """The user turn LLB builds: the instruction, then the table as JSON."""
    table = sample["table_info"]
    info = {"name": table["name"], "row_list": table["row_list"], "column_info_list": table["column_info_list"]}
    return f"{sample['instruction']}\nTable information: {json.dumps(info)}"


def _quote(value: Any) -> str:
    text = value.replace("'", "''") if isinstance(value, str) else value
    return "'%s'" % (text,)


def create_table_sql(table: dict[str, Any]) -> list[str]:
    """LLB's `_build_init_sql` without the database part: CREATE TABLE, then one INSERT."""
    columns = table["column_info_list"]
    column_defs = ",".join(f"`{c['name']}` {c['type']}" for c in columns)
    column_names = ",".join(f"`{c['name']}`" for c in columns)
    rows = ",".join("(" + ",".join(_quote(v) for v in row) + ")" for row in table["row_list"])
    statements = [f"CREATE TABLE IF NOT EXISTS `{table['name']}` ({column_defs})"]
    if rows:
        statements.append(f"INSERT INTO `{table['name']}` ({column_names}) VALUES {rows}")
    return statements


def table_md5_sql(table: dict[str, Any]) -> str:
    """LLB's table hash: MD5 over the sorted 5-character prefixes of each row's MD5."""
    column_names = ",".join(f"`{c['name']}`" for c in table["column_info_list"])
    return (
        "select md5(group_concat(rowhash order by rowhash)) as hash "
        f"from( SELECT substring(MD5(CONCAT_WS(',', {column_names})), 1, 5) AS rowhash "
        f"FROM `{table['name']}`) as sub"
    )


def _tuple_spans(answer: str) -> list[tuple[int, int]] | None:
    """LLB's `_get_tuple_position_list`: (start, end) of each top-level "(...)", skipping Decimal(...)."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    in_decimal = False
    for index, char in enumerate(answer):
        if char == "(":
            if answer[index - len("Decimal"):index] == "Decimal":
                if in_decimal:
                    return None
                in_decimal = True
            else:
                start = index
        elif char == ")":
            if in_decimal:
                in_decimal = False
                continue
            if start is None:
                return None
            spans.append((start, index))
            start = None
    return None if start is not None else spans


def _element_matches(element: str, expected: Any) -> bool:
    if isinstance(expected, (int, float)):
        element = re.sub(r'^Decimal\((["\']?)(.*?)(["\']?)\)$', r"\2", element)
        # LLB trims non-numeric characters with an off-by-one that keeps one of them; kept as is.
        valid = "0123456789.-"
        start = 0
        for i, char in enumerate(element):
            if char in valid:
                break
            start = i
        end = len(element)
        for i in range(len(element) - 1, -1, -1):
            if element[i] in valid:
                break
            end = i + 1
        try:
            number = float(element[start:end])
        except ValueError:
            return False
        return math.isclose(number, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(expected, str):
        if 0 < len(element) - len(expected) <= 2:
            stripped_head = stripped_tail = False
            for quote in ("'", '"'):
                if element.startswith(quote) and not expected.startswith(quote) and not stripped_head:
                    element, stripped_head = element[1:], True
                if element.endswith(quote) and not expected.endswith(quote) and not stripped_tail:
                    element, stripped_tail = element[:-1], True
        return element == expected
    return False


def _row_matches(text: str, expected: list[Any]) -> bool:
    elements = [part.strip() for part in re.split(r"\s*,\s*", text) if part.strip()]
    return len(elements) == len(expected) and all(_element_matches(e, x) for e, x in zip(elements, expected))


def direct_answer_matches(answer: str, expected: list[list[Any]]) -> bool:
    """LLB's `DirectTypeAnswerValidator.validate`, quirks included."""
    spans = _tuple_spans(answer)
    if spans is None:
        return False
    if not spans:
        return not expected or (len(expected) == 1 and _row_matches(answer, expected[0]))
    return len(spans) == len(expected) and all(
        _row_matches(answer[start + 1:end], row) for (start, end), row in zip(spans, expected)
    )


# --------------------------------------------------------------------------- one episode's database


class EpisodeDatabase:
    """A fresh database `llb_<uuid>` holding one sample's table, and the two users of the episode.

    Least privilege: the server's admin account (`address`) only creates and drops the database
    and the users. The agent's SQL runs as `agent_user`, with every right on this database and
    none elsewhere (no other episode's database, no FILE, PROCESS, SUPER or SHUTDOWN). The grader
    reads the table as `grader_user`, who may only SELECT from this database, on a connection of
    its own, so nothing the agent left in its session (temporary tables, variables) or in its
    database (invoker-rights views and functions) acts with more rights than the agent's.
    """

    def __init__(self, address: mysql_address.ServerAddress, table: dict[str, Any]) -> None:
        token = uuid.uuid4().hex
        self.name = f"llb_{token}"
        self.table = table
        self.agent_user = f"llba_{token[:24]}"  # MySQL allows 32 characters in a user name
        self.grader_user = f"llbg_{token[:24]}"
        self._admin_address = address
        admin = address.connect(timeout=STATEMENT_TIMEOUT + 30)
        try:
            with admin.cursor() as cursor:
                cursor.execute("SELECT CURRENT_USER()")
                self._host = cursor.fetchone()[0].rpartition("@")[2]  # where the admin connects from
                cursor.execute(f"CREATE DATABASE `{self.name}`")
                cursor.execute(f"USE `{self.name}`")
                for statement in create_table_sql(table):
                    cursor.execute(statement)
                agent_password, grader_password = secrets.token_hex(16), secrets.token_hex(16)
                for user, password in ((self.agent_user, agent_password), (self.grader_user, grader_password)):
                    cursor.execute("CREATE USER %s@%s IDENTIFIED BY %s", (user, self._host, password))
                cursor.execute(f"GRANT ALL PRIVILEGES ON `{self.name}`.* TO %s@%s", (self.agent_user, self._host))
                cursor.execute(f"GRANT SELECT ON `{self.name}`.* TO %s@%s", (self.grader_user, self._host))
            admin.commit()
        finally:
            admin.close()
        self._address = dataclasses.replace(address, user=self.agent_user, password=agent_password)
        self._grader_address = dataclasses.replace(address, user=self.grader_user, password=grader_password)
        self._connection = self._address.connect(timeout=STATEMENT_TIMEOUT + 30)
        self._mariadb = "MariaDB" in self._connection.get_server_info()

    def _reconnect_if_lost(self) -> None:
        """A new connection when the old one died (e.g. after a statement timed out)."""
        try:
            self._connection.ping()
        except pymysql.Error:
            with contextlib.suppress(pymysql.Error):
                self._connection.close()
            self._connection = self._address.connect(timeout=STATEMENT_TIMEOUT + 30)

    def _prepare(self, cursor: Any) -> None:
        """Per-statement session state, as LLB re-selects its database before every call."""
        if self._mariadb:
            cursor.execute(f"SET SESSION max_statement_time = {STATEMENT_TIMEOUT}")
        cursor.execute(f"USE `{self.name}`")

    def execute(self, sql: str) -> str:
        """Run the agent's SQL as LLB does: split on ";", commit after each, show the last result.

        On MariaDB each statement first goes through `mysql8_compat.as_mysql8`. Rows appear as a
        Python list of tuples; a statement without rows gives "[]", as LLB's prompt promises
        (LLB itself sends an empty message); a failure gives the error code and message.
        Raises `pymysql.OperationalError` only when the server cannot be reached again.
        """
        self._reconnect_if_lost()
        result = "[]"
        try:
            with self._connection.cursor() as cursor:
                self._prepare(cursor)
                for statement in (part.strip() for part in sql.split(";")):
                    if not statement:
                        continue
                    cursor.execute(mysql8_compat.as_mysql8(statement) if self._mariadb else statement)
                    result = str(list(cursor.fetchall())) if cursor.description is not None else "[]"
                    self._connection.commit()
        except pymysql.Error as exc:  # PyMySQL's args are (error code, message)
            result = f"{exc.args[0]}: {exc.args[1]}" if len(exc.args) == 2 else str(exc)
        return result

    def table_md5(self) -> str:
        """LLB's hash of the table now ("None" when the table is empty or gone), read as the grader."""
        grader = self._grader_address.connect(timeout=STATEMENT_TIMEOUT + 30)
        try:
            with grader.cursor() as cursor:
                try:
                    cursor.execute(f"USE `{self.name}`")
                    cursor.execute(table_md5_sql(self.table))
                except pymysql.Error as exc:
                    # A server error reading what the agent left (dropped or altered table, a view
                    # or function the grader may not run) means the table is not the expected one.
                    if exc.args and isinstance(exc.args[0], int) and exc.args[0] < _CLIENT_ERRORS:
                        return "None"
                    raise
                value = cursor.fetchone()[0]
        finally:
            grader.close()
        return "None" if value is None else str(value)

    def drop(self) -> None:
        """Close the agent's connection, then drop the database and both users as the admin."""
        with contextlib.suppress(pymysql.Error):
            self._connection.close()
        admin = self._admin_address.connect(timeout=STATEMENT_TIMEOUT + 30)
        try:
            with admin.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
                for user in (self.agent_user, self.grader_user):
                    cursor.execute("DROP USER IF EXISTS %s@%s", (user, self._host))
            admin.commit()
        finally:
            admin.close()


# --------------------------------------------------------------------------- the adapter


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
            return self._play(database, sample, memories, llm)
        except pymysql.Error as exc:  # the server went away; agents' SQL errors never get here
            return Episode(False, 0, "", status="ENV_ERROR", env_error=True, info={"error": str(exc)})
        finally:
            with contextlib.suppress(pymysql.Error):
                database.drop()

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
