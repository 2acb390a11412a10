"""`vramplan trace` (traced engine): one step of the real model code on the meta device."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from vramplan.cli.common import deep_merge as _merge
from vramplan.cli.common import fail
from vramplan.cli.common import set_path as _set
from vramplan.errors import Problem, ScenarioError, VramplanError

Opt = typer.Option








def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("trace")
    def trace_command(
        scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional")] = None,
        model: Annotated[str | None, Opt(help="catalog id/alias or path to config.json")] = None,
        task: Annotated[str | None, Opt(help="train | inference")] = None,
        gpu: Annotated[str | None, Opt(help="GPU name (see `vramplan gpus`)")] = None,
        num_gpus: Annotated[int | None, Opt(help="GPUs in the job")] = None,
        framework: Annotated[str | None, Opt(help="hf-trainer | accelerate | lightning | torchtitan | deepspeed | plain")] = None,
        micro_batch_size: Annotated[int | None, Opt(help="train: sequences per GPU per micro-step")] = None,
        seq_len: Annotated[int | None, Opt(help="train: tokens per sequence")] = None,
        grad_accum_steps: Annotated[int | None, Opt(help="train: gradient accumulation steps")] = None,
        precision: Annotated[str | None, Opt(help="fp32 | fp16-mixed | bf16-mixed | bf16-true | fp16-true")] = None,
        optimizer: Annotated[str | None, Opt(help="adamw | adamw-fused | adamw-8bit | paged-adamw | paged-adamw-8bit | adafactor | sgd | sgd-momentum | lion | none")] = None,
        gradient_checkpointing: Annotated[str | None, Opt(help="none | full | selective")] = None,
        attention: Annotated[str | None, Opt(help="eager | sdpa | flash")] = None,
        peft: Annotated[str | None, Opt(help="lora | qlora | dora")] = None,
        lora_rank: Annotated[int | None, Opt(help="adapter rank r")] = None,
        target_modules: Annotated[str | None, Opt(help="comma-separated module names, or all-linear")] = None,
        quantization: Annotated[str | None, Opt(help="none | int8 | nf4 | nf4-dq | fp4")] = None,
        batch_size: Annotated[int | None, Opt(help="inference: sequences")] = None,
        prompt_len: Annotated[int | None, Opt(help="inference: prompt tokens")] = None,
        new_tokens: Annotated[int | None, Opt(help="inference: generated tokens")] = None,
        dtype: Annotated[str | None, Opt(help="inference weights dtype: fp32 | fp16 | bf16")] = None,
        zero_stage: Annotated[int | None, Opt(help="DeepSpeed ZeRO stage 0-3")] = None,
        fsdp: Annotated[str | None, Opt(help="none | full_shard | shard_grad_op | hybrid_shard | no_shard")] = None,
        timeline: Annotated[Path | None, Opt(help="write the step's timeline to FILE.png, .html or .json")] = None,
        top: Annotated[int, Opt(help="largest blocks alive at the peak to list")] = 10,
        as_json: Annotated[bool, Opt("--json", help="print the report as JSON")] = False,
    ) -> None:
        """Trace one training step or inference pass of the real model code (needs the trace extra)."""
        out = Console(soft_wrap=False)
        try:
            from vramplan.spec.load import read_document

            base: dict[str, Any] = read_document(scenario) if scenario is not None else {}
            over: dict[str, Any] = {}
            eff_task = task or base.get("task", "train")
            section = "inference" if eff_task == "inference" else "train"
            for path, value in [
                ("model", model), ("task", task), ("hardware.gpu", gpu), ("hardware.num_gpus", num_gpus),
                ("framework", framework), ("train.micro_batch_size", micro_batch_size), ("train.seq_len", seq_len),
                ("train.grad_accum_steps", grad_accum_steps), ("train.precision", precision),
                ("train.optimizer", optimizer), ("train.gradient_checkpointing", gradient_checkpointing),
                (f"{section}.attention", attention), ("train.peft.method", peft), ("train.peft.rank", lora_rank),
                ("train.peft.target_modules", None if target_modules is None else (
                    "all-linear" if target_modules == "all-linear" else [x.strip() for x in target_modules.split(",")])),
                (f"{section}.quantization", quantization), ("inference.batch_size", batch_size),
                ("inference.prompt_len", prompt_len), ("inference.new_tokens", new_tokens),
                ("inference.dtype", dtype), ("parallel.zero_stage", zero_stage), ("parallel.fsdp", fsdp),
            ]:
                _set(over, path, value)
            doc = _merge(base, over)
            if "model" not in doc:
                raise ScenarioError([Problem("model", "no model given", "pass a scenario file or --model")])
            if timeline is not None and timeline.suffix.lower() not in (".png", ".html", ".htm", ".json"):
                raise ScenarioError([Problem("--timeline", f"unknown timeline format {timeline.suffix!r}",
                                             "name a .png, .html or .json file")])
            from vramplan.trace import require_torch

            require_torch()
            from vramplan.trace.engine import report_and_trace

            report, data = report_and_trace(doc, top=top)
            if timeline is not None:
                from vramplan.trace.timeline import write_timeline

                write_timeline(timeline, data)
        except VramplanError as exc:
            fail(exc)
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
