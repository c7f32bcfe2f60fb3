"""docs/method.md's table of departures from the paper is the code's set of switches, each off by default."""

from __future__ import annotations

import re
from dataclasses import fields

from typer.main import get_command

from conftest import ROOT
from memrl_bench.framework.config import HARNESS_DEPARTURES, SELECTORS, BenchConfig
from memrl_cli.cli import app
from memrl_cli.method.retrieval import DEPARTURES, RetrieveParams


def departures_table() -> dict[str, str]:
    """switch → its value when off, as docs/method.md's table gives them."""
    text = (ROOT / "docs" / "method.md").read_text()
    table = text.split("<!-- departures-table -->")[1].split("<!-- end departures-table -->")[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    return {m.group(1): m.group(2) for m in (re.match(r"\| `([^`]+)` \| `([^`]+)` \|", row) for row in rows) if m}


def test_the_table_lists_exactly_the_switches_with_their_off_values() -> None:
    documented = departures_table()
    assert set(documented) == set(DEPARTURES) | set(HARNESS_DEPARTURES)
    params, config = RetrieveParams(), BenchConfig(benchmark="x")
    for name, off in {**DEPARTURES, **HARNESS_DEPARTURES}.items():
        assert documented[name] == str(off).lower(), name
        default = getattr(params, name) if name in DEPARTURES else getattr(config, name)
        assert default == off, f"{name} is on by default"


def test_every_switch_is_reachable_where_the_doc_says() -> None:
    """Retrieval switches are flags of `memrl retrieve`; every switch is a run setting (BenchConfig field,
    `--option NAME=VALUE`), the selector by its method."""
    retrieve = get_command(app).commands["retrieve"]  # type: ignore[attr-defined]
    flags = {opt for p in retrieve.params for opt in p.opts}
    settings = {f.name for f in fields(BenchConfig)}
    for name in DEPARTURES:
        assert f"--{name.replace('_', '-')}" in flags, name
        assert name in settings or (name == "selector" and "memrl-conditioned" in SELECTORS), name
    assert set(HARNESS_DEPARTURES) <= settings


def test_a_default_run_is_the_papers_rule() -> None:
    """`--method memrl` with nothing switched on: no departure in its retrieval parameters."""
    assert BenchConfig(benchmark="x").retrieve_params(0).departures() == {}
    assert BenchConfig(benchmark="x", recall="groups").retrieve_params(0).departures() == {"recall": "groups"}


def test_retrieve_params_are_the_papers_or_a_declared_switch() -> None:
    """A new retrieval knob must be either one of the paper's parameters or a departure in `DEPARTURES` (and so in
    the table): this list is the paper's, plus the grouped recall's own settings and the caller's filters (sources, scopes)."""
    papers = {"k1", "k2", "lam", "threshold", "epsilon", "seed", "sim_mean", "sim_std", "q_min"}
    grouped = {"group_threshold", "pool"}  # meaningful only under recall="groups"
    assert {f.name for f in fields(RetrieveParams)} - papers - grouped - {"sources", "scopes"} == set(DEPARTURES)
