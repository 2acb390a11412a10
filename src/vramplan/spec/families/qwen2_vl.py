"""Qwen2-VL (``model_type: qwen2_vl``, ``Qwen2VLForConditionalGeneration``).

transformers 5.24 ``models/qwen2_vl/modeling_qwen2_vl.py``: ``Qwen2VLModel`` holds ``visual``
(``Qwen2VisionTransformerPretrainedModel``) and ``language_model`` (``Qwen2VLTextModel``: Qwen2's decoder, q/k/v
biases, RMSNorm, gated SiLU MLP, multimodal RoPE without parameters); the LM head is untied unless
``tie_word_embeddings``.  The language model, the processor (``Qwen2VLImageProcessor``'s ``smart_resize``) and the
image tokens are Qwen2.5-VL's (spec/families/qwen2_5_vl.py, which reuses them): the language model is built as the
``qwen2`` Llama-like variant from ``text_config`` or the outer keys.

What differs from Qwen2.5-VL is the vision tower (``Qwen2VLVisionConfig`` defaults: ``embed_dim`` 1280, ``depth``
32, ``num_heads`` 16, ``mlp_ratio`` 4, ``hidden_act`` quick_gelu; ``hidden_size`` is the merger's output, the
language model's width, 3584):

- ``patch_embed.proj``: ``Conv3d(3, d, (2, 14, 14))`` without bias (as Qwen2.5-VL);
- per block (``Qwen2VLVisionBlock``): ``norm1`` / ``norm2`` are ``torch.nn.LayerNorm`` (weight and bias; Qwen2.5-VL:
  RMSNorm), ``attn.qkv`` (d -> 3d) and ``attn.proj`` (d -> d), biased (as Qwen2.5-VL), and a plain MLP
  ``mlp.fc1`` (d -> d x mlp_ratio) -> quick_gelu -> ``mlp.fc2``, biased (Qwen2.5-VL: a gated SiLU MLP);
- every block attends over the whole image (``cu_seqlens`` per image; no window attention, no
  ``fullatt_block_indexes``);
- ``merger`` (``PatchMerger``): ``ln_q`` a LayerNorm (weight and bias; Qwen2.5-VL: RMSNorm), ``mlp.0`` (4d -> 4d),
  GELU, ``mlp.2`` (4d -> ``hidden_size``), biased.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.facts.vllm_multimodal import QWEN_VL_CHECKPOINT_MAX_PIXELS
from vramplan.spec.families.base import Config, Family, Params, build_spec, get
from vramplan.spec.families.qwen2_5_vl import MAX_PIXELS, MIN_PIXELS, merger_params, qwen_vl_start
from vramplan.spec.model import ModelSpec, Traits, VisionSpec

__all__ = ["QWEN2_VL"]

# Qwen2VLVisionConfig defaults (transformers 5.24 configuration_qwen2_vl.py)
_VISION_DEFAULTS: dict[str, Any] = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu",
                                    "mlp_ratio": 4, "num_heads": 16, "in_channels": 3, "patch_size": 14,
                                    "spatial_merge_size": 2, "temporal_patch_size": 2}
# a Qwen2VLVisionBlock as the activation model reads it: LayerNorm, one fused biased qkv whose q and k are rotated
# into new tensors while v stays a view of its output (as Qwen2.5-VL), proj, fc1 -> quick_gelu -> fc2
TOWER_TRAITS = Traits(qkv_modules=("qkv",), out_proj_module="proj", fused_qkv_view=True, fc_modules=("fc1", "fc2"))


def _tower(p: Params, vc: Config) -> dict[str, int]:
    d, n = int(get(vc, "embed_dim")), int(get(vc, "depth"))
    i = int(d * float(get(vc, "mlp_ratio")))  # Qwen2VLVisionBlock: int(config.embed_dim * config.mlp_ratio)
    # released configs spell the channels "in_chans" (Qwen2VLVisionConfig's field is in_channels, default 3)
    ch = int(get(vc, "in_channels", "in_chans"))
    patch, t = int(get(vc, "patch_size")), int(get(vc, "temporal_patch_size"))
    merge, out = int(get(vc, "spatial_merge_size")), int(get(vc, "hidden_size"))
    p.add("visual.patch_embed.proj.weight", d * ch * t * patch * patch, "other")
    for name in ("norm1", "norm2"):
        p.add(f"visual.blocks.{name}.weight", d, "norm", per_layer=n)
        p.add(f"visual.blocks.{name}.bias", d, "bias", per_layer=n)
    for name, fan_in, fan_out in (("attn.qkv", d, 3 * d), ("attn.proj", d, d), ("mlp.fc1", d, i),
                                  ("mlp.fc2", i, d)):
        # role "other": not adapted (as qwen2_5_vl.py); quantized as nn.Linear (VisionSpec.linears)
        p.vision_linear(f"visual.blocks.{name}", fan_in, fan_out, per_layer=n)
    merger_params(p, d, merge, out, ln_bias=True)
    return {"d": d, "i": i, "layers": n, "heads": int(get(vc, "num_heads")), "channels": ch, "patch": patch,
            "temporal": t, "merge": merge}


_NOTE = ("Qwen2-VL's 2-D rotary tables (cos and sin per patch in fp32, made once before the blocks) are counted in "
         "generate's vision moment, not in training")


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text, vc, p, t, side, patches = qwen_vl_start(cfg, name, _VISION_DEFAULTS, _tower)
    act = str(vc["hidden_act"])
    tower = build_spec({}, f"{name} vision tower", "qwen2_vl_vision", Params(), hidden_size=t["d"],
                       num_layers=t["layers"], num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1,
                       intermediate_size=t["i"], hidden_act=act, position="rope", tie_word_embeddings=False,
                       attention_dropout=0.0, hidden_dropout=0.0, max_position_embeddings=patches,
                       encoder_only=True, traits=TOWER_TRAITS)
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=side, patch_size=t["patch"], patches_per_image=patches,
                        tokens_per_image=patches // (t["merge"] ** 2), hidden_act=act,
                        source="transformers 5.24 Qwen2VLImageProcessor smart_resize and Qwen2-VL's PatchMerger",
                        param_prefixes=("visual.",), tower=tower, num_channels=t["channels"],
                        temporal_patch_size=t["temporal"], merge_size=t["merge"], min_pixels=MIN_PIXELS,
                        max_pixels=MAX_PIXELS, checkpoint_max_pixels=QWEN_VL_CHECKPOINT_MAX_PIXELS,
                        # the merger: ln_q (a LayerNorm), then mlp.0's input, the GELU's input and mlp.2's input,
                        # each 4d per merged token (d per patch) in the compute dtype (as Qwen2.5-VL)
                        head_saved_per_patch=(("norm", 1), ("compute", 3 * t["d"])), notes=(_NOTE,),
                        # Qwen2VisionTransformerPretrainedModel.forward binds the rotary cos and sin, fp32 [patches,
                        # head_dim] each (Qwen2VLVisionRotaryEmbedding: .float() frequencies), through the blocks
                        held_per_patch=(("fp32", 2 * t["d"] // t["heads"]), ("int64", 2)),
                        linears=tuple(p.vision_linears), packs_images=True)
    # generate's prefill ran the head on every prompt position before the forward took logits_to_keep
    # (modeling_qwen2_vl.py: none in 4.45-4.57, 5.0 takes it), in fp32 at 4.45 (:1720, ``logits.float()``; 4.46
    # casts only with labels)
    traits = replace(text.traits, logits_to_keep_since=(5, 0), float_logits_before=(4, 46))
    return replace(text, model_type=model_type, traits=traits, params=text.params + tuple(p.rows), vision=vision)


QWEN2_VL = Family(build, "modeling_qwen2_vl.py", required=(("vision_config",),), text_model_type="qwen2")
