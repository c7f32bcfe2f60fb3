"""The README and docs/ name no path outside the repository: no developer's or build machine's directory
(`/work/...`, `/root/...`, `/home/...`), no developer-only data copy (`../shared/...`), and every relative
path that climbs (`../x`) lands on a file or directory of the repository. Placeholders (`/path/to/...`),
the user's own directories (`~/...`) and system paths (`/usr`, `/etc`, `/var`, `/tmp`, ...) are fine.
A run directory kept as an example (docs/examples/*-run/, with its config.json) is a record,
not a document: it names where it ran and is not read here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_RECORDS = {p.parent for p in (ROOT / "docs" / "examples").glob("*-run/config.json")}
DOCUMENTS = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*")
                                          if p.is_file() and p.suffix != ".png" and p.parent not in RUN_RECORDS)])

# An absolute path whose first directory is a home, a build machine's workspace or a mount of one.
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(work|workspace|root|home|Users|scratch|mnt|srv|build)/[\w.~/-]*")
DEVELOPER_COPY = re.compile(r"[\w./-]*\bshared/(data|reference)\b[\w./-]*")
CLIMBING = re.compile(r"(?<![\w.~/-])((?:\.\./)+[\w.-][\w./-]*)")


def problems(document: Path, text: str) -> list[str]:
    """Each path in `text` (the content of `document`) that points outside the repository, with its line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in MACHINE_PATH.finditer(line):
            found.append(f"{number}: {match.group(0)} (a machine's own directory)")
        for match in DEVELOPER_COPY.finditer(line):
            found.append(f"{number}: {match.group(0)} (the developers' data copy)")
        for match in CLIMBING.finditer(line):
            target = (document.parent / match.group(1).rstrip(".")).resolve()
            if not target.is_relative_to(ROOT) or not target.exists():
                found.append(f"{number}: {match.group(1)} (not in the repository)")
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_no_path_outside_the_repository(document: Path) -> None:
    assert problems(document, document.read_text(encoding="utf-8")) == []


def test_the_check_finds_each_kind_of_outside_path() -> None:
    """The lines this test was written against (docs at 0648211) are caught; their fixes and fine paths are not."""
    readme, doc = ROOT / "README.md", ROOT / "docs" / "bench.md"
    caught = {
        (readme, "then in `../shared/data/`; a missing data set skips"),
        (doc, "What our reference material (/work/shared/reference: `memrl_reference_code.md`"),
        (doc, "memrl bench bigcodebench --data ../shared/data/bigcodebench --option stdlib_only=true"),
        (doc, "directories the caller lists in `readable` (the interpreter under `/root/.pyenv`, say)"),
        (doc, '"env": {"MEMRL_DB": "/home/me/.local/share/memrl/agent.db"}'),
        (doc, "see [the numbers](../../elsewhere/results.json)"),
    }
    for document, line in caught:
        assert problems(document, line), line
    fine = ["--examples /path/to/alfworld_examples.json", "`~/.cache/alfworld` after `alfworld-download`",
            "dockerd >/var/log/dockerd.log 2>&1 &", "[results](../benchmarks/perf/results.json)",
            "see [the README](../README.md).", "a/b/../c is not climbing out", "the shared 2-core machine", "private files such as `/root`)"]
    for line in fine:
        assert problems(doc, line) == [], line


MARKDOWN = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
DOC_NAME = re.compile(r"(?<![\w./-])docs/[\w./-]*?\.md(?:#[\w-]+)?")


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code spans: what renders as Markdown links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lowercased, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    """Every #anchor of a Markdown file: its headings' slugs (a repeated one numbered, as GitHub does) and
    explicit `<a id=...>`/`<a name=...>`."""
    text = FENCE.sub("", document.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(document: Path) -> list[str]:
    """Each relative link of `document` whose file, or whose #anchor in that file, does not exist."""
    found = []
    for target in LINK.findall(prose(document.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            found.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            found.append(f"{target} (no such heading in {file.name})")
    return found


@pytest.mark.parametrize("document", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(document: Path) -> None:
    assert broken_links(document) == []


def test_every_doc_named_in_the_code_and_docs_exists() -> None:
    """`docs/NAME.md` (and `#anchor`) in a docstring, a comment, a message or a page names a page that exists."""
    sources = [*MARKDOWN, *ROOT.joinpath("memrl_cli").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py"),
               *ROOT.joinpath("tests").glob("*.py")]
    missing = []
    for source in sources:
        for name in DOC_NAME.findall(source.read_text(encoding="utf-8")):
            path, _, anchor = name.partition("#")
            if re.fullmatch(r"docs/(cli/)?[A-Z]+\.md", path):  # a placeholder: docs/NAME.md
                continue
            if not (ROOT / path).is_file() or (anchor and anchor not in anchors(ROOT / path)):
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert missing == []


def test_the_link_check_follows_githubs_anchor_rules(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# `memrl` command reference\n## Re-check (issue 17), 2026-11-25 night\n## Notes\n## Notes\n"
                    "```sh\n# not a heading\n```\n<a id=\"kept\"></a>\n", encoding="utf-8")
    assert anchors(page) == {"memrl-command-reference", "re-check-issue-17-2026-11-25-night", "notes", "notes-1", "kept"}
    doc = tmp_path / "doc.md"
    doc.write_text("[a](page.md#notes-1) [b](page.md#nowhere) [c](gone.md) `[d](gone.md)` [e](https://x.org/y)\n"
                   "```\n[f](gone.md)\n```\n", encoding="utf-8")
    assert broken_links(doc) == ["page.md#nowhere (no such heading in page.md)", "gone.md (no such file)"]
