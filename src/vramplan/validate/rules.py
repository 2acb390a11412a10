"""The common rules of thumb, scored on the same entries as the engines.

Each rule gives one per-GPU figure, compared with whatever was measured
(allocated, reserved or nvidia-smi: a rule does not tell them apart) and with the
device capacity for its fits/OOM verdict.  ``docs/validation.md`` states the sources.

Definitions (P = the model's total parameter count, all experts included):

- weights bytes ``W = P * b / 8``, with ``b`` the bits of the stored base weights: the
  quantized format's payload when the base weights are quantized (4 for nf4 / fp4 / GPTQ /
  AWQ, 8 for int8 / fp8), else the run's dtype: 32 for ``fp32``, 16 for every 16-bit
  setting (``bf16-mixed``, ``fp16-mixed``, ``bf16-true``, ``fp16-true``, ``fp8-mixed``,
  inference/serve ``fp16``/``bf16``), as the rule's users count a "7B model in bf16" as 14 GB.
- shards ``S``: the GPUs that share one copy of the model state.  Training: ``tp * pp``,
  times the data-parallel degree when the states are sharded (ZeRO stage >= 1, FSDP
  ``full_shard`` / ``shard_grad_op``; ``hybrid_shard`` shards within a node only).
  Inference and serving: ``tp * pp``.
- ``weights x 4`` (train):  ``ceil(4 * W / S)``   -- weights + gradients + two Adam moments.
  Llama 2 7B in bf16 on one GPU: 4 * 13,476,831,232 = 53,907,324,928 B.
- ``16 bytes/param`` (train): ``ceil(16 * P / S)`` -- mixed-precision AdamW model states.
  Llama 2 7B on one GPU: 16 * 6,738,415,616 = 107,814,649,856 B.
- ``weights + 20%`` (inference, serve): ``ceil(6 * W / (5 * S))``.
  Llama 2 7B in fp16 on one GPU: 13,476,831,232 * 1.2 = 16,172,197,478.4 -> 16,172,197,479 B.

A rule does not apply to tasks it was not made for, nor to a ``kv_cache`` measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramplan.facts.quantization import quant_format
from vramplan.spec.load import Resolved
from vramplan.units import DTYPE_BITS, ceil_div

__all__ = ["RULES", "Rule", "model_state_shards", "rule_16_bytes_per_param", "rule_weights_plus_20",
           "rule_weights_x4", "weights_bytes"]



def _stored_bits(r: Resolved) -> int:
    s = r.scenario
    if s.task == "train":
        if s.train.quantization != "none":
            return quant_format(s.train.quantization).bits  # the payload only (facts/quantization.py)
        return 32 if s.train.precision == "fp32" else 16
    section = s.inference if s.task == "inference" else s.serve
    if section.quantization != "none":
        return quant_format(section.quantization).bits
    return DTYPE_BITS[section.dtype]


def weights_bytes(r: Resolved) -> int:
    """``W = P * b / 8`` for the whole model (see the module docstring), rounded up to a byte."""
    return ceil_div(r.model.num_parameters * _stored_bits(r), 8)


def model_state_shards(r: Resolved) -> int:
    """GPUs sharing one copy of the model state, ``S`` in the module docstring."""
    s = r.scenario
    par = s.parallel
    mp = par.tp * par.pp
    if s.task != "train":
        return mp
    dp = s.shard_degree  # data- x context-parallel ranks: both shard one copy (Scenario.shard_degree)
    if par.zero_stage >= 1 or par.fsdp in ("full_shard", "shard_grad_op"):
        return mp * dp
    if par.fsdp == "hybrid_shard":
        return mp * max(1, min(dp, s.hardware.gpus_per_node // mp))
    return mp


def rule_weights_x4(r: Resolved) -> int:
    """Weights, gradients and two Adam moments, each the size of the weights."""
    return ceil_div(4 * weights_bytes(r), model_state_shards(r))


def rule_16_bytes_per_param(r: Resolved) -> int:
    """2 (half weights) + 2 (half gradients) + 4 (fp32 master) + 8 (fp32 Adam moments) bytes."""
    return ceil_div(16 * r.model.num_parameters, model_state_shards(r))


def rule_weights_plus_20(r: Resolved) -> int:
    """Weights plus 20% for everything else (KV cache, activations, CUDA context)."""
    return ceil_div(6 * weights_bytes(r), 5 * model_state_shards(r))


@dataclass(frozen=True)
class Rule:
    """A rule of thumb: the tasks it is meant for and its per-GPU figure."""

    key: str
    label: str
    tasks: tuple[str, ...]
    predict: Callable[[Resolved], int]
    definition: str


RULES: tuple[Rule, ...] = (
    Rule("rule:weights-x4", "weights x 4", ("train",), rule_weights_x4,
         "4 x weights bytes in the training dtype (or the quantized format), per model-state shard"),
    Rule("rule:16-bytes-per-param", "16 B/param", ("train",), rule_16_bytes_per_param,
         "16 bytes x parameters, per model-state shard"),
    Rule("rule:weights+20%", "weights + 20%", ("inference", "serve"), rule_weights_plus_20,
         "1.2 x weights bytes in the run's dtype (or the quantized format), per tp x pp shard"),
)
