"""The `memrl` command line: a thin layer over `MemoryBank` and friends.

Each command parses options, calls one library function, and prints the result as a
table or (with `--json`) as exactly one JSON object on stdout. User errors print one line
on stderr (or a JSON error object with `--json`) and exit non-zero, without a traceback.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Optional

import typer

from memrl_cli.errors import MemrlError, error_object

if TYPE_CHECKING:
    from memrl_cli.bank import MemoryBank

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
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


SELECTOR = typer.Option("memrl", help="Phase B utility: memrl (the paper's rule), conditioned-t (recommended: "
                                     "docs/learning.md), calibrated, ucb, conditioned, conditioned-z, conditioned-n, "
                                     "conditioned-nz, conditioned-ts.")
DB = typer.Option(None, "--db", envvar="MEMRL_DB", show_default=False,
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
    """Turn MemrlError (and Ctrl-C) into one line on stderr, or a JSON error, and an exit code."""
    try:
        yield
    except MemrlError as exc:
        error = error_object(exc)
        if as_json:
            sys.stdout.write(json.dumps(error) + "\n")
        else:
            sys.stderr.write(f"memrl: error: {error['error']['message']}\n")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        sys.stderr.write("memrl: interrupted\n")
        raise typer.Exit(130) from None


def bank_location(db: str | None, create: bool = True) -> str:
    """The bank named by --db / MEMRL_DB, else the default path (its directory made when `create`)."""
    path = db or default_db()
    if db is None and create:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def open_bank(db: str | None, embedder: str | None = None, create: bool = True, index: str = "auto") -> MemoryBank:
    """Open the bank named by --db / MEMRL_DB / the default, printing any warnings on stderr."""
    from memrl_cli.bank import MemoryBank

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
    (nor do their headers); only text columns wrap."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, c in enumerate(columns):
        values = [row[i] for row in cells]
        if any(" " in v or len(v) > 16 for v in values):
            t.add_column(c, overflow="fold", min_width=min(len(c), 10))
        else:
            t.add_column(c, no_wrap=True, min_width=max([len(c), *map(len, values)]))
    for row in cells:
        t.add_row(*row)
    Console().print(t)


def count(n: int, singular: str, plural: str) -> str:
    """'1 memory', '2 memories'."""
    return f"{n} {singular if n == 1 else plural}"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    text = "" if value is None else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


@app.command()
def ingest(
    intent: Optional[str] = typer.Option(None, help="The task text the memory is keyed on."),
    experience: Optional[str] = typer.Option(None, help="The text injected into a prompt."),
    outcome: str = typer.Option("unknown", help="success, failure or unknown."),
    task_id: Optional[str] = typer.Option(None, help="Your id for the task."),
    source: Optional[str] = typer.Option(None, help="Where the memory came from."),
    q: str = typer.Option("0", help="Initial Q."),
    metadata: Optional[str] = typer.Option(None, help="A JSON object stored with the memory."),
    vector: Optional[str] = typer.Option(None, help="The intent's embedding as a JSON list (skip embedding)."),
    jsonl: Optional[str] = typer.Option(None, help="Ingest JSONL lines from FILE or - (stdin), all or nothing."),
    embedder: Optional[str] = typer.Option(None, envvar="MEMRL_EMBEDDER",
                                           help="Embedder for a new bank: local, openai:MODEL, external:NAME:DIM."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Store one memory (from flags) or many (from JSONL). Exact duplicates are reported, not stored twice."""
    with command(as_json):
        if jsonl is not None:
            if intent is not None or experience is not None:
                raise MemrlError("give either --jsonl or --intent/--experience, not both")
            from memrl_cli.transfer import parse_ingest_lines

            with open_input(jsonl) as stream:
                records = parse_ingest_lines(stream)
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
                             vector=parse_json_option(vector, "vector"))
        emit({"id": result.id, "created": result.created}, as_json,
             lambda d: print(f"memory {d['id']} " + ("created" if d["created"] else "already stored (duplicate)")))


@app.command()
def retrieve(
    query: str = typer.Argument(..., help="The task to find memories for."),
    k1: int = typer.Option(5, help="Phase A: how many intent groups (or memories, --recall memories) to recall."),
    k2: int = typer.Option(3, help="Phase B: how many to select by (1-λ)·z(sim) + λ·z(Q)."),
    lam: float = typer.Option(0.5, "--lambda", help="Weight of Q against similarity (0 = plain RAG)."),
    threshold: float = typer.Option(0.5, help="Minimum cosine similarity for Phase A, in [-1, 1]."),
    epsilon: float = typer.Option(0.0, help="Probability of picking a random k2-subset instead (ε-greedy)."),
    seed: Optional[int] = typer.Option(None, help="Seed for ε-greedy."),
    sim_mean: Optional[float] = typer.Option(None, help="Override the bank's similarity mean for z(sim)."),
    sim_std: Optional[float] = typer.Option(None, help="Override the bank's similarity std for z(sim)."),
    q_min: Optional[float] = typer.Option(None, help="Phase B: select only memories with Q at least this "
                                                     "(the authors' BCB/LLB: -0.8)."),
    recall: str = typer.Option("groups", help="Phase A: k1 counts intent groups (groups) or memories (memories)."),
    group_threshold: float = typer.Option(0.9, help="Cosine at or above which two intents form one group."),
    pool: int = typer.Option(64, help="Most memories grouped recall passes to Phase B (the newest kept)."),
    selector: str = SELECTOR,
    vector: Optional[str] = typer.Option(None, help="The query's embedding as a JSON list (skip embedding)."),
    no_record: bool = typer.Option(False, "--no-record", help="Do not store a receipt (nothing to reward later)."),
    source: Optional[list[str]] = typer.Option(None, "--source", help="Only memories whose source matches this "
                                               "pattern (* any text, ? one character; repeatable: any of them)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Find the memories to inject for QUERY; prints a retrieval id to reward later."""
    with command(as_json):
        from memrl_cli.retrieve import RetrieveParams

        params = RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, epsilon=epsilon, seed=seed,
                                sim_mean=sim_mean, sim_std=sim_std, q_min=q_min, recall=recall,
                                group_threshold=group_threshold, pool=pool, selector=selector,
                                sources=tuple(source or ()))
        bank = open_bank(db, create=False)
        result = bank.retrieve(query, params, vector=parse_json_option(vector, "vector"), record=not no_record)
        emit(result.to_dict(), as_json, lambda d: table(
            d["memories"], ["id", "outcome", "similarity", "q", "score", "intent", "experience"],
            f"retrieval {d['retrieval_id']}: {count(len(d['memories']), 'memory', 'memories')}"))


@app.command()
def reward(
    retrieval: Optional[int] = typer.Option(None, help="Reward the memories this retrieval selected."),
    memory: Optional[list[int]] = typer.Option(None, help="Reward this memory id (repeatable)."),
    reward_value: Optional[str] = typer.Option(None, "--reward", help="The reward R (e.g. 1 success, -1 failure)."),
    alpha: str = typer.Option("0.3", help="Learning rate α in Q ← Q + α(R − Q)."),
    floor: Optional[str] = typer.Option(None, help="Lower bound for Q after the update."),
    source: Optional[str] = typer.Option(None, help="Where the reward came from (kept in the ledger)."),
    allow_repeat: bool = typer.Option(False, help="Allow a second reward for the same retrieval."),
    jsonl: Optional[str] = typer.Option(None, help="Many rewards from JSONL (FILE or -): "
                                        '{"retrieval_id"|"memory_ids", "reward", "alpha"?, ...}, one transaction.'),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Update Q of rewarded memories by Q ← Q + α(R − Q), atomically, with a ledger row each."""
    with command(as_json):
        if jsonl is not None:
            from memrl_cli.transfer import read_jsonl

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
            bank = open_bank(db, create=False)
            updates = bank.reward(reward_value, retrieval_id=retrieval, memory_ids=memory or None,  # type: ignore[arg-type]
                                  alpha=alpha, floor=floor, source=source, allow_repeat=allow_repeat)  # type: ignore[arg-type]
        emit({"updated": updates}, as_json, lambda d: table(d["updated"], ["id", "q_before", "q_after"], "Q updates"))


REASON = typer.Option(None, "--reason", help="Why (kept in the bank's records).")
BY = typer.Option(None, "--by", help="Who is acting [default: your login name].")


@app.command()
def quarantine(
    ids: list[int] = typer.Argument(..., help="Memory ids to exclude from retrieval."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Exclude memories from every retrieval (they stay in the bank, exports and inspect); logged."""
    with command(as_json):
        from memrl_cli import hygiene

        emit(hygiene.quarantine(open_bank(db, create=False), ids, reason, by), as_json,
             _render_marked("quarantined", "already quarantined"))


@app.command()
def release(
    ids: list[int] = typer.Argument(..., help="Quarantined memory ids to retrieve again."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Let quarantined memories be retrieved again; logged."""
    with command(as_json):
        from memrl_cli import hygiene

        emit(hygiene.release(open_bank(db, create=False), ids, reason, by), as_json,
             _render_marked("released", "not quarantined"))


def _render_marked(done: str, unchanged: str) -> Callable[[dict[str, Any]], None]:
    """The line `quarantine` / `release` print: how many changed, and which ids were already so."""
    return lambda d: print(f"{done} {count(len(d['changed']), 'memory', 'memories')}"
                           + (f"; {unchanged}: {d['unchanged']}" if d["unchanged"] else ""))


@app.command("reset-q")
def reset_q(
    ids: list[int] = typer.Argument(..., help="Memory ids whose Q goes back to q_init."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Set Q back to its initial value, with a `set` ledger row each (Q = ledger replay still holds)."""
    with command(as_json):
        from memrl_cli import hygiene

        updates = hygiene.reset_q(open_bank(db, create=False), ids, reason, by)
        emit({"updated": updates}, as_json, lambda d: table(d["updated"], ["id", "q_before", "q_after"], "Q reset"))


@app.command()
def undo(
    source: Optional[str] = typer.Option(None, help="Undo the rewards whose source matches this pattern "
                                                    "(* any text, ? one character)."),
    since: Optional[str] = typer.Option(None, help="Undo the rewards given at or after this ISO 8601 time."),
    until: Optional[str] = typer.Option(None, help="Undo the rewards given before this ISO 8601 time."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; write nothing."),
    reason: Optional[str] = REASON, by: Optional[str] = BY, db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Revert the rewards of a source and/or time window: Q becomes the replay of the ledger without them."""
    with command(as_json):
        from memrl_cli import hygiene

        report = hygiene.undo(open_bank(db, create=False), source, since, until, dry_run=dry_run, reason=reason,
                              actor=by)
        emit(report, as_json, _render_undo)


def _render_undo(d: dict[str, Any]) -> None:
    table(d["memories"], ["id", "q_before", "q_after", "undone", "reapplied"],
          "would change (dry run)" if d["dry_run"] else "changed")
    print(f"{'would undo' if d['dry_run'] else 'undid'} {count(d['undone'], 'reward', 'rewards')}, "
          f"re-applying {count(d['reapplied'], 'later one', 'later ones')}"
          + (f"; {d['superseded']} matching rewards precede a set row and no longer count" if d["superseded"] else ""))


@app.command("inspect")
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
        from memrl_cli import inspection

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


@app.command()
def explain(retrieval_id: int = typer.Argument(..., help="A retrieval id."), db: Optional[str] = DB,
            as_json: bool = JSON) -> None:
    """Why a retrieval selected what it selected (same as `inspect --explain`)."""
    with command(as_json):
        from memrl_cli import inspection

        emit(inspection.explain(open_bank(db, create=False), retrieval_id), as_json, _render_explain)


@app.command()
def calibrate(
    mean: Optional[float] = typer.Option(None, help="Fix the similarity mean used by z(sim)."),
    std: Optional[float] = typer.Option(None, help="Fix the similarity std used by z(sim)."),
    clear: bool = typer.Option(False, "--clear", help="Drop a fixed override and use the bank's own statistics."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Recompute the bank's similarity statistics for z(sim), or fix them."""
    with command(as_json):
        emit(open_bank(db, create=False).calibrate(mean, std, clear), as_json, lambda d: print(json.dumps(d, indent=2)))


@app.command("export")
def export_cmd(
    output: str = typer.Option("-", "--output", "-o", help="File to write, or - for stdout."),
    vectors: bool = typer.Option(False, "--vectors", help="Include the embedding vectors."),
    db: Optional[str] = DB,
    as_json: bool = typer.Option(False, "--json", help="With -o FILE: print {\"path\", \"memories\"} as one JSON "
                                                     "object (errors as JSON too)."),
) -> None:
    """Write the bank as JSONL (header line, then one memory with its ledger per line)."""
    with command(as_json):
        from memrl_cli.transfer import export_jsonl

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


@app.command("import")
def import_cmd(
    source_file: str = typer.Argument(..., help="A `memrl export` file, plain ingest JSONL, or - for stdin."),
    merge_duplicates: bool = typer.Option(False, help="Reconcile duplicates (visit-weighted Q) instead of skipping."),
    embedder: Optional[str] = typer.Option(None, envvar="MEMRL_EMBEDDER", help="Embedder for a new bank."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Import memories with their Q and ledger, all or nothing; re-embeds when vectors do not fit."""
    with command(as_json):
        from memrl_cli.transfer import import_records, read_export

        with open_input(source_file) as stream:
            exported_with, records = read_export(stream)  # validate all before opening (or creating) the bank
        counts = import_records(open_bank(db, embedder), records, exported_with, merge_duplicates=merge_duplicates,
                                source_name=os.path.basename(source_file))
        emit(counts, as_json, lambda d: print(f"imported {count(d['created'], 'memory', 'memories')}, "
                                              f"{count(d['duplicates'], 'duplicate', 'duplicates')} skipped, "
                                              f"{d['merged']} merged"))


@app.command()
def merge(
    first: str = typer.Argument(..., help="First bank."),
    second: str = typer.Argument(..., help="Second bank."),
    output: str = typer.Option(..., "--output", "-o",
                               help="The new merged bank: a file that must not exist, or an empty PostgreSQL bank's URL."),
    as_json: bool = JSON,
) -> None:
    """Merge two banks into a new one: duplicates get visit-weighted Q, both ledgers are kept."""
    with command(as_json):
        from memrl_cli.transfer import merge as merge_banks

        from memrl_cli.store import redact

        emit(merge_banks(first, second, output), as_json, lambda d: print(
            f"{redact(output)}: {count(d['created'], 'memory', 'memories')} added from {redact(second)}, "
            f"{count(d['merged'], 'duplicate', 'duplicates')} merged"))


@app.command()
def backup(
    destination: str = typer.Argument(..., help="Where to write the copy."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Copy the bank safely while other processes use it (SQLite online backup)."""
    with command(as_json):
        from memrl_cli.transfer import backup as backup_bank

        size = backup_bank(open_bank(db, create=False), destination, force)
        emit({"path": destination, "bytes": size}, as_json, lambda d: print(f"backed up to {d['path']} ({d['bytes']} bytes)"))


@app.command()
def doctor(
    rebuild_index: bool = typer.Option(False, "--rebuild-index", help="Rebuild the sqlite-vec index from raw vectors."),
    index: Optional[str] = typer.Option(None, "--index", help="Build or drop the engine index: vec or none (SQLite), "
                                                               "hnsw or exact (PostgreSQL)."),
    db: Optional[str] = DB, as_json: bool = JSON,
) -> None:
    """Report the engine (SQLite driver and sqlite-vec, or the PostgreSQL server) and the bank's health."""
    with command(as_json):
        from memrl_cli import inspection

        bank = open_bank(db, create=False)
        report: dict[str, Any] = bank.store.describe()
        if rebuild_index:
            report["reindexed"] = bank.rebuild_index()
        if index is not None:
            report["index"] = bank.set_index(index)
        report.update(inspection.verify(bank))
        emit(report, as_json, lambda d: print(json.dumps(d, indent=2)))
        if not report["ok"]:
            raise typer.Exit(1)


@app.command()
def bench(
    name: str = typer.Argument(..., help="Benchmark: alfworld, bigcodebench, llb-db, llb-os, hle, or module:Class."),
    method: Optional[str] = typer.Option(None, help="memrl (λ=0.5), rag (λ=0), none, memrl-cal, memrl-ucb, memrl-ctx, "
                                                    "memrl-ctxz, memrl-ctxn, memrl-ctxnz, memrl-ctxt (recommended), memrl-ctxts, memp, reflexion, self-rag (bigcodebench, hle), pass@k; "
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
    option: Optional[list[str]] = typer.Option(None, "--option", "-o", help="Adapter option KEY=VALUE (repeatable)."),
    config: Optional[str] = typer.Option(None, help="YAML with `bench:` and `llm:` sections (see configs/)."),
    model: Optional[str] = typer.Option(None, help="Agent model [env MEMRL_MODEL]."),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL [env OPENAI_BASE_URL]."),
    temperature: Optional[str] = typer.Option(None, help="Sampling temperature of every call, or `default` to send "
                                                         "none [config, else none: reasoning models need that]."),
    embedder: Optional[str] = typer.Option(None, help="Embedding model of the run's bank, e.g. "
                                                      "openai:text-embedding-3-large (the authors') [local MiniLM]."),
    local_llm: bool = typer.Option(False, "--local-llm", help="Serve the offline SmolLM2-135M model (plumbing check)."),
    workers: int = typer.Option(4, help="Worker processes that play the episodes (0 = in this process)."),
    concurrency: Optional[int] = typer.Option(None, help="Most episodes (and LLM requests) in flight at once, "
                                                         "threads across the workers [config, else the batch size]."),
    runs_dir: str = typer.Option("runs", help="Where run directories are written."),
    resume: Optional[str] = typer.Option(None, help="Continue the run in this run directory."),
    db: Optional[str] = typer.Option(None, "--db", show_default=False,  # never $MEMRL_DB: a user's agent bank
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


@app.command()
def report(run_dir: str = typer.Argument(..., help="A run directory (runs/<run>/, with config.json)."),
           as_json: bool = JSON) -> None:
    """Where learning stalls: per epoch, how often a memory that proved useful existed, was recalled, was selected."""
    with command(as_json):
        from memrl_cli.report import learning_report

        emit(learning_report(run_dir), as_json, _render_report)


def _render_report(d: dict[str, Any]) -> None:
    print(f"run {d['run_id']} ({d['benchmark']}, {d['method']}): {d['useful_pairs']} (task, memory) pairs proved useful")
    table(d["epochs"], ["epoch", "episodes", "accuracy", "receipts", "existed", "recalled", "selected"],
          "training episodes in which a memory that proved useful for the task...")


TOKEN = typer.Option(None, "--token", envvar="MEMRL_TOKEN", show_default=False,
                     help="Secret every HTTP request must carry (X-Memrl-Token); required to bind beyond 127.0.0.1 "
                          "[env MEMRL_TOKEN].")
READ_ONLY = typer.Option(False, "--read-only", help="Turn off reward and remember (retrieval still stores receipts).")


def need_extra(module: str, extra: str) -> None:
    """A one-line error naming the extra to install when an optional dependency is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MemrlError(f"this command needs the {extra!r} extra: pip install 'memrl[{extra}]'")


@app.command()
def mcp(
    http: Optional[str] = typer.Option(None, "--http", metavar="HOST:PORT",
                                       help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio."),
    selector: str = SELECTOR, token: Optional[str] = TOKEN, read_only: bool = READ_ONLY, db: Optional[str] = DB,
) -> None:
    """Serve the bank as MCP tools (retrieve, remember, reward, top_memories, explain, stats) over stdio or HTTP."""
    with command(False):
        need_extra("mcp", "mcp")
        from memrl_cli.mcp_server import serve

        serve(bank_location(db), http=http, token=token, read_only=read_only, selector=selector)


@app.command()
def proxy(
    upstream: str = typer.Option(..., help="The OpenAI-compatible API to forward to, e.g. https://api.openai.com/v1."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (anything but loopback needs --token)."),
    port: int = typer.Option(8765, help="Port to listen on (0: any free port)."),
    k1: int = typer.Option(5, help="Phase A recall size."),
    k2: int = typer.Option(3, help="Memories injected per request (header X-Memrl-K2 overrides)."),
    lam: float = typer.Option(0.5, "--lambda", help="Weight of Q against similarity (header X-Memrl-Lambda overrides)."),
    threshold: float = typer.Option(0.5, help="Minimum cosine similarity for Phase A."),
    selector: str = SELECTOR, token: Optional[str] = TOKEN, read_only: bool = READ_ONLY, db: Optional[str] = DB,
) -> None:
    """An OpenAI-compatible Chat Completions proxy that injects memories and takes rewards for them."""
    with command(False):
        need_extra("starlette", "proxy")
        need_extra("uvicorn", "proxy")
        from memrl_cli.proxy import serve
        from memrl_cli.retrieve import RetrieveParams

        serve(bank_location(db), upstream, host=host, port=port, token=token, read_only=read_only,
              defaults=RetrieveParams(k1=k1, k2=k2, lam=lam, threshold=threshold, selector=selector))


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
