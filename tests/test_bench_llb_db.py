"""LLB DBBench adapter: LLB's parsing and grading, and episodes on a real MariaDB server.

The agent is a scripted Chat Completions server on 127.0.0.1 that replays each sample's
ground-truth SQL and then copies the result into its final answer. MariaDB (`apt-get install
mariadb-server`) must be installed; outside CI the server tests skip when it is not.
The Docker server is tested in tests/test_bench_llb_docker.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

pytest.importorskip("pymysql", reason="the llb extra is not installed: pip install -e '.[llb]'")
import bench_data  # noqa: E402
from benchmarks.testing.chat_server import ScriptedChatServer  # noqa: E402

from memrl_bench.adapters import llb_common  # noqa: E402
from memrl_bench.environments.mysql import mariadb_local
from memrl_bench.environments.mysql import mysql8_compat
from memrl_bench.environments.mysql import address as mysql_address  # noqa: E402
from memrl_bench.adapters.llb_db.benchmark import SPLIT_FILES, LLBDatabase
from memrl_bench.adapters.llb_db.episode_database import EpisodeDatabase, create_table_sql
from memrl_bench.adapters.llb_db.grading import direct_answer_matches
from memrl_bench.adapters.llb_db.prompt import DB_OUTPUT_FORMAT, instruction_text, parse_action
from memrl_bench.framework.observation_cap import MAX_OBSERVATION_BYTES
from memrl_bench.framework.protocol import Benchmark, Task
from memrl_cli.errors import MemrlError
from memrl_bench.framework.llm import ChatClient, LLMSettings

REPO = Path(__file__).resolve().parents[1]
DATA = bench_data.directory("llb", "db_val.json")  # where the tool finds it, else the developers' copy
# Ground truths whose rows tie on the ORDER BY key: MariaDB breaks such ties in no fixed order,
# so each run reproduces a few of these and misses the others.
TIE_ORDER_IDS = {f"db/{key}" for key in (18, 41, 72, 96, 225, 228, 271, 273, 274, 422)}

needs_data = bench_data.needs("llb", DATA / "db_val.json")


def _require_mariadb() -> None:
    if mariadb_local.find_mariadb() is None:
        message = "MariaDB is not installed (apt-get install -y mariadb-server)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


# --------------------------------------------------------------------------- no server needed


def test_parse_action_follows_llb() -> None:
    operation = parse_action("I will look.\nAction: Operation\n```sql\nSELECT *\nFROM t;\n```")
    assert (operation.kind, operation.content) == ("operation", "SELECT * FROM t;")
    answer = parse_action("Done.\nAction: Answer\nFinal Answer: [(1, 'a')]")
    assert (answer.kind, answer.content) == ("answer", "[(1, 'a')]")
    assert parse_action("Action: Operation\nSELECT 1").kind == "invalid"  # no ```sql block
    assert parse_action("Action: Answer\n[(1,)]").kind == "invalid"  # no Final Answer line
    assert parse_action("SELECT 1").kind == "invalid"
    assert "Can not find action" in parse_action("hello").reason


def test_direct_answer_matches_like_llb() -> None:
    expected = [["North", 1516.6667], ["South", 950.0]]
    assert direct_answer_matches("[('North', Decimal('1516.6667')), ('South', Decimal('950.0000'))]", expected)
    assert direct_answer_matches("[('North', 1516.66670001), ('South', 950)]", expected)
    assert not direct_answer_matches("[('South', 950), ('North', 1516.6667)]", expected)  # row order counts
    assert not direct_answer_matches("[('North', 1516.6667)]", expected)  # a row missing
    assert not direct_answer_matches("[('North', 1516.6667, 1), ('South', 950)]", expected)  # extra column
    assert not direct_answer_matches("[('North', 1517), ('South', 950)]", expected)
    assert direct_answer_matches("5", [[5]])  # a single value without parentheses
    assert direct_answer_matches("", [])
    assert not direct_answer_matches("", [[1]])
    assert not direct_answer_matches("[(1, 'a'", [[1, "a"]])  # unbalanced


def test_create_table_sql_quotes_like_llb() -> None:
    table = {"name": "t", "column_info_list": [{"name": "id", "type": "INT"}, {"name": "who", "type": "TEXT"}],
             "row_list": [[1, "O'Brien"], [2, "x"]]}
    assert create_table_sql(table) == [
        "CREATE TABLE IF NOT EXISTS `t` (`id` INT,`who` TEXT)",
        "INSERT INTO `t` (`id`,`who`) VALUES ('1','O''Brien'),('2','x')",
    ]


def test_as_mysql8_rewrites_only_what_mariadb_runs_differently() -> None:
    rewrite = mysql8_compat.as_mysql8
    assert rewrite("SELECT a, COUNT(*) FROM t GROUP BY a") == "SELECT a, COUNT(*) FROM t GROUP BY a ORDER BY NULL"
    assert (rewrite("SELECT a FROM t GROUP BY a HAVING COUNT(*) > 1 LIMIT 5 OFFSET 1")
            == "SELECT a FROM t GROUP BY a HAVING COUNT(*) > 1 ORDER BY NULL LIMIT 5 OFFSET 1")
    unchanged = [
        "SELECT a FROM t GROUP BY a ORDER BY a DESC",
        "SELECT * FROM (SELECT a FROM t GROUP BY a) AS s",  # GROUP BY only inside a subquery
        "SELECT 'GROUP BY' FROM t",
        "SELECT a FROM t GROUP BY a WITH ROLLUP",
        "INSERT INTO u SELECT a FROM t GROUP BY a",
        "DELETE FROM t WHERE a = 1",
    ]
    assert [rewrite(sql) for sql in unchanged] == unchanged
    assert (rewrite("DELETE FROM t AS x WHERE x.a IN (SELECT a FROM (SELECT a FROM t) AS s)")
            == "DELETE x FROM t AS x WHERE x.a IN (SELECT a FROM (SELECT a FROM t) AS s)")
    assert rewrite("DELETE FROM t AS x WHERE x.a > 1 LIMIT 2") == "DELETE FROM t AS x WHERE x.a > 1 LIMIT 2"


def test_parse_mysql_url() -> None:
    address = mysql_address.parse_mysql_url("mysql://bob:p%40ss@db.example:3307")
    assert (address.user, address.password, address.host, address.port) == ("bob", "p@ss", "db.example", 3307)
    assert not address.tls and mysql_address.parse_mysql_url("mysql://root:pw@127.0.0.1:3306?ssl=true").tls
    with pytest.raises(MemrlError, match="mysql_url"):
        mysql_address.parse_mysql_url("postgres://x@y")


def test_system_prompt_puts_memories_before_the_output_format() -> None:
    memories = [
        {"id": 1, "intent": "count rows", "experience": "Agent:\nSELECT COUNT(*)", "outcome": "success"},
        {"id": 2, "intent": "delete rows", "experience": "forgot WHERE", "outcome": "failure"},
    ]
    prompt = llb_common.system_prompt(memories, DB_OUTPUT_FORMAT)
    assert prompt.startswith(llb_common.SYSTEM_PROMPT)
    assert prompt.index("[Retrieved Memory Context]") < prompt.index("[SUCCESS 1]") < prompt.index("[FAILURE 1]")
    assert prompt.endswith(DB_OUTPUT_FORMAT)
    assert "Task: count rows" in prompt
    assert llb_common.system_prompt([], DB_OUTPUT_FORMAT) == f"{llb_common.SYSTEM_PROMPT}\n\n{DB_OUTPUT_FORMAT}"


def test_missing_data_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(MemrlError, match="db_train.json"):
        LLBDatabase(data=str(tmp_path))


@needs_data
def test_tasks_cover_both_splits_in_index_order() -> None:
    adapter = LLBDatabase(data=str(DATA))
    assert isinstance(adapter, Benchmark)
    train, val = adapter.tasks("train"), adapter.tasks("val")
    assert (len(train), len(val)) == (361, 139)
    assert not {t.id for t in train} & {t.id for t in val}
    keys = [int(t.id.split("/")[1]) for t in val]
    assert keys == sorted(keys)
    raw = json.loads((DATA / "db_val.json").read_text())[val[0].id.split("/")[1]]
    assert val[0].query == raw["instruction"]
    assert {t.meta["answer_type"] for t in val} == {"md5", "direct"}
    assert len(LLBDatabase(data=str(DATA), limit=5).tasks("val")) == 5
    with pytest.raises(MemrlError):
        adapter.tasks("test")


# --------------------------------------------------------------------------- real MariaDB


@pytest.fixture(scope="module")
def adapter() -> Iterator[LLBDatabase]:
    _require_mariadb()
    if not (DATA / "db_val.json").is_file():
        bench_data.unavailable("llb", DATA)
    bench = LLBDatabase(data=str(DATA), server="mariadb")
    yield bench
    bench.close()


def _sample_tasks(adapter: LLBDatabase, kind: str, count: int) -> list[Task]:
    return [t for t in adapter.tasks("val") if t.meta["answer_type"] == kind and t.id not in TIE_ORDER_IDS][:count]


def _ground_truth_agent(tasks: list[Task]) -> Callable[[dict], str]:
    """Replies with the sample's ground-truth SQL, then answers with the last observation."""
    sql_by_instruction = {instruction_text(t.payload): t.payload["answer_info"]["sql"] for t in tasks}

    def respond(request: dict) -> str:
        messages = request["messages"]
        sql = sql_by_instruction[messages[3]["content"]]
        if len(messages) == 4:
            return f"Let me run the query.\nAction: Operation\n```sql\n{sql}\n```"
        return f"Done.\nAction: Answer\nFinal Answer: {messages[-1]['content']}"

    return respond


def _client(server: ScriptedChatServer) -> ChatClient:
    return ChatClient(LLMSettings(model="scripted-model", base_url=server.base_url, api_key="test", max_retries=0))


def _episode_databases(adapter: LLBDatabase) -> list[str]:
    connection = adapter.address().connect()
    with connection.cursor() as cursor:
        cursor.execute("SHOW DATABASES LIKE 'llb\\_%'")
        names = [row[0] for row in cursor.fetchall()]
    connection.close()
    return names


def test_ground_truth_episodes_are_correct(adapter: LLBDatabase) -> None:
    tasks = _sample_tasks(adapter, "md5", 4) + _sample_tasks(adapter, "direct", 4)
    before = _episode_databases(adapter)
    with ScriptedChatServer(_ground_truth_agent(tasks)) as server:
        llm = _client(server)
        episodes = [adapter.run_episode(task, [], llm) for task in tasks]
    assert [e.status for e in episodes] == ["CORRECT"] * len(tasks), [e.info for e in episodes]
    assert all(e.success and e.steps == 2 and not e.env_error for e in episodes)
    first = episodes[0].trajectory
    assert "Action: Operation" in first and "Observation:\n[]" in first and "Final Answer" in first
    assert "execution-focused" not in first and "I will ask you a question" not in first
    assert _episode_databases(adapter) == before  # every episode dropped its database


def test_wrong_sql_and_wrong_answers_are_incorrect(adapter: LLBDatabase) -> None:
    write, read = _sample_tasks(adapter, "md5", 1)[0], _sample_tasks(adapter, "direct", 1)[0]
    table = write.payload["table_info"]["name"]

    def respond(request: dict) -> str:
        messages = request["messages"]
        if len(messages) == 4:
            is_write = messages[3]["content"] == instruction_text(write.payload)
            statement = f"DELETE FROM `{table}`" if is_write else "SELECT 1"
            return f"Action: Operation\n```sql\n{statement}\n```"
        return "Action: Answer\nFinal Answer: [(1,)]"

    with ScriptedChatServer(respond) as server:
        llm = _client(server)
        wrong_write = adapter.run_episode(write, [], llm)
        wrong_read = adapter.run_episode(read, [], llm)
    assert (wrong_write.success, wrong_write.status) == (False, "INCORRECT")
    assert wrong_write.info["graded"] != write.payload["answer_info"]["md5"]
    assert (wrong_read.success, wrong_read.status) == (False, "INCORRECT")


def test_sql_errors_are_observations_and_limits_end_episodes(adapter: LLBDatabase) -> None:
    read = _sample_tasks(adapter, "direct", 1)[0]
    with ScriptedChatServer(lambda request: "Action: Operation\n```sql\nSELEC 1\n```") as server:
        limited = LLBDatabase(data=str(DATA), server="mariadb", max_rounds=3)
        episode = limited.run_episode(read, [], _client(server))
        limited.close()
        assert len(server.requests) == 3
        assert "1064" in server.requests[-1]["messages"][-1]["content"]  # the error reached the agent
    assert (episode.success, episode.status, episode.steps) == (False, "ROUND_LIMIT", 3)
    assert episode.trajectory.count("1064") == 3
    with ScriptedChatServer(lambda request: "I think the answer is 5.") as server:
        episode = adapter.run_episode(read, [], _client(server))
    assert (episode.success, episode.status, episode.steps) == (False, "FORMAT_ERROR", 1)


def test_write_tasks_are_graded_on_the_table_whatever_the_ending(adapter: LLBDatabase) -> None:
    # LLB hashes the table even when the agent then breaks the format: the change is what counts.
    write = _sample_tasks(adapter, "md5", 1)[0]
    sql = write.payload["answer_info"]["sql"]

    def respond(request: dict) -> str:
        return f"Action: Operation\n```sql\n{sql}\n```" if len(request["messages"]) == 4 else "All done!"

    with ScriptedChatServer(respond) as server:
        episode = adapter.run_episode(write, [], _client(server))
    assert (episode.success, episode.status, episode.info["finish"]) == (True, "CORRECT", "format_error")


def test_memories_reach_the_system_prompt(adapter: LLBDatabase) -> None:
    read = _sample_tasks(adapter, "direct", 1)[0]
    memory = {"id": 7, "intent": "a past SELECT task", "experience": "Agent:\nUse LIMIT.", "outcome": "success",
              "similarity": 0.9, "q": 0.5, "score": 1.0}
    with ScriptedChatServer(_ground_truth_agent([read])) as server:
        adapter.run_episode(read, [memory], _client(server))
        messages = server.requests[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "Use LIMIT." in messages[0]["content"] and messages[0]["content"].endswith(DB_OUTPUT_FORMAT)
    assert messages[1]["content"].endswith(llb_common.REQUIREMENT_SUFFIX)
    assert "the number of rounds reaches 15" in messages[1]["content"]
    assert messages[2]["content"] == "OK."
    assert messages[3]["content"].startswith(read.query + "\nTable information: {")


_WORKER: LLBDatabase | None = None


def _init_worker(data: str) -> None:
    global _WORKER
    _WORKER = LLBDatabase(data=data, server="mariadb")  # as the harness does: a fresh adapter per worker


def _play_in_worker(task: Task, base_url: str) -> tuple[str, str | None]:
    """(status, socket of the server this worker used)."""
    assert _WORKER is not None
    llm = ChatClient(LLMSettings(model="scripted-model", base_url=base_url, api_key="test", max_retries=0))
    episode = _WORKER.run_episode(task, [], llm)
    return episode.status, _WORKER.address().unix_socket


@pytest.mark.slow
def test_worker_processes_share_one_server(adapter: LLBDatabase) -> None:
    tasks = _sample_tasks(adapter, "md5", 3) + _sample_tasks(adapter, "direct", 3)
    own_socket = adapter.address().unix_socket
    context = multiprocessing.get_context("spawn")
    with ScriptedChatServer(_ground_truth_agent(tasks)) as server, \
            ProcessPoolExecutor(2, mp_context=context, initializer=_init_worker, initargs=(str(DATA),)) as pool:
        results = list(pool.map(_play_in_worker, tasks, [server.base_url] * len(tasks)))
    assert [status for status, _ in results] == ["CORRECT"] * len(tasks)
    assert {sock for _, sock in results} == {own_socket}  # no worker started a server of its own
    assert mysql_address.is_reachable(adapter.address())  # the workers' exit left it to this process


_LIFECYCLE_SCRIPT = """
import json, sys
from memrl_bench.adapters.llb_db.benchmark import LLBDatabase
from memrl_bench.environments.mysql import server as mysql_server
bench = LLBDatabase(data=sys.argv[1], server="mariadb")
address = bench.address()
record = mysql_server.running_server()
bench.close()
print(json.dumps({"record": record, "after": mysql_server.running_server()}))
"""


def test_last_user_stops_the_server(tmp_path: Path) -> None:
    _require_mariadb()
    if not (DATA / "db_val.json").is_file():
        bench_data.unavailable("llb", DATA)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its own state directory, so its own server
    done = subprocess.run([sys.executable, "-c", _LIFECYCLE_SCRIPT, str(DATA)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    record = result["record"]
    assert record["kind"] == "mariadb" and result["after"] is None
    assert not Path(record["root"]).exists()  # data directory removed
    assert not Path(f"/proc/{record['pid']}").exists() or "Z" in Path(f"/proc/{record['pid']}/stat").read_text()


def test_mysql_url_is_used_as_given(adapter: LLBDatabase) -> None:
    sock = adapter.address().unix_socket
    given = LLBDatabase(data=str(DATA), mysql_url=f"mysql://root@localhost?unix_socket={sock}")
    read = _sample_tasks(adapter, "direct", 1)[0]
    with ScriptedChatServer(_ground_truth_agent([read])) as server:
        assert given.run_episode(read, [], _client(server)).status == "CORRECT"
    given.close()
    assert mysql_address.is_reachable(adapter.address())  # closing a URL adapter stops nothing


@pytest.mark.slow
def test_ground_truths_reproduce_on_mariadb(adapter: LLBDatabase) -> None:
    from benchmarks.perf.llb_db_ground_truth import reproduce

    tasks = [task for split in SPLIT_FILES for task in adapter.tasks(split)]
    failed = {task.id for task in tasks if not reproduce(adapter, task)[0]}
    assert failed <= TIE_ORDER_IDS, sorted(failed - TIE_ORDER_IDS)
    assert len(tasks) - len(failed) >= 490


@pytest.mark.slow
def test_bench_llb_db_through_the_harness(tmp_path: Path) -> None:
    """Two epochs of `run_benchmark` on a real MariaDB with a ground-truth agent: all correct, all remembered."""
    from benchmarks.testing.chat_server import distilling

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark
    from memrl_cli.bank import MemoryBank
    from memrl_cli.ops.inspection import verify

    _require_mariadb()
    if not (DATA / "db_train.json").is_file():
        bench_data.unavailable("llb", DATA)
    tasks = LLBDatabase(data=str(DATA), server="mariadb").tasks("train")  # the harness samples 3 of them
    with ScriptedChatServer(distilling(_ground_truth_agent(tasks))) as server:
        config = BenchConfig(benchmark="llb-db", epochs=2, batch_size=3, limit=3, data=str(DATA),
                             options={"server": "mariadb"})
        summary = run_benchmark(config, LLMSettings(model="scripted", base_url=server.base_url, api_key="test"),
                                runs_dir=str(tmp_path), workers=2)
    assert summary["accuracy"] == {1: 1.0, 2: 1.0}
    with MemoryBank(summary["bank"], create=False) as bank:
        assert bank.count() >= 3 and verify(bank)["ok"]


def test_concurrent_episodes_cannot_reach_each_other(adapter: LLBDatabase) -> None:
    """Least privilege: each episode's SQL runs as a user with rights on its own database only."""
    first, second = _sample_tasks(adapter, "md5", 2)
    mine = EpisodeDatabase(adapter.address(), first.payload["table_info"])
    theirs = EpisodeDatabase(adapter.address(), second.payload["table_info"])
    try:
        table = f"`{theirs.name}`.`{theirs.table['name']}`"
        before = theirs.table_md5()
        refused = {sql: mine.execute(sql) for sql in (
            f"SELECT * FROM {table}", f"DELETE FROM {table}", f"DROP DATABASE `{theirs.name}`",
            f"CREATE TABLE `{theirs.name}`.`x` (a INT)", "SELECT user FROM mysql.user",
            f"GRANT ALL ON *.* TO '{mine.agent_user}'@'%'", "CREATE USER 'intruder'@'%'",
            "SELECT 1 INTO OUTFILE '/tmp/memrl-llb-db-outfile'", "SET GLOBAL max_connections = 1", "SHUTDOWN",
        )}
        assert all(result.startswith(("1044", "1045", "1142", "1227", "1396", "1410")) for result in refused.values()), refused
        assert mine.execute("SHOW DATABASES") == f"[('information_schema',), ('{mine.name}',)]"
        assert theirs.table_md5() == before != "None"  # untouched
        assert not Path("/tmp/memrl-llb-db-outfile").exists()
        # The agent's own database is fully its own.
        assert mine.execute(f"DELETE FROM `{mine.table['name']}`") == "[]" and mine.table_md5() == "None"
    finally:
        mine.drop()
        theirs.drop()


def test_grader_reads_the_table_not_the_agents_session(adapter: LLBDatabase) -> None:
    """A temporary table shadowing the real one in the agent's session does not fool the grader."""
    write = _sample_tasks(adapter, "md5", 1)[0]
    database = EpisodeDatabase(adapter.address(), write.payload["table_info"])
    try:
        name = f"`{database.table['name']}`"
        honest = database.table_md5()
        assert database.execute(f"CREATE TEMPORARY TABLE {name} AS SELECT * FROM {name} LIMIT 0") == "[]"
        assert database.execute(f"SELECT count(*) FROM {name}") == "[(0,)]"  # the agent sees its shadow
        assert database.table_md5() == honest  # the grader reads the real table
    finally:
        database.drop()


def _sleeping_view(table: str) -> list[str]:
    """SQL putting a definer view that sleeps (through a function of the agent's) in place of `table`."""
    return [f"RENAME TABLE `{table}` TO `{table}_kept`",
            "CREATE FUNCTION nap() RETURNS INT NOT DETERMINISTIC NO SQL RETURN SLEEP(60)",
            f"CREATE DEFINER = CURRENT_USER SQL SECURITY DEFINER VIEW `{table}` AS "
            f"SELECT k.* FROM `{table}_kept` k WHERE nap() = 0"]


def test_grading_is_bounded_and_leaves_nothing_behind(adapter: LLBDatabase) -> None:
    """An agent holding a table lock, leaving a sleeping definer view in place of the graded table, or
    preparing an XA transaction: graded in seconds (the table as it is, the view refused, XA refused),
    and once dropped the server holds no database, user or session of the episode."""
    write = _sample_tasks(adapter, "md5", 1)[0]
    table = write.payload["table_info"]["name"]
    attacks = {"lock": [f"LOCK TABLES `{table}` WRITE"], "view": _sleeping_view(table),
               "prepared XA": ["XA START 'forge'", f"DELETE FROM `{table}`", "XA END 'forge'", "XA PREPARE 'forge'"]}
    for name, statements in attacks.items():
        database = EpisodeDatabase(adapter.address(), write.payload["table_info"])
        try:
            results = [database.execute(sql) for sql in statements]
            if name == "prepared XA":  # it would outlive the session, holding the table's locks: refused
                assert results[0] == results[2] == results[3] == "1235: XA transactions are not supported here"
            else:
                assert results == ["[]"] * len(statements), name
            started = time.monotonic()
            graded = database.table_md5()
            assert time.monotonic() - started < 10, name
            assert graded != write.payload["answer_info"]["md5"], name
            if name == "view":
                assert graded == f"refused: `{table}` is a VIEW, not a table"
            elif name == "lock":  # the table as the agent left it, its lock gone with its session
                assert len(graded) == 32, graded
            else:  # the DELETE ran as a plain statement, committed: the table is empty
                assert graded == "None"
        finally:
            database.drop()
        assert database.leftovers() == {"databases": [], "users": [], "sessions": []}, name


def test_observations_are_capped(adapter: LLBDatabase) -> None:
    """A 100 MB result reaches the agent as 16 KiB, the cut marked."""
    write = _sample_tasks(adapter, "md5", 1)[0]
    database = EpisodeDatabase(adapter.address(), write.payload["table_info"])
    try:
        result = database.execute(_FLOOD)
    finally:
        database.drop()
    assert len(result.encode()) < MAX_OBSERVATION_BYTES + 100
    total = len(str([("x" * 2**20,)] * 100))
    assert result.startswith("[('xxxx") and result.endswith(f"…[cut: {total} bytes, kept {MAX_OBSERVATION_BYTES}]")


_FLOOD = ("WITH RECURSIVE r (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 100) "
          "SELECT REPEAT('x', 1048576) FROM r")  # 100 rows of 1 MiB


@pytest.mark.slow
def test_a_huge_query_result_stays_out_of_the_bank(tmp_path: Path) -> None:
    """Through the harness: two episodes whose agent reads 100 MB each leave a bank under 10 MB."""
    from benchmarks.testing.chat_server import distilling

    from memrl_bench.framework.config import BenchConfig
    from memrl_bench.framework.harness import run_benchmark

    _require_mariadb()
    if not (DATA / "db_train.json").is_file():
        bench_data.unavailable("llb", DATA)

    def flood(request: dict) -> str:
        if len(request["messages"]) == 4:
            return f"Action: Operation\n```sql\n{_FLOOD}\n```"
        return "Action: Answer\nFinal Answer: []"

    with ScriptedChatServer(distilling(flood)) as server:
        config = BenchConfig(benchmark="llb-db", epochs=1, batch_size=2, limit=2, data=str(DATA),
                             options={"server": "mariadb"})
        summary = run_benchmark(config, LLMSettings(model="scripted", base_url=server.base_url, api_key="test"),
                                runs_dir=str(tmp_path), workers=1)
    bank = Path(summary["bank"])
    size = sum(path.stat().st_size for path in bank.parent.glob(bank.name + "*"))
    assert summary["accuracy"] == {1: 0.0}
    assert size < 10 * 2**20, size
