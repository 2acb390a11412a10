"""``vramplan`` command line (typer).  Every scenario key has a flag; flags override the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from vramplan.cli.common import fail as _fail
from vramplan.cli.common import progress as _progress
from vramplan.cli.common import scenario_document
from vramplan.cli.flags import Given, scenario_flags, scenario_options
from vramplan.errors import Problem, ScenarioError, VramplanError

app = typer.Typer(
    # typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    add_completion=True, no_args_is_help=True,
    help="Per-GPU memory for LLM training, inference and serving: estimate before you launch.",
)


def _out() -> Console:
    """A console made when a command runs, so it takes the terminal's width then (COLUMNS included), not the
    width at import: tests that set COLUMNS get it, whatever the shell exported."""
    return Console(soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, soft_wrap=True)

Opt = typer.Option


ESTIMATE_FLAGS = scenario_flags([""])  # every scenario field


def _print_version(value: bool) -> None:
    if value:
        from vramplan import __version__

        sys.stdout.write(f"vramplan {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, Opt("--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")] = False,
          token: Annotated[str | None, Opt("--token", help="Hugging Face token for a gated or private Hub id "
                                           "(sets HF_TOKEN for this run; never printed; docs/models.md)")] = None,
          ) -> None:
    """Per-GPU memory for LLM training, inference and serving: estimate before you launch."""
    if token:
        import os

        # huggingface_hub reads HF_TOKEN at each request (utils/_auth.py get_token); the scenario never holds it,
        # so no report or error shows it
        os.environ["HF_TOKEN"] = token




@app.command()
@scenario_options(ESTIMATE_FLAGS)
def estimate(
    scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional")] = None,
    engine: Annotated[str, Opt(help="analytic | trace (trace needs `pip install 'vramplan\\[trace]'`)")] = "analytic",
    as_json: Annotated[bool, Opt("--json", help="print the report as JSON")] = False,
    *,
    given: Given,
) -> None:
    """Estimate per-GPU memory for a scenario file and/or flags."""
    from vramplan.engine import estimate as run_estimate

    try:
        doc = scenario_document(scenario, given)
        if engine == "analytic":
            report = run_estimate(doc)
        elif engine == "trace":
            from vramplan.trace import estimate as trace_estimate

            with _progress("tracing the model on the meta device", quiet=as_json):
                report = trace_estimate(doc)
        else:
            raise ScenarioError([Problem(
                "--engine", f"unknown engine {engine!r}", "use --engine analytic or --engine trace")])
    except VramplanError as exc:
        _fail(exc, given)
        return
    from vramplan.plan.remedies import remedies_and_defaults

    # a job whose verdict is not FITS (the point estimate or the band's high bound over): what would fit
    extra = remedies_and_defaults(report, doc) if engine == "analytic" else {}
    if as_json:
        sys.stdout.write(json.dumps({**report.to_json_dict(), **extra}, indent=2) + "\n")
    else:
        from vramplan.cli.render import render_remedies, render_report

        out = _out()
        render_report(report, out)
        if extra:
            render_remedies(extra["remedies"], extra["assumed_settings"], out)
    if not report.fits:
        raise typer.Exit(1)


@app.command()
def models(query: Annotated[str | None, typer.Argument(help="filter by id, alias or model_type")] = None,
           as_json: Annotated[bool, Opt("--json")] = False) -> None:
    """List the model catalog."""
    from vramplan.catalog.models import list_models
    from vramplan.cli.render import render_models

    rows = list_models(query)
    if as_json:
        sys.stdout.write(json.dumps([{"id": r.id, "aliases": list(r.aliases), "source": r.source,
                                      "revision": r.revision} for r in rows], indent=2) + "\n")
        return
    if not rows:
        _err().print(f"no model matches {query!r}")
        raise typer.Exit(2)
    render_models(list(rows), _out())


@app.command()
def gpus(query: Annotated[str | None, typer.Argument(help="filter by name or alias")] = None,
         as_json: Annotated[bool, Opt("--json")] = False) -> None:
    """List the GPU catalog."""
    from vramplan.catalog.gpus import list_gpus
    from vramplan.cli.render import render_gpus

    rows = list_gpus(query)
    if as_json:
        from dataclasses import asdict

        sys.stdout.write(json.dumps([asdict(g) for g in rows], indent=2) + "\n")
        return
    if not rows:
        _err().print(f"no GPU matches {query!r}")
        raise typer.Exit(2)
    render_gpus(list(rows), _out())


# Each feature area registers its own sub-commands from its own module, so that the
# CLI grows without one file holding every command.
from vramplan.cli import (
    compare_cmd,
    measure_cmd,
    plan_cmd,
    serve_cmd,
    snapshot_cmd,
    trace_cmd,
    validate_cmd,
    web_cmd,
)

for _mod in (trace_cmd, serve_cmd, plan_cmd, compare_cmd, measure_cmd, snapshot_cmd, validate_cmd, web_cmd):
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
