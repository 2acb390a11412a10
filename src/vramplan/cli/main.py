"""``vramplan`` command line (typer).  Every scenario key has a flag; flags override the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from vramplan.cli.common import deep_merge as _deep_merge
from vramplan.cli.common import fail as _fail
from vramplan.cli.common import set_path as _set
from vramplan.errors import Problem, ScenarioError, VramplanError

app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Per-GPU memory for LLM training, inference and serving: estimate before you launch.",
)
out = Console(soft_wrap=False)
err = Console(stderr=True)

Opt = typer.Option


@app.command()
def estimate(
    scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional")] = None,
    model: Annotated[str | None, Opt(help="catalog id/alias or path to config.json")] = None,
    task: Annotated[str | None, Opt(help="train | inference | serve")] = None,
    gpu: Annotated[str | None, Opt(help="GPU name (see `vramplan gpus`)")] = None,
    num_gpus: Annotated[int | None, Opt(help="GPUs in the job")] = None,
    capacity_gib: Annotated[float | None, Opt(help="device capacity in GiB, for a GPU not in the catalog")] = None,
    gpus_per_node: Annotated[int | None, Opt(help="GPUs per node (intra- vs inter-node groups)")] = None,
    cuda_module_loading: Annotated[str | None, Opt(help="lazy | eager: CUDA_MODULE_LOADING of the run (eager: CUDA < 11.7 or CUDA_MODULE_LOADING=EAGER); sets the CUDA context size")] = None,
    framework: Annotated[str | None, Opt(help="hf-trainer | accelerate | lightning | torchtitan | deepspeed | vllm | plain")] = None,
    micro_batch_size: Annotated[int | None, Opt(help="train: sequences per GPU per micro-step")] = None,
    seq_len: Annotated[int | None, Opt(help="train: tokens per sequence")] = None,
    grad_accum_steps: Annotated[int | None, Opt(help="train: gradient accumulation steps")] = None,
    precision: Annotated[str | None, Opt(help="fp32 | fp16-mixed | bf16-mixed | bf16-true | fp16-true | fp8-mixed")] = None,
    optimizer: Annotated[str | None, Opt(help="adamw | adamw-fused | adamw-8bit | paged-adamw | paged-adamw-8bit | adafactor | sgd | sgd-momentum | lion | none")] = None,
    gradient_checkpointing: Annotated[str | None, Opt(help="none | full | selective")] = None,
    attention: Annotated[str | None, Opt(help="eager | sdpa | flash")] = None,
    peft: Annotated[str | None, Opt(help="lora | qlora | dora")] = None,
    lora_rank: Annotated[int | None, Opt(help="adapter rank r")] = None,
    lora_alpha: Annotated[float | None, Opt(help="adapter alpha")] = None,
    lora_dropout: Annotated[float | None, Opt(help="adapter dropout (> 0 keeps a dropped copy of each adapted input)")] = None,
    target_modules: Annotated[str | None, Opt(help="comma-separated module names, or all-linear")] = None,
    quantization: Annotated[str | None, Opt(help="base-weight quantization: none | int8 | nf4 | nf4-dq | fp4 | gptq-4bit | awq-4bit | fp8")] = None,
    batch_size: Annotated[int | None, Opt(help="inference: sequences")] = None,
    prompt_len: Annotated[int | None, Opt(help="inference: prompt tokens")] = None,
    new_tokens: Annotated[int | None, Opt(help="inference: generated tokens")] = None,
    dtype: Annotated[str | None, Opt(help="inference/serve weights dtype: fp32 | fp16 | bf16")] = None,
    kv_cache_dtype: Annotated[str | None, Opt(help="auto | fp16 | bf16 | fp8 | int8")] = None,
    bnb_compute_dtype: Annotated[str | None, Opt(help="inference: bitsandbytes 4-bit compute dtype fp32 | fp16 | bf16 (transformers' default fp32; default here: --dtype)")] = None,
    max_model_len: Annotated[int | None, Opt(help="serve: max tokens per request")] = None,
    gpu_memory_utilization: Annotated[float | None, Opt(help="serve: fraction of memory vLLM may use")] = None,
    block_size: Annotated[int | None, Opt(help="serve: tokens per KV block")] = None,
    max_num_seqs: Annotated[int | None, Opt(help="serve: concurrent sequences")] = None,
    max_num_batched_tokens: Annotated[int | None, Opt(help="serve: tokens per scheduler step")] = None,
    vllm_version: Annotated[str | None, Opt(help="serve: vLLM behaviour modelled, 0.11 | 0.19")] = None,
    cuda_graphs: Annotated[bool | None, Opt(help="serve: vLLM captures CUDA graphs (--no-cuda-graphs = --enforce-eager)")] = None,
    bitsandbytes: Annotated[str | None, Opt(help="bitsandbytes version of the run, e.g. 0.41.1 (before 0.43.2 4-bit layers keep their input)")] = None,
    peft_version: Annotated[str | None, Opt(help="peft version of the run, e.g. 0.10.0 (before 0.12 adapters take the base weight's dtype)")] = None,
    transformers_version: Annotated[str | None, Opt(help="transformers version of the run, e.g. 4.46 (before 5 MoE experts are per-expert linears; generate before 4.42 keeps two caches, before 4.45 all prompt logits)")] = None,
    zero_stage: Annotated[int | None, Opt(help="DeepSpeed ZeRO stage 0-3")] = None,
    fsdp: Annotated[str | None, Opt(help="none | full_shard | shard_grad_op | hybrid_shard | no_shard")] = None,
    tp: Annotated[int | None, Opt(help="tensor-parallel degree")] = None,
    pp: Annotated[int | None, Opt(help="pipeline-parallel degree")] = None,
    cp: Annotated[int | None, Opt(help="context-parallel degree")] = None,
    ep: Annotated[int | None, Opt(help="expert-parallel degree")] = None,
    sequence_parallel: Annotated[bool | None, Opt(help="Megatron sequence parallelism with tp")] = None,
    offload: Annotated[str | None, Opt(help="none | optimizer | optimizer+params")] = None,
    offload_device: Annotated[str | None, Opt(help="cpu | nvme")] = None,
    engine: Annotated[str, Opt(help="analytic | trace (trace needs `pip install 'vramplan[trace]'`)")] = "analytic",
    as_json: Annotated[bool, Opt("--json", help="print the report as JSON")] = False,
) -> None:
    """Estimate per-GPU memory for a scenario file and/or flags."""
    from vramplan.analytic.engine import estimate as run_estimate
    from vramplan.spec.load import read_document

    try:
        base: dict[str, Any] = read_document(scenario) if scenario is not None else {}
        over: dict[str, Any] = {}
        eff_task = task or base.get("task", "train")
        section = {"train": "train", "inference": "inference", "serve": "serve"}.get(str(eff_task), "train")
        for path, value in [
            ("model", model), ("task", task), ("hardware.gpu", gpu), ("hardware.num_gpus", num_gpus),
            ("hardware.capacity_gib", capacity_gib), ("hardware.cuda_module_loading", cuda_module_loading),
            ("hardware.gpus_per_node", gpus_per_node),
            ("framework", framework),
            ("train.micro_batch_size", micro_batch_size), ("train.seq_len", seq_len),
            ("train.grad_accum_steps", grad_accum_steps), ("train.precision", precision),
            ("train.optimizer", optimizer), ("train.gradient_checkpointing", gradient_checkpointing),
            (f"{'inference' if section == 'inference' else 'train'}.attention", attention),
            ("train.peft.method", peft), ("train.peft.rank", lora_rank), ("train.peft.alpha", lora_alpha),
            ("train.peft.dropout", lora_dropout),
            ("train.peft.target_modules", None if target_modules is None else (
                "all-linear" if target_modules == "all-linear" else [x.strip() for x in target_modules.split(",")])),
            (f"{section}.quantization", quantization),
            ("inference.batch_size", batch_size), ("inference.prompt_len", prompt_len),
            ("inference.new_tokens", new_tokens), (f"{'serve' if section == 'serve' else 'inference'}.dtype", dtype),
            (f"{'serve' if section == 'serve' else 'inference'}.kv_cache_dtype", kv_cache_dtype),
            ("inference.bnb_compute_dtype", bnb_compute_dtype),
            ("serve.max_model_len", max_model_len), ("serve.gpu_memory_utilization", gpu_memory_utilization),
            ("serve.block_size", block_size), ("serve.max_num_seqs", max_num_seqs),
            ("serve.max_num_batched_tokens", max_num_batched_tokens), ("serve.vllm_version", vllm_version),
            ("serve.cuda_graphs", cuda_graphs), ("software.bitsandbytes", bitsandbytes),
            ("software.peft", peft_version), ("software.transformers", transformers_version),
            ("parallel.zero_stage", zero_stage),
            ("parallel.fsdp", fsdp), ("parallel.tp", tp), ("parallel.pp", pp), ("parallel.cp", cp),
            ("parallel.ep", ep), ("parallel.sequence_parallel", sequence_parallel), ("parallel.offload", offload),
            ("parallel.offload_device", offload_device),
        ]:
            _set(over, path, value)
        doc = _deep_merge(base, over)
        if "model" not in doc:
            raise ScenarioError([Problem(
                "model", "no model given", "pass a scenario file or --model")])
        if engine == "analytic":
            report = run_estimate(doc)
        elif engine == "trace":
            from vramplan.trace import estimate as trace_estimate

            report = trace_estimate(doc)
        else:
            raise ScenarioError([Problem(
                "--engine", f"unknown engine {engine!r}", "use --engine analytic or --engine trace")])
    except VramplanError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(json.dumps(report.to_json_dict(), indent=2) + "\n")
    else:
        from vramplan.cli.render import render_report

        render_report(report, out)
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
        err.print(f"no model matches {query!r}")
        raise typer.Exit(2)
    render_models(list(rows), out)


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
        err.print(f"no GPU matches {query!r}")
        raise typer.Exit(2)
    render_gpus(list(rows), out)


# Each feature area registers its own sub-commands from its own module, so that the
# CLI grows without one file holding every command.
from vramplan.cli import measure_cmd, plan_cmd, serve_cmd, snapshot_cmd, trace_cmd, validate_cmd

for _mod in (trace_cmd, serve_cmd, plan_cmd, measure_cmd, snapshot_cmd, validate_cmd):
    _mod.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
