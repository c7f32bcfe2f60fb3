"""One LLB DBBench episode's own database on the run's MySQL server, and its two users.

`EpisodeDatabase` creates `llb_<uuid>` holding the sample's table (`create_table_sql`, LLB's
initialisation), runs the agent's SQL as a user with rights on that database only, reads the
table's hash as a grader user who may only SELECT, and drops the database and both users.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import uuid
from typing import Any

import pymysql

from memrl_bench.adapters.llb_db_grading import table_md5_sql
from memrl_bench.environments import mysql8_compat, mysql_address

STATEMENT_TIMEOUT = 30  # seconds a MariaDB statement may run (max_statement_time)
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
