"""DeepSpeed configuration JSON for a DeepSpeed setup (ZeRO stage, offload, precision, batch sizes).

Keys follow DeepSpeed's configuration reference (deepspeed.ai/docs/config-json) as parsed by
``deepspeed.runtime.config.DeepSpeedConfig``.  Batch sizes are explicit and consistent
(``train_batch_size = micro x accumulation x data-parallel ranks``, which DeepSpeed asserts);
optimizer hyper-parameters are ``"auto"`` so that the Hugging Face Trainer (or Accelerate) fills
them from its own arguments.  The optimizer section is present because ZeRO-Offload runs
DeepSpeed's own CPU Adam.
"""

from __future__ import annotations

from typing import Any

from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.facts.optimizers import optimizer_facts
from vramplan.plan.setup import TrainSetup

__all__ = ["deepspeed_config"]


def deepspeed_config(s: TrainSetup, lifecycle: ResolvedLifecycle | None = None) -> dict[str, Any]:
    """The JSON mapping; ``lifecycle`` decides the ZeRO-3 16-bit save (``stage3_gather_16bit_weights_on_model_save``).

    DeepSpeed 0.19 ``DeepSpeedZeroConfig.gather_16bit_weights_on_model_save``: when true, the engine's
    ``save_16bit_model`` (the Trainer's ``save_model`` under ZeRO-3) consolidates the 16-bit weights one module at
    a time (``_zero3_consolidated_16bit_state_dict``), the estimate's full_offload; when false (DeepSpeed's
    default) the Trainer writes each rank's partition with ``save_checkpoint``, the estimate's sharded save."""
    if s.framework != "deepspeed":
        raise ValueError(f"not a DeepSpeed setup: {s.framework}")
    ds_type = optimizer_facts(s.optimizer).deepspeed_type
    if ds_type is None:
        raise ValueError(f"optimizer {s.optimizer!r} has no DeepSpeed optimizer type (facts/optimizers.py)")
    # the buffers the estimate counted: DeepSpeed's defaults (analytic/deepspeed.py), so overlap_comm only at
    # ZeRO-3, where it allocates nothing; at ZeRO-1/2 it would add a second reduce bucket (stage_1_and_2.py
    # setup_buckets), 1 GB in bf16 with the default reduce_bucket_size
    zero: dict[str, Any] = {"stage": s.zero_stage, "overlap_comm": s.zero_stage == 3, "contiguous_gradients": True}
    # the settings the estimate was made with (parallel.deepspeed): their names are DeepSpeed's zero_optimization keys
    if s.parallel.deepspeed is not None:
        zero.update(s.parallel.deepspeed.model_dump(exclude_none=True))
    if s.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if s.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if s.zero_stage == 3:
        lc = lifecycle or resolve_lifecycle(s)
        zero["stage3_gather_16bit_weights_on_model_save"] = lc.state_dict_type != "sharded"
    cfg: dict[str, Any] = {
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": s.grad_accum_steps,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "optimizer": {"type": ds_type, "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
    }
    if s.precision.startswith("bf16"):
        cfg["bf16"] = {"enabled": True}
    elif s.precision.startswith("fp16"):
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return cfg
