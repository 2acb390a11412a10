"""torchtitan's job-config layouts as data: one frozen record per tagged release, read from its source at the tag
(pytorch/torchtitan; the torchtitan exporter writes the layout of ``software.torchtitan``, default the newest row).

What a row records, for the sections the export writes:

* ``sections``: each ``JobConfig`` section (dotted where it is nested, e.g. ``quantize.linear.float8``) and the
  fields of its dataclass.  From v0.2.0 torchtitan's ``ConfigManager._dict_to_dataclass`` raises ValueError on a
  TOML key no field has ("Invalid field names"); v0.1.0's ignores it silently.  Either way only these keys are
  written;
* ``float8_section`` / ``float8_converter`` and ``mx_section`` / ``mx_converter``: where torchao float8 and MXFP8
  training are configured and the name ``[model] converters`` lists (``register_model_converter``);
* ``mx_recipe_values``: the ``recipe_name`` values the MX section takes, as torchao recipe -> value (v0.1.0:
  ``Literal["mxfp8"]``, mapped to torchao's ``mxfp8_cublas`` by ``mx.py`` ``NAME_MAP``); None: any torchao
  ``MXLinearRecipeName``, passed to ``MXLinearConfig.from_recipe_name`` as it is (``recipe_name: str``);
* ``mx_kernel_key``: the key naming the dim1 cast kernel (``mxfp8_dim1_cast_kernel_choice``, "triton" / "cuda" /
  "torch"); None at v0.1.0, whose ``use_fp8_dim1_cast_triton_kernel`` (a bool: triton or torch) has no value for
  the CUDA kernel.  The converter sets either as an attribute of torchao's config, which torchao v0.14.1
  ``MXLinearConfig`` does not read (its field is ``mxfp8_cast_kernel_choice``): the recipe's kernel runs
  (facts/mx_training.py);
* ``checkpoint_enable`` and ``validation_enable``: the switch of ``[checkpoint]`` and of ``[validation]`` (None:
  the release has no ``[validation]``).

Rows (tag commits: v0.1.0 f7084fc, 2025-06-17; v0.2.0 29624e3, 2025-10-17; v0.2.1 81af883, 2025-12-26; v0.2.2
73a0e69, 2026-02-20).  v0.1.0 keeps ``[float8]`` / ``[mx]`` in ``torchtitan/config_manager.py``; v0.2.0 moves
``JobConfig`` to ``torchtitan/config/job_config.py`` and the converters under ``[quantize.linear]``, drops
``force_recompute_fp8_weight_in_bwd`` from float8, renames ``use_fp8_dim1_cast_triton_kernel`` to
``mxfp8_dim1_cast_kernel_choice``, ``enable_checkpoint`` to ``enable`` and adds ``[validation]``; v0.2.1 and
v0.2.2 keep that layout (they add fields the export does not write).  Between v0.1.0 and v0.2.0 the exporter
followed commit 000204a4 (``[float8]`` / ``[mx]`` with ``mxfp8_dim1_cast_kernel_choice``, ``[validation]
enabled``), no release's layout.  After v0.2.2 torchtitan's main branch (b5bcd76, 2026) replaced ``JobConfig``
by Python config classes (``torchtitan/config/configs.py``), no tagged release: not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.errors import suggest

__all__ = ["DEFAULT_RELEASE", "TORCHTITAN_RELEASES", "TorchtitanRelease", "torchtitan_release"]

_JOB_V01 = frozenset({"config_file", "description", "dump_folder", "print_args", "use_for_integration_test"})
_JOB_V020 = frozenset({"config_file", "custom_config_module", "description", "dump_folder", "print_config"})
_JOB_V021 = _JOB_V020 | {"save_config_file"}
_MODEL_V01 = frozenset({"converters", "flavor", "name", "print_after_conversion", "tokenizer_path"})
_MODEL_V02 = _MODEL_V01 | {"hf_assets_path"}
_OPTIMIZER = frozenset({"beta1", "beta2", "early_step_in_backward", "eps", "implementation", "lr", "name",
                        "weight_decay"})
_TRAINING_V01 = frozenset({"compile", "dataset", "dataset_path", "deterministic", "enable_cpu_offload", "gc_debug",
                           "gc_freq", "global_batch_size", "local_batch_size", "max_norm", "mixed_precision_param",
                           "mixed_precision_reduce", "seed", "seq_len", "steps"})
_TRAINING_V020 = _TRAINING_V01 - {"compile"} | {"debug_moe_force_load_balance", "dtype"}
_TRAINING_V021 = _TRAINING_V020 - {"debug_moe_force_load_balance", "deterministic", "seed"} | {"dataloader"}
_PAR_V01 = frozenset({
    "context_parallel_degree", "context_parallel_rotate_method", "data_parallel_replicate_degree",
    "data_parallel_shard_degree", "disable_loss_parallel", "enable_async_tensor_parallel", "enable_compiled_autograd",
    "fsdp_reshard_after_forward", "pipeline_parallel_degree", "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_microbatch_size", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
    "pipeline_parallel_split_points", "tensor_parallel_degree"})
_PAR_V020 = _PAR_V01 - {"pipeline_parallel_split_points"} | {
    "expert_parallel_degree", "expert_tensor_parallel_degree", "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"}
_PAR_V021 = _PAR_V020 - {"enable_compiled_autograd"} | {"expert_parallel_comm_backend",
                                                         "pipeline_parallel_expert_parallel_overlap"}
_PAR_V022 = _PAR_V021 | {"context_parallel_load_balancer"}
_AC_V01 = frozenset({"mode", "selective_ac_option"})
_AC_V020 = _AC_V01 | {"early_stop", "memory_budget", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                      "visualize_memory_budget_pareto"}
_AC_V021 = _AC_V020 | {"debug", "determinism_check", "preserve_rng_state"}
_CKPT_V01 = frozenset({"async_mode", "create_seed_checkpoint", "enable_checkpoint", "exclude_from_loading",
                       "export_dtype", "folder", "initial_load_model_weights_only", "initial_load_path", "interval",
                       "keep_latest_k", "last_save_model_weights_only", "load_step"})
_CKPT_V02 = frozenset({"async_mode", "create_seed_checkpoint", "enable", "enable_first_step_checkpoint",
                       "enable_ft_dataloader_checkpoints", "exclude_from_loading", "export_dtype", "folder",
                       "initial_load_in_hf", "initial_load_in_hf_quantized", "initial_load_model_only",
                       "initial_load_path", "interval", "keep_latest_k", "last_save_in_hf", "last_save_model_only",
                       "load_only", "load_step"})
_VAL_V020 = frozenset({"dataset", "dataset_path", "enable", "freq", "local_batch_size", "seq_len", "steps"})
_VAL_V021 = _VAL_V020 | {"dataloader"}
_FLOAT8_V01 = frozenset({"emulate", "enable_fsdp_float8_all_gather", "filter_fqns",
                         "force_recompute_fp8_weight_in_bwd", "precompute_float8_dynamic_scale_for_fsdp",
                         "recipe_name"})
_FLOAT8_V02 = _FLOAT8_V01 - {"force_recompute_fp8_weight_in_bwd"}
_MX_V01 = frozenset({"filter_fqns", "recipe_name", "use_fp8_dim1_cast_triton_kernel"})
_MX_V02 = frozenset({"filter_fqns", "mxfp8_dim1_cast_kernel_choice", "recipe_name"})


@dataclass(frozen=True, kw_only=True)
class TorchtitanRelease:
    """One tagged torchtitan release's job-config layout (module docstring)."""

    release: str
    commit: str  # the tag's commit
    config_file: str  # where JobConfig is defined
    sections: dict[str, frozenset[str]]
    float8_section: str
    float8_converter: str
    mx_section: str
    mx_converter: str
    mx_recipe_values: dict[str, str] | None
    mx_kernel_key: str | None
    checkpoint_enable: str
    validation_enable: str | None
    source: str


def _v02(release: str, commit: str, job: frozenset[str], training: frozenset[str], par: frozenset[str],
         ac: frozenset[str], val: frozenset[str], source: str) -> TorchtitanRelease:
    return TorchtitanRelease(
        release=release, commit=commit, config_file="torchtitan/config/job_config.py",
        sections={"job": job, "model": _MODEL_V02, "optimizer": _OPTIMIZER, "training": training,
                  "parallelism": par, "activation_checkpoint": ac, "checkpoint": _CKPT_V02, "validation": val,
                  "quantize.linear.float8": _FLOAT8_V02, "quantize.linear.mx": _MX_V02},
        float8_section="quantize.linear.float8", float8_converter="quantize.linear.float8",
        mx_section="quantize.linear.mx", mx_converter="quantize.linear.mx", mx_recipe_values=None,
        mx_kernel_key="mxfp8_dim1_cast_kernel_choice", checkpoint_enable="enable", validation_enable="enable",
        source=source)


TORCHTITAN_RELEASES: tuple[TorchtitanRelease, ...] = (
    TorchtitanRelease(
        release="0.1.0", commit="f7084fc78567f865d0c411f2c7b9bbbef6b155ac", config_file="torchtitan/config_manager.py",
        sections={"job": _JOB_V01, "model": _MODEL_V01, "optimizer": _OPTIMIZER, "training": _TRAINING_V01,
                  "parallelism": _PAR_V01, "activation_checkpoint": _AC_V01, "checkpoint": _CKPT_V01,
                  "float8": _FLOAT8_V01, "mx": _MX_V01},
        float8_section="float8", float8_converter="float8", mx_section="mx", mx_converter="mx",
        mx_recipe_values={"mxfp8_cublas": "mxfp8"}, mx_kernel_key=None, checkpoint_enable="enable_checkpoint",
        validation_enable=None,
        source="config_manager.py: JobConfig :646 (float8 :663, mx :664, no validation), Job :34, Model :96, "
               "Optimizer :122, Training :189, Parallelism :257, Checkpoint :368 (enable_checkpoint :369), "
               "ActivationCheckpoint :464, Float8 :476, MX :510 (use_fp8_dim1_cast_triton_kernel :511, recipe_name "
               "Literal['mxfp8'] :514); components/quantization/float8.py:131 register_model_converter("
               "Float8Converter, 'float8'); mx.py:26 NAME_MAP {'mxfp8': 'mxfp8_cublas'}, mx.py:96 "
               "register_model_converter(MXConverter, 'mx')"),
    _v02("0.2.0", "29624e37fa6dd319fd671b009338651b5c665da2", _JOB_V020, _TRAINING_V020, _PAR_V020, _AC_V020,
         _VAL_V020,
         "config/job_config.py: Job :12, Model :91, Optimizer :125, Training :192, Parallelism :267, Checkpoint :423 "
         "(enable :424), ActivationCheckpoint :587, Float8Linear :649, MXLinear :685 (mxfp8_dim1_cast_kernel_choice "
         ":686, recipe_name: str :695), QuantizedLinear :730, Quantize :748, Validation :852 (enable :853), "
         "JobConfig :884 (quantize :902); components/quantization/float8.py:237 register_model_converter("
         "Float8LinearConverter, 'quantize.linear.float8'); mx.py:171 register_model_converter(MXLinearConverter, "
         "'quantize.linear.mx'); config/manager.py _dict_to_dataclass raises on unknown fields"),
    _v02("0.2.1", "81af8833ddeff9b5f1874dc7e20594aa17da6b86", _JOB_V021, _TRAINING_V021, _PAR_V021, _AC_V021,
         _VAL_V021,
         "config/job_config.py: Job :18, Model :100, Optimizer :134, Training :235, Parallelism :304, Checkpoint :464, "
         "ActivationCheckpoint :628, Float8Linear :708, MXLinear :744 (mxfp8_dim1_cast_kernel_choice :745), "
         "QuantizedLinear :789, Quantize :807, Validation :927, JobConfig :977; components/quantization/"
         "float8.py:238 'quantize.linear.float8'; mx.py:176 'quantize.linear.mx'"),
    _v02("0.2.2", "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce", _JOB_V021, _TRAINING_V021, _PAR_V022, _AC_V021,
         _VAL_V021,
         "config/job_config.py: Job :18, Model :100, Optimizer :134, Training :243, Parallelism :312, Checkpoint :487, "
         "ActivationCheckpoint :651, Float8Linear :731, MXLinear :767 (mxfp8_dim1_cast_kernel_choice :768), "
         "QuantizedLinear :812, Quantize :830, Validation :950, JobConfig :1000; components/quantization/"
         "float8.py:238 'quantize.linear.float8'; mx.py:171 'quantize.linear.mx'"),
)

# the newest release read: what the export writes when software.torchtitan is unset
DEFAULT_RELEASE = TORCHTITAN_RELEASES[-1].release


def _normal(release: str) -> str:
    """``0.2`` -> ``0.2.0``: a release named by fewer parts is its .0 release."""
    parts = release.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts))) if len(parts) < 3 else release


def torchtitan_release(release: str | None) -> TorchtitanRelease:
    """The row of ``release`` (None: ``DEFAULT_RELEASE``); ValueError naming the releases read otherwise."""
    want = DEFAULT_RELEASE if release is None else _normal(release)
    for row in TORCHTITAN_RELEASES:
        if row.release == want:
            return row
    known = [r.release for r in TORCHTITAN_RELEASES]
    close = suggest(want, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ValueError(f"torchtitan {release} has no job-config layout read{hint}; the releases read: "
                     f"{', '.join(known)}")
