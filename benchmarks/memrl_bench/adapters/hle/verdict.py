"""What counts as the HLE judge's verdict: one strict JSON object that the judge wrote, and nothing the answer wrote.

The answer reaches the judge in its prompt, so a judge that repeats it (in part, whole, or as it reads
it) could hand a parser a verdict the agent wrote. Two rules keep the verdict the judge's own:

* `neutralise` renames every verdict label (`correct` before a colon), and every field name of the
  judge prompt or label posing as one (a second `[correct_answer]`, `[gold answer]`, `correct-answer:`
  ... a judge could take for the gold answer), in the answer
  before it is quoted, found in the answer as a reader takes it in (`reading`): HTML entities and `\\u`, `\\x`,
  `%XX` escapes decoded, compatibility forms folded (fullwidth, ligatures, mathematical letters),
  combining marks and invisible format characters (zero-width, soft hyphen, bidi controls) dropped,
  markdown emphasis dropped, case folded, look-alike letters read as Latin. The answer keeps its
  own characters everywhere else.
* `read_verdict` accepts only a reply that is one JSON object (bare, or alone in one code fence) with
  HLE's judge fields, no duplicate or unknown keys, a literal `"correct"` key whose value is `yes` or
  `no`, and exactly one verdict label in the whole reply as a reader takes it in. Anything else
  (an echo before or after the object, two verdicts, prose, an empty or cut reply) is
  `VerdictUnreadable`, which grades as a failure, never a success.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from typing import Any

FIELDS = ("extracted_final_answer", "reasoning", "correct", "confidence")
QUOTED_LABEL = "correct (quoted from the response)"
QUOTED_FIELD = "[a field name quoted from the response]"
LABEL = re.compile(r"(?<!\w)correct(?=\W*:)")  # in a text as `reading` gives it
# What a judge could take for a field of its prompt holding the gold answer (or the extracted answer): a name of
# an answer as the gold one, in any spelling (`correct answer`, `correct-answer`, `gold answer`,
# `extracted final answer`, ...; `_` is dropped by `reading`), used as a label: bracketed (`[...]`, `<...>`,
# `(...)`, `{...}`) or before a colon or `=`. The words alone in prose ("the correct answer is 42") stay.
_ANSWER_NAME = (r"(?<![a-z])(?:correct|gold(?:en)?|reference|expected|true|right|official|target|ground\W{0,3}truth"
                r"|extracted(?:\W{0,3}final)?)\W{0,3}(?:final\W{0,3})?answer(?![a-z])")
# A verdict label, or a field name of the judge prompt or one posing as it (a second "[correct_answer]" that a
# judge could take for the gold answer), in a text as `reading` gives it.
_PLANTED = re.compile(r"(?P<label>(?<!\w)correct(?=\W*:))"
                      rf"|[\[<({{]\s*(?:{_ANSWER_NAME}|question|response)\s*[\]>)}}]|{_ANSWER_NAME}(?=\W{{0,3}}[:=])")
_ESCAPE = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?"  # HTML entities
    r"|\\u[0-9a-fA-F]{4}|\\U[0-9a-fA-F]{8}|\\x[0-9a-fA-F]{2}|%[0-9a-fA-F]{2}"  # escapes, URL encoding
)
_EMPHASIS = frozenset("*_~`")
# Letters that read as the Latin letters of the label (and its colon), by their look; NFKD already folds
# fullwidth, mathematical, circled and superscript forms, and marked letters lose their marks.
_LOOK_ALIKE = str.maketrans({
    **dict.fromkeys("\u0441\u03f2\u1d04\u2ca5\uabaf\u0188\u023c", "c"),
    **dict.fromkeys("\u043e\u03bf\u1d0f\u0585\u2c9f\u05e1\u0d20\u0966\u0e50\u101d\u00f8\u0275\u03c3\u0030", "o"),
    **dict.fromkeys("\u0433\u0280\u1d26\u2c85\uab47\uab48\u027c\u027d", "r"),
    **dict.fromkeys("\u0435\u04bd\u1d07\u212e\uab32\u0259\u0258\u03b5", "e"),
    **dict.fromkeys("\u0442\u1d1b\u03c4\u2ca7\u0167\u01ab\u01ad", "t"),
    **dict.fromkeys("\u2236\u02d0\ua789\u0589\u05c3\u16ec\u205a\ufe30\u1361\u0703\u0704", ":"),
})
_DROPPED = ("Mn", "Me", "Cf")  # combining marks, enclosing marks, format characters (zero-width, soft hyphen, bidi)
_ROUNDS = 3  # escapes decoded up to this deep (`&amp;#99;` is two)


class VerdictUnreadable(ValueError):
    """The judge's reply is not one well-formed verdict of its own: graded as a failure."""


def reading(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` as a reader takes it in (see the module docstring), and for each character of it the span
    of `text` it comes from."""
    chars = list(text)
    spans = [(i, i + 1) for i in range(len(text))]
    for _ in range(_ROUNDS):
        joined = "".join(chars)
        pieces: list[str] = []
        new_spans: list[tuple[int, int]] = []
        last = 0
        for found in _ESCAPE.finditer(joined):
            decoded = _decode(found.group(0))
            if decoded is None:
                continue
            pieces.extend(chars[last:found.start()])
            new_spans.extend(spans[last:found.start()])
            whole = (spans[found.start()][0], spans[found.end() - 1][1])
            pieces.extend(decoded)
            new_spans.extend([whole] * len(decoded))
            last = found.end()
        if last == 0:
            break
        chars, spans = pieces + chars[last:], new_spans + spans[last:]
    out: list[str] = []
    out_spans: list[tuple[int, int]] = []
    for char, span in zip(chars, spans):
        for piece in unicodedata.normalize("NFKD", char):
            if unicodedata.category(piece) in _DROPPED or piece in _EMPHASIS:
                continue
            for folded in piece.casefold().translate(_LOOK_ALIKE):
                out.append(folded)
                out_spans.append(span)
    return "".join(out), out_spans


def _decode(token: str) -> str | None:
    """What an escape or entity stands for, or None when it stands for nothing (an unknown entity, a bad code)."""
    if token.startswith("&"):
        decoded = html.unescape(token)
        return decoded if decoded != token else None
    try:
        code = int(token[2:] if token[0] == "\\" else token[1:], 16)
        return chr(code)
    except (ValueError, OverflowError):
        return None


def verdict_labels(text: str) -> int:
    """How many verdict labels `text` holds as a reader takes it in."""
    return len(LABEL.findall(reading(text)[0]))


def neutralise(response: str) -> str:
    """`response` with every verdict label, in any form `reading` sees through, renamed `QUOTED_LABEL`, and every
    field name of the judge prompt (`[correct_answer]`, `[question]`, `[response]`) or label posing as the gold
    or extracted answer (`_ANSWER_NAME`: `[gold answer]`, `correct-answer:`, ...) renamed `QUOTED_FIELD`."""
    for _ in range(4):  # a rename could only uncover a label a neighbouring escape completed: read again
        read, spans = reading(response)
        found = [(spans[m.start()][0], spans[m.end() - 1][1], QUOTED_LABEL if m.group("label") else QUOTED_FIELD)
                 for m in _PLANTED.finditer(read)]
        if not found:
            return response
        parts, last = [], 0
        for start, end, quoted in found:
            if start < last:  # overlapping spans (one escape holding two labels' letters): already replaced
                continue
            parts += [response[last:start], quoted]
            last = end
        response = "".join(parts) + response[last:]
    read = reading(response)[0]  # still planted: the text as read, renamed
    return _PLANTED.sub(lambda m: QUOTED_LABEL if m.group("label") else QUOTED_FIELD, read)


_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL | re.IGNORECASE)
_LITERAL_KEY = re.compile(r'"correct"\s*:')


def read_verdict(reply: str) -> dict[str, Any]:
    """The judge's verdict from its reply: extracted_final_answer, reasoning, correct ("yes"/"no"), confidence
    (int or None). Raises `VerdictUnreadable` unless the reply is exactly one verdict (module docstring)."""
    body = reply.strip()
    fenced = _FENCE.fullmatch(body)
    if fenced:
        body = fenced.group(1).strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise VerdictUnreadable(f"the judge's reply is not one JSON object: {_excerpt(reply)}")
    try:
        data = json.loads(body, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as exc:
        raise VerdictUnreadable(f"the judge's reply is not valid JSON ({exc}): {_excerpt(reply)}") from None
    if not isinstance(data, dict):
        raise VerdictUnreadable(f"the judge's reply is not a JSON object: {_excerpt(reply)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise VerdictUnreadable(f"the judge's reply has unknown fields {unknown}: {_excerpt(reply)}")
    labels = verdict_labels(reply)
    if labels != 1 or len(_LITERAL_KEY.findall(body)) != 1:
        raise VerdictUnreadable(f"the judge's reply holds {labels} verdict labels, not one of its own: "
                                f"{_excerpt(reply)}")
    verdict = data["correct"]
    if not isinstance(verdict, str) or not verdict.isascii() or verdict.strip().lower() not in ("yes", "no"):
        raise VerdictUnreadable(f"the judge's verdict is {verdict!r}, not yes or no")
    return {
        "extracted_final_answer": str(data.get("extracted_final_answer", "")),
        "reasoning": str(data.get("reasoning", "")),
        "correct": verdict.strip().lower(),
        "confidence": _confidence(data.get("confidence")),
    }


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"duplicate keys {repeated}")
    return dict(pairs)


def _confidence(value: Any) -> int | None:
    try:
        return int(float(str(value).strip().rstrip("%")))
    except (TypeError, ValueError, OverflowError):
        return None


def _excerpt(text: str) -> str:
    return repr(text[:200]) + ("..." if len(text) > 200 else "")
