"""The `memrl` command line: a thin layer over `MemoryBank` and friends.

Each command parses options, calls one library function, and prints the result as a
table or (with `--json`) as exactly one JSON object on stdout. User errors print one line
on stderr (or a JSON error object with `--json`) and exit non-zero, without a traceback.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import sys
from pathlib import Path
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, NoReturn, Optional, get_args, get_origin

import typer
from typer.core import TyperCommand, TyperGroup

from memrl_cli.errors import MemrlError, error_object

if TYPE_CHECKING:
    from memrl_cli.bank.memory_bank import MemoryBank

TYPE_NAMES = {int: "INTEGER", float: "FLOAT", str: "TEXT"}


def type_name(param: Any) -> str:
    """INTEGER, FLOAT or TEXT: the value a parameter takes (of a list's items for a repeatable one)."""
    annotation = param.type_descriptor.annotation
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    return TYPE_NAMES.get(annotation, "TEXT")


class MemrlCommand(TyperCommand):
    """A command's help with manners: typed metavars (`--k1 INTEGER`; `NUMBER`, `FILE`, … where the
    command says so), arguments and usage in capitals, the first sentence of the help written out in
    the command list, and the `epilog` as an "Examples:" section printed verbatim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "option" and not getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = type_name(param)

    @staticmethod
    def _argument(param: Any) -> str:
        return (param.metavar or (param.name or "").upper()) + ("..." if param.nargs != 1 else "")

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(self._argument(param) if param.required else f"[{self._argument(param)}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments = [(self._argument(p), f"{getattr(p, 'help', '') or ''}  [{type_name(p)}"
                      f"{'; required' if p.required else ''}]") for p in self.get_params(ctx)
                     if p.param_type_name == "argument"]
        options = [record for p in self.get_params(ctx) if p.param_type_name == "option"
                   for record in [p.get_help_record(ctx)] if record is not None]
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def get_short_help_str(self, limit: int = 45) -> str:
        """The help's first sentence, whole (click's default cuts it with "...")."""
        text = " ".join(inspect.cleandoc(self.short_help or self.help or "").split("\n\n")[0].split())
        end = text.find(". ")
        return text if end < 0 else text[:end + 1]

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        format_examples(self.epilog, formatter)


def format_examples(epilog: str | None, formatter: Any) -> None:
    """An epilog as an "Examples:" section, its lines as written (not re-wrapped)."""
    if epilog:
        with formatter.section("Examples"):
            for line in inspect.cleandoc(epilog).splitlines():
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


class MemrlGroup(TyperGroup):
    """`memrl` itself: its epilog as an "Examples:" section too."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        format_examples(self.epilog, formatter)


class MemrlTyper(typer.Typer):
    """`typer.Typer` whose commands are `MemrlCommand`s unless they say otherwise."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", MemrlCommand)
        return super().command(*args, **kwargs)


def examples(*lines: str) -> str:
    """A command's "Examples:" epilog: shell lines, printed as written under its --help."""
    return "\n".join(lines)


app = MemrlTyper(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                 context_settings={"help_option_names": ["-h", "--help"]}, cls=MemrlGroup,
                 epilog=examples('memrl ingest --intent "heat an egg" --experience "microwave 1; heat egg" --outcome success',
                                 'memrl retrieve "warm up an egg" --json', 'memrl reward --retrieval 1 --reward success',
                                 "memrl help retrieve"),
                 help="Runtime-learning episodic memory for LLM agents, in one SQLite file.")


def _print_version(value: bool) -> None:
    if value:
        from memrl_cli import __version__

        sys.stdout.write(f"memrl {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print memrl's version and exit.")) -> None:
    """Runtime-learning episodic memory for LLM agents, in one SQLite file."""


def default_db() -> str:
    """`$MEMRL_DB`, else `$XDG_DATA_HOME/memrl/memrl.db` (~/.local/share/memrl/memrl.db)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "memrl", "memrl.db")


SELECTOR = typer.Option("memrl", help="Phase B utility: memrl (the paper's z(Q)) or memrl-conditioned (the rewards "
                                     "a memory earned at similar queries; docs/method.md).")
DB = typer.Option(None, "--db", envvar="MEMRL_DB", show_default=False, metavar="FILE|URL",
                  help="Bank: a SQLite file, or a postgresql:// URL [env MEMRL_DB; default "
                       "~/.local/share/memrl/memrl.db].")
JSON = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")


def emit(data: Any, as_json: bool, render: Callable[[Any], object] | None = None) -> None:
    """Print `data` as JSON, or through `render` for people."""
    # json.dumps, not rich's print_json: that pretty-prints over several lines, and scripts read one line.
    if as_json or render is None:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    else:
        render(data)


@contextmanager
def command(as_json: bool) -> Iterator[None]:
    """Turn MemrlError (and Ctrl-C) into one line on stderr, or a JSON error, and an exit code.

    Any other exception is a bug in memrl: it becomes one line too, saying so (`MEMRL_DEBUG=1` shows
    its traceback), so no traceback reaches a user."""
    try:
        yield
    except MemrlError as exc:
        fail(exc, as_json)
    except KeyboardInterrupt:
        sys.stderr.write("memrl: interrupted\n")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except BrokenPipeError:  # the reader left (`memrl export | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor fail again flushing at exit
        raise typer.Exit(1) from None
    except Exception as exc:
        if os.environ.get("MEMRL_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:300]
        fail(MemrlError(f"unexpected {type(exc).__name__}{': ' + text if text else ''} (a bug in memrl: please "
                        "report it with the traceback MEMRL_DEBUG=1 shows)"), as_json)


def fail(exc: MemrlError, as_json: bool) -> NoReturn:
    """Print `exc` as one line on stderr (`memrl: error: ...`), or as a JSON error on stdout, and exit."""
    error = error_object(exc)
    if as_json:
        sys.stdout.write(json.dumps(error) + "\n")
    else:
        sys.stderr.write(f"memrl: error: {error['error']['message']}\n")
    raise typer.Exit(exc.exit_code) from None


def bank_location(db: str | None, create: bool = True) -> str:
    """The bank named by --db / MEMRL_DB, else the default path (its directory made when `create`)."""
    path = db or default_db()
    if db is None and create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def open_bank(db: str | None, embedder: str | None = None, create: bool = True, index: str = "auto") -> MemoryBank:
    """Open the bank named by --db / MEMRL_DB / the default, printing any warnings on stderr."""
    from memrl_cli.bank.memory_bank import MemoryBank

    path = bank_location(db, create)
    bank = MemoryBank(path, embedder, create=create, index=index)
    for warning in bank.warnings:
        sys.stderr.write(f"memrl: warning: {warning}\n")
    return bank


def parse_number(value: str | None, name: str) -> float | None:
    """A finite float from an option string, with a one-line error otherwise."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise MemrlError(f"--{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise MemrlError(f"--{name} must be a finite number, got {value!r}")
    return number


def parse_json_option(value: str | None, name: str) -> Any:
    """Decode a JSON option value."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise MemrlError(f"--{name} must be JSON: {exc.msg}") from None


def open_input(path: str) -> IO[bytes]:
    """A binary stream for a file path, or stdin for '-'."""
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as exc:
        raise MemrlError(f"cannot read {path}: {exc.strerror}") from None


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr when it is a terminal; yields an advance(n) callback or None."""
    if not sys.stderr.isatty() or not total:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> None:
    """Render rows as a rich table on stdout, fitting 80 columns: numbers and short fields never break
    (nor does any header); text columns wrap between words, and break a word only when it is longer than
    `WORD` characters. A table whose columns cannot fit is printed wider, never with columns dropped."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, c in enumerate(columns):
        values = [row[i] for row in cells]
        if any(" " in v or len(v) > 16 for v in values):
            longest = max((len(word) for v in values for word in v.split()), default=0)
            t.add_column(c, overflow="fold", min_width=max(len(c), min(longest, WORD)))
        else:
            t.add_column(c, no_wrap=True, min_width=max([len(c), *map(len, values)]))
    for row in cells:
        t.add_row(*row)
    console = Console()
    needed = console.measure(t, options=console.options.update_width(10_000)).minimum
    (console if needed <= console.width else Console(width=needed)).print(t)


def count(n: int, singular: str, plural: str) -> str:
    """'1 memory', '2 memories'."""
    return f"{n} {singular if n == 1 else plural}"


WORD = 12  # a word longer than this may break across lines in a table's text column
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(\+00:00|Z)?$")  # the bank's UTC times


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    text = "" if value is None else str(value)
    stamp = STAMP.match(text)
    if stamp:  # a time as people read it (UTC, to the second): two words, a line each when narrow
        return f"{stamp.group(1)} {stamp.group(2)}"
    return text if len(text) <= 80 else text[:77] + "..."


@app.command(epilog=examples(
    'memrl ingest --intent "heat an egg" --experience "take egg; microwave 1; heat egg" --outcome success',
    'memrl ingest --jsonl trajectories.jsonl --json',
    'cat new.jsonl | memrl ingest --jsonl -'))
def ingest(
    intent: Optional[str] = typer.Option(None, help="The task text the memory is keyed on."),
    experience: Optional[str] = typer.Option(None, help="The text injected into a prompt."),
    outcome: str = typer.Option("unknown", help="success, failure or unknown."),
    task_id: Optional[str] = typer.Option(None, help="Your id for the task."),
    source: Optional[str] = typer.Option(None, help="Where the memory came from."),
    scope: Optional[str] = typer.Option(None, help="Whom the memory belongs to, e.g. user:alice (retrieve "
                                                   "--scope filters on it)."),
    q: str = typer.Option("0", metavar="NUMBER", help="Initial Q."),
    metadata: Optional[str] = typer.Option(None, metavar="JSON", help="A JSON object stored with the memory."),
    vector: Optional[str] = typer.Option(None, metavar="JSON", help="The intent's embedding as a JSON list (skip embedding)."),
    jsonl: Optional[str] = typer.Option(None, metavar="FILE|-", help="Ingest JSONL lines from FILE or - (stdin), all or nothing."),
    embedder: Optional[str] = typer.Option(None, envvar="MEMRL_EMBEDDER", metavar="SPEC",
                                           help="Embedder for a new bank: local, openai:MODEL, external:NAME:DIM."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Store one memory (from flags) or many (from JSONL). Exact duplicates are reported, not stored twice."""
    with command(as_json):
        if jsonl is not None:
            if intent is not None or experience is not None:
                raise MemrlError("give either --jsonl or --intent/--experience, not both")
            from memrl_cli.bank.records import check_scope
            from memrl_cli.ops.transfer import parse_ingest_lines

            with open_input(jsonl) as stream:
                records = parse_ingest_lines(stream)
            for record in records:  # --scope: the scope of the lines that give none
                record.scope = record.scope or check_scope(scope)
            bank = open_bank(db, embedder)
            with progress_bar("embedding", len(records)) as advance:
                results = bank.ingest_many(records, advance)
            created = [r.id for r in results if r.created]
            dupes = [r.id for r in results if not r.created]
            emit({"created": len(created), "duplicates": len(dupes), "ids": [r.id for r in results]}, as_json,
                 lambda d: print(f"ingested {count(d['created'], 'memory', 'memories')} "
                                   f"({count(d['duplicates'], 'duplicate', 'duplicates')} skipped)"))
            return
        if intent is None or experience is None:
            raise MemrlError("give --intent and --experience, or --jsonl FILE")
        bank = open_bank(db, embedder)
        result = bank.ingest(intent, experience, outcome, task_id=task_id, source=source,
                             q=parse_number(q, "q") or 0.0, metadata=parse_json_option(metadata, "metadata"),
                             vector=parse_json_option(vector, "vector"), scope=scope)
        emit({"id": result.id, "created": result.created}, as_json,
             lambda d: print(f"memory {d['id']} " + ("created" if d["created"] else "already stored (duplicate)")))


@app.command(epilog=examples(
    'memrl retrieve "warm up an egg"',
    'memrl retrieve "warm up an egg" --k2 5 --lambda 0.3 --json | jq .retrieval_id',
    'memrl retrieve "fix the login bug" --source \'run:*\' --no-record',
    'memrl retrieve "warm up an egg" --recall groups --sim-stats bank   # two departures from the paper'))
def retrieve(
    query: str = typer.Argument(..., help="The task to find memories for."),
    k1: int = typer.Option(5, help="Phase A: how many memories (or intent groups, --recall groups) to recall."),
    k2: int = typer.Option(3, help="Phase B: how many to select by (1-λ)·z(sim) + λ·z(Q)."),
    lam: float = typer.Option(0.5, "--lambda", help="Weight of Q against similarity (0 = plain RAG)."),
    threshold: float = typer.Option(0.5, help="Minimum cosine similarity for Phase A, in [-1, 1]."),
    epsilon: float = typer.Option(0.0, help="Probability of picking a random k2-subset instead (ε-greedy)."),
    seed: Optional[int] = typer.Option(None, help="Seed for ε-greedy."),
    sim_mean: Optional[float] = typer.Option(None, help="Fixed similarity mean for z(sim) (e.g. the authors' constants)."),
    sim_std: Optional[float] = typer.Option(None, help="Fixed similarity std for z(sim)."),
    q_min: Optional[float] = typer.Option(None, help="Phase B: select only memories with Q at least this "
                                                     "(the authors' BCB/LLB: -0.8)."),
    recall: str = typer.Option("memories", help="Phase A: k1 counts memories (the paper) or intent groups (groups: "
                                                "the authors' code; a departure, docs/method.md)."),
    group_threshold: float = typer.Option(0.9, help="--recall groups: cosine at or above which two intents are one group."),
    pool: int = typer.Option(64, help="--recall groups: most memories passed to Phase B (the most similar kept)."),
    member_similarity: bool = typer.Option(False, "--member-similarity", help="--recall groups: each member keeps "
                                           "its own similarity instead of its group's (a departure)."),
    sim_stats: str = typer.Option("candidates", help="z(sim) statistics: candidates (the paper) or bank (the bank's "
                                                     "own, a departure)."),
    selector: str = SELECTOR,
    vector: Optional[str] = typer.Option(None, metavar="JSON", help="The query's embedding as a JSON list (skip embedding)."),
    no_record: bool = typer.Option(False, "--no-record", help="Do not store a receipt (nothing to reward later)."),
    source: Optional[list[str]] = typer.Option(None, "--source", metavar="PATTERN", help="Only memories whose source matches this "
                                               "pattern (* any text, ? one character; repeatable: any of them)."),
    scope: Optional[list[str]] = typer.Option(None, "--scope", help="Only memories whose scope matches this pattern "
                                              "(user:alice, team:*; repeatable: any of them)."),
    task: Optional[str] = typer.Option(None, "--task", metavar="ID", help="Your id for the task: the receipt keeps "
                                       "it (`memrl reward --task ID`), with the scope when one plain --scope is given."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Find the memories to inject for QUERY; prints a retrieval id to reward later."""
    with command(as_json):
        from memrl_cli.method.retrieval import RetrieveParams

        params = RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, epsilon=epsilon, seed=seed,
                                sim_mean=sim_mean, sim_std=sim_std, q_min=q_min, recall=recall,
                                group_threshold=group_threshold, pool=pool, member_similarity=member_similarity,
                                sim_stats=sim_stats, selector=selector, sources=tuple(source or ()),
                                scopes=tuple(scope or ()))
        bank = open_bank(db, create=False)
        plain = scope[0] if scope and len(scope) == 1 and not any(c in scope[0] for c in "*?[") else None
        result = bank.retrieve(query, params, vector=parse_json_option(vector, "vector"), record=not no_record,
                               task_id=task, scope=plain)
        emit(result.to_dict(), as_json, lambda d: table(
            d["memories"], ["id", "outcome", "similarity", "q", "score", "intent", "experience"],
            f"retrieval {d['retrieval_id']}: {count(len(d['memories']), 'memory', 'memories')}"))


@app.command(epilog=examples(
    'memrl reward --retrieval 17 --reward 1          # the episode succeeded',
    'memrl reward --retrieval 18 --reward failure    # same as --reward -1',
    'memrl reward --task ticket-4711 --reward 1      # the newest retrieval for that task id',
    'memrl reward --last --reward -1                 # the newest retrieval: says which task it was',
    'memrl reward --memory 4 --memory 9 --reward 0.5 --source judge-v2',
    'memrl reward --jsonl rewards.jsonl --json'))
def reward(
    retrieval: Optional[int] = typer.Option(None, help="Reward the memories this retrieval selected."),
    task: Optional[str] = typer.Option(None, "--task", metavar="ID", help="Reward the newest retrieval for this task "
                                       "id (X-Memrl-Task-Id, metadata.memrl_task_id, retrieve --task)."),
    scope: Optional[str] = typer.Option(None, "--scope", help="With --task: the task's scope (needed when the id "
                                        "was used in several)."),
    last: bool = typer.Option(False, "--last", help="Reward the newest retrieval, whichever task it was; refused when "
                                                    "it was rewarded already or selected nothing (see `memrl log`)."),
    memory: Optional[list[int]] = typer.Option(None, help="Reward this memory id (repeatable)."),
    reward_value: Optional[str] = typer.Option(None, "--reward", metavar="NUMBER",
                                               help="The reward R: 1 (or success), -1 (or failure), or a value in "
                                                    "between, within the bank's reward range (`memrl config`)."),
    alpha: str = typer.Option("0.3", metavar="NUMBER", help="Learning rate α in Q ← Q + α(R − Q), in (0, 1]."),
    floor: Optional[str] = typer.Option(None, metavar="NUMBER", help="Lower bound for Q after the update."),
    source: Optional[str] = typer.Option(None, help="Where the reward came from (kept in the ledger)."),
    allow_repeat: bool = typer.Option(False, help="Allow a second reward for the same retrieval."),
    jsonl: Optional[str] = typer.Option(None, metavar="FILE|-", help="Many rewards from JSONL (FILE or -): "
                                        '{"retrieval_id"|"memory_ids", "reward", "alpha"?, ...}, one transaction.'),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Update Q of rewarded memories by Q ← Q + α(R − Q), atomically, with a ledger row each."""
    with command(as_json):
        chosen = [name for name, given in (("--retrieval", retrieval is not None), ("--task", task is not None),
                                           ("--last", last), ("--memory", bool(memory)), ("--jsonl", jsonl is not None))
                  if given]
        if len(chosen) > 1:
            raise MemrlError(f"give one of --retrieval, --task, --last, --memory and --jsonl, not {' and '.join(chosen)}")
        if scope is not None and task is None:
            raise MemrlError("--scope goes with --task: the scope of the task to reward")
        about: dict[str, Any] = {}
        if jsonl is not None:
            from memrl_cli.ops.transfer import read_jsonl

            with open_input(jsonl) as stream:
                requests = []
                for number, obj in read_jsonl(stream):
                    if not isinstance(obj, dict):
                        raise MemrlError(f"line {number}: expected a JSON object; nothing was written")
                    requests.append(obj)
            updates = open_bank(db, create=False).reward_many(requests)
        else:
            if reward_value is None:
                raise MemrlError("give --reward R")
            from memrl_cli.bank.ledger import RewardedAlready
            from memrl_cli.ops.memories import newest_receipt

            bank = open_bank(db, create=False)
            receipt = newest_receipt(bank, allow_repeat) if last else None
            if task is not None:
                receipt = bank.store.receipt(bank.task_receipt(task, scope, any_scope=scope is None))
            if receipt is not None:
                retrieval = int(receipt["id"])
                about = {k: receipt[k] for k in ("task_id", "scope", "query")} | {"retrieval_id": retrieval}
            try:
                updates = bank.reward(reward_value, retrieval_id=retrieval, memory_ids=memory or None,  # type: ignore[arg-type]
                                      alpha=alpha, floor=floor, source=source, allow_repeat=allow_repeat)  # type: ignore[arg-type]
            except RewardedAlready as exc:
                whose = f" (the newest of task {task})" if task is not None else ""
                raise MemrlError(f"retrieval {exc.retrieval_id}{whose} was already rewarded; pass --allow-repeat to "
                                 "reward it again") from None
        emit({"updated": updates, **about}, as_json, _render_reward)


def _render_reward(d: dict[str, Any]) -> None:
    """The Q updates, saying which retrieval (and task) they rewarded when the command chose it."""
    if "retrieval_id" in d:
        from memrl_cli.ops.memories import describe_receipt

        print(f"rewarded {describe_receipt({'id': d['retrieval_id'], **d})}")
        if not d["updated"]:
            print("it selected no memories: nothing was learned; its task is over")
    if d["updated"]:
        table(d["updated"], ["id", "q_before", "q_after"], "Q updates")
    forgotten = [u["id"] for u in d["updated"] if u.get("forgotten")]
    if forgotten:
        print(f"note: {count(len(forgotten), 'memory', 'memories')} {forgotten} forgotten since: Q moved, but "
              "forgotten memories are never retrieved again")


FORMATS = ("table", "csv", "nl", "json")


def output_format(**chosen: bool) -> str:
    """The one output format switched on (`--table`, the default, `--csv`, `--nl`, `--json`)."""
    on = [name for name in FORMATS if chosen.get(name)]
    if len(on) > 1:
        raise MemrlError(f"choose one of {', '.join('--' + n for n in FORMATS)}")
    return on[0] if on else "table"


def write_rows(rows: list[dict[str, Any]], columns: list[str], fmt: str, key: str, title: str) -> None:
    """Rows as a table, CSV (a header, then every field in full), newline-delimited JSON objects, or one JSON
    object {key: rows}, as sqlite-utils prints them."""
    if fmt == "json":
        emit({key: rows}, True)
    elif fmt == "nl":
        for row in rows:
            sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    elif fmt == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        table(rows, columns, title)


@app.command(epilog=examples(
    'memrl memories --outcome success --q-min 0.3',
    'memrl memories --text egg --scope user:alice --csv > eggs.csv',
    'memrl memories --order q --limit 20 --nl | jq .intent'))
def memories(
    outcome: Optional[list[str]] = typer.Option(None, "--outcome", help="Only this outcome: success, failure or "
                                                "unknown (repeatable: any of them)."),
    source: Optional[list[str]] = typer.Option(None, "--source", help="Only memories whose source matches this "
                                               "pattern (* any text, ? one character; repeatable)."),
    scope: Optional[list[str]] = typer.Option(None, "--scope", help="Only memories whose scope matches this "
                                              "pattern (user:alice, team:*; repeatable)."),
    q_min: Optional[str] = typer.Option(None, "--q-min", help="Only memories with Q at least this."),
    q_max: Optional[str] = typer.Option(None, "--q-max", help="Only memories with Q at most this."),
    text: Optional[str] = typer.Option(None, "--text", help="Only memories whose intent or experience contains "
                                                            "this text (case-insensitive)."),
    forgotten: bool = typer.Option(False, "--forgotten", help="List the forgotten memories (and edits' old "
                                                              "versions) instead."),
    order: str = typer.Option("newest", help="newest, oldest, q (highest first) or visits (most first)."),
    limit: int = typer.Option(50, help="At most this many memories."),
    as_table: bool = typer.Option(False, "--table", help="A table for people (the default)."),
    as_csv: bool = typer.Option(False, "--csv", help="CSV: a header line, then every field in full."),
    as_nl: bool = typer.Option(False, "--nl", help="One JSON object per memory per line."),
    db: Optional[str] = DB, as_json: bool = typer.Option(False, "--json", help="One JSON object: {\"memories\": [...]}."),
) -> None:
    """List memories, filtered by outcome, source, scope, Q range and text, as a table, CSV or JSON."""
    with command(as_json):
        from memrl_cli.ops.memories import list_memories

        fmt = output_format(table=as_table, csv=as_csv, nl=as_nl, json=as_json)
        rows = list_memories(open_bank(db, create=False), outcomes=outcome or (), sources=source or (),
                             scopes=scope or (), q_min=parse_number(q_min, "q-min"), q_max=parse_number(q_max, "q-max"),
                             text=text, forgotten=forgotten, order=order, limit=limit)
        write_rows(rows, ["id", "outcome", "q", "visits", "scope", "source", "intent", "experience"], fmt, "memories",
                   count(len(rows), "memory", "memories") + (" (forgotten)" if forgotten else ""))


@app.command(epilog=examples(
    'memrl log',
    'memrl log -n 50 --unrewarded',
    'memrl log --json | jq ".receipts[0]"'))
def log(
    number: int = typer.Option(10, "--count", "-n", help="How many retrievals, newest first."),
    unrewarded: bool = typer.Option(False, "--unrewarded", help="Only retrievals that selected memories and "
                                                                "were not rewarded yet."),
    db: Optional[str] = DB, as_json: bool = typer.Option(False, "--json", help="One JSON object: {\"receipts\": [...]}."),
) -> None:
    """Recent retrievals (receipts): the task (its id and the start of its text), the memories selected, and whether
    (and how) each was rewarded."""
    with command(as_json):
        from memrl_cli.ops.memories import receipts

        rows = receipts(open_bank(db, create=False), number, unrewarded)
        emit({"receipts": rows}, as_json, lambda d: _render_log(d["receipts"], unrewarded))


def _render_log(rows: list[dict[str, Any]], unrewarded: bool) -> None:
    """The receipts as a table: the task's id (and scope, when any has one) and the start of its text."""
    shown = [{**r, "created": r["created_at"], "task": _start(r["task_id"] or "-", 16),
              "memories": " ".join(map(str, r["memories"])) or "-", "rewarded": "yes" if r["rewarded"] else "no",
              "query": _start(r["query"], 40)} for r in rows]
    scoped = ["scope"] if any(r["scope"] for r in rows) else []
    table(shown, ["id", "created", "task", *scoped, "memories", "rewarded", "reward", "query"],
          count(len(rows), "retrieval", "retrievals") + (" waiting for a reward" if unrewarded else ""))


def _start(text: str, chars: int) -> str:
    """The start of a text on one line, at most `chars` characters ("…" when cut)."""
    text = " ".join(str(text).split())
    return text if len(text) <= chars else text[:chars - 1].rstrip() + "…"


app.command("receipts", hidden=True, help="The same as `memrl log`.",
            epilog=examples("memrl receipts", "memrl receipts --unrewarded -n 5"))(log)


@app.command(epilog=examples(
    'memrl forget 12',
    'memrl forget 12 13 --vacuum --json'))
def forget(
    ids: list[int] = typer.Argument(..., help="Memory ids to forget."),
    vacuum: bool = typer.Option(False, "--vacuum", help="Then compact the bank, so that its file no longer holds "
                                                        "the erased bytes (rewrites the whole file)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Forget memories: their text and vector erased (earlier versions' too), never retrieved or exported again;
    their id, Q, ledger and receipts stay (verify holds)."""
    with command(as_json):
        from memrl_cli.ops.memories import forget as forget_memories

        emit(forget_memories(open_bank(db, create=False), ids, vacuum), as_json, _render_forget)


def _render_forget(d: dict[str, Any]) -> None:
    print(f"forgot {count(len(d['forgotten']), 'memory', 'memories')}"
          + (f"; already forgotten: {d['unchanged']}" if d["unchanged"] else "")
          + (f"; erased the text and vector of {d['erased']}" if d["erased"] else ""))
    if d["erased"] and not d["vacuumed"]:
        print("the erased bytes may stay in the file's free pages until it is compacted: `memrl forget ID --vacuum`, "
              "or `sqlite3 FILE VACUUM`")


@app.command(epilog=examples(
    'memrl edit 12 --experience "SCRIPT: take egg; heat it; put it on the table"',
    'memrl edit 12 --intent "heat an egg in the microwave"'))
def edit(
    memory_id: int = typer.Argument(..., help="The memory to change."),
    intent: Optional[str] = typer.Option(None, help="The new intent (embedded again)."),
    experience: Optional[str] = typer.Option(None, help="The new experience text."),
    outcome: Optional[str] = typer.Option(None, help="The new outcome: success, failure or unknown."),
    vector: Optional[str] = typer.Option(None, help="The new intent's embedding as a JSON list (skip embedding)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Change a memory's texts: its next version gets a new id and keeps Q and visits; `memrl history` shows both."""
    with command(as_json):
        from memrl_cli.ops.memories import edit as edit_memory

        emit(edit_memory(open_bank(db, create=False), memory_id, intent=intent, experience=experience, outcome=outcome,
                         vector=parse_json_option(vector, "vector")),
             as_json, lambda d: print(f"memory {d['replaces']} is now memory {d['id']}"
                                      + (" (intent embedded again)" if d["reembedded"] else "")))


@app.command(epilog=examples(
    'memrl history 12',
    'memrl history 12 --json'))
def history(
    memory_id: int = typer.Argument(..., help="Any version's id."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """A memory's versions (each edit's), oldest first, each with its rewards and Q assignments."""
    with command(as_json):
        from memrl_cli.ops.memories import history as memory_history

        emit(memory_history(open_bank(db, create=False), memory_id), as_json, _render_history)


def _render_history(d: dict[str, Any]) -> None:
    for v in d["versions"]:
        state = ("" if v["forgotten_at"] is None else f"  replaced by {v['replaced_by']} at {v['forgotten_at']}"
                 if v["replaced_by"] is not None else f"  FORGOTTEN at {v['forgotten_at']}")
        print(f"memory {v['id']}  created {v['created_at']}  q={v['q']:.4f}  visits={v['visits']}  "
              f"outcome={v['outcome']}{state}\nintent: {v['intent']}\nexperience: {v['experience']}")
        table(v["ledger"], ["id", "retrieval_id", "kind", "reward", "q_before", "q_after", "created_at"], "ledger")


REASON = typer.Option(None, "--reason", help="Why (kept in the bank's records).")
BY = typer.Option(None, "--by", help="Who is acting [default: your login name].")


@app.command(epilog=examples(
    'memrl quarantine 12 --reason "prompt injection"',
    'memrl quarantine 3 4 5 --json'))
def quarantine(
    ids: list[int] = typer.Argument(..., help="Memory ids to exclude from retrieval."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Exclude memories from every retrieval (they stay in the bank, exports and inspect); logged."""
    with command(as_json):
        from memrl_cli.ops import hygiene

        emit(hygiene.quarantine(open_bank(db, create=False), ids, reason, by), as_json,
             _render_marked("quarantined", "already quarantined"))


@app.command(epilog=examples(
    'memrl release 12 --reason "reviewed: harmless"'))
def release(
    ids: list[int] = typer.Argument(..., help="Quarantined memory ids to retrieve again."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Let quarantined memories be retrieved again; logged."""
    with command(as_json):
        from memrl_cli.ops import hygiene

        emit(hygiene.release(open_bank(db, create=False), ids, reason, by), as_json,
             _render_marked("released", "not quarantined"))


def _render_marked(done: str, unchanged: str) -> Callable[[dict[str, Any]], None]:
    """The line `quarantine` / `release` print: how many changed, and which ids were already so."""
    return lambda d: print(f"{done} {count(len(d['changed']), 'memory', 'memories')}"
                           + (f"; {unchanged}: {d['unchanged']}" if d["unchanged"] else ""))


@app.command("reset-q", epilog=examples(
    'memrl reset-q 7 --reason "rewarded by a broken judge"'))
def reset_q(
    ids: list[int] = typer.Argument(..., help="Memory ids whose Q goes back to q_init."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Set Q back to its initial value, with a `set` ledger row each (Q = ledger replay still holds)."""
    with command(as_json):
        from memrl_cli.ops import hygiene

        updates = hygiene.reset_q(open_bank(db, create=False), ids, reason, by)
        emit({"updated": updates}, as_json, lambda d: table(d["updated"], ["id", "q_before", "q_after"], "Q reset"))


@app.command(epilog=examples(
    'memrl undo --source judge-v2 --dry-run',
    'memrl undo --since 2026-01-05T10:00 --until 2026-01-05T12:00'))
def undo(
    source: Optional[str] = typer.Option(None, metavar="PATTERN", help="Undo the rewards whose source matches this pattern "
                                                    "(* any text, ? one character)."),
    since: Optional[str] = typer.Option(None, metavar="TIME", help="Undo the rewards given at or after this ISO 8601 time."),
    until: Optional[str] = typer.Option(None, metavar="TIME", help="Undo the rewards given before this ISO 8601 time."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; write nothing."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Revert the rewards of a source and/or time window: Q becomes the replay of the ledger without them."""
    with command(as_json):
        from memrl_cli.ops import hygiene

        report = hygiene.undo(open_bank(db, create=False), source, since, until, dry_run=dry_run, reason=reason,
                              actor=by)
        emit(report, as_json, _render_undo)


def _render_undo(d: dict[str, Any]) -> None:
    table(d["memories"], ["id", "q_before", "q_after", "undone", "reapplied"],
          "would change (dry run)" if d["dry_run"] else "changed")
    print(f"{'would undo' if d['dry_run'] else 'undid'} {count(d['undone'], 'reward', 'rewards')}, "
          f"re-applying {count(d['reapplied'], 'later one', 'later ones')}"
          + (f"; {d['superseded']} matching rewards precede a set row and no longer count" if d["superseded"] else ""))


@app.command("inspect", epilog=examples(
    'memrl inspect',
    'memrl inspect --top-q 10',
    'memrl inspect --memory 4 --json',
    'memrl inspect --verify'))
def inspect_cmd(
    top_q: Optional[int] = typer.Option(None, help="Show the N memories with the highest Q."),
    memory: Optional[int] = typer.Option(None, help="Show one memory with its ledger and receipts."),
    stats: bool = typer.Option(False, "--stats", help="Counts, Q distribution, embedder, calibration."),
    explain: Optional[int] = typer.Option(None, help="Why retrieval ID selected what it selected."),
    verify: bool = typer.Option(False, "--verify", help="Check integrity, vectors, index, and Q = ledger replay."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Look inside the bank (default: --stats)."""
    with command(as_json):
        from memrl_cli.ops import inspection

        chosen = [x for x in (top_q is not None, memory is not None, stats, explain is not None, verify) if x]
        if len(chosen) > 1:
            raise MemrlError("choose one of --top-q, --memory, --stats, --explain, --verify")
        bank = open_bank(db, create=False)
        if top_q is not None:
            emit({"memories": inspection.top_q(bank, top_q)}, as_json, lambda d: table(
                d["memories"], ["id", "q", "visits", "outcome", "quarantined_at", "intent", "experience"],
                f"top {top_q} by Q"))
        elif memory is not None:
            emit(inspection.memory(bank, memory), as_json, _render_memory)
        elif explain is not None:
            emit(inspection.explain(bank, explain), as_json, _render_explain)
        elif verify:
            report = inspection.verify(bank)
            emit(report, as_json, lambda d: print("ok" if d["ok"] else "\n".join(d["problems"])))
            if not report["ok"]:
                raise typer.Exit(1)
        else:
            emit(inspection.stats(bank), as_json, _render_stats)


def _render_memory(d: dict[str, Any]) -> None:
    print(f"memory {d['id']}  q={d['q']:.4f}  visits={d['visits']}  outcome={d['outcome']}  source={d['source']}"
          + (f"  QUARANTINED since {d['quarantined_at']}" if d["quarantined_at"] else "")
          + (f"  FORGOTTEN at {d['forgotten_at']}" if d.get("forgotten_at") else "")
          + (f" (replaced by {d['replaced_by']})" if d.get("replaced_by") else "")
          + f"\nintent: {d['intent']}\nexperience:\n{d['experience']}")
    if d["quarantine_log"]:
        table(d["quarantine_log"], ["action", "reason", "actor", "created_at"], "quarantine log")
    table(d["ledger"], ["id", "retrieval_id", "kind", "reward", "alpha", "q_before", "q_after", "created_at"], "ledger")
    table(d["retrievals"], ["retrieval_id", "similarity", "q", "score", "selected_rank", "query"], "receipts")


def _render_explain(d: dict[str, Any]) -> None:
    p = d["params"]
    print(f"retrieval {d['id']}: {d['query']!r}\nk1={p['k1']} k2={p['k2']} λ={p['lam']} threshold={p['threshold']} "
          f"ε={p['epsilon']} z(sim) mean={d['sim_mean']:.4f} std={d['sim_std']:.4f} explored={d['explored']}")
    import shutil

    wide = shutil.get_terminal_size().columns >= 110  # the z-scores (also in --json) only when they fit
    columns = ["memory_id", "similarity", "z_sim", "q", "z_q", "score", "why", "intent"] if wide else \
        ["memory_id", "similarity", "q", "score", "why", "intent"]
    table(d["candidates"], columns, "candidates")


def _render_stats(d: dict[str, Any]) -> None:
    rows = [{"field": k, "value": json.dumps(v) if isinstance(v, (dict, list)) else v} for k, v in d.items()]
    table(rows, ["field", "value"], "bank")


@app.command(epilog=examples(
    'memrl explain 17',
    'memrl explain 17 --json | jq .candidates'))
def explain(retrieval_id: int = typer.Argument(..., help="A retrieval id."), db: Optional[str] = DB,
            as_json: bool = JSON) -> None:
    """Why a retrieval selected what it selected (same as `inspect --explain`)."""
    with command(as_json):
        from memrl_cli.ops import inspection

        emit(inspection.explain(open_bank(db, create=False), retrieval_id), as_json, _render_explain)


@app.command(epilog=examples(
    'memrl calibrate',
    'memrl calibrate --mean 0.2 --std 0.1',
    'memrl calibrate --clear --json'))
def calibrate(
    mean: Optional[float] = typer.Option(None, help="Fix the bank's similarity mean (used by --sim-stats bank)."),
    std: Optional[float] = typer.Option(None, help="Fix the bank's similarity std (used by --sim-stats bank)."),
    clear: bool = typer.Option(False, "--clear", help="Drop the fixed values and use the bank's measured statistics."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Recompute the bank's similarity statistics, or fix them: what z(sim) uses under the sim_stats switch."""
    with command(as_json):
        emit(open_bank(db, create=False).calibrate(mean, std, clear), as_json, _render_calibration)


@app.command(context_settings={"ignore_unknown_options": True},  # so that MIN may be negative: `reward_range -5 5`
             epilog=examples("memrl config", "memrl config reward_range -5 5", "memrl config reward_range --reset"))
def config(
    name: Optional[str] = typer.Argument(None, help="A bank setting: reward_range."),
    values: Optional[list[str]] = typer.Argument(None, help="Its new value: reward_range MIN MAX."),
    reset: bool = typer.Option(False, "--reset", help="Back to the default (reward_range: -1 1)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Show or change the settings kept in the bank: reward_range, the rewards it accepts [default -1 1]."""
    with command(as_json):
        if name not in (None, "reward_range"):
            raise MemrlError(f"unknown setting {name!r}; the bank's settings: reward_range")
        if (values or reset) and name is None:
            raise MemrlError("name the setting to change: memrl config reward_range MIN MAX")
        if values and reset:
            raise MemrlError("give MIN MAX, or --reset, not both")
        bounds = None
        if values:
            try:
                low, high = map(float, values)
            except ValueError:
                raise MemrlError(f"reward_range takes two numbers, MIN MAX; got {' '.join(values)}") from None
            bounds = (low, high)
        bank = open_bank(db, create=False)
        if values or reset:
            bank.set_reward_range(bounds)
        emit({"reward_range": list(bank.reward_range())}, as_json,
             lambda d: print(f"reward_range {d['reward_range'][0]:g} {d['reward_range'][1]:g}"))


def _render_calibration(d: dict[str, Any]) -> None:
    stats, override, used = d.get("stats"), d.get("override"), d.get("used")
    print("z(sim) uses: " + (f"mean {used['mean']:.4f}, std {used['std']:.4f}" if used else "nothing yet (no memories)")
          + (" (a fixed override)" if override else " (the bank's own statistics)" if stats else ""))
    if stats:
        print(f"the bank's statistics: mean {stats['mean']:.4f}, std {stats['std']:.4f} over {stats['pairs']} "
              f"pairs of {count(stats['memories'], 'memory', 'memories')} ({stats['method']}, {stats['updated_at']})")
    if override:
        print(f"override: mean {override['mean']:.4f}, std {override['std']:.4f} (set {override['set_at']}; "
              "`memrl calibrate --clear` drops it)")


def _render_doctor(d: dict[str, Any]) -> None:
    fields = {k: v for k, v in d.items() if k not in ("ok", "problems")}
    width = max(map(len, fields), default=0)
    for key, value in fields.items():
        shown = json.dumps(value) if isinstance(value, (dict, list)) else "-" if value is None else value
        print(f"{key:<{width}}  {shown}")
    print("ok: no problems found" if d["ok"] else "problems:\n" + "\n".join(f"  - {p}" for p in d["problems"]))


@app.command("export", epilog=examples(
    'memrl export -o bank.jsonl',
    'memrl export --vectors | gzip > bank.jsonl.gz',
    'memrl export --db a.db | memrl import - --db b.db'))
def export_cmd(
    output: str = typer.Option("-", "--output", "-o", metavar="FILE|-", help="File to write, or - for stdout."),
    vectors: bool = typer.Option(False, "--vectors", help="Include the embedding vectors."),
    db: Optional[str] = DB,
    as_json: bool = typer.Option(False, "--json", help="With -o FILE: print {\"path\", \"memories\"} as one JSON "
                                                     "object (errors as JSON too)."),
) -> None:
    """Write the bank as JSONL (header line, then one memory with its ledger per line)."""
    with command(as_json):
        from memrl_cli.ops.transfer import export_jsonl

        if as_json and output == "-":
            raise MemrlError("--json needs -o FILE: on stdout the export itself is the output")
        bank = open_bank(db, create=False)
        if output == "-":
            export_jsonl(bank, sys.stdout, vectors)
        else:
            try:
                with open(output, "w", encoding="utf-8") as out:
                    n = export_jsonl(bank, out, vectors)
            except OSError as exc:
                raise MemrlError(f"cannot write {output}: {exc.strerror}") from None
            emit({"path": output, "memories": n}, as_json,
                 lambda d: sys.stderr.write(f"exported {count(n, 'memory', 'memories')} to {output}\n"))


@app.command("import", epilog=examples(
    'memrl import bank.jsonl',
    'memrl import bank.jsonl --merge-duplicates --db shared.db --json'))
def import_cmd(
    source_file: str = typer.Argument(..., help="A `memrl export` file, plain ingest JSONL, or - for stdin."),
    merge_duplicates: bool = typer.Option(False, help="Reconcile duplicates (visit-weighted Q) instead of skipping."),
    embedder: Optional[str] = typer.Option(None, envvar="MEMRL_EMBEDDER", metavar="SPEC", help="Embedder for a new bank."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Import memories with their Q and ledger, all or nothing; re-embeds when vectors do not fit."""
    with command(as_json):
        from memrl_cli.ops.transfer import import_records, read_export

        with open_input(source_file) as stream:
            exported_with, records = read_export(stream)  # validate all before opening (or creating) the bank
        bank = open_bank(db, embedder)
        with progress_bar("embedding", len(records)) as advance:
            counts = import_records(bank, records, exported_with, advance, merge_duplicates=merge_duplicates,
                                    source_name=os.path.basename(source_file))
        emit(counts, as_json, lambda d: print(f"imported {count(d['created'], 'memory', 'memories')}, "
                                              f"{count(d['duplicates'], 'duplicate', 'duplicates')} skipped, "
                                              f"{d['merged']} merged"))


@app.command(epilog=examples(
    'memrl merge a.db b.db -o merged.db'))
def merge(
    first: str = typer.Argument(..., help="First bank."),
    second: str = typer.Argument(..., help="Second bank."),
    output: str = typer.Option(..., "--output", "-o", metavar="FILE|URL",
                               help="The new merged bank: a file that must not exist, or an empty PostgreSQL bank's URL."),
    as_json: bool = JSON,
) -> None:
    """Merge two banks into a new one: duplicates get visit-weighted Q, both ledgers are kept."""
    with command(as_json):
        from memrl_cli.ops.transfer import merge as merge_banks

        from memrl_cli.store.base import redact

        emit(merge_banks(first, second, output), as_json, lambda d: print(
            f"{redact(output)}: {count(d['created'], 'memory', 'memories')} added from {redact(second)}, "
            f"{count(d['merged'], 'duplicate', 'duplicates')} merged"))


@app.command(epilog=examples(
    'memrl backup copy.db',
    'memrl backup nightly.db --force --json'))
def backup(
    destination: str = typer.Argument(..., help="Where to write the copy."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Copy the bank safely while other processes use it (SQLite online backup)."""
    with command(as_json):
        from memrl_cli.ops.transfer import backup as backup_bank

        size = backup_bank(open_bank(db, create=False), destination, force)
        emit({"path": destination, "bytes": size}, as_json, lambda d: print(f"backed up to {d['path']} ({d['bytes']} bytes)"))


@app.command(epilog=examples(
    'memrl doctor',
    'memrl doctor --rebuild-index',
    'memrl doctor --index vec --json'))
def doctor(
    rebuild_index: bool = typer.Option(False, "--rebuild-index", help="Rebuild the sqlite-vec index from raw vectors."),
    index: Optional[str] = typer.Option(None, "--index", metavar="KIND", help="Build or drop the engine index: vec or none (SQLite), "
                                                               "hnsw or exact (PostgreSQL)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Report the engine (SQLite driver and sqlite-vec, or the PostgreSQL server) and the bank's health."""
    with command(as_json):
        from memrl_cli.ops import inspection

        bank = open_bank(db, create=False)
        report: dict[str, Any] = bank.store.describe()
        if rebuild_index:
            report["reindexed"] = bank.rebuild_index()
        if index is not None:
            report["index"] = bank.set_index(index)
        report.update(inspection.verify(bank))
        emit(report, as_json, _render_doctor)
        if not report["ok"]:
            raise typer.Exit(1)


@app.command(epilog=examples(
    'memrl bench alfworld --local-llm --epochs 2 --limit 2 --max-steps 5 --eval none',
    'memrl bench alfworld --epochs 10 --method memrl,rag,none',
    'memrl bench alfworld --resume runs/alfworld-memrl-20260105-093012-ab12'))
def bench(
    name: str = typer.Argument(..., help="Benchmark: alfworld, bigcodebench, llb-db, llb-os, hle, or module:Class."),
    method: Optional[str] = typer.Option(None, help="memrl (the paper, λ=0.5), rag (λ=0), none, memrl-conditioned, "
                                                    "memp, reflexion, self-rag (bigcodebench, hle), pass@k; "
                                                    "comma-separate to compare."),
    epochs: Optional[int] = typer.Option(None, help="Passes over the training stream [10]."),
    batch_size: Optional[int] = typer.Option(None, help="Episodes per mini-batch (reward + memory update after each) [32]."),
    limit: Optional[int] = typer.Option(None, help="Play a seeded sample of N training tasks, stratified by task "
                                                   "type, and as many of each evaluation split (see --eval-limit)."),
    task_types: Optional[str] = typer.Option(None, help="ALFWorld: comma-separated task types (put,clean,heat,cool,examine,puttwo)."),
    max_steps: Optional[int] = typer.Option(None, help="ALFWorld: max agent steps per episode [30] (LLB: --option max_rounds=N)."),
    eval_splits: Optional[str] = typer.Option(None, "--eval", help="Held-out splits to evaluate, comma-separated "
                                                                   "(`none`: no evaluation)."),
    eval_limit: Optional[str] = typer.Option(None, metavar="N|all",
                                             help="Play a seeded, stratified sample of N tasks of each evaluation "
                                                  "split; `all`: every task [--limit, else all]."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate after every N epochs (and after the last) [1]."),
    k1: Optional[int] = typer.Option(None, help="Phase A recall size [5]."),
    k2: Optional[int] = typer.Option(None, help="Phase B selection size [3]."),
    lam: Optional[float] = typer.Option(None, "--lambda", help="Override the method's λ."),
    threshold: Optional[float] = typer.Option(None, help="Phase A similarity threshold [0.5]."),
    epsilon: Optional[float] = typer.Option(None, help="ε-greedy exploration [0]."),
    alpha: Optional[float] = typer.Option(None, help="Q learning rate [0.3]."),
    seed: Optional[int] = typer.Option(None, help="Seed for exploration [0]."),
    data: Optional[str] = typer.Option(None, help="Benchmark data location (ALFWorld: else $ALFWORLD_DATA)."),
    option: Optional[list[str]] = typer.Option(None, "--option", "-o", metavar="KEY=VALUE", help="Adapter option KEY=VALUE (repeatable)."),
    config: Optional[str] = typer.Option(None, metavar="FILE", help="YAML with `bench:` and `llm:` sections (see configs/)."),
    model: Optional[str] = typer.Option(None, help="Agent model [env MEMRL_MODEL]."),
    base_url: Optional[str] = typer.Option(None, metavar="URL", help="OpenAI-compatible base URL [env OPENAI_BASE_URL]."),
    temperature: Optional[str] = typer.Option(None, metavar="NUMBER|default", help="Sampling temperature of every call, or `default` to send "
                                                         "none [config, else none: reasoning models need that]."),
    embedder: Optional[str] = typer.Option(None, metavar="SPEC", help="Embedding model of the run's bank, e.g. "
                                                      "openai:text-embedding-3-large (the authors') [local MiniLM]."),
    local_llm: bool = typer.Option(False, "--local-llm", help="Serve the offline SmolLM2-135M model (plumbing check)."),
    workers: int = typer.Option(4, help="Worker processes that play the episodes (0 = in this process)."),
    concurrency: Optional[int] = typer.Option(None, help="Most episodes (and LLM requests) in flight at once, "
                                                         "threads across the workers [config, else the batch size]."),
    runs_dir: str = typer.Option("runs", metavar="DIR", help="Where run directories are written."),
    resume: Optional[str] = typer.Option(None, metavar="RUN_DIR", help="Continue the run in this run directory."),
    db: Optional[str] = typer.Option(None, "--db", show_default=False, metavar="FILE|URL",  # never $MEMRL_DB: a user's agent bank
                                     help="Bank to learn in [default: a new bank.db in the run directory; "
                                          "MEMRL_DB is not used]."),
    as_json: bool = JSON,
) -> None:
    """Run the runtime-learning loop on a benchmark and report accuracy, CSR and forgetting per epoch."""
    options = dict(locals())  # every option by its name: the harness owns what each one means
    with command(as_json):
        from memrl_bench.framework import session

        summary, render = session.run_from_cli(options)
        emit(summary, as_json, render)


@app.command(epilog=examples(
    'memrl report runs/alfworld-memrl-20260105-093012-ab12',
    'memrl report runs/alfworld-memrl-20260105-093012-ab12 --json',
    'memrl report runs/alfworld-memrl-20260105-093012-ab12 --q   # does Q predict success?'))
def report(run_dir: str = typer.Argument(..., help="A run directory (runs/<run>/, with config.json)."),
           q: bool = typer.Option(False, "--q", help="The paper's utility analysis instead: success rate by Q bin "
                                                     "and Spearman's ρ of Q with success, per epoch; writes "
                                                     "utility.json and utility.png into the run directory."),
           as_json: bool = JSON) -> None:
    """Where learning stalls: per epoch, how often a memory that proved useful existed, was recalled, was selected."""
    with command(as_json):
        from memrl_cli.ops import report as reports

        if not q:
            emit(reports.learning_report(run_dir), as_json, _render_report)
            return
        analysis = reports.utility_report(run_dir)
        (Path(run_dir) / "utility.json").write_text(json.dumps(analysis, indent=1))
        try:
            from memrl_cli.ops.report_plot import plot_utility

            plot_utility(analysis, Path(run_dir) / "utility.png")
        except ImportError:
            print("memrl: note: no utility.png (matplotlib missing: pip install 'memrl[plots]')", file=sys.stderr)
        emit(analysis, as_json, _render_utility)


def _render_utility(d: dict[str, Any]) -> None:
    def rho(v: float | None) -> str:
        return "n/a" if v is None else f"{v:+.3f}"

    print(f"run {d['run_id']} ({d['benchmark']}, {d['method']}): does a selected memory's Q predict success? "
          f"Spearman ρ overall {rho(d['overall']['spearman'])} over {d['overall']['selections']} selections")
    rows = [{"epoch": e["epoch"], "selections": e["selections"], "spearman": rho(e["spearman"]),
             **{f"Q [{b['low']:+.1f},{b['high']:+.1f})": "-" if b["success_rate"] is None
                else f"{b['success_rate']:.2f} ({b['selections']})" for b in e["bins"]}}
            for e in [*d["epochs"], {**d["overall"], "epoch": "all"}]]
    table(rows, list(rows[0]), "success rate of the episodes, by the Q of the memory selected for them (count)")


def _render_report(d: dict[str, Any]) -> None:
    print(f"run {d['run_id']} ({d['benchmark']}, {d['method']}): {d['useful_pairs']} (task, memory) pairs proved useful")
    table(d["epochs"], ["epoch", "episodes", "accuracy", "receipts", "existed", "recalled", "selected"],
          "training episodes in which a memory that proved useful for the task...")


TOKEN = typer.Option(None, "--token", envvar="MEMRL_TOKEN", show_default=False,
                     help="Secret every HTTP request must carry (X-Memrl-Token); required to bind beyond 127.0.0.1 "
                          "[env MEMRL_TOKEN].")
READ_ONLY = typer.Option(False, "--read-only", help="Turn off reward and remember (retrieval still stores receipts).")
SCOPE = typer.Option(None, "--scope", help="The scope of requests that name none, e.g. user:alice: they retrieve, "
                                           "write and reward in it alone [none: only unscoped memories].")
BANK_WAIT = typer.Option(2.0, "--bank-wait", help="Seconds a request waits for a bank another process holds "
                                                  "before going on without it (proxy) or failing (MCP).")


def need_extra(module: str, extra: str) -> None:
    """A one-line error naming the extra to install when an optional dependency is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MemrlError(f"this command needs the {extra!r} extra: pip install 'memrl[{extra}]'")


MCP_PORT = 8766  # `memrl mcp --host` without --port; the proxy's is 8765, the offline model's 8767


@app.command(epilog=examples(
    'memrl mcp --db ~/agent.db                         # stdio, as MCP clients launch it',
    'memrl mcp --port 8766 --db ~/agent.db             # http://127.0.0.1:8766/mcp',
    'memrl mcp --host 0.0.0.0 --port 8766 --token "$MEMRL_TOKEN" --read-only',
    'memrl mcp --scope user:alice --db ~/team.db'))
def mcp(
    host: Optional[str] = typer.Option(None, show_default=False, help="Serve streamable HTTP at http://HOST:PORT/mcp "
                                       "instead of stdio, bound to this address (anything but loopback needs "
                                       "--token) [default with --port: 127.0.0.1]."),
    port: Optional[int] = typer.Option(None, show_default=False, help="Serve streamable HTTP on this port instead of "
                                       f"stdio (0: any free port) [default with --host: {MCP_PORT}]."),
    http: Optional[str] = typer.Option(None, "--http", metavar="HOST:PORT", hidden=True,
                                       help="Deprecated: --host HOST --port PORT."),
    alpha: float = typer.Option(0.3, help="Learning rate α of the reward tools (the server's, not the model's)."),
    selector: str = SELECTOR, token: Optional[str] = TOKEN, read_only: bool = READ_ONLY,
    scope: Optional[str] = SCOPE, bank_wait: float = BANK_WAIT, db: Optional[str] = DB,
) -> None:
    """Serve the bank as MCP tools (retrieve, remember, reward, reward_task, reward_memories, top_memories, explain,
    stats) over stdio, or over HTTP with --host/--port."""
    with command(False):
        if http is not None:
            if host is not None or port is not None:
                raise MemrlError("give --host/--port, not --http (its deprecated form)")
            sys.stderr.write("memrl: warning: --http HOST:PORT is deprecated; use --host HOST --port PORT\n")
        elif host is not None or port is not None:
            http = f"{host or '127.0.0.1'}:{MCP_PORT if port is None else port}"
        need_extra("mcp", "mcp")
        from memrl_cli.serving.mcp import serve

        serve(bank_location(db), http=http, token=token, read_only=read_only, selector=selector, alpha=alpha,
              scope=scope, bank_wait=bank_wait)


@app.command(epilog=examples(
    'memrl proxy --upstream https://api.openai.com/v1 --db ~/agent.db   # 127.0.0.1:8765',
    'memrl proxy --upstream http://127.0.0.1:8000/v1 --port 9000 --k2 5',
    'memrl proxy --upstream https://api.openai.com/v1 --port 8775 --scope user:alice'))
def proxy(
    upstream: str = typer.Option(..., metavar="URL", help="The OpenAI-compatible API to forward to, e.g. https://api.openai.com/v1."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (anything but loopback needs --token)."),
    port: int = typer.Option(8765, help="Port to listen on (0: any free port)."),
    k1: int = typer.Option(5, help="Phase A recall size."),
    k2: int = typer.Option(3, help="Memories injected per request (header X-Memrl-K2 overrides)."),
    lam: float = typer.Option(0.5, "--lambda", help="Weight of Q against similarity (header X-Memrl-Lambda overrides)."),
    threshold: float = typer.Option(0.5, help="Minimum cosine similarity for Phase A."),
    task_message: str = typer.Option("first", help="Which user message is the task: first (one task per "
                                     "conversation) or latest (each new user message a new task)."),
    task_chars: int = typer.Option(2000, help="At most this many characters of the task (its end) are embedded "
                                   "and stored in the receipt."),
    task_hours: float = typer.Option(24.0, "--task-hours", help="Hours after its last call that a task is continued "
                                     "by a restarted proxy (its state is kept in the bank)."),
    selector: str = SELECTOR, token: Optional[str] = TOKEN, read_only: bool = READ_ONLY,
    scope: Optional[str] = SCOPE, bank_wait: float = BANK_WAIT, db: Optional[str] = DB,
) -> None:
    """An OpenAI-compatible proxy (Chat Completions and Responses API) that injects memories and takes rewards
    for them."""
    with command(False):
        need_extra("starlette", "proxy")
        need_extra("uvicorn", "proxy")
        from memrl_cli.serving.proxy import serve
        from memrl_cli.method.retrieval import RetrieveParams

        serve(bank_location(db), upstream, host=host, port=port, token=token, read_only=read_only,
              defaults=RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, selector=selector),
              task_message=task_message, task_chars=task_chars, scope=scope, bank_wait=bank_wait,
              task_hours=task_hours)


@app.command("help", epilog=examples("memrl help", "memrl help retrieve        # same as memrl retrieve --help"))
def help_cmd(ctx: typer.Context,
             command: Optional[str] = typer.Argument(None, metavar="COMMAND", help="The command to explain.")) -> None:
    """Show memrl's help, or a command's (the same as -h or --help)."""
    root = ctx.parent
    assert root is not None
    group: Any = root.command
    if command is None:
        sys.stdout.write(group.get_help(root) + "\n")
        return
    target = group.get_command(root, command)
    if target is None:
        shown = [name for name in group.list_commands(root) if not group.get_command(root, name).hidden]
        fail(MemrlError(f"no command {command!r}; the commands are {', '.join(shown)}"), False)
    with target.make_context(command, [], parent=root, resilient_parsing=True) as sub:
        sys.stdout.write(target.get_help(sub) + "\n")


def main() -> None:
    """Console-script entry point: usage errors become one line (or a JSON error) too."""
    try:
        code = app(prog_name="memrl", standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("memrl: interrupted\n")
        code = 130
    except Exception as exc:  # click's (or typer's vendored click's) usage errors, duck-typed
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(exc.format_message() + "\n")
            sys.exit(2)
        message = " ".join(exc.format_message().split())
        if "--json" in sys.argv:
            sys.stdout.write(json.dumps({"error": {"type": "UsageError", "message": message}}) + "\n")
        else:
            sys.stderr.write(f"memrl: error: {message} (see --help)\n")
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
