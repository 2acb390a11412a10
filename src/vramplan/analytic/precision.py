"""Which dtype each kind of tensor has, per precision and framework.

The conventions (why a bf16-mixed AdamW job costs 16 bytes per parameter in two
different ways):

* Hugging Face Trainer, Accelerate, Lightning, plain PyTorch with ``torch.autocast``
  (``bf16-mixed``/``fp16-mixed``): parameters stay fp32 (4 B) and are the master
  copy; gradients are fp32 (4 B, a gradient has its parameter's dtype); AdamW's
  two moments are fp32 (8 B).  4 + 4 + 8 = 16 B/parameter.  Autocast keeps a
  half-precision copy of each trainable linear weight from its first use in the
  forward pass until its backward (the autocast weight cache, saved by matmul).
* DeepSpeed (and the ZeRO paper, arXiv 1910.02054 section 3.1): parameters and
  gradients in half precision (2 + 2 B), with fp32 master weights and moments held
  by the optimizer (K = 4 + 4 + 4 = 12 B).  2 + 2 + 12 = 16 B/parameter.
* ``bf16-true``/``fp16-true``: everything in half precision; torch's AdamW keeps its
  moments in the parameter's dtype.  2 + 2 + 4 = 8 B/parameter.
* ``fp8-mixed`` follows Transformer Engine: bf16-mixed plus an fp8 copy of each
  linear weight, and linear inputs saved in fp8 for the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.spec.scenario import Scenario


@dataclass(frozen=True)
class PrecisionPolicy:
    param_bytes: int  # stored (trainable) parameter
    frozen_param_bytes: int  # a frozen base weight under PEFT (loaded in the half dtype)
    grad_bytes: int
    master_bytes: int  # fp32 master copy held outside the model (DeepSpeed, FSDP shards are the params)
    compute_bytes: int  # matmul inputs/outputs, saved activations
    residual_bytes: int  # the residual stream between layers
    autocast: bool
    weight_cast_bytes: int  # autocast's cached copy of each trainable linear weight (0: none)
    linear_input_bytes: int  # how a linear's saved input is stored
    half: str  # "bf16" | "fp16" | "fp32"


def policy(s: Scenario) -> PrecisionPolicy:
    prec = s.train.precision
    framework = s.effective_framework
    half = "fp16" if prec.startswith("fp16") else ("fp32" if prec == "fp32" else "bf16")
    if prec == "fp32":
        return PrecisionPolicy(4, 4, 4, 0, 4, 4, False, 0, 4, "fp32")
    if prec in ("bf16-true", "fp16-true"):
        return PrecisionPolicy(2, 2, 2, 0, 2, 2, False, 0, 2, half)
    fp8 = prec == "fp8-mixed"
    if framework == "deepspeed":
        # DeepSpeed's engine casts the module to half and owns fp32 masters (bf16/fp16 config section).
        return PrecisionPolicy(2, 2, 2, 4, 2, 2, False, 1 if fp8 else 0, 1 if fp8 else 2, half)
    if s.parallel.fsdp not in ("none",) or framework == "torchtitan":
        # FSDP MixedPrecision(param_dtype=half): sharded fp32 params, half all-gathered copies
        # (counted as all-gather buffers), fp32 sharded gradients (reduce_dtype fp32 in torchtitan).
        return PrecisionPolicy(4, 2, 4, 0, 2, 2, False, 1 if fp8 else 0, 1 if fp8 else 2, half)
    return PrecisionPolicy(4, 2, 4, 0, 2, 4, True, 1 if fp8 else 2, 1 if fp8 else 2, half)


def adapter_bytes(s: Scenario, pol: PrecisionPolicy) -> int:
    """Bytes per element of the LoRA/DoRA adapters (and so of their gradients and optimizer moments).

    * DeepSpeed casts the whole module, adapters included, to its half dtype;
    * LitGPT (``framework: lightning``) is kept with fp32 adapters too, although its own LoRA
      matrices are created under ``fabric.init_module`` in the ``*-true`` half dtype: modelling that
      alone moves its published LoRA rows from -0.1..-1.8% to -3.4..-6.9% (docs/conventions.md), so a
      term of LitGPT's LoRA path that compensates is not known yet;
    * Hugging Face peft >= 0.12 (and when ``software.peft`` is not given): fp32,
      ``get_peft_model(autocast_adapter_dtype=True)`` upcasts fp16/bf16 adapters;
    * peft < 0.12: the base weight's dtype when it is a float (``LoraLayer.update_layer`` moved the
      adapter to it), else the default fp32.  A k-bit base is packed in uint8/int8 (fp32 adapters),
      except a 4-bit base sharded by FSDP/ZeRO-3, which is stored in the model's float dtype
      (``bnb_4bit_quant_storage``, so that the shards are uniform): adapters in that dtype.

    Example: Llama-2-7B, LoRA r64 on q,k,v,gate,up,down (80M adapter parameters), bf16-true, peft 0.10:
    2 B each (160 MB) instead of 4 (320 MB), and the same saving on their gradients and AdamW moments.
    """
    framework = s.effective_framework
    if framework == "deepspeed":
        return pol.param_bytes
    if not s.software.peft_adapters_in_base_dtype:
        return 4
    quant = s.train.quantization
    if quant == "none":
        return pol.frozen_param_bytes
    sharded = s.parallel.fsdp in ("full_shard", "shard_grad_op", "hybrid_shard") or s.parallel.zero_stage == 3
    return pol.frozen_param_bytes if sharded and quant in ("nf4", "nf4-dq", "fp4") else 4
