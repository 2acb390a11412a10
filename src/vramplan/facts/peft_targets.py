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

from dataclasses import dataclass

__all__ = ["LITGPT_LORA_DEFAULT", "LITGPT_LORA_SOURCE", "MOE_PATTERNS", "MOE_ROUTER_MODULES", "PEFT_RELEASE",
           "TORCHTUNE_LORA_RECIPE", "TORCHTUNE_LORA_SOURCE", "UNMAPPED_FALLBACK", "MoePattern", "completed_targets",
           "default_lora_targets", "moe_pattern", "router_kind"]

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

# ---- LoRA targets on transformers 5's fused MoE experts ----
#
# transformers 5 holds the routed experts as 3-D parameters of one ``...Experts`` module (``gate_up_proj``
# [E, 2I, h], ``down_proj`` [E, h, I]) and the router as a ``...TopKRouter`` module that holds a ``weight``
# parameter: neither is an ``nn.Linear``, so a ``target_modules`` entry naming them adapts nothing (an expert
# parameter is no module: peft skips the name, or raises ``NoMatchingPeftModuleError`` when no target matches) or
# is refused (the experts or router module itself: peft 0.21 ``_create_new_module`` raises "Target module ... is not
# supported").  peft converts the 4.x names into ``target_parameters`` (peft's ``ParamWrapper``) only for the model
# types transformers' ``conversion_mapping._MODEL_TO_CONVERSION_PATTERN`` maps to a pattern, plus "mixtral", which
# peft adds itself (peft 0.21.2 utils/transformers_weight_conversion.py lines 44-45, ``_convert_peft_config_moe``
# line 414: ``_MODEL_TO_CONVERSION_PATTERN.get(model_type)``).  The base pattern "qwen2_moe" is not a key of that
# table, so Qwen2-MoE's own experts are not converted: its ``gate_proj``/``up_proj``/``down_proj`` targets adapt the
# shared expert only.  Checked against peft 0.21.2 on transformers 5.24 (tests/test_moe_lora_targets.py builds each
# family on the meta device and counts peft's adapters).


@dataclass(frozen=True)
class MoePattern:
    """One row of peft's ``_MOE_TARGET_MODULE_MAPPING`` / ``_MOE_FUSED_TARGETS`` (0.21.2 lines 332-352): the 4.x
    names that become ``target_parameters`` of the fused experts.  ``gate_up``: the two names fused into
    ``gate_up_proj`` (both or neither: peft raises "Cannot convert PEFT target(s) ... without also targeting ...");
    ``down``: the name of ``down_proj``; ``router``: the router module's name (its ``weight`` becomes the target)."""

    gate_up: tuple[str, str]
    down: str
    router: str = "gate"

    @property
    def names(self) -> frozenset[str]:
        return frozenset((*self.gate_up, self.down, self.router))


MOE_PATTERNS: dict[str, MoePattern] = {
    "mixtral": MoePattern(gate_up=("w1", "w3"), down="w2"),
    "qwen2_moe": MoePattern(gate_up=("gate_proj", "up_proj"), down="down_proj"),
}

# transformers 5.24 conversion_mapping.py ``_MODEL_TO_CONVERSION_PATTERN`` (lines 48-78), the MoE rows of the model
# types vramplan has a family for, plus peft's "mixtral"; every other MoE family's expert targets are not converted
_MOE_CONVERSION: dict[str, str] = {
    "mixtral": "mixtral", "minimax": "mixtral",
    **dict.fromkeys(("deepseek_v2", "deepseek_v3", "ernie4_5_moe", "glm4_moe", "qwen3_moe", "qwen3_omni_moe",
                     "qwen3_next", "hunyuan_v1_moe", "olmoe"), "qwen2_moe"),
}

# the router of each MoE family in transformers 5.24 that is not a plain ``nn.Linear``, as ``model.named_modules()``
# lists it on the meta device: (leaf name, class, kind).  kind "module": a module holding a ``weight`` parameter,
# which peft refuses as a target (``_create_new_module``: "Target module ... is not supported") and ``all-linear``
# (``_maybe_include_all_linear_layers``: ``isinstance(module, nn.Linear)``) leaves out; kind "tuple": an
# ``nn.Linear`` subclass whose forward returns a tuple (``PhimoeTopKRouter.forward`` returns logits, weights and
# experts; ``Llama4Router.forward`` scores and logits), which peft wraps in ``lora.Linear`` and whose first forward
# then fails (lora/layer.py ``Linear.forward``: ``torch_result_dtype = result.dtype``, AttributeError on the tuple;
# run on the CPU with peft 0.21.2 and transformers 5.24).  DBRX's and HunYuan's routers hold an ``nn.Linear``
# (``router.layer``, ``gate.wg``) that is adapted like any linear.
MOE_ROUTER_MODULES: dict[str, tuple[str, str, str]] = {
    "mixtral": ("gate", "MixtralTopKRouter", "module"), "qwen2_moe": ("gate", "Qwen2MoeTopKRouter", "module"),
    "qwen3_moe": ("gate", "Qwen3MoeTopKRouter", "module"), "olmoe": ("gate", "OlmoeTopKRouter", "module"),
    "deepseek_v2": ("gate", "DeepseekV2TopkRouter", "module"), "deepseek_v3": ("gate", "DeepseekV3TopkRouter", "module"),
    "glm4_moe": ("gate", "Glm4MoeTopkRouter", "module"), "ernie4_5_moe": ("gate", "Ernie4_5_MoeTopKRouter", "module"),
    "qwen3_next": ("gate", "Qwen3NextTopKRouter", "module"), "minimax": ("gate", "MiniMaxTopKRouter", "module"),
    "qwen3_omni_moe": ("gate", "Qwen3OmniMoeThinkerTextTopKRouter", "module"),
    "gpt_oss": ("router", "GptOssTopKRouter", "module"), "jamba": ("router", "JambaTopKRouter", "module"),
    "granitemoe": ("router", "GraniteMoeTopKRouter", "module"),
    "granitemoehybrid": ("router", "GraniteMoeHybridTopKRouter", "module"),
    "nemotron_h": ("gate", "NemotronHTopkRouter", "module"),
    "phimoe": ("router", "PhimoeTopKRouter", "tuple"), "llama4": ("router", "Llama4Router", "tuple"),
}


def router_kind(model_type: str, module: str) -> str:
    """"module", "tuple" (``MOE_ROUTER_MODULES``) or "" (a plain ``nn.Linear``) for a router-role module.

    >>> router_kind("qwen3_moe", "gate"), router_kind("phimoe", "router"), router_kind("dbrx", "layer")
    ('module', 'tuple', '')
    """
    held = MOE_ROUTER_MODULES.get(model_type)
    return held[2] if held is not None and held[0] == module else ""


def moe_pattern(model_type: str) -> MoePattern | None:
    """The conversion peft applies to a MoE model type's LoRA targets on transformers 5, or None.

    >>> moe_pattern("qwen3_moe").down
    'down_proj'
    >>> moe_pattern("qwen2_moe") is None
    True
    """
    name = _MOE_CONVERSION.get(model_type)
    return MOE_PATTERNS[name] if name else None


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
