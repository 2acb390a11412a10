"""Hugging Face keyword arguments: ``TrainingArguments``, ``from_pretrained``, PEFT ``LoraConfig``,
``BitsAndBytesConfig``.

Names follow transformers 5 (``TrainingArguments``: ``optim`` values of ``OptimizerNames``,
``fsdp=True`` with an ``fsdp_config`` for FSDP2, ``deepspeed`` = the config file) and
peft's ``LoraConfig``.  Model loading matters for memory: transformers 5 loads checkpoints in
their stored dtype by default, so an autocast mixed-precision run (fp32 master weights, what the
estimate assumes) must ask for ``dtype="float32"``; a PEFT base and pure-bf16 training load in
bfloat16.
"""

from __future__ import annotations

from typing import Any

from vramplan.facts.optimizers import optimizer_facts
from vramplan.facts.quantization import quant_format
from vramplan.plan.setup import TrainSetup

__all__ = ["bnb_config_kwargs", "lora_config_kwargs", "model_init_kwargs", "optim_name", "training_arguments_kwargs"]


def optim_name(optimizer: str) -> str:
    """The Trainer's ``optim`` string for ``optimizer`` (its row's ``hf_trainer_optim``).

    >>> optim_name("adamw-8bit")
    'adamw_bnb_8bit'
    """
    name = optimizer_facts(optimizer).hf_trainer_optim
    if name is None:
        raise ValueError(f"optimizer {optimizer!r} has no Hugging Face Trainer optim name (facts/optimizers.py)")
    return name


def _half(s: TrainSetup) -> str | None:
    if s.precision.startswith("bf16"):
        return "bf16"
    if s.precision.startswith("fp16"):
        return "fp16"
    return None


def training_arguments_kwargs(s: TrainSetup, output_dir: str = "outputs",
                              deepspeed_file: str = "ds_config.json") -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (not for torchtitan setups)."""
    if s.framework == "torchtitan":
        raise ValueError("torchtitan setups are launched with torchtitan's TOML, not the Trainer")
    kw: dict[str, Any] = {
        "output_dir": output_dir, "per_device_train_batch_size": s.micro_batch_size,
        "gradient_accumulation_steps": s.grad_accum_steps, "max_grad_norm": 1.0,
    }
    half = _half(s)
    if half is not None:
        kw[half] = True
    if s.framework == "deepspeed":
        kw["deepspeed"] = deepspeed_file
    else:
        kw["optim"] = optim_name(s.optimizer)
        f = optimizer_facts(s.optimizer)
        if f.hf_optim_args is not None:
            # the layout the estimate assumed (GaLore's rank 128, APOLLO-Mini's rank 1), not the Trainer's defaults
            kw["optim_args"] = f.hf_optim_args
        if f.hf_optim_target_modules:
            kw["optim_target_modules"] = list(f.hf_optim_target_modules)
    if s.framework == "accelerate":
        kw["fsdp"] = True
        kw["fsdp_config"] = {
            "version": 2, "reshard_after_forward": s.fsdp != "shard_grad_op", "cpu_offload": s.offload != "none",
            "activation_checkpointing": s.checkpointing == "full", "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT", "cpu_ram_efficient_loading": True,
        }
        if s.grad_accum_steps > 1:
            # the estimate reduce-scatters every micro-step (no unsharded gradient accumulation)
            kw["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    elif s.checkpointing == "full":
        # transformers >= 5 names it activation_checkpointing (gradient_checkpointing is its deprecated alias)
        kw["activation_checkpointing"] = True
        kw["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if s.framework == "hf-trainer" and s.num_gpus > 1:
        kw["ddp_find_unused_parameters"] = False
    return kw


def model_init_kwargs(s: TrainSetup) -> dict[str, Any]:
    """Keyword arguments for ``AutoModelForCausalLM.from_pretrained`` (quantization config given apart)."""
    if s.peft is not None or s.precision.endswith("-true") or s.framework == "deepspeed":
        dtype = "bfloat16" if s.precision.startswith("bf16") else ("float16" if s.precision.startswith("fp16")
                                                                   else "float32")
    else:
        dtype = "float32"  # autocast mixed precision / FSDP: fp32 parameters are the master copy
    attn = "eager" if s.attention == "eager" else "sdpa"
    return {"dtype": dtype, "attn_implementation": attn}


def lora_config_kwargs(s: TrainSetup) -> dict[str, Any]:
    """Keyword arguments for ``peft.LoraConfig``."""
    if s.peft is None:
        raise ValueError("not a PEFT setup")
    return {"r": s.lora_rank, "lora_alpha": s.lora_alpha, "lora_dropout": s.lora_dropout,
            "target_modules": s.target_modules, "bias": "none", "task_type": "CAUSAL_LM"}


def bnb_config_kwargs(s: TrainSetup) -> dict[str, Any] | None:
    """Keyword arguments for ``transformers.BitsAndBytesConfig`` (None when the base is not quantized)."""
    q = s.quantization
    if q == "none":
        return None
    fmt = quant_format(q)
    if not fmt.hf_bnb_config:
        raise ValueError(f"{q} is not a bitsandbytes format (facts/quantization.py)")
    kw: dict[str, Any] = dict(fmt.hf_bnb_config)
    if fmt.dequant == "whole_weight":
        # 4-bit layers dequantize to the compute dtype (set_compute_type may still replace it at run time)
        kw["bnb_4bit_compute_dtype"] = "bfloat16" if s.precision.startswith("bf16") else "float16"
    return kw
