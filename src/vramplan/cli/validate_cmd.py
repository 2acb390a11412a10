"""`vramplan validate` sub-commands: score the engines and the rules of thumb on measured runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from vramplan.cli.common import fail, guard_input, progress
from vramplan.errors import VramplanError

__all__ = ["SHORT_HEAD", "band_lines", "register", "render_result"]

# same columns as the markdown table, with short names for a terminal
SHORT_HEAD = ["n", "med |e|", "p90 |e|", "med e", "under/over", "fits ok", "missed OOM", "false OOM"]


def band_lines(result: object) -> list[str]:
    """Per engine: the band's verdicts, said FITS but OOMed, coverage per workload, and the error of
    motivated and other entries (``vramplan.validate.markdown.band_lines`` is the markdown twin)."""
    from vramplan.validate.markdown import band_lines as md_lines

    return md_lines(result)


def render_result(result: object, console: Console, worst: int = 10, show_entries: bool = False) -> None:
    """Rich tables: one row per predictor, by task, the worst entries and the skipped ones."""
    from vramplan.validate.markdown import fmt_pct, summary_cells
    from vramplan.validate.runner import ValidationResult

    assert isinstance(result, ValidationResult)
    console.print(f"[bold]{result.dataset}[/]: {result.n_entries} entries, {result.n_resolved} resolved, "
                  f"{result.n_usable} usable (known quantity, run fitted), {result.n_skipped} skipped")
    table = Table(title="Error e = (predicted - measured) / measured", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ["predictor", "for", *SHORT_HEAD]:
        table.add_column(col, justify="left" if col in ("predictor", "for") else "right",
                         no_wrap=col in ("predictor", "for"))
    notes: list[str] = []
    for p in result.predictors:
        if p.unavailable_reason:
            table.add_row(p.label, p.applies_to, "[yellow]unavailable[/]", *[""] * (len(SHORT_HEAD) - 1))
            notes.append(f"{p.label}: unavailable: {p.unavailable_reason}")
        else:
            cells = summary_cells(p.overall)
            if p.overall.missed_oom:
                cells[6] = f"[bold red]{cells[6]}[/]"
            table.add_row(p.label, p.applies_to, *cells)
    console.print(table)
    for note in notes:
        console.print(f"[yellow]{note}[/]", highlight=False)
    for line in band_lines(result):
        console.print(line, highlight=False)
    by_task = Table(title="By task (train-full: full fine-tuning, train-peft: LoRA/QLoRA)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ["predictor", "task", *SHORT_HEAD]:
        by_task.add_column(col, justify="left" if col in ("predictor", "task") else "right",
                           no_wrap=col in ("predictor", "task"))
    for p in result.predictors:
        if p.unavailable_reason:
            continue
        for task, s in p.by_workload.items():
            if s.n_error or s.n_fits_checked:
                by_task.add_row(p.label, task, *summary_cells(s))
    console.print(by_task)
    for p in result.predictors:
        if p.kind != "engine" or p.unavailable_reason:
            continue
        rows = result.worst(p.key, worst)
        if not rows:
            continue
        t = Table(title=f"Largest errors, {p.label}", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("entry", "task", "quantity", "measured GiB", "predicted GiB", "error"):
            t.add_column(col, justify="left" if col in ("entry", "task", "quantity") else "right")
        for e in rows:
            pr = e.predictions[p.key]
            t.add_row(e.id, e.task, e.quantity, f"{e.measured_bytes / 2**30:.2f}",
                      f"{(pr.predicted_bytes or 0) / 2**30:.2f}", fmt_pct(pr.signed_error, signed=True))
        console.print(t)
    if show_entries:
        t = Table(title="Every entry", title_justify="left", box=box.SIMPLE_HEAD)
        keys = [p.key for p in result.predictors]
        for col in ("entry", "quantity", "outcome", *keys):
            t.add_column(col)
        for e in result.entries:
            cells = []
            for k in keys:
                cp = e.predictions.get(k)
                if e.status == "skipped" or cp is None:
                    cells.append("skipped")
                elif cp.status != "ok":
                    cells.append(cp.status)
                else:
                    err = fmt_pct(cp.signed_error, signed=True) if cp.signed_error is not None else ""
                    mark = {"correct": "", "false_oom": " said OOM", "missed_oom": " SAID FITS"}[cp.verdict or "correct"]
                    cells.append(f"{err}{mark}".strip() or "ok")
            t.add_row(e.id, e.quantity, e.outcome, *cells)
        console.print(t)
    if result.skipped:
        console.print(f"[yellow]skipped {result.n_skipped} entr{'y' if result.n_skipped == 1 else 'ies'}:[/]")
        for e in result.skipped:
            console.print(f"  {e.id}: {e.skip_reason}", highlight=False)


# a dataset is read whole: published.yaml is about 0.4 MB, so 64 MiB is room for 100 times as many runs
MAX_DATASET_BYTES = 64 << 20


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("validate")
    def validate_cmd(
        dataset: Annotated[Path, typer.Argument(help="dataset of measured runs (.yaml or .json), "
                                                     "e.g. validation/published.yaml")],
        engine: Annotated[str, typer.Option(help="analytic | trace | all")] = "all",
        as_json: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
        markdown: Annotated[bool, typer.Option("--markdown", help="print markdown tables (for a README)")] = False,
        worst: Annotated[int, typer.Option(help="how many of the largest errors to list", min=0)] = 10,
        entries: Annotated[bool, typer.Option("--entries", help="also list every entry's error")] = False,
    ) -> None:
        """Score each engine and the common rules of thumb against measured runs."""
        from vramplan.validate.markdown import to_markdown
        from vramplan.validate.runner import validate

        try:
            guard_input("DATASET", dataset, MAX_DATASET_BYTES)
            with progress(f"scoring {engine} against {dataset.name}", quiet=as_json or markdown):
                result = validate(dataset, engine=engine)
        except VramplanError as exc:
            fail(exc)
        if as_json:
            sys.stdout.write(json.dumps(result.to_json_dict(), indent=2) + "\n")
        elif markdown:
            sys.stdout.write(to_markdown(result, worst=worst))
        else:
            render_result(result, Console(soft_wrap=False), worst=worst, show_entries=entries)
