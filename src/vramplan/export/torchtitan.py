"""A torchtitan job-config TOML fragment for a torchtitan (FSDP2 + TP + PP) or FSDP setup.

Sections and keys are those of the ``JobConfig`` dataclasses of the torchtitan release ``software.torchtitan`` names
(facts/torchtitan_releases.py: one row per tagged release read, v0.1.0 to v0.2.2; unset: the newest, v0.2.2; any
other release is refused with the list): ``[model]`` name/flavor, ``[optimizer]`` name/implementation,
``[training]`` local_batch_size, global_batch_size, seq_len, enable_cpu_offload, mixed_precision_param/reduce,
``[parallelism]`` data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward,
tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule (the row of
facts/pipeline_schedules.py), pipeline_parallel_layers_per_stage (virtual stages other than 2),
pipeline_parallel_microbatch_size, context_parallel_degree, ``[activation_checkpoint]`` mode, ``[checkpoint]``
enable (v0.1.0: enable_checkpoint), ``[validation]`` enable/local_batch_size/seq_len/steps (v0.2.0 on; v0.1.0 has
no such section); with ``precision: fp8-torchao`` ``[model]`` converters = [the release's float8 converter] and
its float8 section (v0.2.x ``[quantize.linear.float8]``, ``Float8Linear``; v0.1.0 ``[float8]``, ``Float8``); with
``precision: mxfp8-torchao`` converters = [the MX converter] and its MX section (v0.2.x ``[quantize.linear.mx]``,
``MXLinear``; v0.1.0 ``[mx]``, ``MX``).  ``JOB_CONFIG_KEYS`` (the default release's) and the rows' ``sections``
list the keys for the tests (torchtitan itself is not a dependency); ``job_config_tables`` walks a config's tables.

Batch semantics: ``local_batch_size`` is per data-parallel rank per optimizer step; without
pipelining torchtitan accumulates ``global / (local x dp)`` micro-batches, so local = micro-batch;
with pipelining the local batch is split into ``local / pipeline_parallel_microbatch_size``
pipeline micro-batches, so local = micro-batch x accumulation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.facts.mx_training import mx_recipe
from vramplan.facts.optimizers import optimizer_facts
from vramplan.facts.pipeline_schedules import pipeline_schedule
from vramplan.facts.torchtitan_releases import TorchtitanRelease, torchtitan_release
from vramplan.plan.setup import TrainSetup
from vramplan.spec.families import torchtitan_model

__all__ = ["JOB_CONFIG_KEYS", "job_config_tables", "release_of", "to_toml", "torchtitan_config"]

# the default release's sections and keys (facts/torchtitan_releases.py)
JOB_CONFIG_KEYS: dict[str, frozenset[str]] = torchtitan_release(None).sections

# torchtitan's own model names and flavors for the catalog models it ships (llama3 "8B"/"70B"/"405B")
_LLAMA3_FLAVORS = {(32, 4096): "8B", (80, 8192): "70B", (126, 16384): "405B"}


def _model_section(family: str, layers: int, hidden: int) -> dict[str, Any]:
    # the family's torchtitan model, where torchtitan ships it (its adapter names it: Llama -> llama3)
    if torchtitan_model(family) == "llama3" and (layers, hidden) in _LLAMA3_FLAVORS:
        return {"name": "llama3", "flavor": _LLAMA3_FLAVORS[(layers, hidden)]}
    return {"name": family, "flavor": f"{layers}L-{hidden}h"}


def release_of(release: str | None) -> TorchtitanRelease:
    """The layout ``software.torchtitan`` names (None: the newest read); a release not read is refused."""
    try:
        return torchtitan_release(release)
    except ValueError as exc:
        raise ScenarioError([Problem("software.torchtitan", str(exc), "set software.torchtitan to one of them, or "
                                     f"leave it out for {torchtitan_release(None).release}")]) from exc


def torchtitan_config(s: TrainSetup, family: str, layers: int, hidden: int,
                      lifecycle: ResolvedLifecycle | None = None, release: str | None = None) -> dict[str, Any]:
    """torchtitan's job config for ``s``; ``family``: the model's config.json family (``ModelSpec.family``);
    ``lifecycle``: the evaluation and checkpoint settings the estimate took (``_lifecycle_sections``);
    ``release``: the torchtitan release whose layout is written (``software.torchtitan``; None: the newest read).
    Nested sections (``quantize.linear.float8``) are nested tables, as ``tomllib`` reads them back."""
    if s.framework not in ("torchtitan", "accelerate") or s.peft is not None or s.fsdp == "shard_grad_op":
        raise ValueError("torchtitan runs full fine-tuning with FSDP (full_shard), TP and PP")
    rel = release_of(release)
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
        model["converters"] = [rel.float8_converter]
    if s.precision == "mxfp8-torchao":
        model["converters"] = [rel.mx_converter]
    flat = {
        "job": {"description": f"vramplan plan: {s.label()}"},
        "model": model,
        "optimizer": {"name": titan_optim[0], "implementation": titan_optim[1]},
        "training": {"local_batch_size": local, "global_batch_size": s.global_batch, "seq_len": s.seq_len,
                     "max_norm": 1.0, "enable_cpu_offload": s.offload != "none",
                     "mixed_precision_param": "float32" if s.precision == "fp32" else "bfloat16",
                     "mixed_precision_reduce": "float32"},
        "parallelism": par,
        "activation_checkpoint": {"mode": "full" if s.checkpointing == "full" else "none"},
        **_lifecycle_sections(s, lifecycle or resolve_lifecycle(s), rel),
        **_float8_section(s, rel),
        **_mx_section(s, rel),
    }
    out: dict[str, Any] = {}
    for section, table in flat.items():
        *parents, leaf = section.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = table
    return out


def job_config_tables(doc: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted section, its keys that are not tables) for each table of a job config, e.g.
    ``("quantize.linear.float8", {...})``; a table holding only tables (``quantize``) is not listed."""
    for name, table in doc.items():
        section = prefix + name
        leaves = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if leaves or not table:
            yield section, leaves
        yield from job_config_tables({k: v for k, v in table.items() if isinstance(v, dict)}, section + ".")


def _float8_section(s: TrainSetup, rel: TorchtitanRelease) -> dict[str, dict[str, Any]]:
    """The release's float8 section for ``precision: fp8-torchao``.  ``Float8Converter`` (v0.1.0) and
    ``Float8LinearConverter`` (v0.2.x) build ``Float8LinearConfig()`` (tensorwise) when ``recipe_name`` is unset and
    assert that a ``recipe_name`` comes without ``enable_fsdp_float8_all_gather`` (and, v0.1.0,
    ``force_recompute_fp8_weight_in_bwd``): tensorwise is written as no ``recipe_name``.  v0.2.x has no
    ``force_recompute_fp8_weight_in_bwd`` (``Float8Linear``): set true, it is refused there (it has no effect in
    torchao, scenario.py ``Float8Training``).  ``filter_fqns`` = ["output"] unless the head is converted (its Llama 3
    configs' value)."""
    if s.precision != "fp8-torchao":
        return {}
    f8 = s.train.float8
    head = f8.convert_lm_head if f8.convert_lm_head is not None else s.framework != "torchtitan"
    out: dict[str, Any] = {"filter_fqns": [] if head else ["output"]}
    keys = rel.sections[rel.float8_section]
    recompute = "force_recompute_fp8_weight_in_bwd"
    if f8.force_recompute_fp8_weight_in_bwd and recompute not in keys:
        raise ScenarioError([Problem("train.float8.force_recompute_fp8_weight_in_bwd", f"torchtitan {rel.release}'s "
                                     f"[{rel.float8_section}] has no {recompute} ({rel.config_file} Float8Linear)",
                                     "drop it (torchao ignores it: it adds nothing to the estimate), or set "
                                     "software.torchtitan: 0.1.0")])
    if f8.recipe_name == "tensorwise":
        out.update(enable_fsdp_float8_all_gather=f8.enable_fsdp_float8_all_gather,
                   precompute_float8_dynamic_scale_for_fsdp=f8.precompute_float8_dynamic_scale_for_fsdp)
        if recompute in keys:
            out[recompute] = f8.force_recompute_fp8_weight_in_bwd
    else:
        out["recipe_name"] = f8.recipe_name
    return {rel.float8_section: out}


def _mx_section(s: TrainSetup, rel: TorchtitanRelease) -> dict[str, dict[str, Any]]:
    """The release's MX section for ``precision: mxfp8-torchao``.  v0.2.x ``MXLinearConverter`` passes
    ``recipe_name`` to torchao's ``MXLinearConfig.from_recipe_name`` as it is (every ``train.mx.recipe_name``);
    v0.1.0 ``MXConverter`` maps "mxfp8", its only value, to mxfp8_cublas (``NAME_MAP``): mxfp8_cublas_rceil and
    mxfp8_emulated are refused there.  v0.2.x's ``mxfp8_dim1_cast_kernel_choice`` is written as the recipe's dim1
    kernel ("cuda"; "torch" for mxfp8_emulated), the kernel the estimate models (the converter sets it as an
    attribute torchao v0.14.1 does not read, facts/mx_training.py); v0.1.0's ``use_fp8_dim1_cast_triton_kernel``
    (triton or torch) has no value for the CUDA kernel and is left out (likewise not read).  ``filter_fqns`` =
    ["output"] unless the head is converted (the section's default)."""
    if s.precision != "mxfp8-torchao":
        return {}
    mx = s.train.mx
    values = rel.mx_recipe_values
    if values is not None and mx.recipe_name not in values:
        offered = ", ".join(f"{v} (torchao {k})" for k, v in values.items())
        raise ScenarioError([Problem("train.mx.recipe_name", f"torchtitan {rel.release}'s [{rel.mx_section}] "
                                     f"recipe_name offers {offered} only, not {mx.recipe_name}",
                                     f"set train.mx.recipe_name: {next(iter(values))} to export, or "
                                     "software.torchtitan: 0.2.0 or later")])
    out: dict[str, Any] = {"recipe_name": mx.recipe_name if values is None else values[mx.recipe_name]}
    if rel.mx_kernel_key is not None:
        out[rel.mx_kernel_key] = mx_recipe(mx.recipe_name).dim1_cast
    out["filter_fqns"] = [] if mx.convert_lm_head else ["output"]
    return {rel.mx_section: out}


def _pipeline_keys(s: TrainSetup, layers: int) -> dict[str, Any]:
    """``pipeline_parallel_schedule`` (the schedule row's name for torch's ``get_schedule_class``, which reads it
    case-insensitively), ``pipeline_parallel_microbatch_size`` and, for v model chunks per rank other than the
    multi-stage default of 2, ``pipeline_parallel_layers_per_stage``.

    torchtitan counts the embedding and the head as one layer each (``pipeline_parallel_first_stage_less_layers``
    and ``..._last_stage_less_layers``, default 1): at v0.1.0 ``distributed/pipeline.py``
    ``generate_split_points`` needs (layers + 2) divisible by pp and gives ((layers + 2) / pp) / layers_per_stage
    stages per rank; from v0.2.0 (and at b5bcd76) ``distributed/pipeline_parallel.py`` makes
    ceil((layers + 2) / layers_per_stage) stages.  layers_per_stage = (layers + 2) / (pp x v) gives v on both; without the key a multi-stage schedule
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


def _lifecycle_sections(s: TrainSetup, lc: ResolvedLifecycle, rel: TorchtitanRelease) -> dict[str, dict[str, Any]]:
    """``[checkpoint]`` enable (v0.1.0: enable_checkpoint; off by default in torchtitan; its saves are torch DCP,
    each rank its shard: the estimate's sharded save) and ``[validation]`` ``enable``, ``local_batch_size`` (the
    evaluation batch), ``seq_len`` and ``steps`` (batches per evaluation), as the release's ``Checkpoint`` and
    ``Validation`` dataclasses name them.  v0.1.0 has no ``[validation]``: no section without evaluation, a
    refusal with it."""
    out: dict[str, dict[str, Any]] = {"checkpoint": {rel.checkpoint_enable: lc.checkpoint_save}}
    if rel.validation_enable is None:
        if lc.evaluation:
            raise ScenarioError([Problem("software.torchtitan", f"torchtitan {rel.release}'s job config has no "
                                         f"[validation] section ({rel.config_file} JobConfig): the evaluation the "
                                         "estimate takes cannot be set", "set software.torchtitan: 0.2.0 or later, "
                                         "or lifecycle.evaluation: false")])
        return out
    out["validation"] = {rel.validation_enable: lc.evaluation}
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


def to_toml(doc: dict[str, Any], header: str = "") -> str:
    """Tables of scalars and lists, nested tables as dotted headers (``[quantize.linear.float8]``), as TOML (what
    ``tomllib`` reads back unchanged)."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    for section, table in job_config_tables(doc):
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        for key, value in table.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
