"""Checkpoint saving: what building the state dict gathers on one GPU.

An unsharded model's ``state_dict()`` shares its parameters' storage and the writers copy each tensor to
the host (safetensors ``save_file``, ``torch.save``): nothing new on the GPU, except under torchtune's QLoRA,
whose state-dict hook dequantizes each NF4 weight on the GPU before moving it to the CPU (the largest one's
``get_original_weight`` peak).  A sharded one depends on the
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

The optimizer is saved after the model (HF Trainer ``_save_checkpoint``: ``save_model``, then
``_save_optimizer_and_scheduler``; Lightning's checkpoint holds both), with the same state-dict type.  Under
``full`` its states are gathered too and kept on the GPU: FSDP's ``FullOptimStateDictConfig`` defaults to
``offload_to_cpu=False, rank0_only=False`` (torch ``distributed/fsdp/api.py``), and
``FSDP.optim_state_dict`` all-gathers each flat parameter's states into one buffer before splitting them
per parameter (``distributed/fsdp/_optim_utils.py`` ``_allgather_orig_param_states``; FSDP2's
``get_optimizer_state_dict(full_state_dict=True)`` calls ``full_tensor()`` per state likewise).  The
model's state dict is out of scope by then, so the save peaks at the larger of the two gathers.  DeepSpeed
writes each rank's optimizer partition (``zero_pp_rank_*_optim_states.pt``): nothing gathered.
"""

from __future__ import annotations

from vramplan.analytic.lifecycle.load import LoadTensor, rank_tensors
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.context import StepContext
from vramplan.facts.torchtune import torchao_nf4_dequant_peak_bytes
from vramplan.spec.scenario import Lifecycle

__all__ = ["save_phase", "state_dict_type", "state_dict_type_for"]


def state_dict_type_for(lc: Lifecycle, framework: str) -> str:
    """The scenario's state-dict type, else the framework's: sharded under torchtitan (DCP) and DeepSpeed
    (``save_checkpoint``), full_offload otherwise."""
    st = lc.state_dict_type
    if st is not None:
        return st
    return "sharded" if framework in ("torchtitan", "deepspeed") else "full_offload"


def state_dict_type(c: StepContext) -> str:
    return state_dict_type_for(c.s.lifecycle, c.framework)


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
    if c.framework == "torchtune" and c.quant != "none" and c.shards[2] <= 1 and not c.offload_params:
        # torchtune's QLoRA builders register reparametrize_as_dtype_state_dict_post_hook(offload_to_cpu=True)
        # (torchtune/modules/common_utils.py, v0.1.1-v0.6.1): state_dict() dequantizes each NF4 weight on the GPU
        # (v.to(dtype): get_original_weight, facts/torchtune.py) and moves it to the CPU, one weight at a time
        return out.add(K.SAVE_GATHERED, torchao_nf4_dequant_peak_bytes(c.rp.largest_linear))
    if c.shards[2] <= 1 or c.offload_params:
        return out
    kind = state_dict_type(c)
    if kind == "sharded":
        return out
    tensors = rank_tensors(c)
    whole, unit = _full_bytes(c, tensors)
    model = out.copy("checkpoint save").add(K.SAVE_GATHERED, whole + unit if kind == "full" else unit)
    if kind != "full" or c.framework == "deepspeed" or not c.s.lifecycle.save_optimizer:
        return model
    optim = out.add(K.SAVE_OPTIM_GATHERED, _full_optimizer_bytes(c, resident, tensors, whole, unit))
    return optim if optim.total > model.total else model


def _full_optimizer_bytes(c: StepContext, resident: Moment, tensors: tuple[LoadTensor, ...], whole: int,
                          unit: int) -> int:
    """The unsharded optimizer states (this rank's partition x the optimizer shards) plus one unit's
    states in the all-gather buffer; a unit's share of the states is its share of the parameter bytes."""
    states = sum(resident.parts.get(K.OPTIMIZER_STATES.part, {}).values()) * c.shards[0]
    if c.peft is not None or whole == 0:
        # adapters: a unit's share of the parameter bytes is not its share of the adapter states; the
        # gather buffer of one layer's adapter states (about 1/layers of ``states``) is left out
        return states
    return states + states * unit // whole
