"""DeepSpeed ZeRO's bucket and live-parameter settings: the scenario's ``parallel.deepspeed`` with each null field
resolved to the framework's default.

Defaults, by the library that writes the ``zero_optimization`` section:

* framework deepspeed (a hand-written config): DeepSpeed's own (deepspeed 0.19.8 runtime/zero/config.py
  ``DeepSpeedZeroConfig``): reduce_bucket_size 5e8, allgather_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
  stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9, stage3_param_persistence_threshold 1e5,
  contiguous_gradients true, overlap_comm true at stage 3 and false below (``overlap_comm_valid``).
* hf-trainer and accelerate: the "auto" entries of the Hugging Face example configs, filled from the model's
  hidden size h (transformers integrations/deepspeed.py ``HfTrainerDeepSpeedConfig.trainer_config_finalize``,
  accelerate accelerator.py ``Accelerator._prepare_deepspeed``): reduce_bucket_size h^2,
  stage3_prefetch_bucket_size int(0.9 h^2), stage3_param_persistence_threshold 10 h; the other keys DeepSpeed's.
  accelerate's ``DeepSpeedPlugin`` without a config file writes no bucket key (accelerate 1.15
  utils/dataclasses.py ``DeepSpeedPlugin.__post_init__``): DeepSpeed's defaults then, which
  ``parallel.deepspeed`` states.
* lightning: ``DeepSpeedStrategy.__init__``'s (lightning/pytorch/strategies/deepspeed.py): reduce and allgather
  buckets 2e8, contiguous_gradients and overlap_comm true; the stage-3 keys DeepSpeed's.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.spec.scenario import DeepSpeedZero, Scenario

__all__ = ["ZeroSettings", "deepspeed_assumptions", "deepspeed_zero", "zero_settings"]


@dataclass(frozen=True)
class ZeroSettings:
    """The resolved ``zero_optimization`` settings (elements, not bytes) and whose defaults filled the nulls."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    max_live_parameters: int
    max_reuse_distance: int
    param_persistence_threshold: int
    contiguous_gradients: bool
    overlap_comm: bool
    defaults: str  # "deepspeed", "hf-auto" or "lightning"


def deepspeed_zero(s: Scenario) -> bool:
    """DeepSpeed's ZeRO runs the step: a ZeRO stage without PyTorch FSDP."""
    return s.parallel.zero_stage > 0 and s.parallel.fsdp == "none"


def zero_settings(s: Scenario, hidden: int) -> ZeroSettings:
    """``parallel.deepspeed`` with each null field resolved to the framework's default (module docstring)."""
    given = s.parallel.deepspeed or DeepSpeedZero()
    fw = s.effective_framework
    stage3 = s.parallel.zero_stage == 3
    if fw in ("hf-trainer", "accelerate"):
        defaults, reduce, allgather, prefetch, persist = "hf-auto", hidden * hidden, 500_000_000, \
            int(0.9 * hidden * hidden), 10 * hidden
        overlap = stage3
    elif fw == "lightning":
        defaults, reduce, allgather, prefetch, persist = "lightning", 200_000_000, 200_000_000, 50_000_000, 100_000
        overlap = True
    else:
        defaults, reduce, allgather, prefetch, persist = "deepspeed", 500_000_000, 500_000_000, 50_000_000, 100_000
        overlap = stage3

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return ZeroSettings(
        reduce_bucket_size=pick(given.reduce_bucket_size, reduce),
        allgather_bucket_size=pick(given.allgather_bucket_size, allgather),
        prefetch_bucket_size=pick(given.stage3_prefetch_bucket_size, prefetch),
        max_live_parameters=pick(given.stage3_max_live_parameters, 1_000_000_000),
        max_reuse_distance=pick(given.stage3_max_reuse_distance, 1_000_000_000),
        param_persistence_threshold=pick(given.stage3_param_persistence_threshold, persist),
        contiguous_gradients=True if given.contiguous_gradients is None else given.contiguous_gradients,
        overlap_comm=overlap if given.overlap_comm is None else given.overlap_comm,
        defaults=defaults,
    )


_DEFAULTS_WHY = {
    "deepspeed": "DeepSpeed's own defaults (runtime/zero/config.py)",
    "hf-auto": "the Hugging Face 'auto' values from the hidden size (transformers HfTrainerDeepSpeedConfig; "
               "accelerate without a DeepSpeed config file writes none: set parallel.deepspeed to DeepSpeed's)",
    "lightning": "Lightning DeepSpeedStrategy's defaults",
}


def deepspeed_assumptions(s: Scenario, hidden: int) -> list[str]:
    """The report's lines on DeepSpeed ZeRO's settings and what of them the estimate models."""
    if not deepspeed_zero(s) or s.task != "train":
        return []
    z = zero_settings(s, hidden)
    first = (f"DeepSpeed ZeRO-{s.parallel.zero_stage} settings ({_DEFAULTS_WHY[z.defaults]} where parallel.deepspeed "
             f"leaves them null): reduce_bucket_size {z.reduce_bucket_size:,}, contiguous_gradients "
             f"{str(z.contiguous_gradients).lower()}, overlap_comm {str(z.overlap_comm).lower()}")
    out = [first]
    if s.parallel.zero_stage == 3 and s.data_parallel_degree <= 1:
        # terms/deepspeed.py zero3: nothing is partitioned on one data-parallel rank, and the terms are not counted
        return [first + "; not modelled: DeepSpeed ZeRO-3 on one data-parallel rank (its reduce bucket, flat "
                "gradient partition and module fetching, which stage3.py allocates whatever the world size, are not "
                "counted: the step is estimated unsharded)"]
    if s.parallel.zero_stage == 3:
        out[0] += (f", stage3_prefetch_bucket_size {z.prefetch_bucket_size:,}, stage3_max_live_parameters "
                   f"{z.max_live_parameters:,}, stage3_max_reuse_distance {z.max_reuse_distance:,}, "
                   f"stage3_param_persistence_threshold {z.param_persistence_threshold:,}")
        out.append("DeepSpeed ZeRO-3 fetching as in a step with a complete module trace (from the third step): "
                   "module by module, with prefetch and the parameters reused within stage3_max_reuse_distance kept "
                   "gathered (partitioned_param_coordinator.py); an invalidated trace releases every module and "
                   "prefetches nothing. Not modelled: the LoRA adapters kept gathered for reuse "
                   "(their persistent matrices are counted), the host-to-GPU copies of offloaded parameters "
                   "before their all-gather")
    return out
