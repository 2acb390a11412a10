"""`vramplan compare`: two to four scenario files or flag sets side by side (``vramplan.compare`` computes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from vramplan.cli.common import deep_merge, fail, refuse_other_task_options, set_path
from vramplan.cli.flags import Flag, Given, scenario_flags, scenario_options
from vramplan.errors import Problem, ScenarioError, VramplanError, suggest
from vramplan.units import GiB

__all__ = ["COMPARE_FLAGS", "parse_setup", "register", "render_comparison"]

Opt = typer.Option
COMPARE_FLAGS = scenario_flags([""])


def _path_for(key: str, flags: tuple[Flag, ...], task: object) -> str:
    """A ``--setup`` key: a dotted scenario key (``train.micro_batch_size``) or an option's name
    (``micro-batch-size``, ``micro_batch_size``)."""
    if "." in key:
        return key
    name = key.lstrip("-").replace("-", "_")
    for f in flags:
        if f.name == name:
            return f.path_for(task)
    close = suggest(name, [f.name for f in flags])
    raise ScenarioError([Problem("--setup", f"unknown setting {key!r}",
                                 f"did you mean {close[0]!r}?" if close else "use an option name or a dotted key")])


def parse_setup(text: str, flags: tuple[Flag, ...], task: object) -> dict[str, Any]:
    """``"micro-batch-size=4 gradient-checkpointing=full"`` -> a nested scenario mapping (values read as YAML
    scalars, so numbers and booleans keep their type)."""
    import yaml

    out: dict[str, Any] = {}
    for item in text.replace(",", " ").split():
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise ScenarioError([Problem("--setup", f"{item!r} is not KEY=VALUE", "e.g. --setup 'micro-batch-size=4'")])
        try:
            value = yaml.safe_load(raw) if len(raw) <= 100 else raw
        except yaml.YAMLError:
            value = raw
        set_path(out, _path_for(key, flags, task), value if isinstance(value, (str, int, float, bool)) else raw)
    return out


def _cell(key: str, value: Any) -> str:
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / GiB:,.2f}"
    return "-" if value is None else str(value)


def render_comparison(doc: dict[str, Any], console: Console) -> None:
    """The differing settings, then the results, one column per setup; differing values in bold."""
    reports = doc["reports"]
    table = Table(title="Setups side by side (GiB per GPU; differing values in bold)", title_justify="left")
    table.add_column("", no_wrap=True)  # a dotted key stays whole; the setups' columns fold instead
    for i, r in enumerate(reports):
        star = " (best)" if doc["best"] == i else ""
        table.add_column(f"{i + 1}: {r['model'].get('name', '?')} on {r['gpu'].get('name', '?')}{star}",
                         justify="right", overflow="fold")
    for d in doc["differences"]:
        table.add_row(d["key"], *[f"[bold yellow]{_cell(d['key'], v)}[/]" for v in d["values"]])
    table.add_section()
    for row in doc["results"]:
        label = row["key"].removeprefix("per_gpu.").removesuffix("_bytes").replace("_", " ")
        cells = [_cell(row["key"], v) for v in row["values"]]
        table.add_row(label, *[f"[bold]{c}[/]" if row["differs"] else c for c in cells])
    console.print(table)
    if not doc["differences"]:
        console.print("the setups have the same settings")


def register(app: typer.Typer) -> None:
    """Add ``compare`` to the top-level app."""

    @app.command("compare")
    @scenario_options(COMPARE_FLAGS)
    def compare_command(
        scenarios: Annotated[list[Path] | None, typer.Argument(help="scenario files (0-4)")] = None,
        setup: Annotated[list[str] | None, Opt(
            help="a setup as KEY=VALUE pairs over the options given ('micro-batch-size=4 zero-stage=3'); "
                 "repeat for each")] = None,
        engine: Annotated[str, Opt(help="analytic | trace")] = "analytic",
        as_json: Annotated[bool, Opt("--json", help="print the comparison as JSON")] = False,
        *,
        given: Given,
    ) -> None:
        """Two to four setups side by side: scenario files and/or --setup flag sets (options given apply to
        every setup); exit 0 when all fit, 1 when one does not."""
        from vramplan.compare import compare
        from vramplan.spec.load import read_document

        console = Console(soft_wrap=False)
        try:
            docs: list[dict[str, Any]] = []
            for path in scenarios or []:
                base = read_document(path)
                task = given["task"] or base.get("task", "train")
                refuse_other_task_options(given, task)
                docs.append(deep_merge(base, given.document(task)))
            for text in setup or []:
                task = given["task"] or "train"
                refuse_other_task_options(given, task)
                docs.append(deep_merge(given.document(task), parse_setup(text, given.flags, task)))
            result = compare(docs, engine=engine)
        except VramplanError as exc:
            fail(exc, given)
        if as_json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            render_comparison(result, console)
        if not all(r["fits"] for r in result["reports"]):
            raise typer.Exit(1)
