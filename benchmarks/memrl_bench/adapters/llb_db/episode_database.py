"""One LLB DBBench episode's own database on the run's MySQL server, and its two users.

`EpisodeDatabase` creates `llb_<uuid>` holding the sample's table (`create_table_sql`, LLB's
initialisation), runs the agent's SQL as a user with rights on that database only, reads the
table's hash as a grader user who may only SELECT, and drops the database and both users.

Grading is bounded and leaves nothing behind: before the grader reads, every session of the
agent's user is killed (its locks go with it); the grader waits at most `GRADER_TIMEOUT`
seconds for a lock and for its statement; a view in place of the graded table is refused; the
agent's SQL may not open an XA transaction (a prepared one outlives every session).
`drop` kills every session of both users before dropping, and `leftovers` lists what of the
episode the server still holds (databases, users, sessions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import time
import uuid
from typing import Any

import pymysql

from memrl_bench.adapters.llb_db.grading import table_md5_sql
from memrl_bench.environments.mysql import mysql8_compat
from memrl_bench.environments.mysql import address as mysql_address
from memrl_bench.framework.observation_cap import cap

STATEMENT_TIMEOUT = 30  # seconds a MariaDB statement may run (max_statement_time)
GRADER_TIMEOUT = 5  # seconds the grader waits for a lock, and its statement may run
ADMIN_LOCK_TIMEOUT = 10  # seconds the admin's DROP waits for a lock
# A prepared XA transaction outlives its session and would hold the episode's locks (and block its
# DROP) for good: the agent's SQL may not use XA (no DBBench task does).
_XA = re.compile(r"\bXA\b", re.IGNORECASE)
_CLIENT_ERRORS = 2000  # MySQL error codes from 2000 up are the client's (connection lost...): the environment's


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
        (LLB itself sends an empty message); a failure gives the error code and message; a
        statement naming XA is refused (1235) before it reaches the server. The text is capped
        (`observation_cap.cap`, 16 KiB, the cut marked).
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
                    if _XA.search(statement):
                        raise pymysql.err.NotSupportedError(1235, "XA transactions are not supported here")
                    cursor.execute(mysql8_compat.as_mysql8(statement) if self._mariadb else statement)
                    result = str(list(cursor.fetchall())) if cursor.description is not None else "[]"
                    self._connection.commit()
        except pymysql.Error as exc:  # PyMySQL's args are (error code, message)
            result = f"{exc.args[0]}: {exc.args[1]}" if len(exc.args) == 2 else str(exc)
        return cap(result)

    def _admin(self) -> pymysql.connections.Connection:
        """A connection as the server's admin whose statements wait at most `ADMIN_LOCK_TIMEOUT` for a lock."""
        admin = self._admin_address.connect(timeout=STATEMENT_TIMEOUT + 30)
        try:
            with admin.cursor() as cursor:
                cursor.execute(f"SET SESSION lock_wait_timeout = {ADMIN_LOCK_TIMEOUT}")
                cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {ADMIN_LOCK_TIMEOUT}")
        except BaseException:
            admin.close()
            raise
        return admin

    def _sessions(self, cursor: Any, users: tuple[str, ...]) -> list[int]:
        """Ids of the server's sessions (connections, event threads) of `users`."""
        marks = ",".join(["%s"] * len(users))
        cursor.execute(f"SELECT id FROM information_schema.processlist WHERE user IN ({marks})", users)
        return [int(row[0]) for row in cursor.fetchall()]

    def _kill_sessions(self, users: tuple[str, ...]) -> None:
        """Kill every session of `users` (their locks and running statements end with them)."""
        with contextlib.suppress(pymysql.Error):
            self._connection.close()
        admin = self._admin()
        try:
            with admin.cursor() as cursor:
                for _ in range(50):
                    sessions = self._sessions(cursor, users)
                    if not sessions:
                        return
                    for session in sessions:
                        with contextlib.suppress(pymysql.Error):  # it ended meanwhile
                            cursor.execute(f"KILL CONNECTION {session}")
                    time.sleep(0.02)
        finally:
            admin.close()

    def table_md5(self) -> str:
        """LLB's hash of the table now ("None" when the table is empty or gone), read as the grader.

        The agent's sessions are killed first: the agent is done, and nothing it holds (LOCK
        TABLES, an open transaction, a running statement) may stall the grader. The grader waits
        at most `GRADER_TIMEOUT` seconds for a lock or for its statement, which then fails (the
        table is not the expected one). A view in place of the table (it could run the agent's
        code as its definer, or sleep) is refused: "refused: ..." never equals a hash.
        """
        self._kill_sessions((self.agent_user,))
        grader = self._grader_address.connect(timeout=GRADER_TIMEOUT + 30)
        try:
            with grader.cursor() as cursor:
                try:
                    for variable in ("lock_wait_timeout", "innodb_lock_wait_timeout"):
                        cursor.execute(f"SET SESSION {variable} = {GRADER_TIMEOUT}")
                    if self._mariadb:
                        cursor.execute(f"SET SESSION max_statement_time = {GRADER_TIMEOUT}")
                    else:
                        cursor.execute(f"SET SESSION max_execution_time = {GRADER_TIMEOUT * 1000}")
                    cursor.execute("SELECT table_type FROM information_schema.tables "
                                   "WHERE table_schema = %s AND table_name = %s", (self.name, self.table["name"]))
                    found = cursor.fetchone()
                    if found is None:
                        return "None"
                    if found[0] != "BASE TABLE":
                        return f"refused: `{self.table['name']}` is a {found[0]}, not a table"
                    cursor.execute(f"USE `{self.name}`")
                    cursor.execute(table_md5_sql(self.table))
                except pymysql.Error as exc:
                    # A server error reading what the agent left (dropped or altered table, a
                    # function the grader may not run, a statement over its time) means the table
                    # is not the expected one.
                    if exc.args and isinstance(exc.args[0], int) and exc.args[0] < _CLIENT_ERRORS:
                        return "None"
                    raise
                value = cursor.fetchone()[0]
        finally:
            grader.close()
        return "None" if value is None else str(value)

    def drop(self) -> None:
        """Kill every session of both users, then drop the database and both users as the admin."""
        self._kill_sessions((self.agent_user, self.grader_user))
        admin = self._admin()
        try:
            with admin.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
                for user in (self.agent_user, self.grader_user):
                    cursor.execute("DROP USER IF EXISTS %s@%s", (user, self._host))
            admin.commit()
        finally:
            admin.close()

    def leftovers(self) -> dict[str, list[Any]]:
        """What of this episode the server still holds (see `server_leftovers`)."""
        return server_leftovers(self._admin_address, self.name)


def server_leftovers(address: mysql_address.ServerAddress, name: str) -> dict[str, list[Any]]:
    """What the server at `address` still holds of the episode whose database is `name`: the
    database, its two users (named after it) and any session of theirs."""
    token = name.removeprefix("llb_")
    users = (f"llba_{token[:24]}", f"llbg_{token[:24]}")
    admin = address.connect(timeout=STATEMENT_TIMEOUT + 30)
    try:
        with admin.cursor() as cursor:
            cursor.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name = %s", (name,))
            databases = [row[0] for row in cursor.fetchall()]
            cursor.execute("SELECT user FROM mysql.user WHERE user IN (%s, %s)", users)
            found = [row[0] for row in cursor.fetchall()]
            cursor.execute("SELECT id, user, command, info FROM information_schema.processlist "
                           "WHERE user IN (%s, %s)", users)
            sessions = [list(row) for row in cursor.fetchall()]
    finally:
        admin.close()
    return {"databases": databases, "users": found, "sessions": sessions}


def episode_databases(address: mysql_address.ServerAddress) -> set[str]:
    """The names of the episode databases (`llb_…`) on the server at `address` now."""
    admin = address.connect(timeout=STATEMENT_TIMEOUT + 30)
    try:
        with admin.cursor() as cursor:
            cursor.execute("SHOW DATABASES LIKE 'llb\\_%'")
            return {row[0] for row in cursor.fetchall()}
    finally:
        admin.close()
