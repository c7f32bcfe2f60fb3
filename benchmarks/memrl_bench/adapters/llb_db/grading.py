"""LLB DBBench's grading (`src/tasks/instance/db_bench/task.py`), quirks included.

A write task (INSERT/UPDATE/DELETE) passes when the table's hash after the episode equals the
expected one: `table_md5_sql` is LLB's hash query, run by the grader's own user
(`EpisodeDatabase.table_md5`). A query task passes when the final answer matches the expected
rows under LLB's tuple parser with a 1e-6 float tolerance (`direct_answer_matches`).
"""

from __future__ import annotations

import math
import re
from typing import Any


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
