"""Qwen3-VL (``model_type: qwen3_vl``, ``Qwen3VLForConditionalGeneration``; ``qwen3_vl_moe``,
``Qwen3VLMoeForConditionalGeneration``).

transformers 5.24 ``models/qwen3_vl/modeling_qwen3_vl.py``: ``Qwen3VLModel`` holds ``visual`` (``Qwen3VLVisionModel``)
and ``language_model`` (``Qwen3VLTextModel``: Qwen3's decoder, q/k RMSNorm over head_dim, no q/k/v bias, gated SiLU
MLP, interleaved multimodal RoPE without parameters); the LM head is tied when ``tie_word_embeddings``
(``_tied_weights_keys``; ``Qwen3VLConfig`` default False, the 2B and 4B releases set it).  The language model is the
``qwen3`` Llama-like variant built from ``text_config`` with ``Qwen3VLTextConfig``'s defaults; Qwen3-VL-MoE's
(``modeling_qwen3_vl_moe.py``, ``Qwen3VLMoeTextConfig``) is the ``qwen3_moe`` variant (routed experts in every
``decoder_sparse_step``-th layer outside ``mlp_only_layers``).

The vision tower (``Qwen3VLVisionConfig`` defaults: depth 27, width 1152, MLP 4304, 16 heads, patch 16, temporal
patch 2, merge 2, 2,304 learned positions, ``deepstack_visual_indexes`` (8, 16, 24)):

- ``patch_embed.proj``: ``Conv3d(3, d, (2, 16, 16))`` with a bias (Qwen2.5-VL's has none);
- ``pos_embed``: ``Embedding(num_position_embeddings, d)``, bilinearly interpolated to each image's grid;
- per block (``Qwen3VLVisionBlock``): ``norm1`` / ``norm2`` LayerNorms (weight and bias), ``attn.qkv`` (d -> 3d)
  and ``attn.proj``, ``mlp.linear_fc1`` (d -> i) -> gelu_pytorch_tanh -> ``mlp.linear_fc2``, all biased; every
  block attends over the whole image (``cu_seqlens`` per image), with 2-D rotary embeddings;
- ``merger`` (``Qwen3VLVisionPatchMerger``): ``norm`` (LayerNorm of d, before the 2 x 2 shuffle), ``linear_fc1``
  (4d -> 4d) -> GELU -> ``linear_fc2`` (4d -> ``out_hidden_size``), biased;
- ``deepstack_merger_list``: one merger per ``deepstack_visual_indexes`` entry over that block's output, its
  ``norm`` over the shuffled 4d (``use_postshuffle_norm``); ``Qwen3VLTextModel._deepstack_process`` adds the k-th
  one's output to the image tokens' hidden states after decoder layer k.

Image tokens: ``Qwen2VLImageProcessor`` (``AutoImageProcessor``'s class for qwen3_vl) with the Qwen3-VL releases'
``preprocessor_config.json`` values (``size`` shortest_edge 65,536 and longest_edge 16,777,216 pixels, patch 16,
merge 2; that file is not read here) resizes each image with ``smart_resize`` (factor 32), and
``Qwen3VLProcessor`` writes (h / 16) x (w / 16) / 4 image tokens per image (spec/vision.py ``image_grid``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, inherit_outer, non_null
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, Traits, VisionSpec

__all__ = ["QWEN3_VL", "QWEN3_VL_MOE", "deepstack_kept"]

# Qwen3VLVisionConfig defaults (transformers 5.24 configuration_qwen3_vl.py; Qwen3VLMoeVisionConfig's are the same)
_VISION_DEFAULTS: dict[str, Any] = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
                                    "intermediate_size": 4304, "num_heads": 16, "in_channels": 3, "patch_size": 16,
                                    "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584,
                                    "num_position_embeddings": 2304, "deepstack_visual_indexes": (8, 16, 24)}
# Qwen3VLTextConfig defaults (configuration_qwen3_vl.py)
_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": 151_936, "hidden_size": 4096, "intermediate_size": 22_016,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                                  "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 128_000,
                                  "rms_norm_eps": 1e-6, "attention_bias": False}
# Qwen3VLMoeTextConfig defaults (configuration_qwen3_vl_moe.py; head_dim None: hidden / heads)
_MOE_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": 151_936, "hidden_size": 2048, "intermediate_size": 5632,
                                      "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                                      "hidden_act": "silu", "max_position_embeddings": 128_000, "rms_norm_eps": 1e-6,
                                      "attention_bias": False, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                                      "num_experts_per_tok": 4, "num_experts": 60, "mlp_only_layers": []}
# the Qwen3-VL releases' preprocessor_config.json: size {"shortest_edge": 65536, "longest_edge": 16777216}
MIN_PIXELS, MAX_PIXELS = 65_536, 16_777_216
# a Qwen3VLVisionBlock as the activation model reads it: LayerNorm, one fused biased qkv whose q and k are rotated
# into new tensors while v stays a view of its output (as Qwen2-VL), proj, linear_fc1 -> gelu_pytorch_tanh ->
# linear_fc2
TOWER_TRAITS = Traits(qkv_modules=("qkv",), out_proj_module="proj", fused_qkv_view=True,
                      fc_modules=("linear_fc1", "linear_fc2"))


def _text_config(cfg: Config, kind: str, defaults: Config) -> dict[str, Any]:
    """``text_config`` over its configuration class's defaults, built as ``kind``; the outer
    ``tie_word_embeddings`` (the class attribute ``_tied_weights_keys`` reads the outer config), dtype and
    quantization."""
    text = dict(defaults)
    text.update({k: v for k, v in dict(cfg.get("text_config") or {}).items()
                 if v is not None and k not in ("layer_types", "model_type")})
    text["model_type"] = kind
    text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    return inherit_outer(text, cfg)


def _merger(p: Params, name: str, d: int, wide: int, out: int, norm_width: int, count: int = 1) -> None:
    """A ``Qwen3VLVisionPatchMerger``: ``norm`` (LayerNorm), ``linear_fc1`` (wide -> wide), ``linear_fc2``
    (wide -> out), biased."""
    p.add(f"{name}.norm.weight", norm_width, "norm", per_layer=count)
    p.add(f"{name}.norm.bias", norm_width, "bias", per_layer=count)
    p.vision_linear(f"{name}.linear_fc1", wide, wide, per_layer=count)
    p.vision_linear(f"{name}.linear_fc2", wide, out, per_layer=count)


def _tower(p: Params, vc: Config) -> dict[str, int]:
    d, i, n = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size")), int(get(vc, "depth"))
    ch, patch, t = int(get(vc, "in_channels")), int(get(vc, "patch_size")), int(get(vc, "temporal_patch_size"))
    merge, out = int(get(vc, "spatial_merge_size")), int(get(vc, "out_hidden_size"))
    deep = [int(x) for x in (vc.get("deepstack_visual_indexes") or ())]
    if any(not 0 <= x < n for x in deep):
        raise ValueError(f"deepstack_visual_indexes {deep} outside the tower's {n} blocks")
    p.add("visual.patch_embed.proj.weight", d * ch * t * patch * patch, "other")
    p.add("visual.patch_embed.proj.bias", d, "bias")
    p.add("visual.pos_embed.weight", int(get(vc, "num_position_embeddings")) * d, "other")
    for name in ("norm1", "norm2"):
        p.add(f"visual.blocks.{name}.weight", d, "norm", per_layer=n)
        p.add(f"visual.blocks.{name}.bias", d, "bias", per_layer=n)
    for name, fan_in, fan_out in (("attn.qkv", d, 3 * d), ("attn.proj", d, d), ("mlp.linear_fc1", d, i),
                                  ("mlp.linear_fc2", i, d)):
        # role "other": not adapted (as qwen2_vl.py); quantized as nn.Linear (VisionSpec.linears)
        p.vision_linear(f"visual.blocks.{name}", fan_in, fan_out, per_layer=n)
    wide = d * merge * merge
    _merger(p, "visual.merger", d, wide, out, d)
    if deep:
        _merger(p, "visual.deepstack_merger_list", d, wide, out, wide, count=len(deep))
    return {"d": d, "i": i, "layers": n, "heads": int(get(vc, "num_heads")), "channels": ch, "patch": patch,
            "temporal": t, "merge": merge, "deep": len(deep), "kept": deepstack_kept(deep, n, out)}


def deepstack_kept(deep: list[int], layers: int, out: int) -> int:
    """Elements per merged token of the DeepStack features alive while the tower's last block runs
    (``VisionSpec.kept_merged_elements``): the vision model's forward appends each ``deepstack_visual_indexes`` block's
    merger output ([tokens, out_hidden_size]) to ``deepstack_feature_lists`` and returns the list, so those of the
    blocks before the last are alive through it (transformers 5.24 modeling_qwen3_vl.py l.702-722)."""
    return out * sum(1 for x in set(deep) if x < layers - 1)


def _notes(t: dict[str, int]) -> tuple[str, ...]:
    out = [("the bilinear interpolation of Qwen3-VL's pos_embed to each image's grid (four gathered rows per patch, "
            "forward transients) is not counted; its fp32 result and the 2-D rotary tables (fp32), held through the "
            "blocks, are counted in generate's vision moment, not in training")]
    if t["deep"]:
        out.append(f"the {t['deep']} DeepStack mergers' saved tensors are counted as the final merger's; their "
                   "outputs are counted while the tower's last block runs; added to the image tokens' hidden states "
                   "after the first decoder layers (Qwen3VLTextModel._deepstack_process: a clone of the hidden "
                   "states and an indexed add), they are held through the language model's forward and its clones "
                   "are transient: not counted there")
    return tuple(out)


def _build(cfg: Config, model_type: str, name: str, kind: str, defaults: Config) -> ModelSpec:
    text = LLAMA_FAMILIES[kind].build(_text_config(cfg, kind, defaults), kind, name)
    vc = {**_VISION_DEFAULTS, **non_null(cfg.get("vision_config"))}
    p = Params()
    t = _tower(p, vc)
    factor = t["patch"] * t["merge"]
    side = int(MAX_PIXELS**0.5) // factor * factor  # the largest square smart_resize lets through: 4096
    patches = (side // t["patch"]) ** 2
    act = str(vc["hidden_act"])
    tower = build_spec({}, f"{name} vision tower", "qwen3_vl_vision", Params(), hidden_size=t["d"],
                       num_layers=t["layers"], num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1,
                       intermediate_size=t["i"], hidden_act=act, position="rope", tie_word_embeddings=False,
                       attention_dropout=0.0, hidden_dropout=0.0, max_position_embeddings=patches,
                       encoder_only=True, traits=TOWER_TRAITS)
    mergers = 1 + t["deep"]
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=side, patch_size=t["patch"], patches_per_image=patches,
                        tokens_per_image=patches // (t["merge"] ** 2), hidden_act=act,
                        source="transformers 5.24 Qwen2VLImageProcessor smart_resize (the Qwen3-VL releases' "
                               "preprocessor_config.json: patch 16, min 65,536 and max 16,777,216 pixels) and "
                               "Qwen3VLVisionPatchMerger",
                        param_prefixes=("visual.",), tower=tower, num_channels=t["channels"],
                        temporal_patch_size=t["temporal"], merge_size=t["merge"], min_pixels=MIN_PIXELS,
                        max_pixels=MAX_PIXELS,
                        # each merger (the final one and the DeepStack ones): its norm, then linear_fc1's input,
                        # the GELU's input and linear_fc2's input, each 4d per merged token (d per patch)
                        head_saved_per_patch=(("norm", mergers), ("compute", 3 * t["d"] * mergers)),
                        notes=_notes(t), linears=tuple(p.vision_linears), kept_merged_elements=t["kept"],
                        # the forward binds pos_embeds (fp32: the bf16 rows times fp32 interpolation weights) and the
                        # rotary cos and sin, fp32 [patches, head_dim] each, through the blocks (l.694-697), with the
                        # int64 position ids [patches, 2] and interpolation indices [patches, 4] and fp32 weights
                        held_per_patch=(("fp32", t["d"] + 2 * t["d"] // t["heads"] + 4), ("int64", 2 + 4)))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    return _build(cfg, model_type, name, "qwen3", _TEXT_DEFAULTS)


def build_moe(cfg: Config, model_type: str, name: str) -> ModelSpec:
    return _build(cfg, model_type, name, "qwen3_moe", _MOE_TEXT_DEFAULTS)


QWEN3_VL = Family(build, "modeling_qwen3_vl.py", required=(("vision_config",), ("text_config",)),
                  text_model_type="qwen3")
QWEN3_VL_MOE = Family(build_moe, "modeling_qwen3_vl_moe.py", required=(("vision_config",), ("text_config",)),
                      text_model_type="qwen3_moe")
