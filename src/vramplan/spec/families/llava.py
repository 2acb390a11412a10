"""LLaVA (``model_type: llava``, ``LlavaForConditionalGeneration``).

transformers 5.24 ``models/llava/modeling_llava.py``: ``LlavaModel`` holds ``vision_tower``
(``AutoModel.from_config(config.vision_config)``: a ``CLIPVisionModel`` for ``clip_vision_model``, LlavaConfig's
default, or a ``SiglipVisionModel``), ``multi_modal_projector`` (``LlavaMultiModalProjector``: ``linear_1``
(d_vision x feature layers -> d_text), ``projector_hidden_act`` (GELU), ``linear_2`` (d_text -> d_text), both
biased unless ``multimodal_projector_bias`` is false) and ``language_model`` (``AutoModel.from_config(text_config)``,
a Llama unless ``text_config`` names another model_type); the LM head is untied (``LlavaConfig``
``tie_word_embeddings`` False, or the text config's).

The CLIP tower (``models/clip/modeling_clip.py`` ``CLIPVisionModel``; no ``vision_model`` wrapper in 5.24):

- ``embeddings.class_embedding`` [d], ``embeddings.patch_embedding`` (``Conv2d(3, d, patch, stride=patch)``,
  no bias), ``embeddings.position_embedding`` (``Embedding((image // patch)^2 + 1, d)``: one position per
  patch and the class token);
- ``pre_layrnorm`` (LayerNorm), ``encoder.layers`` (``CLIPEncoderLayer``: LayerNorm, biased q/k/v/out_proj,
  LayerNorm, fc1 -> quick_gelu -> fc2, biased), ``post_layernorm`` (applied to the class token only, for the
  pooled output).

Which tower output reaches the language model: ``LlavaModel.get_image_features`` takes
``hidden_states[vision_feature_layer]`` (default -2: the input of the last encoder layer) and, with
``vision_feature_select_strategy`` "default", drops its first token (the class token).  The encoder still runs
every layer (``CLIPEncoder.forward`` loops over all of them; ``select_hidden_states`` only chooses which hidden
states ``capture_outputs`` keeps), and ``CLIPVisionModel.forward`` still applies ``post_layernorm`` to the last
layer's class token.  In training, the layers after the selected one record saved tensors that no gradient
reaches: they are freed with the model output that holds ``image_outputs`` (``LlavaModelOutputWithPast``), when
the Trainer's ``compute_loss`` returns, before the backward (analytic/terms/vision.py ``unused`` tensors).

Image tokens: ``LlavaProcessor.replace_image_token`` writes (h // patch) x (w // patch) +
``num_additional_image_tokens`` (1 for CLIP's class token) tokens per image, less one with the "default"
strategy; ``CLIPImageProcessor`` resizes and center-crops every image to ``image_size`` (llava-1.5: 336 / 14
-> 576 patches, 576 tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import (
    OUTER_KEYS,
    Config,
    Family,
    Params,
    get,
    held_tower_states,
    inherit_outer,
    non_null,
)
from vramplan.spec.families.gemma3 import siglip_tower, tower_layer_spec, vit_encoder_layers
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["LLAVA", "LLAVA_SDPA_SINCE", "clip_tower", "feature_layers", "llava_spec", "llava_text_config", "selected_layers"]

# LlamaConfig defaults (transformers 5.24 configuration_llama.py), LlavaConfig's default text model, for the keys
# a sparse text_config leaves out (llava-hf/llava-1.5-7b-hf's names only max_position_embeddings, rms_norm_eps,
# vocab_size and model_type)
_LLAMA_DEFAULTS: dict[str, Any] = {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008,
                                   "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
                                   "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
# LlavaConfig's vision_config init_kwargs over CLIPVisionConfig's defaults (configuration_llava.py,
# configuration_clip.py): CLIP ViT-L/14 at 336 pixels
_CLIP_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                  "num_attention_heads": 16, "num_channels": 3, "image_size": 336, "patch_size": 14,
                                  "hidden_act": "quick_gelu", "model_type": "clip_vision_model"}
_SIGLIP_DEFAULTS: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                    "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
                                    "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True}
# MistralConfig defaults (transformers 5.24 configuration_mistral.py lines 62-79), for a sparse mistral text_config
# (llava-hf/llava-v1.6-mistral-7b-hf's names neither hidden_size nor the layer and head counts)
_MISTRAL_DEFAULTS: dict[str, Any] = {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 14_336,
                                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6,
                                     "sliding_window": 4096, "tie_word_embeddings": False}
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {"llama": _LLAMA_DEFAULTS, "mistral": _MISTRAL_DEFAULTS}
PREFIX = "vision_tower"


def llava_text_config(cfg: Config) -> dict[str, Any]:
    """The language model's keys: ``text_config`` (LlamaConfig's or MistralConfig's defaults under a llama or mistral
    one, for the keys it leaves out), inheriting the outer tie/dtype/quantization keys."""
    inner = dict(cfg.get("text_config") or {})
    kind = str(inner.get("model_type") or "llama")
    text = dict(_TEXT_DEFAULTS.get(kind, {}))
    text.update(non_null(inner))
    text["model_type"] = kind
    inherit_outer(text, cfg, ("tie_word_embeddings", *OUTER_KEYS))
    if kind not in LLAMA_FAMILIES:
        raise ValueError(f"a {cfg.get('model_type')} language model of model_type {kind!r} is not modelled "
                         f"(known: {', '.join(sorted(LLAMA_FAMILIES))})")
    return text


def clip_tower(p: Params, vc: Config, prefix: str = PREFIX) -> dict[str, int]:
    """Add a ``CLIPVisionModel``'s tensors to ``p``; returns its sizes (d, layers, heads, i, image, patch,
    patches per image (without the class token), channels)."""
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_attention_heads"))
    image, patch, ch = int(get(vc, "image_size")), int(get(vc, "patch_size")), int(get(vc, "num_channels"))
    patches = (image // patch) ** 2
    p.add(f"{prefix}.embeddings.class_embedding", d, "other")
    p.add(f"{prefix}.embeddings.patch_embedding.weight", d * ch * patch * patch, "other")
    p.add(f"{prefix}.embeddings.position_embedding.weight", (patches + 1) * d, "other")
    for name in ("pre_layrnorm", "post_layernorm"):
        p.add(f"{prefix}.{name}.weight", d, "norm")
        p.add(f"{prefix}.{name}.bias", d, "bias")
    vit_encoder_layers(p, f"{prefix}.encoder.layers", d, i, n)  # the same layers as SigLIP's
    return {"d": d, "layers": n, "heads": heads, "i": i, "image": image, "patch": patch, "patches": patches,
            "channels": ch}


def feature_layers(cfg: Config, layers: int) -> tuple[int, int]:
    """(hidden states concatenated into the projector's input, encoder layers run after the last of them).

    ``hidden_states`` has ``layers + 1`` entries (the embeddings', then each layer's output), so index ``k``
    (negative from the end) is the output of layer ``k`` (``layers + 1 + k``): -2 leaves the last layer unused.
    """
    sel = cfg.get("vision_feature_layer", -2)
    picks = [int(x) for x in (sel if isinstance(sel, (list, tuple)) else [sel])]
    used = [k if k >= 0 else layers + 1 + k for k in picks]
    if not picks or min(used) < 0 or max(used) > layers:
        raise ValueError(f"vision_feature_layer {sel!r} is outside the tower's {layers} layers")
    return len(picks), layers - max(used)


def selected_layers(cfg: Config, default: int = -2) -> tuple[int, ...]:
    """The hidden-state indices ``vision_feature_layer`` names (one or a list), as ``select_hidden_states`` hands them
    to the tower's ``capture_outputs``."""
    sel = cfg.get("vision_feature_layer", default)
    return tuple(int(x) for x in (sel if isinstance(sel, (list, tuple)) else [sel]))


def _vision_config(cfg: Config) -> tuple[dict[str, Any], bool]:
    """The tower's keys with its class's defaults; True for CLIP (a class token), False for SigLIP."""
    given = non_null(cfg.get("vision_config"))
    kind = given.get("model_type", "clip_vision_model")
    if kind == "clip_vision_model":
        return {**_CLIP_DEFAULTS, **given}, True
    if kind == "siglip_vision_model":
        return {**_SIGLIP_DEFAULTS, **given}, False
    raise ValueError(f"a vision tower of model_type {kind!r} is not modelled (clip_vision_model, siglip_vision_model)")


def _notes(unused: int, clip: bool) -> tuple[str, ...]:
    out = []
    if unused:
        out.append(f"the tower's last {unused} layer(s) after vision_feature_layer run in the forward (CLIPEncoder "
                   "runs every layer) and their saved tensors, which no gradient reaches, are freed before the "
                   "backward with the model output that holds them (counted at the forward's end only)")
    if not clip:
        out.append("not modelled: the SigLIP attention-pooling head's saved tensors on the last layer's output "
                   "(unused by the projector, freed before the backward)")
    return tuple(out)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    return llava_spec(cfg, model_type, name)


LLAVA_SDPA_SINCE = (4, 37)


def llava_spec(cfg: Config, model_type: str, name: str, anyres: tuple[tuple[int, int], ...] = ()) -> ModelSpec:
    """LLaVA's ``ModelSpec``; ``anyres``: LLaVA-NeXT's image_grid_pinpoints (spec/families/llava_next.py), which
    adds its ``image_newline`` and cuts each image into tiles of the tower's resolution."""
    text_cfg = llava_text_config(cfg)
    kind = str(text_cfg["model_type"])
    text = LLAMA_FAMILIES[kind].build(text_cfg, kind, name)
    vc, clip = _vision_config(cfg)
    p = Params()
    t = clip_tower(p, vc) if clip else siglip_tower(p, vc, PREFIX)
    feats, unused = feature_layers(cfg, t["layers"])
    cls = 1 if clip else 0
    default = cfg.get("vision_feature_select_strategy", "default") == "default"
    tokens = t["patches"] + cls - (1 if default else 0)
    bias = bool(cfg.get("multimodal_projector_bias", True))
    d_text = text.hidden_size
    p.add("multi_modal_projector.linear_1.weight", t["d"] * feats * d_text, "other")
    p.add("multi_modal_projector.linear_2.weight", d_text * d_text, "other")
    if bias:
        p.add("multi_modal_projector.linear_1.bias", d_text, "bias")
        p.add("multi_modal_projector.linear_2.bias", d_text, "bias")
    # the projector's two nn.Linear (rows added above in the order of earlier releases: weights, then biases)
    p.vision_linears += [("multi_modal_projector.linear_1.weight", t["d"] * feats, d_text),
                         ("multi_modal_projector.linear_2.weight", d_text, d_text)]
    if anyres:
        # LlavaNextModel.image_newline: one d_text vector appended after each row of the tiles' features
        p.add("image_newline", d_text, "other")
    act = str(vc["hidden_act"])
    tower = tower_layer_spec({**t, "patches": t["patches"] + cls}, act, name)
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=tokens, hidden_act=act,
                        source="transformers 5.24 LlavaProcessor.replace_image_token (patches + class token, less "
                               "one with vision_feature_select_strategy 'default') and CLIPImageProcessor's crop",
                        tower=tower, num_channels=t["channels"], extra_tokens=cls, dropped_tokens=int(default),
                        # CLIP's pre_layrnorm on the embeddings (class token included); the projector's inputs per
                        # image token: linear_1's cast of the selected hidden states (autocast), the activation's
                        # input and linear_2's input in the compute dtype
                        stem_saved_per_token=(("norm", 1),) if clip else (),
                        head_saved_per_token=(("cast", t["d"] * feats), ("compute", 2 * d_text)),
                        unused_layers=unused, notes=_notes(unused, clip),
                        # the encoder's input (pre_layrnorm's output, or SigLIP's embeddings) bound in the vision
                        # model's forward through every layer, and any selected state before the last layer's input
                        # (get_image_features' select_hidden_states)
                        kept_hidden_states=held_tower_states(t["layers"], selected_layers(cfg)),
                        # post_layernorm on the last layer's class token (the pooled output nothing uses)
                        unused_saved_per_image=(("norm", 1),) if clip else (), linears=tuple(p.vision_linears))
    if anyres:
        vision = _anyres(vision, anyres, t["image"])
    # the composite class's SDPA path: none in 4.36.2's LlavaForConditionalGeneration, from 4.37 a property that
    # delegates to the language model's (``_supports_sdpa``, read off the 4.36.2-4.45.2 wheels); before it the language
    # model is built eager whatever its own class offers
    traits = replace(text.traits, sdpa_since=max(text.traits.sdpa_since or (0,), LLAVA_SDPA_SINCE))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision, traits=traits)


def _anyres(v: VisionSpec, pinpoints: tuple[tuple[int, int], ...], tile: int) -> VisionSpec:
    """LLaVA-NeXT's image path: tiles of ``tile`` pixels; the default image is the largest square of the grid
    (llava-v1.6: 672 x 672, 4 tiles and the base image, 2,928 image tokens)."""
    from vramplan.spec.vision import anyres_grid

    side = max(min(h, w) for h, w in pinpoints)
    v = replace(v, grid_pinpoints=pinpoints, tile_size=tile, image_size=side,
                param_prefixes=(*v.param_prefixes, "image_newline"),
                source="transformers 5.24 LlavaNextProcessor._get_number_of_features (anyres tiles unpadded, a "
                       "newline per row, the base image) and image_size_to_num_patches")
    tiles, tokens = anyres_grid(v, side)
    return replace(v, patches_per_image=tiles * (tile // v.patch_size) ** 2, tokens_per_image=tokens)


LLAVA = Family(build, "modeling_llava.py", required=(("vision_config",),), text_model_type="llama")
