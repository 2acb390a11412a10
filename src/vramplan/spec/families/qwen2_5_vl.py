"""Qwen2.5-VL (``model_type: qwen2_5_vl``, ``Qwen2_5_VLForConditionalGeneration``).

transformers 5.24 ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``: ``Qwen2_5_VLModel`` holds ``visual``
(``Qwen2_5_VisionTransformerPretrainedModel``) and ``language_model`` (``Qwen2_5_VLTextModel``, Qwen2's decoder:
q/k/v biases, RMSNorm, gated SiLU MLP, multimodal RoPE without parameters); the LM head is untied unless
``tie_word_embeddings`` (``Qwen2_5_VLConfig`` default False).  The language model is the ``qwen2`` Llama-like
variant, built from ``text_config`` (or the outer keys of a config that has none).

The vision tower (``Qwen2_5_VLVisionConfig`` defaults: 3 input channels, temporal patch 2, merge 2):

- ``patch_embed.proj``: ``Conv3d(3, d, (2, 14, 14))`` without bias;
- per block (``Qwen2_5_VLVisionBlock``, ``depth`` of them): ``norm1``, ``norm2`` (RMSNorm, weight only),
  ``attn.qkv`` (d -> 3d, biased), ``attn.proj`` (d -> d, biased), ``mlp.gate_proj`` / ``up_proj`` (d -> i) and
  ``down_proj`` (i -> d), all biased; window attention except in ``fullatt_block_indexes``, 2-D rotary
  embeddings without parameters;
- ``merger`` (``Qwen2_5_VLPatchMerger``): ``ln_q`` (RMSNorm of d), ``mlp.0`` (4d -> 4d) and ``mlp.2``
  (4d -> ``out_hidden_size``), biased, over each 2 x 2 square of patches.

Image tokens: ``Qwen2VLImageProcessor`` (``image_processing_qwen2_vl.py``) resizes each image with
``smart_resize`` (factor 28, min_pixels 56 x 56, max_pixels 28 x 28 x 1280) and the processor writes
(h / 14) x (w / 14) / 4 image tokens per image (spec/vision.py ``image_grid``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from vramplan.facts.vllm_multimodal import QWEN_VL_CHECKPOINT_MAX_PIXELS
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, inherit_outer, non_null
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, Traits, VisionSpec

__all__ = ["QWEN2_5_VL", "merger_params", "qwen_vl_start", "qwen_vl_text_config"]

# Qwen2_5_VLVisionConfig defaults (transformers 5.24 configuration_qwen2_5_vl.py)
_VISION_DEFAULTS: dict[str, Any] = {"depth": 32, "hidden_size": 3584, "hidden_act": "silu", "intermediate_size": 3420,
                                    "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
                                    "temporal_patch_size": 2, "out_hidden_size": 3584}
# Qwen2VLImageProcessor's size {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280
# a Qwen2_5_VLVisionBlock as the activation model reads it: RMSNorm, one fused biased qkv whose q and k are
# rotated into new tensors while v stays a view of its output (phi3's fused_qkv_view), proj, a gated SiLU MLP
TOWER_TRAITS = Traits(qkv_modules=("qkv",), out_proj_module="proj", fused_qkv_view=True)


def qwen_vl_text_config(cfg: Config) -> dict[str, Any]:
    """The language model's keys: ``text_config`` (transformers >= 4.53 writes one) or the outer keys."""
    inner = cfg.get("text_config")
    text = {k: v for k, v in (dict(inner) if isinstance(inner, dict) else dict(cfg)).items()
            if k not in ("vision_config", "text_config", "layer_types")}
    text["model_type"] = "qwen2"
    text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    inherit_outer(text, cfg)
    return text


def _tower(p: Params, vc: Config) -> dict[str, int]:
    d, i, n = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size")), int(get(vc, "depth"))
    ch, patch, t = int(get(vc, "in_channels")), int(get(vc, "patch_size")), int(get(vc, "temporal_patch_size"))
    merge, out = int(get(vc, "spatial_merge_size")), int(get(vc, "out_hidden_size"))
    p.add("visual.patch_embed.proj.weight", d * ch * t * patch * patch, "other")
    for name in ("norm1", "norm2"):
        p.add(f"visual.blocks.{name}.weight", d, "norm", per_layer=n)
    for name, fan_in, fan_out in (("attn.qkv", d, 3 * d), ("attn.proj", d, d), ("mlp.gate_proj", d, i),
                                  ("mlp.up_proj", d, i), ("mlp.down_proj", i, d)):
        # role "other": not adapted (as gemma3.py); quantized as nn.Linear (VisionSpec.linears)
        p.vision_linear(f"visual.blocks.{name}", fan_in, fan_out, per_layer=n)
    merger_params(p, d, merge, out, ln_bias=False)
    return {"d": d, "i": i, "layers": n, "heads": int(get(vc, "num_heads")), "channels": ch, "patch": patch,
            "temporal": t, "merge": merge}


def _notes(vc: Config, t: dict[str, int]) -> tuple[str, ...]:
    full = list(vc.get("fullatt_block_indexes") or (7, 15, 23, 31))
    side = int(vc.get("window_size", 112)) // t["patch"]
    note = (f"Qwen2.5-VL's window attention (every block but {full} attends within {side} x {side}-patch windows) "
            "is counted as attention over the whole image: the flash and memory-efficient kernels save the same "
            "tensors per patch either way (eager's scores are over-counted); the per-window outputs' "
            "concatenation and the window reordering are not counted; the 2-D rotary tables (fp32) are counted in "
            "generate's vision moment, not in training")
    return (note,)


def merger_params(p: Params, d: int, merge: int, out: int, ln_bias: bool) -> None:
    """The patch merger: ``ln_q`` over d (Qwen2.5-VL's an RMSNorm, Qwen2-VL's a LayerNorm with a bias), then a
    two-layer MLP over merge^2 patches concatenated (d merge^2 -> d merge^2 -> the language model's width)."""
    wide = d * merge * merge
    p.add("visual.merger.ln_q.weight", d, "norm")
    if ln_bias:
        p.add("visual.merger.ln_q.bias", d, "bias")
    p.vision_linear("visual.merger.mlp.0", wide, wide)
    p.vision_linear("visual.merger.mlp.2", wide, out)


def qwen_vl_start(cfg: Config, name: str, defaults: Config,
                  tower_params: Callable[[Params, dict[str, Any]], dict[str, int]]
                  ) -> tuple[ModelSpec, dict[str, Any], Params, dict[str, int], int, int]:
    """What Qwen2-VL and Qwen2.5-VL build alike: the language model, the vision config over its defaults, the
    tower's tensors (``tower_params``), and the largest image ``smart_resize`` lets through (``max_pixels`` as a
    square, a multiple of patch x merge a side) with its patches."""
    text = LLAMA_FAMILIES["qwen2"].build(qwen_vl_text_config(cfg), "qwen2", name)
    vc = {**defaults, **non_null(cfg.get("vision_config"))}
    p = Params()
    t = tower_params(p, vc)
    factor = t["patch"] * t["merge"]
    side = int(MAX_PIXELS**0.5) // factor * factor
    return text, vc, p, t, side, (side // t["patch"]) ** 2


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text, vc, p, t, side, patches = qwen_vl_start(cfg, name, _VISION_DEFAULTS, _tower)
    tower = build_spec({}, f"{name} vision tower", "qwen2_5_vl_vision", Params(), hidden_size=t["d"],
                       num_layers=t["layers"], num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1,
                       intermediate_size=t["i"], hidden_act=str(vc["hidden_act"]), mlp_gated=True, norm="rms",
                       position="rope", tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
                       max_position_embeddings=patches, encoder_only=True, traits=TOWER_TRAITS)
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=side, patch_size=t["patch"], patches_per_image=patches,
                        tokens_per_image=patches // (t["merge"] ** 2), hidden_act=str(vc["hidden_act"]),
                        source="transformers 5.24 Qwen2VLImageProcessor smart_resize and Qwen2_5_VLPatchMerger",
                        param_prefixes=("visual.",), tower=tower, num_channels=t["channels"],
                        temporal_patch_size=t["temporal"], merge_size=t["merge"], min_pixels=MIN_PIXELS,
                        max_pixels=MAX_PIXELS, checkpoint_max_pixels=QWEN_VL_CHECKPOINT_MAX_PIXELS,
                        # the merger: ln_q, then mlp.0's input, the GELU's input and mlp.2's input, each 4d per
                        # merged token (d per patch) in the compute dtype
                        head_saved_per_patch=(("norm", 1), ("compute", 3 * t["d"])), notes=_notes(vc, t),
                        # the forward binds the window-ordered rotary cos and sin, fp32 [patches, head_dim] each
                        # (Qwen2_5_VLVisionRotaryEmbedding), through the blocks
                        held_per_patch=(("fp32", 2 * t["d"] // t["heads"]), ("int64", 2)),
                        linears=tuple(p.vision_linears), packs_images=True)
    # generate's prefill ran the head on every prompt position before the forward took logits_to_keep
    # (modeling_qwen2_5_vl.py: none in 4.49-4.53, 4.54 takes it); bf16, the fp32 cast only with labels
    traits = replace(text.traits, logits_to_keep_since=(4, 54))
    return replace(text, model_type=model_type, traits=traits, params=text.params + tuple(p.rows), vision=vision)


QWEN2_5_VL = Family(build, "modeling_qwen2_5_vl.py", required=(("vision_config",),), text_model_type="qwen2")
