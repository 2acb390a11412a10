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
it has not.  Lit-GPT and torchtune adapt their own modules: ``LITGPT_LORA_DEFAULT`` and ``TORCHTUNE_LORA_RECIPE``
below (spec/load.py ``lora_targets_for``).
"""

from __future__ import annotations

__all__ = ["LITGPT_LORA_DEFAULT", "LITGPT_LORA_SOURCE", "PEFT_RELEASE", "TORCHTUNE_LORA_RECIPE",
           "TORCHTUNE_LORA_SOURCE", "UNMAPPED_FALLBACK", "completed_targets", "default_lora_targets"]

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


# Frameworks with LoRA of their own: PEFT's table above does not apply to them.
#
# Lit-GPT (framework: lightning): ``finetune/lora.py`` defaults lora_query=True, lora_key=False, lora_value=True,
# lora_projection=False, lora_mlp=False, lora_head=False (lit-gpt 8641822 lines 49-54, module-level settings;
# litgpt v0.3.1 ``setup`` lines 50-55 and v0.5.13 lines 59-64, the same defaults): the query and the value parts of
# its fused ``attn.attn`` (``LoRAQKVLinear`` with ``enable_lora=(True, False, True)``), which transformers' layout
# names q_proj and v_proj where a model has them.
LITGPT_LORA_DEFAULT: tuple[str, ...] = ("q_proj", "v_proj")
LITGPT_LORA_SOURCE = ("Lit-GPT's finetune/lora.py defaults lora_query and lora_value (lit-gpt 8641822; litgpt v0.3.1 "
                      "to v0.5.13)")
# torchtune: every LoRA model builder takes ``lora_attn_modules: List[LORA_ATTN_MODULES]`` with no default (53
# builders under torchtune/models at v0.6.1, e.g. llama3_1/_model_builders.py ``lora_llama3_1_8b`` line 85), so a
# recipe config always names them; 89 of the 91 LoRA configs at v0.6.1 name ['q_proj', 'v_proj', 'output_proj'] with
# ``apply_lora_to_mlp: True`` (e.g. recipes/configs/llama3_1/8B_lora_single_device.yaml lines 24-25): transformers'
# names q_proj, v_proj, o_proj and the MLP's gate_proj, up_proj, down_proj (torchtune's w1, w3, w2).
TORCHTUNE_LORA_RECIPE: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TORCHTUNE_LORA_SOURCE = ("torchtune's LoRA builders take lora_attn_modules with no default (v0.6.1 "
                         "torchtune/models/*/_model_builders.py); its recipe configs name "
                         "['q_proj', 'v_proj', 'output_proj'] with apply_lora_to_mlp: True")


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
