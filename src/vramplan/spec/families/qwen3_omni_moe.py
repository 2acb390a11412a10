"""Qwen3-Omni (``model_type: qwen3_omni_moe``, ``Qwen3OmniMoeForConditionalGeneration``: Qwen3-Omni-30B-A3B-Instruct,
-Thinking and -Captioner).

transformers 5.24 ``models/qwen3_omni_moe/modeling_qwen3_omni_moe.py`` (``configuration_qwen3_omni_moe.py`` for the
defaults).  ``Qwen3OmniMoeForConditionalGeneration.__init__`` (modeling:3963-3974) builds the ``thinker`` always and
the ``talker`` and ``code2wav`` only when the config's ``enable_audio_output`` (default True, configuration:594) is
set (``enable_talker``); the -Thinking and -Captioner releases set it False and ship no talker weights.

* Thinker (``Qwen3OmniMoeThinkerForConditionalGeneration``, modeling:2157; ``Qwen3OmniMoeThinkerModel``, modeling:1752-1771;
  ``thinker_config``):
  ``model.language_model`` (``Qwen3OmniMoeThinkerTextModel``, modeling:1631: Qwen3-MoE's decoder, q/k RMSNorm over
  head_dim, routed experts as fused 3-D ``gate_up_proj``/``down_proj``, no shared expert) built here as the ``qwen3_moe``
  Llama-like variant from ``text_config`` over ``Qwen3OmniMoeTextConfig``'s defaults (configuration:159-181), the
  untied ``lm_head``; ``model.visual`` (``Qwen3OmniMoeVisionEncoder``, modeling:1138): Qwen3-VL's tower (a biased
  Conv3d patch embedding, learned positions, LayerNorm blocks with a fused biased qkv, ``linear_fc1``/``linear_fc2``)
  whose mergers are named ``merger.ln_q``/``merger.mlp.0``/``merger.mlp.2`` and ``merger_list`` (the DeepStack
  mergers, ``use_postshuffle_norm``); ``model.audio_tower`` (``Qwen3OmniMoeAudioEncoder``, modeling:766): three
  stride-2 ``Conv2d`` (3 x 3, biased) over the mel bins, ``conv_out`` (no bias), Whisper-style pre-norm layers
  (biased ``q/k/v/out_proj``, ``fc1``/``fc2``, two LayerNorms), ``ln_post``, ``proj1`` -> GELU -> ``proj2``; its
  sinusoidal positions are a non-persistent buffer, not a parameter.
* Talker (``Qwen3OmniMoeTalkerForConditionalGeneration``, modeling:3102; ``talker_config``): ``model`` (layers of
  the Thinker's attention with a ``Qwen3OmniMoeTalkerTextSparseMoeBlock``: router, fused experts, a shared expert of
  ``shared_expert_intermediate_size`` and its one-output gate, modeling:2883-2890; every layer, modeling:2919),
  ``codec_embedding``; ``text_projection`` and ``hidden_projection`` (``Qwen3OmniMoeTalkerResizeMLP``: thinker width
  -> intermediate -> hidden, biased); ``codec_head``; ``code_predictor`` (dense q/k-normed layers, ``num_code_groups``
  - 1 codec embeddings and heads, modeling:2621-2720).
* Code2Wav (``Qwen3OmniMoeCode2Wav``, modeling:3895-3926): an 8-layer sliding-window transformer with layer scales
  (no q/k norm), a code embedding of ``codebook_size x num_quantizers`` rows, ConvNeXt upsampling blocks and a
  SnakeBeta convolutional decoder.

What is estimated: the Thinker's text (and image) generate and PEFT training, its language model as Qwen3-MoE's
terms and its vision tower as Qwen3-VL's (``VisionSpec``); the audio encoder, the talker and Code2Wav are held weights
only (``Traits.held_modules``: full fine-tuning and serving refused, ``spec/checks.py::held_module_problems``).

Image tokens: ``Qwen2VLImageProcessor`` with the three releases' ``preprocessor_config.json`` values (patch 16, merge 2,
``min_pixels`` 3,136 and ``max_pixels`` 12,845,056; that file is not read here) resizes each image with
``smart_resize`` (factor 32).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, inherit_outer, non_null
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.families.qwen3_vl import TOWER_TRAITS, deepstack_kept
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["QWEN3_OMNI_MOE"]

# Qwen3OmniMoeTextConfig defaults (configuration:159-181; head_dim absent: hidden / heads, modeling:1435)
_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": 3584, "hidden_size": 2048, "intermediate_size": 18944,
                                  "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                  "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                                  "attention_bias": False, "decoder_sparse_step": 1, "moe_intermediate_size": 768,
                                  "num_experts_per_tok": 8, "num_experts": 128, "mlp_only_layers": []}
# Qwen3OmniMoeVisionEncoderConfig defaults (configuration:91-102)
_VISION_DEFAULTS: dict[str, Any] = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
                                    "intermediate_size": 4304, "num_heads": 16, "in_channels": 3, "patch_size": 16,
                                    "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584,
                                    "num_position_embeddings": 2304, "deepstack_visual_indexes": (8, 16, 24)}
# Qwen3OmniMoeAudioEncoderConfig defaults (configuration:54-71)
_AUDIO_DEFAULTS: dict[str, Any] = {"num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20,
                                   "encoder_ffn_dim": 5120, "d_model": 1280, "output_dim": 3584,
                                   "downsample_hidden_size": 480}
# Qwen3OmniMoeTalkerTextConfig defaults (configuration:365-388; num_experts is read as num_local_experts,
# attribute_map configuration:335-336)
_TALKER_DEFAULTS: dict[str, Any] = {"vocab_size": 3072, "hidden_size": 1024, "intermediate_size": 2048,
                                    "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 2,
                                    "attention_bias": False, "moe_intermediate_size": 384, "num_experts": 128}
# Qwen3OmniMoeTalkerCodePredictorConfig defaults (configuration:269-291)
_PREDICTOR_DEFAULTS: dict[str, Any] = {"vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072,
                                       "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
                                       "head_dim": 128, "attention_bias": False, "num_code_groups": 32}
# Qwen3OmniMoeCode2WavConfig defaults (configuration:506-522)
_CODE2WAV_DEFAULTS: dict[str, Any] = {"codebook_size": 2048, "hidden_size": 1024, "num_attention_heads": 16,
                                      "num_key_value_heads": 16, "attention_bias": False, "intermediate_size": 3072,
                                      "num_hidden_layers": 8, "num_quantizers": 16, "upsample_rates": (8, 5, 4, 3),
                                      "upsampling_ratios": (2, 2), "decoder_dim": 1536}
# the three releases' preprocessor_config.json (Qwen2VLImageProcessor): min_pixels 3,136, max_pixels 12,845,056
MIN_PIXELS, MAX_PIXELS = 3_136, 12_845_056
# what the Thinker's text generate does not run, with the modules' parameter-name prefixes
HELD = (("audio_tower.", "the audio encoder"), ("talker.", "the talker"), ("code2wav.", "Code2Wav"))


def _sub(cfg: Config, key: str, defaults: Config) -> dict[str, Any]:
    return {**defaults, **non_null(cfg.get(key))}


def _linear(p: Params, name: str, fan_in: int, fan_out: int, bias: bool, count: int = 1) -> None:
    """An ``nn.Linear`` outside the language model: its weight with role "other" (held, never adapted)."""
    p.add(f"{name}.weight", fan_in * fan_out, "other", per_layer=count)
    if bias:
        p.add(f"{name}.bias", fan_out, "bias", per_layer=count)


def _layer_norm(p: Params, name: str, width: int, count: int = 1) -> None:
    p.add(f"{name}.weight", width, "norm", per_layer=count)
    p.add(f"{name}.bias", width, "bias", per_layer=count)


def _merger(p: Params, name: str, wide: int, out: int, norm_width: int, count: int = 1) -> None:
    """A ``Qwen3OmniMoeVisionPatchMerger`` (modeling:965-975): ``ln_q``, ``mlp.0`` (wide -> wide), ``mlp.2``
    (wide -> out), biased."""
    _layer_norm(p, f"{name}.ln_q", norm_width, count)
    p.vision_linear(f"{name}.mlp.0", wide, wide, per_layer=count)
    p.vision_linear(f"{name}.mlp.2", wide, out, per_layer=count)


def _vision(p: Params, vc: Config) -> dict[str, int]:
    """``Qwen3OmniMoeVisionEncoder`` (modeling:1138-1171)."""
    d, i, n = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size")), int(get(vc, "depth"))
    ch, patch, t = int(get(vc, "in_channels")), int(get(vc, "patch_size")), int(get(vc, "temporal_patch_size"))
    merge, out = int(get(vc, "spatial_merge_size")), int(get(vc, "out_hidden_size"))
    deep = [int(x) for x in (vc.get("deepstack_visual_indexes") or ())]
    if any(not 0 <= x < n for x in deep):
        raise ValueError(f"deepstack_visual_indexes {deep} outside the tower's {n} blocks")
    wide = d * merge * merge
    if deep:
        _merger(p, "visual.merger_list", wide, out, wide, count=len(deep))
    p.add("visual.patch_embed.proj.weight", d * ch * t * patch * patch, "other")
    p.add("visual.patch_embed.proj.bias", d, "bias")
    p.add("visual.pos_embed.weight", int(get(vc, "num_position_embeddings")) * d, "other")
    _layer_norm(p, "visual.blocks.norm1", d, n)
    _layer_norm(p, "visual.blocks.norm2", d, n)
    for name, fan_in, fan_out in (("attn.qkv", d, 3 * d), ("attn.proj", d, d), ("mlp.linear_fc1", d, i),
                                  ("mlp.linear_fc2", i, d)):
        p.vision_linear(f"visual.blocks.{name}", fan_in, fan_out, per_layer=n)
    _merger(p, "visual.merger", wide, out, d)
    return {"d": d, "i": i, "layers": n, "heads": int(get(vc, "num_heads")), "channels": ch, "patch": patch,
            "temporal": t, "merge": merge, "deep": len(deep), "kept": deepstack_kept(deep, n, out)}


def _audio(p: Params, ac: Config) -> None:
    """``Qwen3OmniMoeAudioEncoder`` (modeling:766-789) and its layers (modeling:605-615, 530-533)."""
    d, ffn, n = int(ac["d_model"]), int(ac["encoder_ffn_dim"]), int(ac["encoder_layers"])
    c, mel = int(ac["downsample_hidden_size"]), int(ac["num_mel_bins"])
    for k, (a, b) in enumerate(((1, c), (c, c), (c, c)), start=1):  # Conv2d(a, b, 3, 2, padding=1)
        p.add(f"audio_tower.conv2d{k}.weight", b * a * 9, "other")
        p.add(f"audio_tower.conv2d{k}.bias", b, "bias")
    # conv_out: the channels times the mel bins left after three stride-2 convolutions
    _linear(p, "audio_tower.conv_out", c * ((((mel + 1) // 2 + 1) // 2 + 1) // 2), d, bias=False)
    for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
        _linear(p, f"audio_tower.layers.self_attn.{name}", d, d, bias=True, count=n)
    _layer_norm(p, "audio_tower.layers.self_attn_layer_norm", d, n)
    _linear(p, "audio_tower.layers.fc1", d, ffn, bias=True, count=n)
    _linear(p, "audio_tower.layers.fc2", ffn, d, bias=True, count=n)
    _layer_norm(p, "audio_tower.layers.final_layer_norm", d, n)
    _layer_norm(p, "audio_tower.ln_post", d)
    _linear(p, "audio_tower.proj1", d, d, bias=True)
    _linear(p, "audio_tower.proj2", d, int(ac["output_dim"]), bias=True)


def _attention(p: Params, prefix: str, h: int, heads: int, kv: int, hd: int, bias: bool, n: int,
               qk_norm: bool = True) -> None:
    _linear(p, f"{prefix}.q_proj", h, heads * hd, bias, n)
    _linear(p, f"{prefix}.k_proj", h, kv * hd, bias, n)
    _linear(p, f"{prefix}.v_proj", h, kv * hd, bias, n)
    _linear(p, f"{prefix}.o_proj", heads * hd, h, bias, n)
    if qk_norm:
        p.add(f"{prefix}.q_norm.weight", hd, "norm", per_layer=n)
        p.add(f"{prefix}.k_norm.weight", hd, "norm", per_layer=n)


def _gated_mlp(p: Params, prefix: str, h: int, i: int, n: int) -> None:
    for name, a, b in (("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h)):
        _linear(p, f"{prefix}.{name}", a, b, False, n)


def _heads(c: Config) -> tuple[int, int, int, int]:
    h, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    kv = int(get(c, "num_key_value_heads", default=heads))
    return h, heads, kv, int(get(c, "head_dim", default=h // heads))


def _talker(p: Params, tc: Config, thinker_hidden: int) -> None:
    """``Qwen3OmniMoeTalkerForConditionalGeneration`` (modeling:3102-3115) and its ``code_predictor``."""
    text = _sub(tc, "text_config", _TALKER_DEFAULTS)
    if "shared_expert_intermediate_size" not in text:
        # not a field of Qwen3OmniMoeTalkerTextConfig: Qwen3OmniMoeTalkerTextSparseMoeBlock reads it from the
        # config.json's extra keys (modeling:2887-2889)
        raise ValueError("talker_config.text_config lacks shared_expert_intermediate_size, which the talker's MoE "
                         "block reads (Qwen3OmniMoeTalkerTextSparseMoeBlock)")
    h, heads, kv, hd = _heads(text)
    n, e, ei = int(text["num_hidden_layers"]), int(get(text, "num_experts", "num_local_experts")), int(
        text["moe_intermediate_size"])
    bias = bool(text.get("attention_bias", False))
    _attention(p, "talker.model.layers.self_attn", h, heads, kv, hd, bias, n)
    p.add("talker.model.layers.mlp.gate.weight", e * h, "other", per_layer=n)
    p.add("talker.model.layers.mlp.experts.gate_up_proj", e * 2 * ei * h, "other", per_layer=n)
    p.add("talker.model.layers.mlp.experts.down_proj", e * h * ei, "other", per_layer=n)
    _gated_mlp(p, "talker.model.layers.mlp.shared_expert", h, int(text["shared_expert_intermediate_size"]), n)
    _linear(p, "talker.model.layers.mlp.shared_expert_gate", h, 1, False, n)
    p.add("talker.model.layers.input_layernorm.weight", h, "norm", per_layer=n)
    p.add("talker.model.layers.post_attention_layernorm.weight", h, "norm", per_layer=n)
    p.add("talker.model.norm.weight", h, "norm")
    vocab = int(text["vocab_size"])
    p.add("talker.model.codec_embedding.weight", vocab * h, "other")
    inter = int(text["intermediate_size"])
    for name in ("text_projection", "hidden_projection"):
        _linear(p, f"talker.{name}.linear_fc1", thinker_hidden, inter, True)
        _linear(p, f"talker.{name}.linear_fc2", inter, h, True)
    _linear(p, "talker.codec_head", h, vocab, False)
    pc = _sub(tc, "code_predictor_config", _PREDICTOR_DEFAULTS)
    ch, cheads, ckv, chd = _heads(pc)
    cn, groups, cvocab = int(pc["num_hidden_layers"]), int(pc["num_code_groups"]), int(pc["vocab_size"])
    pre = "talker.code_predictor.model"
    _attention(p, f"{pre}.layers.self_attn", ch, cheads, ckv, chd, bool(pc.get("attention_bias", False)), cn)
    _gated_mlp(p, f"{pre}.layers.mlp", ch, int(pc["intermediate_size"]), cn)
    p.add(f"{pre}.layers.input_layernorm.weight", ch, "norm", per_layer=cn)
    p.add(f"{pre}.layers.post_attention_layernorm.weight", ch, "norm", per_layer=cn)
    p.add(f"{pre}.norm.weight", ch, "norm")
    p.add(f"{pre}.codec_embedding.weight", cvocab * ch, "other", per_layer=groups - 1)
    _linear(p, "talker.code_predictor.lm_head", ch, cvocab, False, groups - 1)


def _conv(p: Params, name: str, c_in: int, c_out: int, kernel: int, groups: int = 1) -> None:
    """A ``Conv1d``/``ConvTranspose1d`` with its bias (both hold in x out / groups x kernel weights)."""
    p.add(f"{name}.weight", c_in * c_out // groups * kernel, "other")
    p.add(f"{name}.bias", c_out, "bias")


def _code2wav(p: Params, cc: Config) -> None:
    """``Qwen3OmniMoeCode2Wav`` (modeling:3895-3926), its transformer (modeling:3709, 3645-3654, 3534-3547) and blocks."""
    h, heads, kv, hd = _heads(cc)
    n = int(cc["num_hidden_layers"])
    pre = "code2wav.pre_transformer.layers"
    _attention(p, f"{pre}.self_attn", h, heads, kv, hd, bool(cc.get("attention_bias", False)), n, qk_norm=False)
    _gated_mlp(p, f"{pre}.mlp", h, int(cc["intermediate_size"]), n)
    for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn_layer_scale.scale",
                 "mlp_layer_scale.scale"):
        p.add(f"{pre}.{name}", h, "norm", per_layer=n)
    p.add("code2wav.pre_transformer.norm.weight", h, "norm")
    p.add("code2wav.code_embedding.weight", int(cc["codebook_size"]) * int(cc["num_quantizers"]) * h, "other")
    for k, factor in enumerate(cc["upsampling_ratios"]):
        up = f"code2wav.upsample.{k}"
        _conv(p, f"{up}.0.conv", h, h, int(factor))
        _conv(p, f"{up}.1.dwconv.conv", h, h, 7, groups=h)  # ConvNeXt's depthwise convolution
        _layer_norm(p, f"{up}.1.norm", h)
        _linear(p, f"{up}.1.pwconv1", h, 4 * h, True)
        _linear(p, f"{up}.1.pwconv2", 4 * h, h, True)
        p.add(f"{up}.1.gamma", h, "norm")
    dim = int(cc["decoder_dim"])
    _conv(p, "code2wav.decoder.0.conv", h, dim, 7)
    for k, rate in enumerate(cc["upsample_rates"]):
        a, b = dim // 2**k, dim // 2 ** (k + 1)
        blk = f"code2wav.decoder.{k + 1}.block"
        p.add(f"{blk}.0.alpha", a, "norm")  # SnakeBeta's alpha and beta
        p.add(f"{blk}.0.beta", a, "norm")
        _conv(p, f"{blk}.1.conv", a, b, 2 * int(rate))
        for unit in (2, 3, 4):  # residual units of dilation 1, 3, 9
            for act in ("act1", "act2"):
                p.add(f"{blk}.{unit}.{act}.alpha", b, "norm")
                p.add(f"{blk}.{unit}.{act}.beta", b, "norm")
            _conv(p, f"{blk}.{unit}.conv1.conv", b, b, 7)
            _conv(p, f"{blk}.{unit}.conv2.conv", b, b, 1)
    last, k = dim // 2 ** len(cc["upsample_rates"]), len(cc["upsample_rates"]) + 1
    p.add(f"code2wav.decoder.{k}.alpha", last, "norm")
    p.add(f"code2wav.decoder.{k}.beta", last, "norm")
    _conv(p, f"code2wav.decoder.{k + 1}.conv", last, 1, 7)


def _text_config(thinker: Config, cfg: Config) -> dict[str, Any]:
    """The Thinker's ``text_config`` over ``Qwen3OmniMoeTextConfig``'s defaults, built as ``qwen3_moe``; the
    Thinker's ``tie_word_embeddings`` (default False, configuration:234), the checkpoint's dtype and quantization."""
    text = dict(_TEXT_DEFAULTS)
    text.update({k: v for k, v in non_null(thinker.get("text_config")).items() if k not in ("model_type",)})
    text["model_type"] = "qwen3_moe"
    text["tie_word_embeddings"] = bool(thinker.get("tie_word_embeddings", False))
    return inherit_outer(inherit_outer(text, thinker), cfg)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    thinker = non_null(cfg.get("thinker_config"))
    text = LLAMA_FAMILIES["qwen3_moe"].build(_text_config(thinker, cfg), "qwen3_moe", name)
    p = Params()
    _audio(p, _sub(thinker, "audio_config", _AUDIO_DEFAULTS))
    vc = _sub(thinker, "vision_config", _VISION_DEFAULTS)
    t = _vision(p, vc)
    audio_output = bool(cfg.get("enable_audio_output", True))
    if audio_output:  # Qwen3OmniMoeForConditionalGeneration.enable_talker (modeling:3966-3974)
        _talker(p, non_null(cfg.get("talker_config")), text.hidden_size)
        _code2wav(p, _sub(cfg, "code2wav_config", _CODE2WAV_DEFAULTS))
    factor = t["patch"] * t["merge"]
    side = int(MAX_PIXELS**0.5) // factor * factor  # the largest square smart_resize lets through: 3584
    patches = (side // t["patch"]) ** 2
    act = str(vc["hidden_act"])
    tower = build_spec({}, f"{name} vision tower", "qwen3_omni_moe_vision", Params(), hidden_size=t["d"],
                       num_layers=t["layers"], num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1,
                       intermediate_size=t["i"], hidden_act=act, position="rope", tie_word_embeddings=False,
                       attention_dropout=0.0, hidden_dropout=0.0, max_position_embeddings=patches,
                       encoder_only=True, traits=TOWER_TRAITS)
    mergers = 1 + t["deep"]
    notes = [("the bilinear interpolation of Qwen3-Omni's pos_embed to each image's grid is not counted; its fp32 "
              "result and the 2-D rotary tables (fp32), held through the blocks, are counted in generate's vision "
              "moment, not in training")]
    if t["deep"]:
        notes.append(f"the {t['deep']} DeepStack mergers' saved tensors are counted as the final merger's; their "
                     "outputs are counted while the tower's last block runs; added to the image tokens' hidden "
                     "states after the first decoder layers, they are held through the language model's forward: "
                     "not counted there")
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=side, patch_size=t["patch"], patches_per_image=patches,
                        tokens_per_image=patches // (t["merge"] ** 2), hidden_act=act,
                        source="transformers 5.24 Qwen2VLImageProcessor smart_resize (the Qwen3-Omni releases' "
                               "preprocessor_config.json: patch 16, min 3,136 and max 12,845,056 pixels) and "
                               "Qwen3OmniMoeVisionPatchMerger",
                        param_prefixes=("visual.",), tower=tower, num_channels=t["channels"],
                        temporal_patch_size=t["temporal"], merge_size=t["merge"], min_pixels=MIN_PIXELS,
                        max_pixels=MAX_PIXELS,
                        # each merger: its ln_q, then mlp.0's input, the GELU's input and mlp.2's input, each 4d per
                        # merged token (d per patch), as Qwen3-VL's
                        head_saved_per_patch=(("norm", mergers), ("compute", 3 * t["d"] * mergers)),
                        notes=tuple(notes), linears=tuple(p.vision_linears),
                        # the DeepStack features of the blocks before the last, alive through it (modeling:1211-1224)
                        kept_merged_elements=t["kept"],
                        # pos_embeds and the rotary cos and sin, fp32, bound through the blocks (modeling:1203-1206)
                        held_per_patch=(("fp32", t["d"] + 2 * t["d"] // t["heads"] + 4), ("int64", 2 + 4)))
    held = HELD if audio_output else HELD[:1]
    # Qwen3OmniMoeThinkerForConditionalGeneration.forward takes no logits_to_keep (modeling:2223-2244) and runs
    # lm_head on every position (modeling:2313): generate's prefill computes the prompt's logits
    traits = replace(text.traits, held_modules=held, head_on_every_position=True)
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision, traits=traits)


QWEN3_OMNI_MOE = Family(build, "modeling_qwen3_omni_moe.py", required=(("thinker_config",),),
                        text_model_type="qwen3_moe", nested_config="thinker_config")
