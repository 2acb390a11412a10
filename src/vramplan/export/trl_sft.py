"""TRL's supervised fine-tuning config: one YAML for ``trl sft --config trl_sft.yaml``.

The ``trl sft`` script (trl 1.16.0 ``trl/scripts/sft.py``) parses one flat YAML into ``ScriptArguments``,
``SFTConfig`` (a ``TrainingArguments`` subclass, ``trl/trainer/sft_config.py``) and ``ModelConfig``
(``trl/trainer/model_config.py``) with ``TrlParser.parse_args_and_config``; the model is
``model_name_or_path`` (a Hub id, ``hub.py``), loaded with ``ModelConfig.dtype`` and
``attn_implementation``, quantized by ``get_quantization_config`` (``load_in_4bit``, ``bnb_4bit_quant_type``,
``use_bnb_nested_quant``, compute dtype = ``dtype``) and given adapters by ``get_peft_config`` (``use_peft``,
``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``).

Keys the estimate depends on and SFTConfig sets: ``max_length`` (the sequence length; with ``packing`` the
packed length), ``packing`` (best-fit-decreasing packing, which turns on ``padding_free``: sequences
flattened with position_ids, as the scenario's ``train.packing`` models), ``activation_offloading``
(``train.activation_offload: cpu``), and the Trainer's own (batch sizes, precision, optimizer, checkpointing,
the lifecycle keys).  SFTConfig changes two Trainer defaults (``_BaseConfig``: ``gradient_checkpointing=True``,
``bf16=True`` unless fp16), so both are always written.

Loss: SFTTrainer 1.16 computes the loss with its own fused LM head (``add_fused_lm_head``: per-token
log-probabilities in tiles, without the ``(batch, seq, vocab)`` logits) and refuses Liger's fused linear
cross-entropy (``liger_kernel_config={"fused_linear_cross_entropy": True}`` raises); Liger's layer kernels
(RMSNorm, SwiGLU, RoPE) go through ``use_liger_kernel`` with ``liger_kernel_config``.  The README states what
this means for the loss the estimate counted.

``SFT_CONFIG_FIELDS`` and ``MODEL_CONFIG_FIELDS`` are those dataclasses' own fields at trl 1.16.0 (SFTConfig's
besides ``TrainingArguments``'), so the tests can check the names where trl is not installed.
"""

from __future__ import annotations

from typing import Any

from vramplan.export.hf import attn_implementation, casts_after_load, held_dtype, training_arguments_kwargs
from vramplan.export.hub import LaunchModel
from vramplan.export.lifecycle import ResolvedLifecycle, resolve_lifecycle
from vramplan.facts.quantization import quant_format
from vramplan.plan.setup import TrainSetup

__all__ = ["MODEL_CONFIG_FIELDS", "SFT_CONFIG_FIELDS", "TRL_VERSION", "trl_sft_config"]

TRL_VERSION = "1.16.0"

# trl 1.16.0 trl/trainer/sft_config.py, class SFTConfig: its fields that TrainingArguments does not have
SFT_CONFIG_FIELDS = frozenset({
    "activation_offloading", "assistant_only_loss", "chat_template_path", "completion_only_loss", "dataset_kwargs",
    "dataset_num_proc", "dataset_text_field", "eos_token", "eval_packing", "loss_type", "max_length",
    "model_init_kwargs", "packing", "packing_strategy", "pad_to_multiple_of", "pad_token", "padding_free",
    "router_aux_loss_coef", "shuffle_dataset", "truncation_mode", "trust_remote_code",
})
# trl 1.16.0 trl/trainer/model_config.py, class ModelConfig
MODEL_CONFIG_FIELDS = frozenset({
    "model_name_or_path", "model_revision", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha",
    "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save", "lora_task_type",
    "use_rslora", "use_dora", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
})


def _model_config(s: TrainSetup, model: LaunchModel, lc: ResolvedLifecycle) -> dict[str, Any]:
    kw: dict[str, Any] = {"model_name_or_path": model.name}
    if model.revision is not None:
        kw["model_revision"] = model.revision
    kw["dtype"] = "float32" if casts_after_load(s, lc) else held_dtype(s)
    kw["attn_implementation"] = attn_implementation(s)
    if s.peft is not None:
        alpha = s.lora_alpha
        # ModelConfig.lora_alpha is an int: a fractional alpha cannot be written
        if alpha != int(alpha):
            raise ValueError(f"TRL's ModelConfig.lora_alpha is an integer; lora_alpha {alpha} is not")
        targets = s.target_modules
        kw.update({"use_peft": True, "lora_r": s.lora_rank, "lora_alpha": int(alpha), "lora_dropout": s.lora_dropout,
                   "lora_target_modules": targets if isinstance(targets, str) else list(targets),
                   "lora_task_type": "CAUSAL_LM"})
    if s.quantization != "none":
        bnb = dict(quant_format(s.quantization).hf_bnb_config)
        if not bnb:
            raise ValueError(f"{s.quantization} is not a bitsandbytes format (facts/quantization.py)")
        if bnb.get("load_in_8bit"):
            kw["load_in_8bit"] = True
        else:
            kw.update({"load_in_4bit": True, "bnb_4bit_quant_type": bnb["bnb_4bit_quant_type"],
                       "use_bnb_nested_quant": bool(bnb.get("bnb_4bit_use_double_quant", False))})
    return kw


def trl_sft_config(s: TrainSetup, model: LaunchModel, loss: str = "standard", packing: bool = False,
                   liger_kernels: bool = False, activation_offload: bool = False,
                   lifecycle: ResolvedLifecycle | None = None, output_dir: str = "outputs",
                   deepspeed_file: str = "ds_config.json") -> dict[str, Any]:
    """The flat ``trl sft --config`` mapping (SFTConfig and ModelConfig keys) for a Trainer-driven setup."""
    if loss not in ("standard", "liger-fused-linear-ce"):
        raise ValueError(f"loss {loss} has no SFTConfig key")
    lc = lifecycle or resolve_lifecycle(s)
    kw = training_arguments_kwargs(s, output_dir=output_dir, deepspeed_file=deepspeed_file, lifecycle=lc)
    # SFTConfig defaults gradient_checkpointing=True and bf16=True (trl _BaseConfig): say what the estimate took
    kw.setdefault("activation_checkpointing", False)
    kw.setdefault("bf16", False)
    kw.update({"max_length": s.seq_len, "packing": packing, "activation_offloading": activation_offload})
    if packing:
        kw["packing_strategy"] = "bfd"  # best-fit decreasing, padding-free (SFTTrainer: padding_free with bfd)
    if liger_kernels:
        kw["use_liger_kernel"] = True
        kw["liger_kernel_config"] = {"fused_linear_cross_entropy": False, "cross_entropy": False,
                                     "rms_norm": True, "swiglu": True, "rope": True}
    return {**kw, **_model_config(s, model, lc)}
