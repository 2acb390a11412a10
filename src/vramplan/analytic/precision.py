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

from vramplan.facts.precisions import FrameworkFamily, PrecisionPolicy, precision_policy
from vramplan.facts.quantization import quant_format
from vramplan.spec.scenario import Scenario

__all__ = ["PrecisionPolicy", "adapter_bytes", "framework_family", "litgpt_fp32_base", "policy"]


def framework_family(s: Scenario) -> FrameworkFamily:
    """The precision family of the framework that runs ``s`` (``facts/precisions.py``): DeepSpeed's
    half module with fp32 masters; Megatron-Core's bf16 module with an fp32 grad buffer and fp32 masters; FSDP's
    MixedPrecision (any FSDP sharding, torchtitan); else autocast."""
    framework = s.effective_framework
    if s.deepspeed_engine:
        # framework deepspeed, or a ZeRO stage under the HF Trainer, accelerate or Lightning (Scenario.deepspeed_engine)
        return "deepspeed"
    if framework == "megatron":
        return "megatron"
    if s.parallel.fsdp != "none" or framework == "torchtitan":
        return "fsdp"
    return "autocast"


def policy(s: Scenario) -> PrecisionPolicy:
    """The scenario's row of ``facts.precisions.PRECISIONS`` (docs/conventions.md, "Model states")."""
    return precision_policy(s.train.precision, framework_family(s))


def litgpt_fp32_base(s: Scenario) -> bool:
    """Lit-GPT's PEFT finetuning under a ``*-mixed`` precision holds its frozen base in fp32.

    Lit-GPT's ``finetune/lora.py`` builds ``GPT(config)`` under ``fabric.init_module`` and copies the checkpoint
    into it with ``model.load_state_dict`` (``load_checkpoint``); ``bf16-mixed`` is its default for training
    (``get_default_supported_precision(training=True)``).  Lightning Fabric's ``MixedPrecision`` overrides neither
    ``module_init_context``/``init_context`` nor ``convert_module`` (the base ``Precision``'s ``nullcontext()`` and
    ``return module``), so the model is made in the default fp32 and stays so: 4 B per frozen weight, against 2 B
    under ``bf16-true`` (``HalfPrecision`` sets the default dtype and ``module.to(dtype)``).  Read at lit-gpt
    8641822 (October 2023) and litgpt v0.3.1, v0.4.0, v0.5.0, v0.5.13 (``litgpt/finetune/lora.py`` ``setup``/
    ``main``, ``litgpt/utils.py``), lightning 71aed75 and 2.4.0 (``fabric/plugins/precision/amp.py``,
    ``precision.py``, ``half.py``).  Lit-GPT's own tutorial measured it (tutorials/finetune_lora.md from commit
    982abcb): Llama 2 7B LoRA, micro-batch 1, "Default (bf16-mixed) | OutOfMemoryError" against 21.30 GB for
    ``--precision bf16-true`` on the 40 GB A100.  Quantized bases never get here: Lit-GPT refuses a
    bitsandbytes ``--quantize`` with a mixed precision (spec/checks.py ``litgpt_problems``).  lit-llama, the project
    before Lit-GPT, is not this: its ``finetune_lora.py`` of April 2023 (commits 8a13cbf-5f484dd) ran
    ``precision="bf16-mixed"`` on a model built in bf16 (``EmptyInitOnDevice(dtype=torch.bfloat16)``, then
    ``LLaMA(config).bfloat16()``), and ``precision="bf16-true"`` from
    4ba680f on, so a lit-llama run is described with ``precision: bf16-true``.
    """
    return (s.effective_framework == "lightning" and s.train.peft is not None
            and s.train.precision in ("bf16-mixed", "fp16-mixed"))


def adapter_bytes(s: Scenario, pol: PrecisionPolicy) -> int:
    """Bytes per element of the LoRA/DoRA adapters (and so of their gradients and optimizer moments).

    * DeepSpeed casts the whole module, adapters included, to its half dtype;
    * torchtune builds its LoRA matrices with the model, in the model's dtype (bf16 or fp32);
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
    if s.deepspeed_engine:
        return pol.param_bytes
    if framework == "torchtune":
        # torchtune builds the whole model, LoRALinear's lora_a/lora_b included, under
        # training.set_default_dtype(dtype) and checks the adapters with validate_expected_param_dtype(..., dtype)
        # (recipes/lora_finetune_single_device.py _setup_model, v0.2.0-v0.6.1): the model's own dtype
        return pol.frozen_param_bytes
    if not s.software.peft_adapters_in_base_dtype:
        return 4
    quant = s.train.quantization
    if quant == "none":
        return pol.frozen_param_bytes
    sharded = s.parallel.fsdp in ("full_shard", "shard_grad_op", "hybrid_shard") or s.parallel.zero_stage == 3
    # a 4-bit bitsandbytes base is packed in the float storage dtype when sharded (bnb_4bit_quant_storage)
    packed_in_float = quant_format(quant).library == "bitsandbytes" and quant_format(quant).bits == 4
    return pol.frozen_param_bytes if sharded and packed_in_float else 4
