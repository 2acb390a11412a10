"""Checkpoint saving: what building the state dict gathers on one GPU.

An unsharded model's ``state_dict()`` shares its parameters' storage and the writers copy each tensor to
the host (safetensors ``save_file``, ``torch.save``): nothing new on the GPU.  A sharded one depends on the
state-dict type (``lifecycle.state_dict_type``):

* ``full``: FSDP ``FULL_STATE_DICT`` without ``offload_to_cpu``/``rank0_only`` unshards every unit and
  clones its parameters on the GPU of every rank (torch ``distributed/fsdp/_state_dict_utils.py``
  ``_full_post_state_dict_hook``: ``state_dict[fqn] = state_dict[fqn].clone()`` when not offloading), so the
  whole model is on each GPU, beside one unit still unsharded;
* ``full_offload``: ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``, accelerate's default
  (``FullyShardedDataParallelPlugin.__post_init__``) and Lightning's (``FSDPStrategy``
  ``_get_full_state_dict_context``), or DeepSpeed's 16-bit save
  (``DeepSpeedEngine._zero3_consolidated_16bit_state_dict``: ``GatheredParameters`` one module at a
  time, copied to the CPU): one unit (FSDP: a layer; DeepSpeed: a module's parameters) at a time;
* ``sharded``: each rank writes its own shard (FSDP ``SHARDED_STATE_DICT``, torch DCP as torchtitan
  saves, DeepSpeed ``save_checkpoint``): nothing gathered.

The default is full_offload, sharded under torchtitan and DeepSpeed (whose ``save_checkpoint`` the HF
Trainer calls; ``stage3_gather_16bit_weights_on_model_save`` is off by default).
"""

from __future__ import annotations

from vramplan.analytic.lifecycle.load import LoadTensor, rank_tensors
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.context import StepContext

__all__ = ["save_phase", "state_dict_type"]


def state_dict_type(c: StepContext) -> str:
    st = c.s.lifecycle.state_dict_type
    if st is not None:
        return st
    return "sharded" if c.framework in ("torchtitan", "deepspeed") else "full_offload"


def _full_bytes(c: StepContext, tensors: tuple[LoadTensor, ...]) -> tuple[int, int]:
    """(whole model, largest unit) unsharded, in the dtype the step holds the parameters."""
    per = c.pol.param_bytes if c.peft is None else c.pol.frozen_param_bytes
    units: dict[int, int] = {}
    for t in tensors:
        units[t.unit] = units.get(t.unit, 0) + t.numel * per
    deepspeed = c.framework == "deepspeed" or c.s.parallel.zero_stage == 3
    largest = max((t.numel * per for t in tensors), default=0) if deepspeed else max(units.values(), default=0)
    return sum(units.values()), largest


def save_phase(c: StepContext, resident: Moment) -> Moment:
    """The save's highest moment over what stays resident between steps."""
    out = resident.copy("checkpoint save")
    if c.shards[2] <= 1 or c.offload_params:
        return out
    kind = state_dict_type(c)
    if kind == "sharded":
        return out
    whole, unit = _full_bytes(c, rank_tensors(c))
    return out.add(K.SAVE_GATHERED, whole + unit if kind == "full" else unit)
