"""ALFWorld game files: where they live, which games a split holds, and each game's intent.

The data is the TextWorld version of ALFWorld that `alfworld-download` puts under
`$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-.../trial_*/`, each trial
holding `game.tw-pddl` (PDDL problem, text grammar, gold `walkthrough`) and `traj_data.json`.
Games are selected exactly as `alfworld.agents.environment.AlfredTWEnv.collect_game_files`
does (no `movable`/`Sliced` games, task type from `traj_data.json`, `solvable` games only).

A game's intent (the initial observation without the welcome banner) is derived here from the
game file alone, without starting the game: a reset costs 0.5-4 s, which would make listing
the 3553 training games take most of an hour. `intent_from_game` reproduces the text the
environment prints (the same demangled receptacle names, order and list punctuation); the
tests compare it with real resets.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl_cli.errors import MemrlError

GAMES_DIR = "json_2.1.1"
# Official ALFWorld task type names (traj_data.json `task_type`) -> short names.
TASK_TYPES = {
    "pick_and_place_simple": "put",
    "look_at_obj_in_light": "examine",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "puttwo",
}
SHORT_TYPES = tuple(TASK_TYPES.values())
# AlfredTWEnv numbers task types 1-6 in its config; accept those too.
_NUMBERED_TYPES = dict(zip("123456", ("put", "examine", "clean", "heat", "cool", "puttwo")))
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
HOW_TO_GET_DATA = (
    "get the ALFWorld games with `pip install alfworld==0.4.2 && alfworld-download` "
    "(it fills $ALFWORLD_DATA, default ~/.cache/alfworld), then pass --data DIR or set "
    "ALFWORLD_DATA to the directory that contains json_2.1.1 (a json_2.1.1*.tar.xz archive also works)"
)


@dataclass(frozen=True)
class Game:
    """One playable game of a split."""

    id: str  # path of the trial directory relative to json_2.1.1, e.g. "valid_unseen/<task>/trial_x"
    path: str  # absolute path of game.tw-pddl
    task_type: str  # short name: put, examine, clean, heat, cool, puttwo
    intent: str  # initial observation without the welcome banner


def cache_dir() -> Path:
    """memrl's cache directory for ALFWorld ($MEMRL_CACHE_DIR, else $XDG_CACHE_HOME/memrl, else ~/.cache/memrl)."""
    base = os.environ.get("MEMRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memrl"
    )
    return Path(base) / "alfworld"


def resolve_data_dir(data: str | os.PathLike[str] | None) -> Path:
    """The directory that contains `json_2.1.1`, from `data`, else $ALFWORLD_DATA, else ~/.cache/alfworld.

    `data` may also be the `json_2.1.1` directory itself or a `.tar.xz`/`.tar.gz` archive of it,
    which is unpacked once into the cache directory (keyed by the archive's SHA-256).
    """
    if data is not None:
        where = Path(data).expanduser()
        if where.is_file() and tarfile.is_tarfile(where):
            return unpack_archive(where)
        if where.name == GAMES_DIR and where.is_dir():
            where = where.parent
        if not (where / GAMES_DIR).is_dir():
            raise MemrlError(f"no ALFWorld games at {where} (expected {where / GAMES_DIR}): {HOW_TO_GET_DATA}")
        return where.resolve()
    env_dir = os.environ.get("ALFWORLD_DATA")
    candidates = [Path(env_dir).expanduser()] if env_dir else [Path("~/.cache/alfworld").expanduser()]
    for where in candidates:
        if (where / GAMES_DIR).is_dir():
            return where.resolve()
    place = f"ALFWORLD_DATA={env_dir} has no {GAMES_DIR}" if env_dir else "ALFWorld data not found"
    raise MemrlError(f"{place}: {HOW_TO_GET_DATA}")


def unpack_archive(archive: Path) -> Path:
    """Unpack a tar archive holding `json_2.1.1/` once into the cache; return the directory containing it."""
    digest = hashlib.sha256()
    with archive.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    target = cache_dir() / f"data-{digest.hexdigest()[:16]}"
    if (target / GAMES_DIR).is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                tar.extractall(staging, filter="data")
            else:  # older Pythons lack extraction filters: refuse paths that leave the target
                unsafe = [m.name for m in tar.getmembers() if m.name.startswith("/") or ".." in Path(m.name).parts]
                if unsafe or any(m.issym() or m.islnk() for m in tar.getmembers()):
                    raise MemrlError(f"{archive} has links or paths outside its top directory: unpack it yourself")
                tar.extractall(staging)  # noqa: S202
        if not (staging / GAMES_DIR).is_dir():
            raise MemrlError(f"{archive} does not contain a top-level {GAMES_DIR}/ directory: {HOW_TO_GET_DATA}")
        try:
            staging.rename(target)
        except OSError:  # another process unpacked it first
            if not (target / GAMES_DIR).is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def parse_task_types(task_types: str | list[Any] | tuple[Any, ...] | None) -> tuple[str, ...]:
    """Short task type names from a comma-separated string or a list (short names, official names or 1-6)."""
    if task_types is None or task_types == "" or task_types == "all":
        return SHORT_TYPES
    items = task_types.split(",") if isinstance(task_types, str) else list(task_types)
    chosen: list[str] = []
    for item in items:
        name = str(item).strip()
        short = TASK_TYPES.get(name) or _NUMBERED_TYPES.get(name) or (name if name in SHORT_TYPES else None)
        if short is None:
            raise MemrlError(f"unknown ALFWorld task type {name!r}: use any of {', '.join(SHORT_TYPES)} (or 1-6)")
        if short not in chosen:
            chosen.append(short)
    return tuple(t for t in SHORT_TYPES if t in chosen)


def list_games(root: Path, split: str, task_types: tuple[str, ...] = SHORT_TYPES) -> list[Game]:
    """The solvable games of `split` whose type is in `task_types`, sorted by id."""
    split_dir = root / GAMES_DIR / split
    if not split_dir.is_dir():
        splits = sorted(p.name for p in (root / GAMES_DIR).iterdir() if p.is_dir())
        raise MemrlError(f"no ALFWorld split {split!r} under {root / GAMES_DIR}: use one of {', '.join(splits)}")
    games = []
    for traj_path in sorted(split_dir.glob("*/*/traj_data.json")):
        trial_dir = traj_path.parent
        if "movable" in str(trial_dir) or "Sliced" in str(trial_dir):
            continue
        game_path = trial_dir / "game.tw-pddl"
        if not game_path.is_file():
            continue
        official_type = json.loads(traj_path.read_text())["task_type"]
        short = TASK_TYPES.get(official_type)
        if short not in task_types:
            continue
        game = json.loads(game_path.read_text())
        if not game.get("solvable", False):
            continue
        games.append(
            Game(
                id=trial_dir.relative_to(root / GAMES_DIR).as_posix(),
                path=str(game_path),
                task_type=short,
                intent=intent_from_game(game),
            )
        )
    return games


def load_walkthrough(game_path: str) -> list[str]:
    """The gold plan stored in a game file (a list of commands)."""
    walkthrough = json.loads(Path(game_path).read_text()).get("walkthrough")
    if isinstance(walkthrough, str):  # some copies store its repr
        walkthrough = json.loads(walkthrough.replace("'", '"'))
    if not walkthrough:
        raise MemrlError(f"{game_path} has no walkthrough: use ALFWorld game files of grammar version 2.1.3")
    return [str(step) for step in walkthrough]


def strip_banner(observation: str) -> str:
    """The initial observation without its first paragraph, the welcome banner."""
    if observation.lstrip().startswith(BANNER):
        return observation.lstrip()[len(BANNER) :].lstrip("\n")
    return observation


def intent_from_game(game: dict[str, Any]) -> str:
    """The initial observation without the welcome banner, computed from the game file.

    At reset the agent is nowhere, so the room text is the grammar's unconditional
    `look.feedback` rule: every receptacle placed at a location, as "a <name>", in the order of
    their PDDL ids (fast-downward lower-cases them), joined with the grammar's list separators.
    Names are demangled as `alfworld.agents.utils.misc.Demangler` does (numbers counted per name
    over the sorted ids, handed out from the highest down).
    """
    rules = _grammar_rules(game["grammar"])
    task = rules["task"][0]["rhs"]
    look = next(rule["rhs"] for rule in rules["look.feedback"] if not rule.get("condition"))
    init = game["pddl_problem"].split("(:init", 1)[1].split("(:goal", 1)[0]
    ids = sorted({name.lower() for name in re.findall(r"[\s(]([A-Za-z0-9_]+_bar_[A-Za-z0-9_]+)", init)})
    names = _demangled_names(ids)
    receptacles = sorted({r.lower() for r in re.findall(r"\(receptacleAtLocation\s+(\S+)\s+\S+\)", init, flags=re.I)})
    items = [f"a {names[r]}" for r in receptacles]
    separator = rules["list_separator"][0]["rhs"]
    last_separator = rules["list_last_separator"][0]["rhs"]
    if not items:
        listing = rules["list_empty"][0]["rhs"]
    elif len(items) == 1:
        listing = items[0]
    else:
        listing = separator.join(items[:-1]) + last_separator + items[-1]
    return look.replace("#list_appliances#", listing) + "\n\n" + task


def _grammar_rules(grammar: str) -> dict[str, list[dict[str, str]]]:
    """The production rules of a game's text grammar (its JSON blocks `grammar :: \"\"\"...\"\"\"`, merged)."""
    rules: dict[str, list[dict[str, str]]] = {}
    for block in grammar.split('"""')[1::2]:
        for name, alternatives in json.loads(block).items():
            rules.setdefault(name, []).extend(alternatives)
    return rules


def _demangled_names(ids: list[str]) -> dict[str, str]:
    """Demangled display names ("desk 2") of sorted PDDL ids, as ALFWorld's Demangler assigns them."""

    def base(entity_id: str) -> str:
        name = entity_id.split("_bar_", 1)[0]
        return name + "basin" if "basin" in entity_id else name

    counts = Counter(base(i) for i in ids)
    remaining = {name: list(range(1, count + 1)) for name, count in counts.items()}
    return {i: f"{base(i)} {remaining[base(i)].pop()}" for i in ids}
