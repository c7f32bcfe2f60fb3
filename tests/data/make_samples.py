"""Write the small benchmark samples of tests/data/ (see its README) from the full data sets.

    python tests/data/make_samples.py alfworld ALFWORLD_DIR   # the directory holding json_2.1.1
    python tests/data/make_samples.py bigcodebench BCB_DIR    # the directory holding bigcodebench_full.jsonl
    python tests/data/make_samples.py examples ALFWORLD_DIR   # examples built from the training walkthroughs
                                                              # (needs the alfworld extra: plays 6 games)

The output is deterministic: the same input gives the same bytes.
"""

from __future__ import annotations

import io
import json
import lzma
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
sys.path.insert(0, str(HERE.parents[1]))

from memrl_bench.adapters.alfworld.data import GAMES_DIR, SHORT_TYPES, list_games  # noqa: E402

ALFWORLD_SAMPLE = HERE / "alfworld" / "json_2.1.1_sample.tar.xz"
ALFWORLD_EXAMPLES = HERE / "alfworld" / "examples_from_walkthroughs.json"
BIGCODEBENCH_SAMPLE = HERE / "bigcodebench" / "bigcodebench_full.jsonl"
BIGCODEBENCH_ROWS = 20  # the first rows of the full set: the tasks the tests play, and enough for a seeded split
TRAJ_FIELDS = ("task_id", "task_type", "pddl_params")  # all that memrl and ALFWorld's game loader read


def alfworld_games(root: Path) -> list[str]:
    """The valid_unseen games the tests play: for each task type, its smallest game file (the quickest reset)."""
    games = list_games(root, "valid_unseen")
    return [min((g for g in games if g.task_type == kind), key=lambda g: Path(g.path).stat().st_size).id
            for kind in SHORT_TYPES]


def _add(tar: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if data is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def write_alfworld(root: Path) -> None:
    chosen = alfworld_games(root)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories = sorted({"/".join(Path(GAMES_DIR, game).parts[:n]) for game in chosen for n in (1, 2, 3, 4)})
        for directory in directories:
            _add(tar, directory, None)
        for game in sorted(chosen):
            trial = root / GAMES_DIR / game
            traj = json.loads((trial / "traj_data.json").read_text())
            _add(tar, f"{GAMES_DIR}/{game}/game.tw-pddl", (trial / "game.tw-pddl").read_bytes())
            _add(tar, f"{GAMES_DIR}/{game}/traj_data.json",
                 json.dumps({k: traj[k] for k in TRAJ_FIELDS if k in traj}, indent=1).encode())
    ALFWORLD_SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    ALFWORLD_SAMPLE.write_bytes(lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{ALFWORLD_SAMPLE}: {len(chosen)} games, {ALFWORLD_SAMPLE.stat().st_size} bytes")


def write_examples(root: Path) -> None:
    from memrl_bench.adapters.alfworld.examples import build_walkthrough_examples

    items = [{"task": kind, "example": dialogue} for kind, dialogue in build_walkthrough_examples(root).items()]
    ALFWORLD_EXAMPLES.write_text(json.dumps(items, indent=1) + "\n")
    print(f"{ALFWORLD_EXAMPLES}: {len(items)} examples")


def write_bigcodebench(data: Path) -> None:
    with (data / "bigcodebench_full.jsonl").open(encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip()][:BIGCODEBENCH_ROWS]
    BIGCODEBENCH_SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    BIGCODEBENCH_SAMPLE.write_text("".join(lines), encoding="utf-8")
    print(f"{BIGCODEBENCH_SAMPLE}: {len(lines)} tasks, {BIGCODEBENCH_SAMPLE.stat().st_size} bytes")


if __name__ == "__main__":
    what, source = sys.argv[1], Path(sys.argv[2])
    {"alfworld": write_alfworld, "examples": write_examples, "bigcodebench": write_bigcodebench}[what](source)
