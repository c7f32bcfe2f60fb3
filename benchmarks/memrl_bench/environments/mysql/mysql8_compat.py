"""MariaDB made to behave like LLB's MySQL 8: the server's settings and the statements it runs differently.

LLB's expected answers come from MySQL 8. Every managed MariaDB starts with `SERVER_SETTINGS`
(MySQL 8's `sql_mode`, character set and GROUP_CONCAT length) and `INNODB_SETTINGS` (a small
footprint for a throwaway database); `as_mysql8` rewrites the two constructs whose meaning
differs before each agent statement runs (docs/llb.md, "MariaDB versus LLB's MySQL").
"""

from __future__ import annotations

import re

# MySQL 8's defaults, so that a MariaDB server groups, sorts and concatenates like LLB's MySQL.
MYSQL8_SQL_MODE = (
    "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"
)
SERVER_SETTINGS = (
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_unicode_520_ci",
    f"--sql-mode={MYSQL8_SQL_MODE}",
    "--group-concat-max-len=1024",
    "--max-connections=500",
    "--skip-log-bin",
)
INNODB_SETTINGS = (
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",
)

_DELETE_WITH_ALIAS = re.compile(r"\s*DELETE\s+FROM\s+(`[^`]+`|\w+)\s+AS\s+(`[^`]+`|\w+)\s", re.IGNORECASE)
_CLAUSE_AFTER_GROUPS = re.compile(r"\b(WINDOW|LIMIT|FOR\s+UPDATE|LOCK\s+IN|INTO)\b")


def _top_level(sql: str) -> str:
    """`sql` upper-cased with quoted text and everything inside parentheses blanked (same length)."""
    out: list[str] = []
    depth, quote, index = 0, "", 0
    while index < len(sql):
        char = sql[index]
        if quote:
            if char == "\\" and quote != "`":
                out.append("  ")
                index += 2
                continue
            if char == quote:
                if sql[index + 1:index + 2] == quote:  # doubled quote inside the literal
                    out.append("  ")
                    index += 2
                    continue
                quote = ""
            out.append(" ")
        elif char in "'\"`":
            quote = char
            out.append(" ")
        elif char in "()":
            depth = depth + 1 if char == "(" else max(0, depth - 1)
            out.append(" ")
        elif depth:
            out.append(" ")
        else:
            upper = char.upper()
            out.append(upper if len(upper) == 1 else char)  # keep one character per character
        index += 1
    return "".join(out)[: len(sql)]  # an escape at the very end adds one blank too many


def as_mysql8(statement: str) -> str:
    """Rewrite one statement so that MariaDB runs it the way MySQL 8 does.

    * `DELETE FROM t AS a WHERE ...` (MySQL-only syntax) becomes `DELETE a FROM t AS a WHERE ...`.
    * MariaDB sorts the result of a top-level GROUP BY that has no ORDER BY; MySQL 8 returns
      groups in the order it meets them, which is what LLB's expected rows follow. Appending
      `ORDER BY NULL` makes MariaDB do the same.
    """
    delete = _DELETE_WITH_ALIAS.match(statement)
    if delete and not re.search(r"\b(ORDER\s+BY|LIMIT)\b", _top_level(statement)):
        return f"DELETE {delete.group(2)} FROM {delete.group(1)} AS {delete.group(2)} {statement[delete.end():]}"
    top = _top_level(statement)
    group = re.search(r"\bGROUP\s+BY\b", top)
    if (
        group is None
        or not re.match(r"\s*(SELECT|WITH)\b", top)
        or re.search(r"\b(ORDER\s+BY|UNION|INTERSECT|EXCEPT|ROLLUP)\b", top)
    ):
        return statement
    tail = _CLAUSE_AFTER_GROUPS.search(top, group.end())
    cut = tail.start() if tail else len(statement.rstrip())
    return f"{statement[:cut].rstrip()} ORDER BY NULL {statement[cut:].lstrip()}".rstrip()
