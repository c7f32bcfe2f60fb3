"""HLE's question file: reading and validating a cais/hle parquet or JSONL file, and the task splits.

Every row is checked (required columns, answer type, unique ids) and gets its image as a data URL
("" if none). `select_questions` keeps categories and draws a seeded sample in file order;
`split_tasks` moves a seeded share of every category to the "val" split.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Any

from memrl_bench.framework.protocol import Task
from memrl_cli.errors import MemrlError

EXACT_MATCH = "exactMatch"
MULTIPLE_CHOICE = "multipleChoice"
REQUIRED_COLUMNS = ("id", "question", "answer", "category")
OPTIONAL_COLUMNS = ("answer_type", "image")
HOW_TO_GET_HLE = (
    "HLE is gated: accept its terms at https://huggingface.co/datasets/cais/hle, log in with "
    '`huggingface-cli login`, then run `python -c "import datasets; '
    "datasets.load_dataset('cais/hle', split='test').to_parquet('hle.parquet')\"` and pass --data hle.parquet"
)
_EXPECTED = "expected columns id, question, answer, category, answer_type (exactMatch|multipleChoice), image (optional)"
_IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


def load_rows(data: str | None) -> list[dict[str, Any]]:
    """Read and validate the question file; every row gets a data-URL `image` ("" if none)."""
    if data is None:
        raise MemrlError(f"HLE needs a question file: pass --data PATH (parquet or JSONL). {HOW_TO_GET_HLE}")
    path = Path(data).expanduser()
    if not path.is_file():
        raise MemrlError(f"HLE data file {path} does not exist. {HOW_TO_GET_HLE}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        rows = _read_jsonl(path)
    else:
        raise MemrlError(f"HLE data file {path} must end in .parquet or .jsonl. {HOW_TO_GET_HLE}")
    if not rows:
        raise MemrlError(f"HLE data file {path} holds no questions. {HOW_TO_GET_HLE}")
    missing = [column for column in REQUIRED_COLUMNS if column not in rows[0]]
    if missing:
        raise MemrlError(f"HLE data file {path} lacks column(s) {', '.join(missing)}; {_EXPECTED}. {HOW_TO_GET_HLE}")
    return [_clean_row(row, path, number) for number, row in enumerate(rows, start=1)]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        wanted = [name for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if name in names]
        table = pq.read_table(path, columns=wanted)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise MemrlError(f"cannot read HLE parquet file {path}: {exc}") from None
    return table.to_pylist()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MemrlError(f"HLE data file {path} line {number} is not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise MemrlError(f"HLE data file {path} line {number} is not a JSON object; {_EXPECTED}")
        rows.append(row)
    return rows


def _clean_row(row: dict[str, Any], path: Path, number: int) -> dict[str, Any]:
    missing = [column for column in REQUIRED_COLUMNS if row.get(column) in (None, "")]
    if missing:
        raise MemrlError(f"HLE data file {path} row {number} has empty {', '.join(missing)}; {_EXPECTED}")
    answer_type = row.get("answer_type") or EXACT_MATCH
    if answer_type not in (EXACT_MATCH, MULTIPLE_CHOICE):
        raise MemrlError(
            f"HLE data file {path} row {number} has answer_type {answer_type!r}; use exactMatch or multipleChoice"
        )
    return {
        "id": str(row["id"]),
        "question": str(row["question"]),
        "answer": str(row["answer"]),
        "answer_type": answer_type,
        "category": str(row["category"]),
        "image": image_data_url(row.get("image"), f"{path} row {number}"),
    }


def image_data_url(image: Any, where: str) -> str:
    """The image as a data URL: strings pass through; {'bytes': ...} (raw or base64) is encoded."""
    if image is None or image == "":
        return ""
    if isinstance(image, str):
        return image
    if isinstance(image, dict) and image.get("bytes"):
        raw = image["bytes"]
        if isinstance(raw, str):  # JSON cannot hold bytes, so JSONL files carry them as base64
            raw = base64.b64decode(raw)
        mime = next((kind for magic, kind in _IMAGE_TYPES if raw.startswith(magic)), "image/png")
        return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
    if isinstance(image, dict) and not image.get("bytes") and not image.get("path"):
        return ""
    raise MemrlError(f"HLE image in {where} is neither a data URL string nor {{'bytes': ...}}")


def select_questions(
    rows: list[dict[str, Any]], categories: list[str] | None, sample: int | None, seed: int
) -> list[dict[str, Any]]:
    """Keep `categories`, check ids are unique, then draw `sample` rows (kept in file order)."""
    if categories:
        known = sorted({row["category"] for row in rows})
        unknown = [category for category in categories if category not in known]
        if unknown:
            raise MemrlError(f"HLE categories {unknown} are not in the data; available: {known}")
        rows = [row for row in rows if row["category"] in categories]
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise MemrlError(f"HLE question id {row['id']!r} appears twice in the data; ids must be unique")
        seen.add(row["id"])
    if sample is not None and int(sample) < len(rows):
        chosen = set(random.Random(seed).sample(range(len(rows)), int(sample)))
        rows = [row for index, row in enumerate(rows) if index in chosen]
    return rows


def split_tasks(rows: list[dict[str, Any]], val_fraction: float, seed: int) -> dict[str, list[Task]]:
    """Seeded per-category split: round(n * val_fraction) questions of every category go to val."""
    val_ids: set[str] = set()
    by_category: dict[str, list[str]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["id"])
    rng = random.Random(seed)
    for category in sorted(by_category):
        ids = by_category[category]
        rng.shuffle(ids)
        val_ids.update(ids[: round(len(ids) * val_fraction)])
    splits: dict[str, list[Task]] = {"train": [], "val": []}
    for row in rows:
        splits["val" if row["id"] in val_ids else "train"].append(_task(row))
    return splits


def _task(row: dict[str, Any]) -> Task:
    meta = {"category": row["category"], "task_type": row["category"], "answer_type": row["answer_type"],
            "has_image": bool(row["image"])}
    return Task(id=row["id"], query=row["question"], payload=row, meta=meta)
