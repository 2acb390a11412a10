"""`vramplan measure` sub-commands: one real step, measured, beside the prediction."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vramplan.cli.common import fail, progress, scenario_document
from vramplan.cli.flags import Given, scenario_flags, scenario_options
from vramplan.errors import Problem, ScenarioError, VramplanError

if TYPE_CHECKING:
    from vramplan.measure.result import MeasureResult

__all__ = ["MEASURE_FLAGS", "parse_bytes", "register", "render_measure"]

# measure takes a scenario as flags too; its own shrink options keep their names, so the scenario fields of
# the same name (seq_len, micro_batch_size, batch_size, prompt_len, new_tokens) are set from a file only
_SHRINK = frozenset({"seq_len", "micro_batch_size", "batch_size", "prompt_len", "new_tokens"})
MEASURE_FLAGS = tuple(f for f in scenario_flags([""]) if f.name not in _SHRINK)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'8000000000', '8GB', '7.5 GiB' -> bytes (GB = 10**9, GiB = 2**30)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ScenarioError([Problem("--max-cpu-bytes", f"cannot read {text!r} as a size",
                                     "give bytes (8000000000) or a size with a unit: 8GB, 7.5GiB, 512MiB")])
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value < 2**63:  # 1e400 reads as inf (int() raised OverflowError); no host has 8 EiB
        raise ScenarioError([Problem("--max-cpu-bytes", f"{text!r} is beyond any machine's memory",
                                     "give a size below 8 EiB, e.g. 64GiB")])
    return int(value)


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,} B"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def render_measure(res: MeasureResult, console: Console) -> None:
    pred_pg = res.prediction.per_gpu
    console.print(f"[bold]{res.model_name}[/] · {res.task} · measured on {res.device}: [bold]{res.measured}[/]",
                  highlight=False)
    console.print(f"peak {_size(res.peak_allocated_bytes)} measured, {_size(res.predicted_peak_bytes)} predicted "
                  f"({_pct(res.relative_error)}); peak in {res.peak_phase} (predicted: {pred_pg.peak_phase}); "
                  f"{res.parameters:,} parameters, {res.trainable_parameters:,} trainable", highlight=False)
    table = Table(title="Memory at the peak: measured vs predicted", title_justify="left")
    table.add_column("part")
    table.add_column("measured", justify="right")
    table.add_column("predicted", justify="right")
    table.add_column("error", justify="right")
    negligible = res.peak_allocated_bytes // 1000  # below 0.1% of the peak, an error says nothing
    for row in res.rows:
        style = "bold" if row.part in ("peak allocated",) else None
        small = max(row.measured_bytes or 0, row.predicted_bytes or 0) < negligible
        table.add_row(row.part, _size(row.measured_bytes), _size(row.predicted_bytes),
                      "(negligible)" if small else _pct(row.relative_error), style=style)
    console.print(table)
    if res.phases:
        phases = ", ".join(f"{k} {_size(v)} (predicted {_size(res.predicted_phases.get(k))})"
                           for k, v in res.phases.items())
        console.print(f"phase peaks: {phases}", highlight=False)
    if res.outside_allocator_bytes is not None:
        console.print(f"outside the allocator (NVML used - reserved): {_size(res.outside_allocator_bytes)} "
                      f"(predicted CUDA context {_size(pred_pg.outside_allocator.get('cuda_context'))})",
                      highlight=False)
    console.print("error = (predicted - measured) / measured; negative = under-prediction")
    if res.notes:
        console.print("Notes:")
        for note in res.notes:
            console.print(f"  - {note}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("measure")
    @scenario_options(MEASURE_FLAGS)
    def measure_command(
        scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional with "
                                                              "--model")] = None,
        device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")] = "auto",
        layers: Annotated[int | None, typer.Option(help="shrink: decoder layers (num_hidden_layers)")] = None,
        seq_len: Annotated[int | None, typer.Option(help="shrink: train tokens per sequence")] = None,
        micro_batch_size: Annotated[int | None, typer.Option(help="shrink: train sequences per step")] = None,
        batch_size: Annotated[int | None, typer.Option(help="shrink: inference sequences")] = None,
        prompt_len: Annotated[int | None, typer.Option(help="shrink: inference prompt tokens")] = None,
        new_tokens: Annotated[int | None, typer.Option(help="shrink: inference generated tokens")] = None,
        max_cpu_bytes: Annotated[str | None, typer.Option(
            help="CPU runs: refuse above this predicted size (bytes or 8GB/7.5GiB); default half the available RAM",
        )] = None,
        warmup: Annotated[bool, typer.Option(help="run one warm-up step first (steady state: optimizer states "
                                                   "exist)")] = True,
        as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
        *,
        given: Given,
    ) -> None:
        """Run one real step of a scenario (file and/or flags; random weights) and compare its memory with the
        prediction."""
        try:
            limit = parse_bytes(max_cpu_bytes) if max_cpu_bytes is not None else None
            from vramplan.measure.run import measure

            doc = scenario_document(scenario, given)
            with progress("running one step", quiet=as_json):
                res = measure(doc, device=device, layers=layers, seq_len=seq_len, micro_batch_size=micro_batch_size,
                              batch_size=batch_size, prompt_len=prompt_len, new_tokens=new_tokens,
                              max_cpu_bytes=limit, warmup=warmup)
        except VramplanError as exc:
            fail(exc, given)
        except Exception as exc:  # noqa: BLE001 - the real step raised (a CUDA OOM, the model code refusing its inputs)
            # the run itself failed, not the scenario: one line naming the exception, exit status 1, no traceback
            first = (str(exc).strip().splitlines() or [""])[0]
            oom = type(exc).__name__ == "OutOfMemoryError"
            hint = ("the job does not fit as run: compare with `vramplan estimate` on the same scenario, or shrink it "
                    "(--layers, --seq-len, --batch-size)" if oom else
                    "the installed torch/transformers could not run this scenario's step; `vramplan estimate` needs neither")
            Console(stderr=True).print(f"[red]error:[/] the measured step failed: {escape(type(exc).__name__)}: "
                                       f"{escape(first)} ({hint})", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        if as_json:
            sys.stdout.write(json.dumps(res.to_json_dict(), indent=2) + "\n")
            return
        render_measure(res, Console(soft_wrap=False))
