"""Gemma 3 as a vision-language model (``model_type: gemma3``, ``Gemma3ForConditionalGeneration``).

transformers 5.24 ``models/gemma3/modeling_gemma3.py``: ``Gemma3Model`` holds ``vision_tower``
(``AutoModel.from_config(config.vision_config)``, a ``SiglipVisionModel``), ``multi_modal_projector``
(``Gemma3MultiModalProjector``) and ``language_model`` (``Gemma3TextModel``); the LM head is tied to the
text embeddings (``_tied_weights_keys``).  The language model is the ``gemma3_text`` Llama-like variant,
built from ``text_config`` with ``Gemma3TextConfig``'s defaults for the keys a checkpoint leaves out
(``configuration_gemma3.py``: vocab_size 262208, num_attention_heads 8, num_key_value_heads 4,
head_dim 256); the vision tower follows ``models/siglip/modeling_siglip.py`` (``SiglipVisionConfig``
defaults: 3 channels, ``layer_norm_eps`` 1e-6, ``vision_use_head`` True).

The tower, as ``SiglipVisionModel`` builds it (its tensors directly under ``vision_tower.``: 5.24 has no
``vision_model`` wrapper):

- ``embeddings.patch_embedding``: ``Conv2d(3, d, patch, stride=patch)`` with a bias;
- ``embeddings.position_embedding``: ``Embedding((image // patch)^2, d)``;
- per layer (``SiglipEncoderLayer``): ``layer_norm1``, ``self_attn.{q,k,v,out}_proj`` (biased, d x d),
  ``layer_norm2``, ``mlp.fc1`` (d -> i), ``mlp.fc2`` (i -> d), all with biases; LayerNorms with bias;
- ``post_layernorm``; the attention-pooling head only with ``vision_use_head`` (Gemma 3 sets it False).

The projector: ``mm_input_projection_weight`` (d_vision x d_text, no bias) and ``mm_soft_emb_norm`` (a
Gemma RMSNorm of d_vision); its ``AvgPool2d`` pools the (image/patch)^2 patch outputs to
``mm_tokens_per_image`` tokens (default 256, ``Gemma3Config``).  ``Gemma3Processor`` (``processing_gemma3.py``,
``image_seq_length`` 256) writes each image into the text as ``"\\n\\n" + <start_of_image> + 256 x
<image_soft_token> + <end_of_image> + "\\n\\n"``.

The tower's tensors take the roles "other" (weights), "norm" and "bias": they hold weights, gradients and
optimizer states like every parameter, but are not given adapters (docs/models.md, Vision-language models, lists
what is not modelled); the ``nn.Linear`` weights among them are listed in ``VisionSpec.linears``, quantized with
the language model's linears where the quantizer reaches them (spec/vision_quant.py).  The projector's
``mm_input_projection_weight`` is a bare Parameter (a matmul, not an ``nn.Linear``): never quantized.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import (
    OUTER_KEYS,
    Config,
    Family,
    Params,
    build_spec,
    get,
    held_tower_states,
    inherit_outer,
    non_null,
    square_side,
)
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, Traits, VisionSpec

__all__ = ["GEMMA3", "siglip_tower", "vit_encoder_layers"]

# Gemma3TextConfig defaults (transformers 5.24 configuration_gemma3.py) for keys the multimodal checkpoints'
# sparse text_config leaves out (google/gemma-3-4b-it names only hidden_size, intermediate_size,
# num_hidden_layers, rope_scaling and sliding_window)
_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                                  "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                                  "max_position_embeddings": 131_072, "query_pre_attn_scalar": 256,
                                  "sliding_window": 4096, "model_type": "gemma3_text"}
# SiglipVisionConfig defaults (configuration_siglip.py)
_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                    "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
                                    "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True}
# SiglipVisionModel in transformers 5.24 holds the embeddings, encoder and post_layernorm directly (no
# ``vision_model`` wrapper: on the meta device, ``model.vision_tower.embeddings.patch_embedding.weight``)
PREFIX = "vision_tower"


def vit_encoder_layers(p: Params, enc: str, d: int, i: int, n: int) -> None:
    """``n`` ViT encoder layers of width ``d`` and MLP width ``i`` under ``enc`` (SigLIP's and CLIP's
    ``EncoderLayer``: biased q/k/v/out projections, fc1 -> activation -> fc2, two biased LayerNorms)."""
    for name, fan_in, fan_out in (("self_attn.q_proj", d, d), ("self_attn.k_proj", d, d), ("self_attn.v_proj", d, d),
                                  ("self_attn.out_proj", d, d), ("mlp.fc1", d, i), ("mlp.fc2", i, d)):
        # role "other" with no in/out features: not adapted (module docstring); quantized as an nn.Linear
        p.vision_linear(f"{enc}.{name}", fan_in, fan_out, per_layer=n)
    for name in ("layer_norm1", "layer_norm2"):
        p.add(f"{enc}.{name}.weight", d, "norm", per_layer=n)
        p.add(f"{enc}.{name}.bias", d, "bias", per_layer=n)


def siglip_tower(p: Params, vc: Config, prefix: str = PREFIX) -> dict[str, int]:
    """Add a ``SiglipVisionTransformer``'s tensors to ``p``; returns its sizes (d, layers, heads, i, image,
    patch, patches per image)."""
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_attention_heads"))
    image, patch, ch = square_side(get(vc, "image_size")), square_side(get(vc, "patch_size")), int(get(vc, "num_channels"))
    patches = (image // patch) ** 2
    p.add(f"{prefix}.embeddings.patch_embedding.weight", d * ch * patch * patch, "other")
    p.add(f"{prefix}.embeddings.patch_embedding.bias", d, "bias")
    p.add(f"{prefix}.embeddings.position_embedding.weight", patches * d, "other")
    vit_encoder_layers(p, f"{prefix}.encoder.layers", d, i, n)
    p.add(f"{prefix}.post_layernorm.weight", d, "norm")
    p.add(f"{prefix}.post_layernorm.bias", d, "bias")
    if bool(get(vc, "vision_use_head")):
        # SiglipMultiheadAttentionPoolingHead: probe [1, 1, d], nn.MultiheadAttention (in_proj d -> 3d and
        # out_proj d -> d, biased), a LayerNorm and a SiglipMLP
        head = f"{prefix}.head"
        p.add(f"{head}.probe", d, "other")
        p.add(f"{head}.attention.in_proj_weight", 3 * d * d, "other")
        p.add(f"{head}.attention.in_proj_bias", 3 * d, "bias")
        p.add(f"{head}.attention.out_proj.weight", d * d, "other")
        p.add(f"{head}.attention.out_proj.bias", d, "bias")
        p.add(f"{head}.layernorm.weight", d, "norm")
        p.add(f"{head}.layernorm.bias", d, "bias")
        # the MLP's fc1/fc2 are nn.Linear; the attention's in_proj is a bare Parameter and its out_proj a
        # NonDynamicallyQuantizableLinear, which bitsandbytes' ``type(module) is nn.Linear`` test leaves alone
        p.vision_linear(f"{head}.mlp.fc1", d, i)
        p.vision_linear(f"{head}.mlp.fc2", i, d)
    return {"d": d, "layers": n, "heads": heads, "i": i, "image": image, "patch": patch, "patches": patches,
            "channels": ch}


# SiglipEncoderLayer as the activation model reads it: pre-norm LayerNorms, biased q/k/v/out_proj, a non-gated
# MLP fc1 -> gelu_pytorch_tanh -> fc2, no dropout (SiglipVisionConfig attention_dropout 0.0, no hidden dropout)
TOWER_TRAITS = Traits(qkv_modules=("q_proj", "k_proj", "v_proj"), out_proj_module="out_proj", fc_modules=("fc1", "fc2"))


def tower_layer_spec(t: dict[str, int], act: str, name: str) -> ModelSpec:
    """One SigLIP encoder layer's shape (no parameters: they are the outer model's), for the activation model."""
    return build_spec({}, f"{name} vision tower", "siglip_vision_model", Params(), hidden_size=t["d"],
                      num_layers=t["layers"], num_attention_heads=t["heads"], num_kv_heads=t["heads"],
                      vocab_size=1, intermediate_size=t["i"], hidden_act=act, position="learned",
                      tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
                      max_position_embeddings=t["patches"], encoder_only=True, traits=TOWER_TRAITS)


def _text_config(cfg: Config) -> dict[str, Any]:
    """``text_config`` with Gemma3TextConfig's defaults, inheriting the outer tie/dtype/quantization keys."""
    text = dict(_TEXT_DEFAULTS)
    text.update(non_null(cfg.get("text_config")))
    text["model_type"] = "gemma3_text"
    inherit_outer(text, cfg, ("tie_word_embeddings", *OUTER_KEYS))
    return text


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text = LLAMA_FAMILIES["gemma3_text"].build(_text_config(cfg), "gemma3_text", name)
    vc = {**_VISION_DEFAULTS, **non_null(cfg.get("vision_config"))}
    p = Params()
    t = siglip_tower(p, vc)
    tokens = int(cfg.get("mm_tokens_per_image", 256))
    side, per_side = t["image"] // t["patch"], int(tokens**0.5)
    if per_side * per_side != tokens or side % per_side:
        # Gemma3MultiModalProjector pools with kernel (image / patch) // sqrt(mm_tokens_per_image)
        raise ValueError(f"mm_tokens_per_image {tokens} does not pool {side} x {side} patches evenly")
    p.add("multi_modal_projector.mm_input_projection_weight", t["d"] * text.hidden_size, "other")
    p.add("multi_modal_projector.mm_soft_emb_norm.weight", t["d"], "norm")
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=tokens, hidden_act=str(vc["hidden_act"]),
                        source="transformers 5.24 Gemma3MultiModalProjector (AvgPool2d to mm_tokens_per_image) "
                               "and Gemma3Processor (image_seq_length 256)",
                        tower=tower_layer_spec(t, str(vc["hidden_act"]), name), num_channels=t["channels"],
                        # post_layernorm, then AvgPool2d saves its input (the norm's output, residual dtype)
                        head_saved_per_patch=(("norm", 1), ("residual", t["d"])), linears=tuple(p.vision_linears),
                        # Gemma3Processor's full_image_sequence: "\n\n" <start_of_image> ... <end_of_image> "\n\n"
                        # ("\n\n" one token: vLLM gemma3_mm.py vocab["\n\n"]); pan-and-scan off by default
                        fixed_image_profile=True, image_wrap_tokens=4,
                        # SiglipVisionTransformer.forward binds the embeddings' output through the encoder's layers
                        kept_hidden_states=held_tower_states(t["layers"]))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision)


GEMMA3 = Family(build, "modeling_gemma3.py", required=(("vision_config",), ("text_config",)),
                text_model_type="gemma3_text")
