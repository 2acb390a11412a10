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

from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.facts.optimizers import optimizer_facts
from vramplan.facts.quantization import quant_format
from vramplan.plan.setup import TrainSetup

__all__ = [
    "attn_implementation", "bnb_config_kwargs", "casts_after_load", "fsdp_state_dict_type", "held_dtype", "lifecycle_arguments",
    "loads_onto_gpu", "lora_config_kwargs", "model_init_kwargs", "optim_name", "training_arguments_kwargs",
]


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


def training_arguments_kwargs(s: TrainSetup, output_dir: str = "outputs", deepspeed_file: str = "ds_config.json",
                              lifecycle: ResolvedLifecycle | None = None) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (not for torchtitan setups); ``lifecycle``: the
    evaluation and checkpoint settings the estimate took (default: the framework's, ``resolve_lifecycle``)."""
    if s.framework == "torchtitan":
        raise ValueError("torchtitan setups are launched with torchtitan's TOML, not the Trainer")
    lc = lifecycle or resolve_lifecycle(s)
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
            "state_dict_type": fsdp_state_dict_type(lc), "cpu_ram_efficient_loading": True,
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
    kw.update(lifecycle_arguments(s, lc))
    return kw


def fsdp_state_dict_type(lc: ResolvedLifecycle) -> str:
    """FSDP's ``state_dict_type`` for the estimate's ``lifecycle.state_dict_type``.

    ``FULL_STATE_DICT`` makes accelerate 1.15 ``FullyShardedDataParallelPlugin.set_state_dict_type`` use
    ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``: one unit gathered at a time, the estimate's
    full_offload (its ``full``, without offload, has no accelerate option: the README says so)."""
    return "SHARDED_STATE_DICT" if lc.state_dict_type == "sharded" else "FULL_STATE_DICT"


def lifecycle_arguments(s: TrainSetup, lc: ResolvedLifecycle) -> dict[str, Any]:
    """The ``TrainingArguments`` keys of the lifecycle settings (transformers 5.24 ``training_args.py``):
    ``eval_strategy`` ("no" is the default: no evaluation loop), ``per_device_eval_batch_size`` (the batch
    ``Trainer.evaluation_loop`` runs), ``prediction_loss_only`` (true: the loop keeps no logits, as
    ``Trainer.evaluate`` without a ``compute_metrics``), ``eval_accumulation_steps`` (kept logits move to the CPU
    every this many batches), ``save_strategy`` ("no": no checkpoint while training) and ``save_only_model``
    (the checkpoint holds no optimizer, scheduler or RNG state)."""
    kw: dict[str, Any] = {"eval_strategy": "steps" if lc.evaluation else "no",
                          "per_device_eval_batch_size": lc.eval_batch_size}
    if lc.evaluation:
        kw["prediction_loss_only"] = not lc.eval_keeps_logits
        if lc.eval_accumulation_steps is not None:
            kw["eval_accumulation_steps"] = lc.eval_accumulation_steps
    kw["save_strategy"] = "steps" if lc.checkpoint_save else "no"
    # Trainer refuses save_only_model with FSDP's SHARDED_STATE_DICT (trainer.py, "save_only_model option is not
    # compatible"); a sharded save gathers nothing, optimizer or not, so the estimate is the same either way
    fsdp_sharded = s.framework == "accelerate" and lc.state_dict_type == "sharded"
    if lc.checkpoint_save and not fsdp_sharded:
        kw["save_only_model"] = not lc.save_optimizer
    return kw


def held_dtype(s: TrainSetup) -> str:
    """The dtype the step holds the (non-quantized) weights in, which ``from_pretrained`` loads them in."""
    if s.peft is not None or s.precision.endswith("-true") or s.framework == "deepspeed":
        return "bfloat16" if s.precision.startswith("bf16") else ("float16" if s.precision.startswith("fp16")
                                                                  else "float32")
    return "float32"  # autocast mixed precision / FSDP: fp32 parameters are the master copy


def casts_after_load(s: TrainSetup, lc: ResolvedLifecycle) -> bool:
    """``lifecycle.load_dtype: fp32`` for weights held in half precision: loaded in fp32, then cast (the
    estimate's fp32-cast load, ``analytic/lifecycle/load.py`` ``load_mode``; a sharded or quantized load ignores
    it there, so here too)."""
    return (lc.load_dtype == "fp32" and held_dtype(s) != "float32" and s.quantization == "none"
            and not lc.sharded and s.offload != "optimizer+params")


def model_init_kwargs(s: TrainSetup, lifecycle: ResolvedLifecycle | None = None) -> dict[str, Any]:
    """Keyword arguments for ``AutoModelForCausalLM.from_pretrained`` (quantization config given apart).

    ``dtype``: the dtype the step holds the weights in, or float32 under ``lifecycle.load_dtype: fp32`` (the
    launch README's snippet then casts, as the estimate assumed).  ``device_map``: ``{"": 0}`` on one GPU when
    the scenario loads a non-quantized, unsharded model onto the GPU (``lifecycle.device_map: auto``); with
    several processes the snippet gives each its own GPU (``{"": local rank}``), since transformers'
    ``device_map="auto"`` would split one model over every visible GPU (``infer_auto_device_map``), which is
    not what the estimate counts.  A bitsandbytes model needs none: transformers gives it
    ``{"": current_device}`` (``Bnb4BitHfQuantizer.update_device_map``), the estimate's default."""
    lc = lifecycle or resolve_lifecycle(s)
    attn = attn_implementation(s)
    kw: dict[str, Any] = {"dtype": "float32" if casts_after_load(s, lc) else held_dtype(s),
                          "attn_implementation": attn}
    if loads_onto_gpu(s, lc) and s.num_gpus == 1:
        kw["device_map"] = {"": 0}
    return kw


def attn_implementation(s: TrainSetup) -> str:
    """transformers' ``attn_implementation`` for ``train.attention`` (flash: the flash-attention-2 kernels, which
    variable-length packing needs)."""
    return {"eager": "eager", "flash": "flash_attention_2"}.get(s.attention, "sdpa")


def loads_onto_gpu(s: TrainSetup, lc: ResolvedLifecycle) -> bool:
    """The scenario asks for a device map the library would not set by itself (see ``model_init_kwargs``)."""
    return lc.device_map == "auto" and s.quantization == "none" and not lc.sharded


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
