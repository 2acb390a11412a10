"""Accelerate configuration YAML (``accelerate launch --config_file``) for a training setup.

FSDP setups get ``distributed_type: FSDP`` with an FSDP2 ``fsdp_config`` (the ``fsdp_*`` keys
``accelerate launch`` maps onto ``FullyShardedDataParallelPlugin``); DeepSpeed setups point at the
exported DeepSpeed JSON (``deepspeed_config_file``) and, as accelerate requires with a config file,
set nothing that file already decides (mixed precision, accumulation, ZeRO stage, offload).
Plain data parallelism is ``MULTI_GPU`` (``NO`` on one GPU).  Nodes: ``num_machines`` =
ceil(GPUs / GPUs per node), and every node runs ``accelerate launch`` with its ``machine_rank``.
"""

from __future__ import annotations

from typing import Any

from vramplan.export.hf import fsdp_state_dict_type
from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.plan.setup import TrainSetup

__all__ = ["accelerate_config"]


def accelerate_config(s: TrainSetup, deepspeed_file: str = "ds_config.json",
                      lifecycle: ResolvedLifecycle | None = None) -> dict[str, Any]:
    """The YAML mapping; ``lifecycle`` gives FSDP's ``fsdp_state_dict_type`` (``hf.fsdp_state_dict_type``)."""
    if s.framework == "torchtitan":
        raise ValueError("torchtitan setups are launched with torchrun and torchtitan's TOML")
    machines = -(-s.num_gpus // s.gpus_per_node)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "machine_rank": 0,
        "main_training_function": "main", "num_machines": machines, "num_processes": s.num_gpus,
        "rdzv_backend": "static", "same_network": True, "use_cpu": False,
    }
    half = "bf16" if s.precision.startswith("bf16") else ("fp16" if s.precision.startswith("fp16") else "no")
    if s.framework == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"deepspeed_config_file": deepspeed_file, "zero3_init_flag": s.zero_stage == 3}
        return cfg
    cfg["mixed_precision"] = half
    if s.framework == "accelerate":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": s.fsdp != "shard_grad_op", "fsdp_offload_params": s.offload != "none",
            "fsdp_activation_checkpointing": s.checkpointing == "full", "fsdp_state_dict_type": fsdp_state_dict_type(lifecycle or resolve_lifecycle(s)),
            "fsdp_cpu_ram_efficient_loading": True,
        }
    else:
        cfg["distributed_type"] = "MULTI_GPU" if s.num_gpus > 1 else "NO"
    return cfg
