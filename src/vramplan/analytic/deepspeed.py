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

__all__ = ["ELEMENTWISE_OVERFLOW_CHECK_UNTIL", "OVERFLOW_CHECK_EVERY_DTYPE_UNTIL", "ZeroSettings",
           "deepspeed_assumptions", "deepspeed_zero", "overflow_check_bytes", "step_overflow_check", "zero_settings"]

# ZeRO-1/2's ``_has_inf_or_nan`` (runtime/zero/stage_1_and_2.py) up to 0.19.5: ``float_x = x.float()``, ``isnan``,
# ``isinf``, ``logical_or`` and ``.float()`` of the last, all alive at once: 4 + 1 + 1 + 1 + 4 = 11 B per element of
# a half gradient (7 of an fp32 one, whose ``.float()`` is itself); from 0.19.6 it calls runtime/utils.py
# ``has_inf_or_nan`` (``amax``/``amin``: nothing per element).  Read in the v0.9.5-v0.19.5 tags and the 0.19.6,
# 0.19.7 and 0.19.8 sdists.
ELEMENTWISE_OVERFLOW_CHECK_UNTIL = (0, 19, 6)
# ``step()`` checked every dtype's gradients for overflow until PR deepspeedai/DeepSpeed#4512 ("Don't check overflow
# for bf16 data type", first in v0.11.2); from then on fp16 only (``check_grad_overflow`` from v0.17.1, PR #6976,
# True for fp16 and bf16's ``check_grad_overflow``, false by default).
OVERFLOW_CHECK_EVERY_DTYPE_UNTIL = (0, 11, 2)


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
    if s.software.deepspeed is None and s.parallel.zero_stage < 3 and (
            s.parallel.offload != "none" or step_overflow_check(s)):
        out.append("DeepSpeed release 0.11.2-0.19.5 assumed (software.deepspeed not given): ZeRO-1/2's overflow check "
                   "copies each gradient it checks, 11 B per element of a half gradient (an fp32 copy, three masks "
                   "and a float of the last); 0.19.6 on allocates nothing for it")
    one_rank = s.parallel.zero_stage == 3 and s.shard_degree <= 1
    if one_rank:
        # terms/deepspeed.py zero3 and fetches_copies: stage3.py's buffers whatever the world size, no gathered copy
        out.append("DeepSpeed ZeRO-3 on one data-parallel rank: the optimizer's reduce bucket, flat gradient "
                   "partition and sub-groups' fp32 gradients as on more ranks (stage3.py does not look at the world "
                   "size), and fetching copies nothing" + (" but the parameters offloaded to the host"
                                                           if s.parallel.offload == "optimizer+params" else "")
                   + " (a partition world size of 1 gathers through NoGatherHandle: the partition itself, "
                   "partition_parameters.py)")
    if s.parallel.zero_stage == 3:
        out[0] += (f", stage3_prefetch_bucket_size {z.prefetch_bucket_size:,}, stage3_max_live_parameters "
                   f"{z.max_live_parameters:,}, stage3_max_reuse_distance {z.max_reuse_distance:,}, "
                   f"stage3_param_persistence_threshold {z.param_persistence_threshold:,}; sub_group_size "
                   f"1,000,000,000 assumed (DeepSpeed's default, no scenario key: the step's fp32 gradient is one "
                   f"sub-group at a time)")
        if one_rank and s.parallel.offload != "optimizer+params":
            return out
        out.append("DeepSpeed ZeRO-3 fetching as in a step with a complete module trace (from the third step): "
                   "module by module, with prefetch and the parameters reused within stage3_max_reuse_distance kept "
                   "gathered (partitioned_param_coordinator.py); an invalidated trace releases every module and "
                   "prefetches nothing. The gathered parameters are a pool of their own on the all-gather stream (with "
                   "overlap_comm), the reserved bytes the pools' sum. Not modelled: the LoRA adapters kept gathered "
                   "for reuse (their persistent matrices are counted), the host-to-GPU copies of offloaded parameters "
                   "before their all-gather, and the frees across streams (record_stream: a gathered parameter or a "
                   "gradient moved to the bucket returns to its pool only once the other stream's work has passed "
                   "it), which can hold more reserved bytes than the replay's")
    return out


def overflow_check_bytes(s: Scenario, half: bool) -> int:
    """Bytes per gradient element of ZeRO-1/2's overflow check: 11 (half) or 7 (fp32) up to 0.19.5, else 0.
    ``software.deepspeed`` None: a release before 0.19.6 (``Software.deepspeed``)."""
    v = s.software.deepspeed_version
    if v is not None and v >= ELEMENTWISE_OVERFLOW_CHECK_UNTIL:
        return 0
    return 11 if half else 7


def step_overflow_check(s: Scenario) -> bool:
    """Whether ZeRO-1/2's ``step()`` checks the gradients for overflow: fp16 always, other dtypes before 0.11.2
    (``software.deepspeed`` None: from 0.11.2 on)."""
    v = s.software.deepspeed_version
    return s.train.precision.startswith("fp16") or (v is not None and v < OVERFLOW_CHECK_EVERY_DTYPE_UNTIL)
