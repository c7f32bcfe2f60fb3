"""HLE's local grading: the answer line of a response, normalised, compared when that decides.

`extract_answer` reads the last "Answer:" / "Exact Answer:" line; `local_verdict` returns True or
False only when a normalised comparison is decisive (an exact match, or a bare option letter
against a letter), else None, and the judge decides (`memrl_bench.adapters.hle.judge`).
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation

from memrl_bench.adapters.hle.data import EXACT_MATCH

_ANSWER_LINE = re.compile(
    r"^[\s>*#_]*(?:final\s+)?(?:exact\s+)?answer[\s*_]*:[ \t*_]*(.*)$", re.IGNORECASE | re.MULTILINE
)
_CONFIDENCE_LINE = re.compile(r"^[\s>*#_]*confidence[\s*_]*:", re.IGNORECASE)
_BOXED = re.compile(r"^\\boxed\{(.*)\}$")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:e[+-]?\d+)?$")
_LETTER = re.compile(r"^[(\[]?([A-Z])[)\]]?[.:]?$")


def extract_answer(response: str) -> str | None:
    """The value of the last "Answer:" / "Exact Answer:" line (or the next line if it is empty)."""
    matches = list(_ANSWER_LINE.finditer(response))
    if not matches:
        return None
    last = matches[-1]
    value = last.group(1).strip()
    if not value:
        for line in response[last.end() :].splitlines():
            if _CONFIDENCE_LINE.match(line):
                break
            if line.strip():
                value = line.strip()
                break
    return value or None


def normalize_answer(text: str) -> str:
    """Case, whitespace, markdown/LaTeX wrapping, edge punctuation and simple numbers normalised (never the
    characters inside: an answer with a mark or an invisible character inside goes to the judge)."""
    value = re.sub(r"\s+", " ", _unwrap(unicodedata.normalize("NFKC", text))).casefold()
    value = value.rstrip(" .,;:!?\"'").lstrip(" \"'")
    return _canonical_number(value) or value


def _unwrap(text: str) -> str:
    """`text` without the markdown bold/code marks and $...$ around it, and out of a \\boxed{...}.

    Marks inside are kept: "4**2" is not "42".
    """
    value = text.strip().strip("*`").strip().strip("$").strip()
    boxed = _BOXED.match(value)
    return boxed.group(1).strip() if boxed else value


def _canonical_number(value: str) -> str | None:
    """Canonical form of a plain number ("1,000.50" -> "1000.5", "-0.0" -> "0"), else None."""
    if not value or not _NUMBER.match(value) or not any(ch.isdigit() for ch in value):
        return None
    try:
        number = Decimal(value.replace(",", ""))
    except InvalidOperation:
        return None
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def answer_letter(text: str) -> str | None:
    """The option letter when the answer is a letter alone ("B", "(B)", "B."), else None."""
    match = _LETTER.match(_unwrap(text))
    return match.group(1) if match else None


def local_verdict(extracted: str | None, gold: str, answer_type: str) -> bool | None:
    """True/False when a local comparison decides the grade, None when the judge must decide.

    exactMatch: a normalised match is correct; anything else goes to the judge (answers can be
    equivalent without being equal). multipleChoice: a bare option letter decides both ways
    when the gold answer is a letter too; longer answers go to the judge.
    """
    if extracted is None:
        return None
    if answer_type == EXACT_MATCH:
        return True if normalize_answer(extracted) == normalize_answer(gold) else None
    chosen, correct = answer_letter(extracted), answer_letter(gold)
    if chosen is None or correct is None:
        return None
    return chosen == correct
