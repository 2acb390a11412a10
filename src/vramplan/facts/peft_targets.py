"""PEFT's default LoRA targets per model type, as data (``train.peft.target_modules: null``).

``LoraConfig(target_modules=None)`` is completed by ``peft.tuners.tuners_utils.BaseTuner._prepare_adapter_config``
from ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_config["model_type"]]``; a model type absent from
that table raises ``ValueError("Please specify `target_modules` in `peft_config`")``.  The rows below are that
table as peft 0.21.2 ships it (``peft/utils/constants.py``), every row but Gemma 4's, which is a regular
expression over a multimodal wrapper (no family here has that model type).  The encoder-only rows (BERT and its
kin: ``query``, ``value``) are kept: a BERT scenario is estimated, and PEFT completes its targets.

So a scenario that names no targets gets the modules PEFT itself would adapt: Falcon, GPT-NeoX and BLOOM their
fused ``query_key_value``, GPT-2 its ``c_attn``, Phi-2 ``q_proj``, ``v_proj``, ``fc1`` and ``fc2`` (its MLP too),
T5 ``q`` and ``v``.  A model type PEFT has no default for keeps ``q_proj``/``v_proj`` where the model has them,
stated as an assumption (PEFT would raise: the real script must have named its targets), and is refused where
it has not.
"""

from __future__ import annotations

__all__ = ["PEFT_RELEASE", "UNMAPPED_FALLBACK", "completed_targets", "default_lora_targets"]

PEFT_RELEASE = "0.21.2"

# peft 0.21.2 peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (lines 67-108), but gemma4
_LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "t5": ("q", "v"),
    "mt5": ("q", "v"),
    "bart": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",),
    "bloom": ("query_key_value",),
    "blip-2": ("q", "v", "q_proj", "v_proj"),
    "opt": ("q_proj", "v_proj"),
    "gptj": ("q_proj", "v_proj"),
    "gpt_neox": ("query_key_value",),
    "gpt_neo": ("q_proj", "v_proj"),
    "bert": ("query", "value"),
    "roberta": ("query", "value"),
    "xlm-roberta": ("query", "value"),
    "electra": ("query", "value"),
    "deberta-v2": ("query_proj", "value_proj"),
    "deberta": ("in_proj",),
    "layoutlm": ("query", "value"),
    "llama": ("q_proj", "v_proj"),
    "llama4": ("q_proj", "v_proj"),
    "chatglm": ("query_key_value",),
    "gpt_bigcode": ("c_attn",),
    "mpt": ("Wqkv",),
    "RefinedWebModel": ("query_key_value",),
    "RefinedWeb": ("query_key_value",),
    "falcon": ("query_key_value",),
    "btlm": ("c_proj", "c_attn"),
    "codegen": ("qkv_proj",),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "stablelm": ("q_proj", "v_proj"),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "nemotron_h": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "rwkv": ("key", "value", "receptance", "output"),
    "rwkv7": ("r_proj", "k_proj", "v_proj", "o_proj", "key", "value"),
}

# what a model type without a PEFT default keeps, where the model has these modules (stated as an assumption)
UNMAPPED_FALLBACK: tuple[str, ...] = ("q_proj", "v_proj")


def default_lora_targets(model_type: str) -> tuple[str, ...] | None:
    """The targets PEFT adapts when ``target_modules`` is not given, or None where PEFT has no default.

    >>> default_lora_targets("falcon")
    ('query_key_value',)
    >>> default_lora_targets("qwen2_moe") is None
    True
    """
    return _LORA_TARGETS.get(model_type)


def completed_targets(target_modules: list[str] | str | None, default: tuple[str, ...] | None) -> list[str] | str:
    """``target_modules`` as given, or (null) the model type's PEFT default (``ModelSpec.peft_default_targets``),
    or the assumed fallback: what a consumer that reads a scenario not completed by ``catalog.resolve`` adapts."""
    if target_modules is not None:
        return target_modules
    return list(default or UNMAPPED_FALLBACK)
