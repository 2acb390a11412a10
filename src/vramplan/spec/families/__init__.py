"""Model families: one adapter per family, turning a Hugging Face ``config.json`` into a ``ModelSpec``.

The layout follows torchtitan's ``torchtitan/models/``: one module per family (each names the transformers
``modeling_*.py`` it follows), and one registry, ``FAMILIES`` (``model_type`` -> ``Family``), that replaces an
if-chain.  What a family does differently at run time is written once, as ``Traits`` set by its adapter; the
engines read the traits and never the family's name.  ``docs/checklists/model-family.md`` lists every file a
new family needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramplan.spec.families.bamba import BAMBA
from vramplan.spec.families.bart import BART
from vramplan.spec.families.base import KEY_ALIASES, Family, inherit_outer
from vramplan.spec.families.bert import BERT
from vramplan.spec.families.bloom import BLOOM
from vramplan.spec.families.dbrx import DBRX
from vramplan.spec.families.falcon import FALCON
from vramplan.spec.families.falcon_h1 import FALCON_H1
from vramplan.spec.families.gated_layernorm import COHERE, COHERE2, OLMO, STABLELM
from vramplan.spec.families.gemma3 import GEMMA3
from vramplan.spec.families.gemma3n import GEMMA3N, GEMMA3N_TEXT
from vramplan.spec.families.gpt2 import GPT2, GPT_BIGCODE
from vramplan.spec.families.gptj import GPTJ
from vramplan.spec.families.granitemoehybrid import GRANITEMOEHYBRID
from vramplan.spec.families.idefics3 import IDEFICS3, SMOLVLM
from vramplan.spec.families.internvl import INTERNVL
from vramplan.spec.families.jamba import JAMBA
from vramplan.spec.families.lfm2 import LFM2
from vramplan.spec.families.llama4 import LLAMA4, LLAMA4_TEXT
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.families.llava import LLAVA
from vramplan.spec.families.llava_next import LLAVA_NEXT
from vramplan.spec.families.mamba import FALCON_MAMBA, MAMBA
from vramplan.spec.families.mamba2 import MAMBA2
from vramplan.spec.families.minimax import MINIMAX
from vramplan.spec.families.mistral3 import MISTRAL3
from vramplan.spec.families.mllama import MLLAMA
from vramplan.spec.families.nemotron_h import NEMOTRON_H
from vramplan.spec.families.neox import GPT_NEOX
from vramplan.spec.families.opt import OPT
from vramplan.spec.families.paligemma import PALIGEMMA
from vramplan.spec.families.phi import PHI
from vramplan.spec.families.phi4_multimodal import PHI4_MULTIMODAL
from vramplan.spec.families.qwen2_5_vl import QWEN2_5_VL
from vramplan.spec.families.qwen2_vl import QWEN2_VL
from vramplan.spec.families.qwen3_next import QWEN3_NEXT
from vramplan.spec.families.qwen3_omni_moe import QWEN3_OMNI_MOE
from vramplan.spec.families.qwen3_vl import QWEN3_VL, QWEN3_VL_MOE
from vramplan.spec.families.recurrent_gemma import RECURRENT_GEMMA
from vramplan.spec.families.rwkv import RWKV
from vramplan.spec.families.starcoder2 import STARCODER2
from vramplan.spec.families.t5 import MT5, T5, UMT5
from vramplan.spec.families.whisper import WHISPER
from vramplan.spec.families.zamba2 import ZAMBA2

__all__ = ["FAMILIES", "KEY_ALIASES", "Family", "flatten_text_config", "torchtitan_model", "transformers_config",
           "typed_for_transformers"]

FAMILIES: dict[str, Family] = {
    **LLAMA_FAMILIES,
    "gpt2": GPT2, "gpt_bigcode": GPT_BIGCODE, "gptj": GPTJ, "gpt_neox": GPT_NEOX, "falcon": FALCON,
    "bloom": BLOOM, "opt": OPT, "bert": BERT, "phi": PHI, "starcoder2": STARCODER2,
    "stablelm": STABLELM, "cohere": COHERE, "olmo": OLMO, "cohere2": COHERE2,
    # nested attn_config / ffn_config, fused Wqkv, experts as 2-D parameters (training refused: spec/checks.py)
    "dbrx": DBRX,
    # vision-language: the outer config with its vision_config (flatten_text_config keeps it whole)
    "gemma3": GEMMA3, "qwen2_5_vl": QWEN2_5_VL, "llava": LLAVA, "qwen2_vl": QWEN2_VL,
    "llava_next": LLAVA_NEXT, "paligemma": PALIGEMMA, "mistral3": MISTRAL3, "idefics3": IDEFICS3, "smolvlm": SMOLVLM,
    "qwen3_vl": QWEN3_VL, "qwen3_vl_moe": QWEN3_VL_MOE, "internvl": INTERNVL,
    # a Thinker (language model, vision tower, audio encoder) and, with enable_audio_output, a talker and Code2Wav
    # held beside it: the Thinker's generate and PEFT training estimated, full fine-tuning and serving refused
    # (Traits.held_modules)
    "qwen3_omni_moe": QWEN3_OMNI_MOE,
    # Phi-4-multimodal: a Phi-3 language model, a SigLIP tower with dynamic crops and a conformer audio encoder in
    # embed_tokens_extend (audio input not modelled)
    "phi4_multimodal": PHI4_MULTIMODAL,
    # cross-attention to the image (Llama 3.2 Vision): parameters only, every task refused (spec/checks.py)
    "mllama": MLLAMA,
    # Llama 4: experts run on every token, chunked local attention, a tiled image path: parameters counted, the
    # tasks that depend on those refused (spec/checks.py unmodelled_layer_problems)
    "llama4_text": LLAMA4_TEXT, "llama4": LLAMA4,
    # hybrid: Mamba2 mixers beside attention layers (ModelSpec.mamba)
    "bamba": BAMBA,
    "granitemoehybrid": GRANITEMOEHYBRID,
    "nemotron_h": NEMOTRON_H,
    # attention and a Mamba2 mixer side by side in every layer (MambaSpec.parallel_attention)
    "falcon_h1": FALCON_H1,
    # a Mamba2 mixer in every layer, shared transformer blocks run ahead of the mixer in some (MambaSpec.shared_attention_layers)
    "zamba2": ZAMBA2,
    # RG-LRU recurrent blocks and local attention (Griffin): their state on the modules (MambaSpec.kind "rg_lru",
    # Traits.module_state); generate estimated, training and serving refused (spec/checks.py _rg_lru_problems)
    "recurrent_gemma": RECURRENT_GEMMA,
    # lightning (linear) attention interleaved with softmax attention, MoE: its state in MiniMaxCache (MambaSpec.kind
    # "lightning", Traits.cache_class); generate estimated, training and serving refused (spec/checks.py _lightning_problems)
    "minimax": MINIMAX,
    # Gemma 3n: AltUp streams, per-layer embeddings, KV-cache sharing, LAuReL, a MobileNetV5 vision tower and a
    # conformer audio tower: parameters counted, every task refused (Traits.unmodelled_mixer)
    "gemma3n_text": GEMMA3N_TEXT, "gemma3n": GEMMA3N,
    # hybrid: Mamba-1 mixers beside attention layers, dense and mixture-of-experts MLPs (MambaSpec.kind "mamba1")
    "jamba": JAMBA,
    # hybrid: Gated DeltaNet linear-attention layers beside gated full attention, experts with a shared expert
    # (MambaSpec.kind "gated_deltanet")
    "qwen3_next": QWEN3_NEXT,
    # hybrid: gated short-convolution blocks beside grouped-query attention (MambaSpec.kind "short_conv")
    "lfm2": LFM2,
    # state-space: a mixer in every layer, no attention, no MLP (ModelSpec.mamba covering every layer)
    "mamba2": MAMBA2, "mamba": MAMBA, "falcon_mamba": FALCON_MAMBA,
    # attention-free: RWKV-4's time-mixing wkv recurrence and channel-mixing feed-forward in every block, its state
    # passed as ``state`` (MambaSpec.kind "rwkv4", Traits.state_argument)
    "rwkv": RWKV,
    # encoder-decoder: an encoder stack and a decoder stack with cross-attention (ModelSpec.encoder_decoder)
    "t5": T5, "mt5": MT5, "umt5": UMT5, "bart": BART,
    # a speech encoder (log-mel features through two convolutions) and a text decoder (EncoderDecoderSpec.audio)
    "whisper": WHISPER,
}


def flatten_text_config(cfg: Mapping[str, Any], default_type: str | None = None) -> dict[str, Any]:
    """Multimodal configs (Gemma 3, Llama 4, Mistral 3) nest the language model in ``text_config``.

    The text config inherits the outer ``tie_word_embeddings``, ``torch_dtype`` and ``quantization_config``;
    Gemma 3's outer ``model_type`` "gemma3" names the multimodal class, its language model is "gemma3_text"
    (``default_type`` also names a text config without a model_type).  A config with a ``vision_config`` whose
    outer ``model_type`` is a registered family (``gemma3``, ``qwen2_5_vl``) is kept whole for ``model_from_config`` (no
    ``default_type``): its adapter builds the vision tower too; ``transformers_config`` (which passes a
    ``default_type``) still takes the language model alone.
    """
    out = dict(cfg)
    if default_type is None and cfg.get("model_type") in FAMILIES and isinstance(cfg.get("vision_config"), Mapping):
        return out  # a vision-language family whose adapter builds the tower and the language model together
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in cfg and "n_embd" not in cfg:
        merged = dict(text)
        for k in ("tie_word_embeddings", "torch_dtype", "quantization_config"):
            if k in cfg and k not in merged:
                merged[k] = cfg[k]
        out = merged
        kind = out.get("model_type") or default_type
        out["model_type"] = "gemma3_text" if kind == "gemma3" else kind
    return out


def transformers_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` as transformers' ``AutoConfig.for_model(**cfg)`` takes it: the language model of a
    multimodal config, the ``model_type`` of the transformers classes that build the family
    (``Family.transformers_model_type``), without the null keys its configuration class rejects."""
    outer = FAMILIES.get(str(cfg.get("model_type")))
    if outer is not None and outer.nested_config and isinstance(cfg.get(outer.nested_config), Mapping):
        # Qwen3-Omni: the Thinker's config holds text_config and vision_config; its dtype is the checkpoint's
        cfg = {**inherit_outer(dict(cfg[outer.nested_config]), cfg), "model_type": cfg["model_type"]}
    if (outer is not None and outer.text_model_type and isinstance(cfg.get("vision_config"), Mapping)
            and isinstance(cfg.get("text_config"), Mapping)):
        # PaliGemma's outer config holds a hidden_size of its own (PaliGemmaConfig.hidden_size) beside text_config
        cfg = {k: v for k, v in cfg.items() if k != "hidden_size"}
    out = flatten_text_config(cfg, default_type="gemma3_text")
    if outer is not None and outer.text_model_type and isinstance(cfg.get("vision_config"), Mapping):
        # a vision-language model's language model alone (the traced engine's report says the tower is not traced)
        # (and Phi-4-multimodal's audio_config)
        out = {k: v for k, v in out.items() if k not in ("vision_config", "text_config", "audio_config")}
        # the text config's own model_type where it names a text family (LLaVA's language model may be a Llama,
        # a Mistral, a Qwen2), else the family's (Qwen2.5-VL's "qwen2_5_vl_text" is built as qwen2; a text_config
        # without one, left to its configuration class's defaults, is the family's too, not flatten_text_config's
        # gemma3_text default)
        inner = cfg.get("text_config")
        own = FAMILIES.get(str(inner.get("model_type") if isinstance(inner, Mapping) else out.get("model_type")))
        if own is None or own.text_model_type:
            out["model_type"] = outer.text_model_type
    rope = out.get("rope_scaling")
    if isinstance(rope, Mapping) and "mrope" in (rope.get("type"), rope.get("rope_type")):
        # Qwen2-VL's published config.json writes rope_scaling {"type": "mrope", "mrope_section": [...]}; transformers'
        # own Qwen2VLConfig.__init__ (4.45-4.57) renames "mrope" to "default" (M-RoPE is the default rotary with
        # per-section position ids), and the rope registry has no "mrope" entry (ROPE_INIT_FUNCTIONS: KeyError)
        out["rope_scaling"] = {**rope, "type": "default", "rope_type": "default"}
    fam = FAMILIES.get(str(out.get("model_type")))
    if fam is not None:
        if fam.transformers_model_type:
            out["model_type"] = fam.transformers_model_type
        for k in fam.drop_null_keys:
            if k in out and out[k] is None:
                out.pop(k)
    return typed_for_transformers(out)


def typed_for_transformers(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` with its family's ``float_keys`` written as floats (1 -> 1.0), as the family's strict
    transformers configuration class takes them; nested dictionaries on the way are copied, not changed."""
    out = dict(cfg)
    fam = FAMILIES.get(str(out.get("model_type")))
    for path in fam.float_keys if fam is not None else ():
        *outer, last = path.split(".")
        node = out
        for k in outer:
            sub = node.get(k)
            if not isinstance(sub, Mapping):
                break
            node[k] = node = dict(sub)
        else:
            value = node.get(last)
            if isinstance(value, int) and not isinstance(value, bool):
                node[last] = float(value)
    return out


def torchtitan_model(family: str) -> str | None:
    """torchtitan's model name for ``family`` (a config's ``model_type``), where torchtitan ships it."""
    fam = FAMILIES.get(family)
    return fam.torchtitan_model if fam is not None else None
