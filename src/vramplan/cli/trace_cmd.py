"""`vramplan trace` (traced engine): one step of the real model code on the meta device."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from vramplan.cli.common import fail, guard_output, progress, scenario_document
from vramplan.cli.flags import Given, scenario_flags, scenario_options
from vramplan.errors import ScenarioError, VramplanError
from vramplan.spec.checks import number_problems

Opt = typer.Option

# The traced engine runs the installed libraries, so the software versions are not offered.
TRACE_FLAGS = scenario_flags(["model", "task", "framework", "hardware", "train", "inference", "parallel", "offline"])


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("trace")
    @scenario_options(TRACE_FLAGS)
    def trace_command(
        scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional")] = None,
        timeline: Annotated[Path | None, Opt(help="write the step's timeline to FILE.png, .html or .json")] = None,
        top: Annotated[int, Opt(help="largest blocks alive at the peak to list")] = 10,
        as_json: Annotated[bool, Opt("--json", help="print the report as JSON")] = False,
        *,
        given: Given,
    ) -> None:
        """Trace one training step or inference pass of the real model code (needs the trace extra)."""
        out = Console(soft_wrap=False)
        try:
            doc = scenario_document(scenario, given)
            guard_output("--timeline", timeline, (".png", ".html", ".htm", ".json"), ".png, .html or .json")
            problems = number_problems("--top", top, 1, 1000)
            if problems:
                raise ScenarioError(problems)
            from vramplan.trace import require_torch

            require_torch()
            from vramplan.trace.engine import report_and_trace

            with progress("tracing the model on the meta device", quiet=as_json):
                report, data = report_and_trace(doc, top=top)
            if timeline is not None:
                from vramplan.trace.timeline import write_timeline

                write_timeline(timeline, data)
        except VramplanError as exc:
            fail(exc, given)
        if as_json:
            payload = report.to_json_dict()
            payload["trace"] = {"top_at_peak": data["top_at_peak"], "peak_seq": data["peak"]["seq"]}
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        else:
            from vramplan.cli.render import render_report

            render_report(report, out)
            _render_top(data, out)
            if timeline is not None:
                out.print(f"timeline written to {timeline}")
        if not report.fits:
            raise typer.Exit(1)


def _render_top(data: dict[str, Any], console: Console) -> None:
    from vramplan.units import GiB

    rows = data.get("top_at_peak", [])
    if not rows:
        return
    table = Table(title="Largest blocks alive at the peak", title_justify="left")
    table.add_column("GiB", justify="right")
    table.add_column("category")
    table.add_column("module / tensor")
    for r in rows:
        named = r["category"] in ("weights", "gradients", "optimizer_states", "master_weights")
        table.add_row(f"{r['bytes'] / GiB:,.3f}", r["category"], r["what"] if named else (r["module"] or r["what"]))
    console.print(table)
