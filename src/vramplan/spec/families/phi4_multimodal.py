"""Phi-4-multimodal, transformers' port (``model_type: phi4_multimodal``, ``Phi4MultimodalForCausalLM``; the
``microsoft/Phi-4-multimodal-instruct`` checkpoint converted by ``convert_phi4_multimodal_weights_to_hf.py``).

transformers 5.24 ``models/phi4_multimodal/modeling_phi4_multimodal.py``:

- the language model is Phi-3's (``Phi4MultimodalModel``, l.1463-1480: ``embed_tokens``, ``layers`` of
  ``Phi4MultimodalDecoderLayer`` with the fused ``self_attn.qkv_proj`` and ``mlp.gate_up_proj``, l.1130-1131 and
  l.1232-1233, ``norm``; ``Phi4MultimodalForCausalLM.lm_head``, l.1584, tied to ``embed_tokens`` with
  ``tie_word_embeddings``, ``_tied_weights_keys`` l.1575): built here by the ``phi3`` adapter from the outer keys;
- ``embed_tokens_extend`` (``Phi4MultimodalFeatureEmbedding``, l.1328) holds ``image_embed`` and ``audio_embed``;
- ``image_embed`` (``Phi4MultimodalImageEmbedding``, l.455-477): ``img_processor``, a SigLIP vision model
  (``Phi4MultimodalVisionModel``, l.387-397: ``embeddings.patch_embedding`` Conv2d and ``position_embedding``,
  ``encoder.layers`` of SigLIP's encoder layer, ``post_layernorm`` and the attention-pooling ``head``: ``probe``,
  an ``nn.MultiheadAttention``, a LayerNorm and an MLP, l.361-370), ``img_projection_up`` (d_vision -> d) ->
  GELU -> ``img_projection_down`` (d -> d), and the two learnable separators ``global_img_feature_extensor`` [d_vision]
  and ``sub_img_feature_extensor`` [d_vision];
- ``audio_embed`` (``Phi4MultimodalAudioEmbedding``, l.1044-1059): ``encoder``, a conformer
  (``Phi4MultimodalAudioModel``, l.912-925: ``embed``, the NeMo convolutional subsampling, l.753-776: a
  ``Conv2d(1, c, 3, stride 2)``, then log2(time_reduction) - 1 pairs of a depthwise ``Conv2d(c, c, 3, stride 2,
  groups=c)`` and a pointwise ``Conv2d(c, c, 1)``, and ``out`` Linear(c x nemo_final_size, d_audio);
  ``relative_attention_bias_layer.bias_values`` Embedding(2 x bias_max_distance, heads), l.798-807; ``encoders``,
  ``num_blocks`` conformer layers, l.725-734: ``feed_forward_in``/``feed_forward_out`` (LayerNorm, biased
  ``gate_up_proj`` d_audio -> 2 x intermediate, ``down_proj``), ``self_attn`` (biased q/k/v/o_proj), ``conv``
  (LayerNorm, ``glu.ext_pw_conv_1d`` Conv1d(d_audio, 2 x ext_pw_out_channel, 1) with ``b1``/``b2``,
  ``dw_sep_conv_1d.dw_conv`` Conv1d(d_audio, d_audio x multiplier, kernel, groups=d_audio) and ``pw_conv``
  Conv1d(that, depthwise_separable_out_channel, 1), ``ext_pw_conv_1d`` Conv1d(d_audio, ext_pw_out_channel, 1),
  l.659-709), ``layer_norm_att`` and ``layer_norm``; the mean/variance normalisation's ``global_mean`` and
  ``global_invstd`` are buffers, l.831-838) and two projector pairs, ``up_proj_for_speech``/``down_proj_for_speech``
  and ``up_proj_for_vision_speech``/``down_proj_for_vision_speech`` (d_audio x downsample_rate -> d -> d).

The original checkpoint's vision and speech LoRA adapters are not in the module: the conversion drops every
``lora`` key and keeps each ``base_layer`` weight (``convert_phi4_multimodal_weights_to_hf.py`` ``map_old_key_to_new``),
and the model card loads them through PEFT (``model.load_adapter(path, adapter_name="vision",
adapter_kwargs={"subfolder": "vision-lora"})``, docs/source/en/model_doc/phi4_multimodal.md).  Their parameters
(and a LoRA's adapter memory) are not counted here; ``published "5.6B"`` counts them, so the catalog row leaves
``published_parameters`` null.

Images (``image_processing_phi4_multimodal.py``): ``dynamic_preprocess`` (l.79-137) resizes each image onto a grid of
``ceil(w / crop) x ceil(h / crop)`` crops of ``size`` (448) pixels, at most ``dynamic_hd`` (36, the class default)
crops (else the closest aspect ratio of at most that many); ``_preprocess`` (l.156-231) puts the whole image at 448
before them (1 + crops tower passes of (448 / 14)^2 = 1,024 patches) and counts ``num_img_tokens`` = 256 + 1 +
the crops' pooled patches + one separator per pooled row + 16 (l.216-222): the global image's 16 x 16 pooled
patches with a separator column, the ``global_img_feature_extensor``, and the crops' (16 c) x (16 c) patches with a
separator column (``Phi4MultimodalImageEmbedding.forward``, l.523-570).  ``Phi4MultimodalProcessor`` writes that
many image tokens (``replace_image_token``, processing_phi4_multimodal.py l.42-44).  ``get_img_features`` takes the
tower's ``hidden_states[feature_layer]`` (-2: the last layer's output is not used) and average-pools each 2 x 2
square of patches (``image_token_compression``, l.479-497).  ``dynamic_hd`` is in ``preprocessor_config.json``,
which is not read: the class default is assumed and said (spec/vision.py ``phi4_hd_crops``).

Audio input is not modelled: a scenario of this model is text and images (no audio field), said in every report
(``VisionSpec.param_note``); the audio encoder's and its projectors' parameters are held with the vision tower's
(``VisionSpec.param_prefixes`` "embed_tokens_extend."), frozen with it, and run for no image.  A trained tower
(``VisionSpec.train_refused``) and serving (``VisionSpec.serve_refused``) are refused (spec/vision.py).
"""

from __future__ import annotations

import math
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
    square_side,
)
from vramplan.spec.families.gemma3 import tower_layer_spec, vit_encoder_layers
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["AUDIO_PREFIX", "IMAGE_PREFIX", "PHI4_MULTIMODAL", "hd_tokens"]

IMAGE_PREFIX = "embed_tokens_extend.image_embed"
AUDIO_PREFIX = "embed_tokens_extend.audio_embed"
# Phi4MultimodalVisionConfig's defaults (configuration_phi4_multimodal.py l.51-63)
_VISION: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                           "num_attention_heads": 16, "num_channels": 3, "image_size": 448, "patch_size": 14,
                           "hidden_act": "gelu_pytorch_tanh", "crop_size": 448, "feature_layer": -2}
# Phi4MultimodalAudioConfig's defaults (configuration_phi4_multimodal.py l.120-143)
_AUDIO: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 1536, "num_blocks": 24, "num_attention_heads": 16,
                          "ext_pw_out_channel": 1024, "depthwise_separable_out_channel": 1024,
                          "depthwise_multiplier": 1, "kernel_size": 3, "input_size": 80, "time_reduction": 8,
                          "bias_max_distance": 1000, "bias_symmetric": False, "nemo_conv_channels": 1024,
                          "downsample_rate": 1}
# Phi4MultimodalImageProcessor.dynamic_hd (image_processing_phi4_multimodal.py l.48): at most 36 crops per image
DYNAMIC_HD = 36


def _text_config(cfg: Config) -> dict[str, Any]:
    """The outer keys without the sub-configs, as a phi3 config (Phi4MultimodalConfig's defaults where missing:
    configuration_phi4_multimodal.py l.194-214)."""
    defaults = {"vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "tie_word_embeddings": False}
    text = {**defaults, **{k: v for k, v in cfg.items() if k not in ("vision_config", "audio_config")}}
    text["model_type"] = "phi3"
    return inherit_outer(text, cfg, OUTER_KEYS)


def _vision(p: Params, vc: Config, d_text: int) -> dict[str, int]:
    """``image_embed``'s tensors in the modeling file's order; returns the tower's sizes."""
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_attention_heads"))
    image, patch, ch = square_side(get(vc, "image_size")), square_side(get(vc, "patch_size")), int(get(vc, "num_channels"))
    proc = f"{IMAGE_PREFIX}.img_processor"
    p.add(f"{proc}.embeddings.patch_embedding.weight", d * ch * patch * patch, "other")
    p.add(f"{proc}.embeddings.patch_embedding.bias", d, "bias")
    p.add(f"{proc}.embeddings.position_embedding.weight", (image // patch) ** 2 * d, "other")
    vit_encoder_layers(p, f"{proc}.encoder.layers", d, i, n)
    p.add(f"{proc}.post_layernorm.weight", d, "norm")
    p.add(f"{proc}.post_layernorm.bias", d, "bias")
    head = f"{proc}.head"  # Phi4MultimodalVisionMultiheadAttentionPoolingHead (l.361-370)
    p.add(f"{head}.probe", d, "other")
    p.add(f"{head}.attention.in_proj_weight", 3 * d * d, "other")
    p.add(f"{head}.attention.in_proj_bias", 3 * d, "bias")
    # nn.MultiheadAttention's out_proj is a NonDynamicallyQuantizableLinear (not an nn.Linear to bitsandbytes)
    p.add(f"{head}.attention.out_proj.weight", d * d, "other")
    p.add(f"{head}.attention.out_proj.bias", d, "bias")
    p.add(f"{head}.layernorm.weight", d, "norm")
    p.add(f"{head}.layernorm.bias", d, "bias")
    p.vision_linear(f"{head}.mlp.fc1", d, i)
    p.vision_linear(f"{head}.mlp.fc2", i, d)
    p.vision_linear(f"{IMAGE_PREFIX}.img_projection_up", d, d_text)
    p.vision_linear(f"{IMAGE_PREFIX}.img_projection_down", d_text, d_text)
    p.add(f"{IMAGE_PREFIX}.global_img_feature_extensor", d, "other")
    p.add(f"{IMAGE_PREFIX}.sub_img_feature_extensor", d, "other")
    return {"d": d, "layers": n, "heads": heads, "i": i, "image": image, "patch": patch,
            "patches": (image // patch) ** 2, "channels": ch}


def _audio(p: Params, ac: Config, d_text: int) -> None:
    """``audio_embed``'s tensors (the conformer encoder and its two projector pairs)."""
    d, i = int(ac["hidden_size"]), int(ac["intermediate_size"])
    n, heads = int(ac["num_blocks"]), int(ac["num_attention_heads"])
    c, reduction = int(ac["nemo_conv_channels"]), int(ac["time_reduction"])
    if reduction < 2 or reduction & (reduction - 1):
        # Phi4MultimodalAudioConfig.validate_architecture requires a multiple of 2; the subsampling's
        # int(log2(time_reduction)) stride-2 stages (l.757-774) shrink the mel bins to nemo_final_size
        raise ValueError(f"audio_config.time_reduction {reduction}: a power of two is modelled")
    stages = int(math.log2(reduction))
    final = int(ac["input_size"])
    for _ in range(stages):  # Phi4MultimodalAudioConfig.__post_init__ nemo_final_size (l.145-149)
        final = math.floor((final - 1) / 2 + 1)
    enc = f"{AUDIO_PREFIX}.encoder"
    # embed.conv: Sequential of Conv2d(1, c, 3) and act, then (Conv2d(c, c, 3, groups=c), Conv2d(c, c, 1), act) x
    # (stages - 1): indices 0, then 2 + 3k and 3 + 3k
    p.add(f"{enc}.embed.conv.0.weight", c * 9, "other")
    p.add(f"{enc}.embed.conv.0.bias", c, "bias")
    for k in range(stages - 1):
        p.add(f"{enc}.embed.conv.{2 + 3 * k}.weight", c * 9, "other")
        p.add(f"{enc}.embed.conv.{2 + 3 * k}.bias", c, "bias")
        p.add(f"{enc}.embed.conv.{3 + 3 * k}.weight", c * c, "other")
        p.add(f"{enc}.embed.conv.{3 + 3 * k}.bias", c, "bias")
    p.vision_linear(f"{enc}.embed.out", c * final, d)
    buckets = int(ac["bias_max_distance"]) * (1 if bool(ac["bias_symmetric"]) else 2)
    p.add(f"{enc}.relative_attention_bias_layer.bias_values.weight", buckets * heads, "other")
    layer = f"{enc}.encoders"
    for ff in ("feed_forward_in", "feed_forward_out"):
        p.add(f"{layer}.{ff}.layer_norm.weight", d, "norm", per_layer=n)
        p.add(f"{layer}.{ff}.layer_norm.bias", d, "bias", per_layer=n)
        p.vision_linear(f"{layer}.{ff}.gate_up_proj", d, 2 * i, per_layer=n)
        p.vision_linear(f"{layer}.{ff}.down_proj", i, d, per_layer=n)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        p.vision_linear(f"{layer}.self_attn.{name}", d, d, per_layer=n)
    ext, mult, kernel = int(ac["ext_pw_out_channel"]), int(ac["depthwise_multiplier"]), int(ac["kernel_size"])
    sep = int(ac["depthwise_separable_out_channel"])
    conv = f"{layer}.conv"
    p.add(f"{conv}.layer_norm.weight", d, "norm", per_layer=n)
    p.add(f"{conv}.layer_norm.bias", d, "bias", per_layer=n)
    p.add(f"{conv}.glu.b1", ext, "bias", per_layer=n)
    p.add(f"{conv}.glu.b2", ext, "bias", per_layer=n)
    p.add(f"{conv}.glu.ext_pw_conv_1d.weight", 2 * ext * d, "other", per_layer=n)
    p.add(f"{conv}.glu.ext_pw_conv_1d.bias", 2 * ext, "bias", per_layer=n)
    p.add(f"{conv}.dw_sep_conv_1d.dw_conv.weight", d * mult * kernel, "other", per_layer=n)
    p.add(f"{conv}.dw_sep_conv_1d.dw_conv.bias", d * mult, "bias", per_layer=n)
    p.add(f"{conv}.dw_sep_conv_1d.pw_conv.weight", sep * d * mult, "other", per_layer=n)
    p.add(f"{conv}.dw_sep_conv_1d.pw_conv.bias", sep, "bias", per_layer=n)
    p.add(f"{conv}.ext_pw_conv_1d.weight", ext * d, "other", per_layer=n)
    p.add(f"{conv}.ext_pw_conv_1d.bias", ext, "bias", per_layer=n)
    for name in ("layer_norm_att", "layer_norm"):
        p.add(f"{layer}.{name}.weight", d, "norm", per_layer=n)
        p.add(f"{layer}.{name}.bias", d, "bias", per_layer=n)
    wide = d * int(ac["downsample_rate"])
    for mode in ("speech", "vision_speech"):
        p.vision_linear(f"{AUDIO_PREFIX}.up_proj_for_{mode}", wide, d_text)
        p.vision_linear(f"{AUDIO_PREFIX}.down_proj_for_{mode}", d_text, d_text)


def hd_tokens(crops_per_side: int, pooled: int) -> int:
    """Image tokens of a square image of ``crops_per_side``^2 crops whose tower passes pool to ``pooled`` x
    ``pooled`` patches: the global image's pooled^2 and a separator per row, the global separator, the crops'
    (c x pooled)^2 and a separator per row (``Phi4MultimodalImageEmbedding.forward``; the processor's
    ``num_img_tokens``, image_processing_phi4_multimodal.py l.216-222, with 256 = 16^2 and 16 for 448 / 14)."""
    side = crops_per_side * pooled
    return pooled * pooled + pooled + 1 + side * side + side


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text = LLAMA_FAMILIES["phi3"].build(_text_config(cfg), "phi3", name)
    vc = {**_VISION, **non_null(cfg.get("vision_config"))}
    ac = {**_AUDIO, **non_null(cfg.get("audio_config"))}
    p = Params()
    t = _vision(p, vc, text.hidden_size)
    _audio(p, ac, text.hidden_size)
    crop = int(vc["crop_size"])
    per_side = t["image"] // t["patch"]
    # get_img_features reshapes each pass's patches to a square and a reflection pad makes an odd side even
    # before the 2 x 2 average pool (l.465-470, l.491-493); the processor crops at crop_size (its size 448)
    pooled = (per_side + per_side % 2) // 2
    refused = ""
    if crop != t["image"]:
        refused = (f"crop_size {crop} differs from the tower's image_size {t['image']}: the processor's crops and "
                   "the image embedding's crop arithmetic are not modelled for it")
    layer = int(vc["feature_layer"])
    if not -t["layers"] - 1 <= layer < t["layers"] + 1:
        raise ValueError(f"vision_config.feature_layer {layer} selects no hidden state of {t['layers']} layers")
    unused = -layer - 1 if layer < 0 else t["layers"] - layer
    act = str(vc["hidden_act"])
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=hd_tokens(1, pooled), hidden_act=act,
                        source="transformers 5.24 Phi4MultimodalImageProcessor (dynamic_preprocess's crops and "
                               "num_img_tokens) and Phi4MultimodalImageEmbedding.forward",
                        param_prefixes=("embed_tokens_extend.",), tower=tower_layer_spec(t, act, name),
                        num_channels=t["channels"], merge_size=2, dynamic_hd=DYNAMIC_HD, unused_layers=unused,
                        images_refused=refused, notes=_notes(t, unused), linears=tuple(p.vision_linears),
                        train_refused=_TRAIN_REFUSED, serve_refused=_SERVE_REFUSED,
                        # Phi4MultimodalVisionModel.forward binds the embeddings' output through the encoder's
                        # layers; get_img_features asks the tower for hidden_states[feature_layer] (l.480-483), which
                        # capture_outputs keeps (utils/output_capturing.py), the last layer's input at -2
                        kept_hidden_states=held_tower_states(t["layers"], (layer,)), param_note=_held(p))
    # the class came in transformers 4.50, after the causal-LM heads stopped upcasting every logit (logits.float(),
    # Traits.upcasts_all_logits, 4.44); Phi4MultimodalForCausalLM.forward computes lm_head's logits in the model dtype
    # (l.1656-1658)
    traits = replace(text.traits, upcasts_all_logits=False)
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision, traits=traits)


# a trained tower: the audio encoder and the unused projector pairs get no gradient without audio (AdamW keeps no state
# for them), the unused last tower layer, post_layernorm and pooling head save tensors no gradient reaches, and the
# crops' tensors of a batch are padded to its largest image's crops (image_processing_phi4_multimodal.py l.232-236)
_TRAIN_REFUSED = ("the SigLIP tower's unused last layer and pooling head, its padded crops and the audio encoder "
                  "(no gradient without audio) make a trained tower's gradients, optimizer states and saved tensors "
                  "unlike any modelled tower")
# serving: vLLM's profiling run encodes dummy images and audio of its encoder budget, and the model is served with the
# original checkpoint's vision and speech LoRA adapters (LoRA requests): neither is modelled for this model
_SERVE_REFUSED = ("vLLM's profiling run of dummy images and audio through its encoders and the vision and speech LoRA "
                  "adapters it serves the model with are not modelled")


def _held(p: Params) -> str:
    audio = sum(r.total for r in p.rows if r.name.startswith(AUDIO_PREFIX))
    return (f"the vision tower's parameters include the audio encoder and its two projector pairs ({audio:,}), held "
            "with it (frozen in training); audio input is not modelled (no audio field), and the original "
            "checkpoint's vision and speech LoRA adapters are not in transformers' module (PEFT loads them: not "
            "counted)")


def _notes(t: dict[str, int], unused: int) -> tuple[str, ...]:
    crops = (f"each image through the tower as the whole image at {t['image']} and up to {DYNAMIC_HD} crops "
             "(Phi4MultimodalImageProcessor.dynamic_hd, the class default; preprocessor_config.json is not read)")
    tail = (f"the tower's last {unused} layer(s), post_layernorm and attention-pooling head run but their output is "
            "not used (feature_layer); their transients are bounded by a tower layer's")
    return (crops, tail) if unused else (crops,)


PHI4_MULTIMODAL = Family(build, "modeling_phi4_multimodal.py", required=(("vision_config",), ("audio_config",)),
                         text_model_type="phi3")
