"""A torchtitan job-config TOML fragment for a torchtitan (FSDP2 + TP + PP) or FSDP setup.

Sections and keys are those of torchtitan's ``JobConfig`` dataclasses (pytorch/torchtitan
``torchtitan/config/job_config.py``, commit 000204a4a8bf3d0f31adc44fc29855fbb6ea13d8): ``[model]``
name/flavor, ``[optimizer]`` name/implementation, ``[training]`` local_batch_size,
global_batch_size, seq_len, enable_cpu_offload, mixed_precision_param/reduce, ``[parallelism]``
data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward,
tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule (the row of
facts/pipeline_schedules.py), pipeline_parallel_layers_per_stage (virtual stages other than 2),
pipeline_parallel_microbatch_size, context_parallel_degree, ``[activation_checkpoint]`` mode,
``[checkpoint]`` enable_checkpoint, ``[validation]`` enabled/local_batch_size/seq_len/steps; with
``precision: fp8-torchao`` ``[model]`` converters = ["float8"] and ``[float8]`` (``Float8``: recipe_name,
enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp, force_recompute_fp8_weight_in_bwd,
filter_fqns); with ``precision: mxfp8-torchao`` ``[model]`` converters = ["mx"] and ``[mx]`` (``MX``: recipe_name,
mxfp8_dim1_cast_kernel_choice, filter_fqns).
``JOB_CONFIG_KEYS`` lists them for the tests (torchtitan itself is not a dependency).

Batch semantics: ``local_batch_size`` is per data-parallel rank per optimizer step; without
pipelining torchtitan accumulates ``global / (local x dp)`` micro-batches, so local = micro-batch;
with pipelining the local batch is split into ``local / pipeline_parallel_microbatch_size``
pipeline micro-batches, so local = micro-batch x accumulation.
"""

from __future__ import annotations

from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.facts.optimizers import optimizer_facts
from vramplan.facts.pipeline_schedules import pipeline_schedule
from vramplan.plan.setup import TrainSetup
from vramplan.spec.families import torchtitan_model

__all__ = ["JOB_CONFIG_KEYS", "to_toml", "torchtitan_config"]

JOB_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "job": frozenset({"config_file", "dump_folder", "description", "use_for_integration_test", "print_args"}),
    "model": frozenset({"name", "flavor", "tokenizer_path", "converters", "print_after_conversion"}),
    "optimizer": frozenset({"name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
                            "early_step_in_backward"}),
    "training": frozenset({"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                           "max_norm", "steps", "enable_cpu_offload", "mixed_precision_param",
                           "mixed_precision_reduce", "compile", "gc_freq", "gc_debug", "seed", "deterministic"}),
    "parallelism": frozenset({
        "data_parallel_replicate_degree", "enable_compiled_autograd", "data_parallel_shard_degree",
        "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel",
        "enable_async_tensor_parallel", "pipeline_parallel_degree", "pipeline_parallel_split_points",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatch_size", "context_parallel_degree", "context_parallel_rotate_method",
        "expert_parallel_degree"}),
    "activation_checkpoint": frozenset({"mode", "selective_ac_option",
                                        "per_op_sac_force_recompute_mm_shapes_by_fqns"}),
    "checkpoint": frozenset({"enable_checkpoint", "folder", "initial_load_path", "initial_load_model_only", "interval",
                             "last_save_model_only", "export_dtype", "create_seed_checkpoint", "async_mode",
                             "keep_latest_k", "load_step", "exclude_from_loading", "enable_first_step_checkpoint",
                             "last_save_in_hf"}),
    "validation": frozenset({"enabled", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq", "steps"}),
    "float8": frozenset({"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                         "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate",
                         "moe_fqns_prototype"}),
    "mx": frozenset({"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"}),
}

# torchtitan's own model names and flavors for the catalog models it ships (llama3 "8B"/"70B"/"405B")
_LLAMA3_FLAVORS = {(32, 4096): "8B", (80, 8192): "70B", (126, 16384): "405B"}


def _model_section(family: str, layers: int, hidden: int) -> dict[str, Any]:
    # the family's torchtitan model, where torchtitan ships it (its adapter names it: Llama -> llama3)
    if torchtitan_model(family) == "llama3" and (layers, hidden) in _LLAMA3_FLAVORS:
        return {"name": "llama3", "flavor": _LLAMA3_FLAVORS[(layers, hidden)]}
    return {"name": family, "flavor": f"{layers}L-{hidden}h"}


def torchtitan_config(s: TrainSetup, family: str, layers: int, hidden: int,
                      lifecycle: ResolvedLifecycle | None = None) -> dict[str, dict[str, Any]]:
    """torchtitan's job config for ``s``; ``family``: the model's config.json family (``ModelSpec.family``);
    ``lifecycle``: the evaluation and checkpoint settings the estimate took (``_lifecycle_sections``)."""
    if s.framework not in ("torchtitan", "accelerate") or s.peft is not None or s.fsdp == "shard_grad_op":
        raise ValueError("torchtitan runs full fine-tuning with FSDP (full_shard), TP and PP")
    titan_optim = optimizer_facts(s.optimizer).torchtitan
    if titan_optim is None:
        raise ValueError(f"optimizer {s.optimizer!r} has no torchtitan [optimizer] name (facts/optimizers.py)")
    local = s.micro_batch_size * s.grad_accum_steps if s.pp > 1 else s.micro_batch_size
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": s.dp,
        "fsdp_reshard_after_forward": "default", "tensor_parallel_degree": s.tp,
        "pipeline_parallel_degree": s.pp, "context_parallel_degree": 1,
    }
    if s.pp > 1:
        par.update(_pipeline_keys(s, layers))
    model = _model_section(family, layers, hidden)
    if s.precision == "fp8-torchao":
        model["converters"] = ["float8"]
    if s.precision == "mxfp8-torchao":
        model["converters"] = ["mx"]
    return {
        "job": {"description": f"vramplan plan: {s.label()}"},
        "model": model,
        "optimizer": {"name": titan_optim[0], "implementation": titan_optim[1]},
        "training": {"local_batch_size": local, "global_batch_size": s.global_batch, "seq_len": s.seq_len,
                     "max_norm": 1.0, "enable_cpu_offload": s.offload != "none",
                     "mixed_precision_param": "float32" if s.precision == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32"},
        "parallelism": par,
        "activation_checkpoint": {"mode": "full" if s.checkpointing == "full" else "none"},
        **_lifecycle_sections(s, lifecycle or resolve_lifecycle(s)),
        **_float8_section(s),
        **_mx_section(s),
    }


def _float8_section(s: TrainSetup) -> dict[str, dict[str, Any]]:
    """``[float8]`` for ``precision: fp8-torchao``.  At the cited commit ``Float8Converter`` builds
    ``Float8LinearConfig()`` (tensorwise) when ``recipe_name`` is unset and asserts that a ``recipe_name`` comes
    without ``enable_fsdp_float8_all_gather`` and ``force_recompute_fp8_weight_in_bwd``: tensorwise is written as
    no ``recipe_name``.  ``filter_fqns`` = ["output"] unless the head is converted (its Llama 3 configs' value)."""
    if s.precision != "fp8-torchao":
        return {}
    f8 = s.train.float8
    head = f8.convert_lm_head if f8.convert_lm_head is not None else s.framework != "torchtitan"
    out: dict[str, Any] = {"filter_fqns": [] if head else ["output"]}
    if f8.recipe_name == "tensorwise":
        out.update(enable_fsdp_float8_all_gather=f8.enable_fsdp_float8_all_gather,
                   precompute_float8_dynamic_scale_for_fsdp=f8.precompute_float8_dynamic_scale_for_fsdp,
                   force_recompute_fp8_weight_in_bwd=f8.force_recompute_fp8_weight_in_bwd)
    else:
        out["recipe_name"] = f8.recipe_name
    return {"float8": out}


def _mx_section(s: TrainSetup) -> dict[str, dict[str, Any]]:
    """``[mx]`` for ``precision: mxfp8-torchao``.  At the cited commit ``MXConverter`` maps ``recipe_name`` "mxfp8"
    (its only value) to torchao's mxfp8_cublas (``NAME_MAP``) and sets the dim1 cast kernel from
    ``mxfp8_dim1_cast_kernel_choice`` (default "triton"): "cuda" is written, the kernel of mxfp8_cublas as the
    estimate models it.  mxfp8_cublas_rceil and mxfp8_emulated have no ``[mx]`` value there (torchtitan f7a56e60 on,
    ``[quantize.linear.mx]``, takes any torchao recipe name): refused.  ``filter_fqns`` = ["output"] unless the head
    is converted (the section's default)."""
    if s.precision != "mxfp8-torchao":
        return {}
    mx = s.train.mx
    if mx.recipe_name != "mxfp8_cublas":
        raise ScenarioError([Problem("train.mx.recipe_name", f"torchtitan's [mx] section (commit 000204a4) offers "
                                     f"recipe_name mxfp8 (torchao mxfp8_cublas) only, not {mx.recipe_name}",
                                     "set train.mx.recipe_name: mxfp8_cublas to export")])
    return {"mx": {"recipe_name": "mxfp8", "mxfp8_dim1_cast_kernel_choice": "cuda",
                   "filter_fqns": [] if mx.convert_lm_head else ["output"]}}


def _pipeline_keys(s: TrainSetup, layers: int) -> dict[str, Any]:
    """``pipeline_parallel_schedule`` (the schedule row's name for torch's ``get_schedule_class``, which reads it
    case-insensitively), ``pipeline_parallel_microbatch_size`` and, for v model chunks per rank other than the
    multi-stage default of 2, ``pipeline_parallel_layers_per_stage``.

    torchtitan counts the embedding and the head as one layer each (``pipeline_parallel_first_stage_less_layers``
    and ``..._last_stage_less_layers``, default 1): at the cited commit ``distributed/pipeline.py``
    ``generate_split_points`` needs (layers + 2) divisible by pp and gives ((layers + 2) / pp) / layers_per_stage
    stages per rank; at b5bcd76 ``distributed/pipeline_parallel.py`` makes ceil((layers + 2) / layers_per_stage)
    stages.  layers_per_stage = (layers + 2) / (pp x v) gives v on both; without the key a multi-stage schedule
    runs 2 per rank.  Examples: 30 layers, pp 2, v 4: 32 / 8 = 4 layers per stage; 32 layers, pp 2, v 4: 34 / 8 is
    not whole, refused."""
    par = s.parallel
    row, v = pipeline_schedule(par.pp_schedule), par.pp_virtual_stages
    out: dict[str, Any] = {"pipeline_parallel_schedule": row.torchtitan,
                           "pipeline_parallel_microbatch_size": s.micro_batch_size}
    if not row.multi_stage or v == 2:
        return out
    effective, chunks = layers + 2, s.pp * v
    if effective % chunks:
        raise ValueError(f"torchtitan cannot split {layers} layers (+ embedding and head, {effective}) into {chunks} "
                         f"even chunks: no pipeline_parallel_layers_per_stage gives {v} chunks per rank")
    out["pipeline_parallel_layers_per_stage"] = effective // chunks
    return out


def _lifecycle_sections(s: TrainSetup, lc: ResolvedLifecycle) -> dict[str, dict[str, Any]]:
    """``[checkpoint] enable_checkpoint`` (off by default in torchtitan; its saves are torch DCP, each rank its
    shard: the estimate's sharded save) and ``[validation]`` ``enabled``, ``local_batch_size`` (the evaluation
    batch), ``seq_len`` and ``steps`` (batches per evaluation), as that commit's ``Checkpoint`` and
    ``Validation`` dataclasses name them."""
    out: dict[str, dict[str, Any]] = {"checkpoint": {"enable_checkpoint": lc.checkpoint_save}}
    out["validation"] = {"enabled": lc.evaluation}
    if lc.evaluation:
        out["validation"].update({"local_batch_size": lc.eval_batch_size, "seq_len": s.seq_len,
                                  "steps": lc.eval_batches})
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(doc: dict[str, dict[str, Any]], header: str = "") -> str:
    """Tables of scalars and lists as TOML (what ``tomllib`` reads back unchanged)."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    for section, table in doc.items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        for key, value in table.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
