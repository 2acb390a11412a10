"""Precision conventions as data: which dtype each kind of tensor has, per precision and framework family.

One row per (precision, framework family), with keyword fields, each citing the convention it
follows in ``docs/conventions.md`` ("Model states").  ``analytic/precision.py`` ``policy`` picks the
row for a scenario; the planner, the step-time model and ``measure`` read the same ``PrecisionPolicy``.

Framework families (``analytic/precision.py`` ``framework_family``):

* ``autocast``: Hugging Face Trainer, Accelerate without FSDP, Lightning, plain PyTorch with
  ``torch.autocast``: fp32 parameters are the master copy, fp32 gradients, a cached half copy of each
  trainable linear weight (the autocast weight cache).  4 + 4 + 8 = 16 B/parameter with AdamW.
* ``fsdp``: FSDP ``MixedPrecision(param_dtype=half)`` and torchtitan: sharded fp32 parameters, half
  all-gathered copies (counted as all-gather buffers), fp32 gradients, no autocast.
* ``deepspeed``: the engine casts the module to half and owns fp32 masters (ZeRO paper, arXiv 1910.02054
  sec. 3.1: 2 + 2 + 12 = 16 B/parameter).
* ``megatron``: Megatron-Core with ``--bf16``: bf16 parameters, gradients in DDP's fp32 grad buffer
  (``accumulate_allreduce_grads_in_fp32``, set by ``--bf16``), fp32 main parameters held by the optimizer
  (facts/megatron.py; docs/source/api-guide/dist_optimizer.md: 2 + 4 + 12 = 18 B/parameter).
* ``any``: the row holds for every framework (``fp32``, ``*-true``).

``fp8-mixed`` follows Transformer Engine: the mixed-precision row of the family plus an fp8 copy of
each linear weight, and linear inputs saved in fp8 for the backward pass.

``fp8-torchao`` follows torchao's float8 training (torchao v0.14.1 ``Float8Linear``, torchtitan's ``float8``
converter): one row, for the FSDP family, equal to bf16-mixed's, because a converted linear saves its bf16 input
and its weight as ``nn.Linear`` does and keeps no float8 copy between the forward and the backward
(facts/float8_training.py); its casts and its float8 all-gather are terms (analytic/float8.py).  The other
families are refused (spec/load.py): torchtitan is the framework modelled.  ``mxfp8-torchao`` (torchao's MXFP8
training, torchtitan's ``mx`` converter) is the same row for the same reason: ``mx_mm`` saves the bf16 input and
weight (facts/mx_training.py); its casts are terms (analytic/mx.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PRECISIONS", "FrameworkFamily", "PrecisionConvention", "PrecisionPolicy", "precision_names",
           "precision_policy"]

FrameworkFamily = Literal["any", "autocast", "fsdp", "deepspeed", "megatron"]

_STATES = "docs/conventions.md#model-states-bytes-per-trainable-parameter"


@dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
    """Dtypes of one precision convention.  Every ``*_bytes`` field is bytes **per element** (2 or 4),
    not a total; ``half`` names the half dtype."""

    param_bytes: int  # stored (trainable) parameter, per element
    frozen_param_bytes: int  # a frozen base weight under PEFT (loaded in the half dtype), per element
    grad_bytes: int  # gradient, per element
    master_bytes: int  # fp32 master copy held outside the model (DeepSpeed), per element; 0: none
    compute_bytes: int  # matmul inputs/outputs, saved activations, per element
    residual_bytes: int  # the residual stream between layers, per element
    autocast: bool
    weight_cast_bytes: int  # autocast's cached copy of each trainable linear weight, per element (0: none)
    linear_input_bytes: int  # how a linear's saved input is stored, per element
    half: str  # "bf16" | "fp16" | "fp32"


@dataclass(frozen=True, kw_only=True)
class PrecisionConvention:
    """One row: the policy of ``precision`` under ``family``, and the convention it follows."""

    precision: str
    family: FrameworkFamily
    policy: PrecisionPolicy
    convention: str  # the section of docs/conventions.md


def _mixed(precision: str, half: str, fp8: bool) -> tuple[PrecisionConvention, ...]:
    # fp8-mixed (Transformer Engine): an fp8 copy of each linear weight and fp8 saved linear inputs
    cast = 1 if fp8 else 2
    inputs = 1 if fp8 else 2
    return (
        PrecisionConvention(precision=precision, family="autocast", convention=_STATES, policy=PrecisionPolicy(
            param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2, residual_bytes=4,
            autocast=True, weight_cast_bytes=cast, linear_input_bytes=inputs, half=half)),
        PrecisionConvention(precision=precision, family="fsdp", convention=_STATES, policy=PrecisionPolicy(
            param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2, residual_bytes=2,
            autocast=False, weight_cast_bytes=1 if fp8 else 0, linear_input_bytes=inputs, half=half)),
        PrecisionConvention(precision=precision, family="deepspeed", convention=_STATES, policy=PrecisionPolicy(
            param_bytes=2, frozen_param_bytes=2, grad_bytes=2, master_bytes=4, compute_bytes=2, residual_bytes=2,
            autocast=False, weight_cast_bytes=1 if fp8 else 0, linear_input_bytes=inputs, half=half)),
    )


def _true(precision: str, half: str) -> PrecisionConvention:
    # everything in the half dtype; torch's AdamW keeps its moments in the parameter's dtype: 2 + 2 + 4 B
    return PrecisionConvention(precision=precision, family="any", convention=_STATES, policy=PrecisionPolicy(
        param_bytes=2, frozen_param_bytes=2, grad_bytes=2, master_bytes=0, compute_bytes=2, residual_bytes=2,
        autocast=False, weight_cast_bytes=0, linear_input_bytes=2, half=half))


PRECISIONS: tuple[PrecisionConvention, ...] = (
    PrecisionConvention(precision="fp32", family="any", convention=_STATES, policy=PrecisionPolicy(
        param_bytes=4, frozen_param_bytes=4, grad_bytes=4, master_bytes=0, compute_bytes=4, residual_bytes=4,
        autocast=False, weight_cast_bytes=0, linear_input_bytes=4, half="fp32")),
    *_mixed("fp16-mixed", "fp16", fp8=False),
    *_mixed("bf16-mixed", "bf16", fp8=False),
    _true("bf16-true", "bf16"),
    _true("fp16-true", "fp16"),
    *_mixed("fp8-mixed", "bf16", fp8=True),
    # Megatron-Core --bf16: bf16 parameters and activations (the residual stream in the parameters' dtype without
    # --fp32-residual-connection), fp32 grad buffer, fp32 main parameters (facts/megatron.py)
    PrecisionConvention(precision="bf16-mixed", family="megatron", convention=_STATES, policy=PrecisionPolicy(
        param_bytes=2, frozen_param_bytes=2, grad_bytes=4, master_bytes=4, compute_bytes=2, residual_bytes=2,
        autocast=False, weight_cast_bytes=0, linear_input_bytes=2, half="bf16")),
    # torchao float8 under FSDP2 / torchtitan: bf16-mixed's FSDP row (what is saved is unchanged)
    PrecisionConvention(precision="fp8-torchao", family="fsdp", convention=_STATES, policy=PrecisionPolicy(
        param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2, residual_bytes=2,
        autocast=False, weight_cast_bytes=0, linear_input_bytes=2, half="bf16")),
    # torchao MXFP8 under FSDP2 / torchtitan: the same (mx_mm saves input_hp and weight_hp; no MX all-gather)
    PrecisionConvention(precision="mxfp8-torchao", family="fsdp", convention=_STATES, policy=PrecisionPolicy(
        param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2, residual_bytes=2,
        autocast=False, weight_cast_bytes=0, linear_input_bytes=2, half="bf16")),
)


def precision_names() -> tuple[str, ...]:
    """Every precision, in table order, once."""
    return tuple(dict.fromkeys(r.precision for r in PRECISIONS))


def precision_policy(precision: str, family: FrameworkFamily) -> PrecisionPolicy:
    """The row for (precision, family), else the precision's ``any`` row."""
    fallback = None
    for r in PRECISIONS:
        if r.precision == precision:
            if r.family == family:
                return r.policy
            if r.family == "any":
                fallback = r.policy
    if fallback is None:
        raise KeyError(f"no precision convention for {precision!r} under {family!r}")
    return fallback
