"""InternVL, transformers' native port (``model_type: internvl``, ``InternVLForConditionalGeneration``; the
``OpenGVLab/InternVL3-*-hf`` checkpoints).

transformers 5.24 ``models/internvl/modeling_internvl.py``: ``InternVLModel`` holds ``vision_tower``
(``InternVLVisionModel``), ``multi_modal_projector`` (``InternVLMultiModalProjector``) and ``language_model``
(``AutoModel.from_config(text_config)``, a Qwen2 by default: ``InternVLConfig.sub_configs``); the LM head is tied when
the outer ``tie_word_embeddings`` is (``InternVLConfig`` default True, ``_tied_weights_keys``).

The tower (``InternVLVisionConfig`` defaults, InternViT-300M: width 1024, 24 layers, 16 heads, MLP 4096, GELU,
LayerNorm, 448 x 448 images in 14 x 14 patches, layer scale 0.1, mean pooling):

- ``embeddings``: ``cls_token`` [d], ``mask_token`` [d] with ``use_mask_token``, ``patch_embeddings.projection``
  (``Conv2d(3, d, patch)`` with a bias), ``position_embeddings`` [(image / patch)^2 + 1, d] with
  ``use_absolute_position_embeddings``;
- per layer (``encoder.layer``, ``InternVLVisionLayer``): ``attention.q_proj``/``k_proj``/``v_proj`` (d -> d, biased
  with ``attention_bias``), ``attention.projection_layer`` (d -> d, biased), ``attention.q_norm``/``k_norm``
  (RMSNorm of d) with ``use_qk_norm``, ``mlp.fc1``/``fc2`` (biased), ``layernorm_before``/``layernorm_after``
  (``norm_type``: LayerNorm with a bias, or RMSNorm), and the layer scales ``lambda_1``/``lambda_2`` [d];
- ``layernorm`` (LayerNorm) unless ``use_mean_pooling`` (Identity).

The projector: ``layer_norm`` (LayerNorm of d / downsample_ratio^2), ``linear_1`` (that -> d_text) ->
``projector_hidden_act`` -> ``linear_2`` (d_text -> d_text), biased.  ``get_image_features`` takes the last hidden
state (``vision_feature_layer`` -1), drops the class token (``vision_feature_select_strategy`` "default") and
``pixel_shuffle``s each 1/ratio x 1/ratio square of patches into one token.

Image tokens: ``InternVLProcessor`` writes ``<img>`` + image_seq_length x tiles + ``</img>`` per image
(``_get_num_multimodal_tokens``: 2 + image_seq_length x patches), image_seq_length = (image / patch)^2 x ratio^2
(256).  The tiles are ``GotOcr2ImageProcessor``'s: one image of ``image_size`` unless ``crop_to_patches`` (the class
default is off), then ``get_optimal_tiled_canvas``'s grid and a thumbnail (spec/vision.py ``internvl_tiles``).  The
-hf checkpoints keep that setting in ``preprocessor_config.json``, which is not read: the tiling is modelled when
the config carries the original InternVL chat configuration's ``dynamic_image_size`` (with ``max_dynamic_patch``,
``min_dynamic_patch``), else one tile per image is assumed and said.
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
from vramplan.spec.families.llava import feature_layers, selected_layers
from vramplan.spec.model import ModelSpec, Traits, VisionSpec

__all__ = ["INTERNVL"]

# InternVLVisionConfig defaults (transformers 5.24 configuration_internvl.py)
_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                    "attention_bias": False, "use_qk_norm": False, "intermediate_size": 4096,
                                    "hidden_act": "gelu", "norm_type": "layer_norm", "image_size": 448,
                                    "patch_size": 14, "num_channels": 3, "use_mask_token": False,
                                    "use_absolute_position_embeddings": True, "use_mean_pooling": True}
PREFIX = "vision_tower"
# InternVLVisionLayer as the activation model reads it: pre-norm, separate q/k/v, projection_layer, fc1 -> act -> fc2
TOWER_TRAITS = Traits(qkv_modules=("q_proj", "k_proj", "v_proj"), out_proj_module="projection_layer",
                      fc_modules=("fc1", "fc2"))


def _text_config(cfg: Config) -> dict[str, Any]:
    """``text_config`` (a Qwen2 unless it names another model_type), the outer tie (``InternVLConfig`` default True),
    dtype and quantization."""
    inner = dict(cfg.get("text_config") or {})
    kind = str(inner.get("model_type") or "qwen2")
    if kind not in LLAMA_FAMILIES:
        raise ValueError(f"an internvl language model of model_type {kind!r} is not modelled "
                         f"(known: {', '.join(sorted(LLAMA_FAMILIES))})")
    text = non_null(inner)
    text["model_type"] = kind
    text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    return inherit_outer(text, cfg, OUTER_KEYS)


def _tower(p: Params, vc: Config) -> dict[str, int]:
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_attention_heads"))
    image, patch, ch = square_side(get(vc, "image_size")), square_side(get(vc, "patch_size")), int(get(vc, "num_channels"))
    patches = (image // patch) ** 2
    emb = f"{PREFIX}.embeddings"
    p.add(f"{emb}.cls_token", d, "other")
    if bool(vc["use_mask_token"]):
        p.add(f"{emb}.mask_token", d, "other")
    p.add(f"{emb}.patch_embeddings.projection.weight", d * ch * patch * patch, "other")
    p.add(f"{emb}.patch_embeddings.projection.bias", d, "bias")
    if bool(vc["use_absolute_position_embeddings"]):
        p.add(f"{emb}.position_embeddings", (patches + 1) * d, "other")
    layer = f"{PREFIX}.encoder.layer"
    bias = bool(vc["attention_bias"])
    for name in ("q_proj", "k_proj", "v_proj"):
        p.vision_linear(f"{layer}.attention.{name}", d, d, per_layer=n, bias=bias)
    p.vision_linear(f"{layer}.attention.projection_layer", d, d, per_layer=n)
    if bool(vc["use_qk_norm"]):
        for name in ("q_norm", "k_norm"):
            p.add(f"{layer}.attention.{name}.weight", d, "norm", per_layer=n)
    p.vision_linear(f"{layer}.mlp.fc1", d, i, per_layer=n)
    p.vision_linear(f"{layer}.mlp.fc2", i, d, per_layer=n)
    rms = str(vc["norm_type"]) == "rms_norm"
    for name in ("layernorm_before", "layernorm_after"):
        p.add(f"{layer}.{name}.weight", d, "norm", per_layer=n)
        if not rms:
            p.add(f"{layer}.{name}.bias", d, "bias", per_layer=n)
    for name in ("lambda_1", "lambda_2"):
        # a per-channel scale, a bare Parameter: the HF Trainer's weight-decay group takes it (its name matches no
        # norm or bias pattern of Trainer.get_decay_parameter_names)
        p.add(f"{layer}.{name}", d, "other", per_layer=n)
    if not bool(vc["use_mean_pooling"]):
        p.add(f"{PREFIX}.layernorm.weight", d, "norm")
        p.add(f"{PREFIX}.layernorm.bias", d, "bias")
    return {"d": d, "i": i, "layers": n, "heads": heads, "image": image, "patch": patch, "patches": patches,
            "channels": ch, "rms": int(rms), "qk_norm": int(bool(vc["use_qk_norm"]))}


def _tiling(cfg: Config) -> tuple[int, int]:
    """(min, max) tiles per image: the original InternVL chat configuration's dynamic_image_size keys, else (1, 1)."""
    if not cfg.get("dynamic_image_size"):
        return 1, 1
    low, high = int(cfg.get("min_dynamic_patch", 1)), int(cfg.get("max_dynamic_patch", 12))
    if not 1 <= low <= high:
        raise ValueError(f"min_dynamic_patch {low} / max_dynamic_patch {high} do not bound a tile count")
    return low, high


def _notes(t: dict[str, int], tiles: tuple[int, int]) -> tuple[str, ...]:
    out = []
    if tiles == (1, 1):
        out.append("each image is one 448-pixel tile (GotOcr2ImageProcessor without crop_to_patches, the class "
                   "default; an -hf checkpoint's preprocessor_config.json may set crop_to_patches and max_patches, "
                   "not read here: give the config dynamic_image_size and max_dynamic_patch to model the tiling)")
    out.append("pixel_shuffle's two permuted copies of each tile's features (forward transients) are not counted")
    if t["qk_norm"]:
        out.append("not modelled: the tower's q_norm/k_norm saved tensors (use_qk_norm)")
    return tuple(out)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text_cfg = _text_config(cfg)
    kind = str(text_cfg["model_type"])
    text = LLAMA_FAMILIES[kind].build(text_cfg, kind, name)
    vc = {**_VISION_DEFAULTS, **non_null(cfg.get("vision_config"))}
    p = Params()
    t = _tower(p, vc)
    ratio = float(cfg.get("downsample_ratio", 0.5))
    merge = round(1 / ratio)
    per_side = t["image"] // t["patch"]
    if abs(merge * ratio - 1) > 1e-9 or per_side % merge:
        raise ValueError(f"downsample_ratio {ratio} does not fold {per_side} patches a side evenly (pixel_shuffle)")
    sel = cfg.get("vision_feature_layer", -1)
    feats, unused = feature_layers({"vision_feature_layer": sel}, t["layers"])
    if feats != 1 or isinstance(sel, (list, tuple)):
        # InternVLModel.get_image_features takes hidden_states[vision_feature_layer], one layer: the projector's
        # layer_norm is d x merge^2 wide, which a concatenation of several layers' states does not pass
        raise ValueError(f"vision_feature_layer {sel!r}: only one layer is modelled (InternVLMultiModalProjector "
                         "normalizes d x merge^2 features)")
    default = cfg.get("vision_feature_select_strategy", "default") == "default"
    d, d_text = t["d"], text.hidden_size
    wide = d * merge * merge
    p.add("multi_modal_projector.layer_norm.weight", wide, "norm")
    p.add("multi_modal_projector.layer_norm.bias", wide, "bias")
    p.vision_linear("multi_modal_projector.linear_1", wide, d_text)
    p.vision_linear("multi_modal_projector.linear_2", d_text, d_text)
    tiles = _tiling(cfg)
    seq = t["patches"] // (merge * merge)  # image_seq_length: 256 for 448 / 14 at ratio 0.5
    act = str(vc["hidden_act"])
    tower = build_spec({}, f"{name} vision tower", "internvl_vision", Params(), hidden_size=d, num_layers=t["layers"],
                       num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1, intermediate_size=t["i"],
                       hidden_act=act, norm="rms" if t["rms"] else "layer", position="learned",
                       tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
                       max_position_embeddings=t["patches"] + 1, encoder_only=True, traits=TOWER_TRAITS)
    vision = VisionSpec(hidden_size=d, num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=seq + 2, hidden_act=act,
                        source="transformers 5.24 InternVLProcessor (<img>, image_seq_length tokens per tile, </img>) "
                               "and GotOcr2ImageProcessor's tiles",
                        tower=tower, num_channels=t["channels"], extra_tokens=1, dropped_tokens=int(default),
                        merge_size=merge, min_tiles=tiles[0], max_tiles=tiles[1],
                        # the layer scales: lambda_1 * attention output and lambda_2 * MLP output save the outputs
                        # (compute dtype) for lambda's gradient
                        layer_saved_per_token=(("compute", 2 * d),),
                        # the projector per patch: layer_norm over the shuffled d x merge^2 (d per patch), linear_1's
                        # autocast cast of its output, then the activation's and linear_2's inputs, d_text each per
                        # token (merge^2 patches)
                        head_saved_per_patch=(("norm", 1), ("cast", d), ("compute", 2 * d_text // (merge * merge))),
                        unused_layers=unused, notes=_notes(t, tiles), linears=tuple(p.vision_linears),
                        # InternVLVisionModel.forward binds the embeddings' output through the encoder's layers, and
                        # get_image_features' select_hidden_states keeps vision_feature_layer's state
                        kept_hidden_states=held_tower_states(t["layers"], selected_layers({"vision_feature_layer": sel})))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision)


INTERNVL = Family(build, "modeling_internvl.py", required=(("vision_config",), ("text_config",)),
                  text_model_type="qwen2")
