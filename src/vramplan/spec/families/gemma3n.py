"""Gemma 3n (``model_type: gemma3n_text``, ``Gemma3nForCausalLM``; ``gemma3n``, ``Gemma3nForConditionalGeneration``).

transformers 5.24 ``models/gemma3n/modeling_gemma3n.py`` (lines cited below) and ``configuration_gemma3n.py``.

The language model (``Gemma3nTextModel``, modeling_gemma3n.py:1565-1615):

- ``embed_tokens`` (vocab x h, the LM head tied to it: ``_tied_weights_keys``, :1777 and :2172), ``norm``;
- the per-layer embeddings: ``embed_tokens_per_layer`` (``vocab_size_per_layer_input`` x ``L * p``, p =
  ``hidden_size_per_layer_input``), ``per_layer_model_projection`` (h -> ``L * p``, no bias) and
  ``per_layer_projection_norm`` (p) (:1589-1602);
- AltUp's ``altup_projections`` and ``altup_unembed_projections``: ``altup_num_inputs - 1`` linears h -> h each
  (:1604-1610).

Each ``Gemma3nTextDecoderLayer`` (:1248-1268):

- ``self_attn`` (``Gemma3nTextAttention``, :1150-1186): ``q_proj``, ``q_norm`` (head_dim), ``o_proj``; ``k_proj``,
  ``v_proj``, ``k_norm`` and ``v_norm`` (without a weight: ``with_scale=False``) only on a layer that computes its
  own K/V.  The last ``num_kv_shared_layers`` layers reuse the K/V of the last earlier layer of their type
  (``Gemma3nTextConfig.kv_sharing_modes``, configuration_gemma3n.py:205-231: "reuse" layers hold no k/v weights
  and write no cache, :1190-1206);
- ``mlp`` (``Gemma3nTextMLP``, :938-946): gate/up/down of ``intermediate_size[i]`` (a list, one width per layer,
  MatFormer), its gate through a Gaussian top-k where ``activation_sparsity_pattern[i]`` > 0 (:955-974);
- four RMSNorms (``input_layernorm``, ``post_attention_layernorm``, ``pre_feedforward_layernorm``,
  ``post_feedforward_layernorm``);
- ``altup`` (``Gemma3nTextAltUp``, :976-995): ``correct_output_scale`` (h), ``correction_coefs`` (n -> n),
  ``prediction_coefs`` (n -> n^2), ``modality_router`` (h -> n), ``router_norm`` (h), n = ``altup_num_inputs``;
- ``laurel`` (``Gemma3nTextLaurelBlock``, :920-929): ``linear_left`` (h -> r), ``linear_right`` (r -> h),
  ``post_laurel_norm``, r = ``laurel_rank``;
- ``per_layer_input_gate`` (h -> p), ``per_layer_projection`` (p -> h), ``post_per_layer_input_norm`` (h).

The multimodal model (``Gemma3nModel``, :1912-1925) adds:

- ``vision_tower``: ``AutoModel.from_config(vision_config)``, a ``TimmWrapperModel`` over timm's
  ``mobilenetv5_300m_enc`` (``Gemma3nVisionConfig.architecture``); its tensors are counted from timm 1.0's
  ``timm/models/mobilenetv5.py`` (``_gen_mobilenet_v5``'s arch_def, ``MobileNetV5Encoder``,
  ``MobileNetV5MultiScaleFusionAdapter``) below (``mobilenetv5_300m_enc_tensors``); another timm architecture is refused;
- ``audio_tower`` (``Gemma3nAudioEncoder``, :1422-1440): ``subsample_conv_projection`` (two bias-free Conv2d with a
  cumulative group norm weight each, then ``input_proj_linear``, :641-766) and ``conf_num_hidden_layers`` conformer
  blocks (``Gemma3nAudioConformerBlock``, :879-889: two feed-forwards of 4h, chunked local attention with a
  relative position projection and ``per_dim_scale``, a light depthwise Conv1d block, norms);
- ``embed_vision`` and ``embed_audio`` (``Gemma3nMultimodalEmbedder``, :1856-1876): ``embedding`` (the modality's
  ``vocab_size`` x its width), ``hard_embedding_norm``, ``soft_embedding_norm``, ``embedding_projection`` (its
  width -> text h), ``embedding_post_projection_norm`` without a weight.

AltUp runs every layer over ``altup_num_inputs`` copies of the residual stream, the per-layer embeddings add a
``L x p`` input per token (kept through the forward), the KV-shared layers read the earlier layers' full K/V
(``shared_kv_states``) and write no cache, LAuReL and the activation-sparsity top-k add tensors of their own.  The
adapter records them as data (``ModelSpec.altup``: ``AltUpSpec``; ``ModelSpec.kv_reuse_layers``; one MLP width per
layer in ``layers``), from which the analytic engine estimates generate (``analytic/altup.py``,
``analytic/kv_cache.py attention_layers``); its training terms (what each layer saves for the backward) do not hold
them, so the analytic engine refuses training (``Traits.analytic_unmodelled``, ``Traits.analytic_generate``).  The
traced engine runs transformers' own forward for both (``Gemma3nForCausalLM``; its decode step's cache holds the
layers that store one, trace/step.py ``_reads_shared_cache``).  Serving is refused.  The multimodal model's every task
is refused (``Traits.unmodelled_mixer``): the traced engine would build its language model alone.
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
    inherit_outer,
    non_null,
    prob,
)
from vramplan.spec.model import AltUpSpec, ModelSpec

__all__ = ["GEMMA3N", "GEMMA3N_TEXT", "kv_sharing_modes", "layer_types", "mobilenetv5_300m_enc_tensors"]

ANALYTIC_UNMODELLED = ("its AltUp streams (altup_num_inputs copies of the residual stream through every layer), "
                       "per-layer inputs (embed_tokens_per_layer, per_layer_model_projection), KV-shared layers (the "
                       "last num_kv_shared_layers read earlier layers' K/V, shared_kv_states), LAuReL blocks and "
                       "activation-sparsity top-k (transformers 5.24 modeling_gemma3n.py) are among the analytic "
                       "engine's generate terms (analytic/altup.py) but not its training terms (what each layer saves "
                       "for the backward)")
UNMODELLED = ("its AltUp streams (altup_num_inputs copies of the residual stream through every layer), "
                       "per-layer inputs (embed_tokens_per_layer, per_layer_model_projection), KV-shared layers (the "
                       "last num_kv_shared_layers read earlier layers' K/V, shared_kv_states), LAuReL blocks and "
                       "activation-sparsity top-k (transformers 5.24 modeling_gemma3n.py) are not among the analytic "
                       "engine's terms")
UNMODELLED = ("its MobileNetV5 vision tower and conformer audio tower are not modelled (the traced engine would build "
              "the language model alone); its text_config alone (model_type gemma3n_text) is estimated: generate by "
              "either engine, training with --engine trace")

# Gemma3nTextConfig defaults (configuration_gemma3n.py:95-126), the E4B shape
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384, "num_hidden_layers": 35,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32_768, "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 512,
    "final_logit_softcapping": 30.0, "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256,
    "altup_num_inputs": 4, "num_kv_shared_layers": 15, "laurel_rank": 64}
# Gemma3nAudioConfig defaults (configuration_gemma3n.py:307-331)
_AUDIO_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128, "input_feat_size": 128, "hidden_size": 1536, "conf_num_attention_heads": 8,
    "conf_num_hidden_layers": 12, "conf_conv_kernel_size": 5, "sscp_conv_channel_size": [128, 32],
    "sscp_conv_kernel_size": [[3, 3], [3, 3]], "sscp_conv_stride_size": [[2, 2], [2, 2]]}
# Gemma3nVisionConfig defaults (configuration_gemma3n.py:365-372)
_VISION_DEFAULTS: dict[str, Any] = {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048, "vocab_size": 128}


def layer_types(cfg: Config, n: int) -> list[str]:
    """``Gemma3nTextConfig.__post_init__`` (configuration_gemma3n.py:140-143): every fifth layer full attention."""
    types = cfg.get("layer_types")
    if types:
        return [str(t) for t in types]
    return ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]


def kv_sharing_modes(types: list[str], shared: int) -> list[str | None]:
    """``Gemma3nTextConfig.kv_sharing_modes`` (configuration_gemma3n.py:205-231): None (own cache), "store" (the
    last layer of each type before the shared range, whose full K/V the shared layers read) or "reuse"."""
    n = len(types)
    if shared == 0:
        return [None] * n
    first = n - shared
    modes: list[str | None] = [None if i < first else "reuse" for i in range(n)]
    before = types[:first][::-1]
    if sorted(set(before)) != sorted(set(types)):
        raise ValueError("the set of layer types producing a cache is different than the set of layer types using "
                         "them (num_kv_shared_layers against layer_types)")
    for kind in set(types):
        modes[first - 1 - before.index(kind)] = "store"
    return modes


def _widths(cfg: Config, n: int) -> list[int]:
    inter = cfg.get("intermediate_size", _TEXT_DEFAULTS["intermediate_size"])
    widths = [int(w) for w in inter] if isinstance(inter, (list, tuple)) else [int(inter)] * n
    if len(widths) != n:  # Gemma3nTextConfig.__post_init__ (configuration_gemma3n.py:129-136)
        raise ValueError(f"intermediate_size must have one width per layer: {n} layers, {len(widths)} widths")
    return widths


def build_text(cfg: Config, model_type: str, name: str) -> ModelSpec:
    c = {**_TEXT_DEFAULTS, **non_null(cfg)}
    h, n = int(c["hidden_size"]), int(c["num_hidden_layers"])
    heads, kv, hd = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["head_dim"])
    vocab, p_in = int(c["vocab_size"]), int(c["hidden_size_per_layer_input"])
    n_alt, rank = int(c["altup_num_inputs"]), int(c["laurel_rank"])
    bias = bool(c["attention_bias"])
    types = layer_types(c, n)
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, num_hidden_layers is {n}")
    modes = kv_sharing_modes(types, int(c["num_kv_shared_layers"]))
    widths = _widths(c, n)
    sparsity = c.get("activation_sparsity_pattern")
    if sparsity is not None and not isinstance(sparsity, (list, tuple)):  # its len() (configuration_gemma3n.py:151)
        raise ValueError(f"activation_sparsity_pattern must be a list of one value per layer ({n} layers), "
                         f"not {sparsity!r}")
    if sparsity is not None and len(sparsity) != n:  # configuration_gemma3n.py:151-155
        raise ValueError(f"activation_sparsity_pattern must have one value per layer: {n} layers, {len(sparsity)}")
    every = tuple(range(n))
    own = tuple(i for i in every if modes[i] != "reuse")
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    # Gemma3nTextAttention (modeling_gemma3n.py:1168-1186): k/v projections and norms only where the layer
    # computes its own K/V; v_norm has no weight (with_scale=False)
    p.linear("layers.self_attn.q_proj", h, heads * hd, every, bias, "column")
    p.norm("layers.self_attn.q_norm", hd, every, False)
    p.linear("layers.self_attn.k_proj", h, kv * hd, own, bias, "column")
    p.linear("layers.self_attn.v_proj", h, kv * hd, own, bias, "column")
    p.norm("layers.self_attn.k_norm", hd, own, False)
    p.linear("layers.self_attn.o_proj", heads * hd, h, every, bias, "row")
    for width in sorted(set(widths)):
        at = tuple(i for i in every if widths[i] == width)
        p.linear("layers.mlp.gate_proj", h, width, at, False, "column")
        p.linear("layers.mlp.up_proj", h, width, at, False, "column")
        p.linear("layers.mlp.down_proj", width, h, at, False, "row")
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):
        p.norm(f"layers.{norm}", h, every, False)
    # Gemma3nTextAltUp (:991-995): bare Parameter, three nn.Linear, an RMSNorm; held, never adapted (role "other")
    p.add("layers.altup.correct_output_scale", h, "other", every)
    p.add("layers.altup.correction_coefs.weight", n_alt * n_alt, "other", every)
    p.add("layers.altup.prediction_coefs.weight", n_alt * n_alt * n_alt, "other", every)
    p.add("layers.altup.modality_router.weight", h * n_alt, "other", every)
    p.norm("layers.altup.router_norm", h, every, False)
    # Gemma3nTextLaurelBlock (:927-929)
    p.linear("layers.laurel.linear_left", h, rank, every, False, "replicated")
    p.linear("layers.laurel.linear_right", rank, h, every, False, "replicated")
    p.norm("layers.laurel.post_laurel_norm", h, every, False)
    # the per-layer input path (:1266-1268)
    p.linear("layers.per_layer_input_gate", h, p_in, every, False, "replicated")
    p.linear("layers.per_layer_projection", p_in, h, every, False, "replicated")
    p.norm("layers.post_per_layer_input_norm", h, every, False)
    p.norm("norm", h, (), False)
    # Gemma3nTextModel (:1589-1610)
    p.add("embed_tokens_per_layer.weight", int(c["vocab_size_per_layer_input"]) * n * p_in, "embedding", tp="vocab")
    p.add("per_layer_model_projection.weight", h * n * p_in, "other")
    p.add("per_layer_projection_norm.weight", p_in, "norm")
    p.add("altup_projections.weight", h * h, "other", per_layer=n_alt - 1)
    p.add("altup_unembed_projections.weight", h * h, "other", per_layer=n_alt - 1)
    tied = bool(c["tie_word_embeddings"])
    if not tied:
        p.lm_head("lm_head", vocab, h)
    window = int(c["sliding_window"])
    spec = build_spec(c, name, model_type, p, windows=[window if t == "sliding_attention" else None for t in types],
                      hidden_size=h, num_layers=n, num_attention_heads=heads, num_kv_heads=kv, head_dim=hd,
                      vocab_size=vocab, intermediate_size=max(widths), hidden_act=str(c["hidden_activation"]),
                      mlp_gated=True, norm="rms", position="rope", tie_word_embeddings=tied, qk_norm=True,
                      sandwich_norms=True, attention_dropout=prob(c, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(c["max_position_embeddings"]),
                      final_logit_softcapping=c.get("final_logit_softcapping"))
    if sparsity is None:  # Gemma3nTextConfig.__post_init__ (configuration_gemma3n.py:145-149): the first 10 layers
        sparse = tuple(range(10)) if n > 10 else ()
    else:
        sparse = tuple(i for i in every if float(sparsity[i]) > 0.0)
    # MatFormer: one MLP width per layer (Gemma3nTextMLP, modeling_gemma3n.py:943)
    layers = tuple(replace(ls, intermediate_size=widths[ls.index]) for ls in spec.layers)
    altup = AltUpSpec(num_inputs=n_alt, per_layer_input_width=p_in, laurel_rank=rank, sparse_layers=sparse)
    return replace(spec, layers=layers, altup=altup, kv_reuse_layers=tuple(i for i in every if modes[i] == "reuse"),
                   traits=replace(spec.traits, analytic_unmodelled=ANALYTIC_UNMODELLED, analytic_generate=True))


# timm 1.0 mobilenetv5.py ``_gen_mobilenet_v5`` arch_def of every variant but "mobilenetv5_base" (the one
# mobilenetv5_300m_enc builds), as (block, repeats, options): "er" EdgeResidual (kernel k, expansion e, channels c),
# "uir" UniversalInvertedResidual (start depthwise kernel a, middle depthwise kernel k, 0: none), "mqa"
# MobileAttention (heads h, key/value dim d, key/value stride v: a depthwise down-convolution and norm when > 1)
_MNV5_300M: tuple[tuple[str, int, dict[str, int]], ...] = (
    ("er", 1, {"k": 3, "e": 4, "c": 128}), ("er", 2, {"k": 3, "e": 4, "c": 128}),
    ("uir", 1, {"a": 3, "k": 5, "e": 6, "c": 256}), ("uir", 1, {"a": 5, "k": 0, "e": 4, "c": 256}),
    ("uir", 1, {"a": 3, "k": 0, "e": 4, "c": 256}), ("uir", 1, {"a": 5, "k": 0, "e": 4, "c": 256}),
    ("uir", 1, {"a": 3, "k": 0, "e": 4, "c": 256}),
    ("uir", 1, {"a": 5, "k": 5, "e": 6, "c": 640}), ("uir", 7, {"a": 5, "k": 0, "e": 4, "c": 640}),
    ("uir", 1, {"a": 0, "k": 0, "e": 1, "c": 640}),
    *((("mqa", 1, {"k": 3, "h": 12, "v": 2, "d": 64, "c": 640}), ("uir", 1, {"a": 0, "k": 0, "e": 2, "c": 640}))
      * 14),
    ("uir", 1, {"a": 5, "k": 5, "e": 6, "c": 1280}),
    *((("mqa", 1, {"k": 3, "h": 16, "v": 1, "d": 96, "c": 1280}), ("uir", 1, {"a": 0, "k": 0, "e": 2, "c": 1280}))
      * 19),
)
_MNV5_STEM = 64  # MobileNetV5Encoder stem_size (ConvNormAct 3 -> 64, kernel 3, with a bias)
_MNV5_FEATURES = 2048  # MobileNetV5Encoder.num_features, the fusion adapter's output


def _uir(cin: int, cout: int, a: int, k: int, e: float, scale: bool) -> int:
    """A UniversalInvertedResidual's elements: optional start depthwise conv (a x a) + norm, 1x1 expansion to
    ``cin * e`` + norm, optional middle depthwise conv (k x k) + norm, 1x1 projection + norm, LayerScale2d."""
    mid = int(cin * e)
    return ((cin * a * a + cin if a else 0) + cin * mid + mid + (mid * k * k + mid if k else 0) + mid * cout + cout
            + (cout if scale else 0))


def mobilenetv5_300m_enc_tensors() -> list[tuple[str, int]]:
    """(name, elements) of timm 1.0's ``mobilenetv5_300m_enc`` (``MobileNetV5Encoder``, every block bias-free, the
    norms RmsNorm2d weights, layer_scale_init_value 1e-5 on the UIR and attention blocks): the stem, the blocks in
    stage order, and the multi-scale fusion adapter (a UIR of expansion 2 without LayerScale over the last two
    stages' channels, 640 + 1280, to 2048, then a norm)."""
    rows: list[tuple[str, int]] = [("conv_stem", _MNV5_STEM * 3 * 3 * 3 + _MNV5_STEM + _MNV5_STEM)]
    cin = _MNV5_STEM
    for kind, repeats, o in _MNV5_300M:
        for _ in range(repeats):
            c = o["c"]
            if kind == "er":  # EdgeResidual: conv_exp k x k to cin * e, bn1, conv_pwl 1x1, bn2 (no LayerScale)
                mid = cin * o["e"]
                n = cin * mid * o["k"] ** 2 + mid + mid * c + c
            elif kind == "uir":
                n = _uir(cin, c, o["a"], o["k"], o["e"], True)
            else:  # MobileAttention: norm, query 1x1 to h*d, key and value 1x1 to d (after a depthwise stride-v
                # down_conv k x k and its norm when v > 1), output 1x1 back, LayerScale2d
                down = (cin * o["k"] ** 2 + cin) if o["v"] > 1 else 0
                n = cin + 2 * cin * o["h"] * o["d"] + 2 * (down + cin * o["d"]) + c
            rows.append((f"blocks.{kind}", n))
            cin = c
    rows.append(("msfa", _uir(640 + 1280, _MNV5_FEATURES, 0, 0, 2, False) + _MNV5_FEATURES))
    return rows


def _audio(p: Params, ac: Config) -> int:
    """``Gemma3nAudioEncoder``'s tensors under ``audio_tower.``; returns its width."""
    d, heads = int(ac["hidden_size"]), int(ac["conf_num_attention_heads"])
    chans = [int(x) for x in ac["sscp_conv_channel_size"]]
    kernels = [[int(x) for x in k] for k in ac["sscp_conv_kernel_size"]]
    strides = [[int(x) for x in s] for s in ac["sscp_conv_stride_size"]]
    f = int(ac["input_feat_size"])
    cin = 1
    for i in range(2):  # Gemma3nAudioSubSampleConvProjection (:713-766): frequency padding 1 each side
        kh, kw = kernels[i]
        p.add(f"audio_tower.subsample_conv_projection.conv_{i}.conv.weight", chans[i] * cin * kh * kw, "other")
        p.add(f"audio_tower.subsample_conv_projection.conv_{i}.norm.weight", chans[i], "norm")
        f = (f + 2 - kw) // strides[i][1] + 1
        cin = chans[i]
    p.vision_linear("audio_tower.subsample_conv_projection.input_proj_linear", chans[-1] * f, d, bias=False)
    n = int(ac["conf_num_hidden_layers"])
    c = "audio_tower.conformer"
    for ffw in ("ffw_layer_start", "ffw_layer_end"):  # Gemma3nAudioConformerFeedForward (:818-821)
        p.add(f"{c}.{ffw}.pre_layer_norm.weight", d, "norm", per_layer=n)
        p.vision_linear(f"{c}.{ffw}.ffw_layer_1", d, 4 * d, per_layer=n, bias=False)
        p.vision_linear(f"{c}.{ffw}.ffw_layer_2", 4 * d, d, per_layer=n, bias=False)
        p.add(f"{c}.{ffw}.post_layer_norm.weight", d, "norm", per_layer=n)
    # Gemma3nAudioConformerAttention (:789-792) around Gemma3nAudioAttention (:322-328), head_dim d / heads
    p.add(f"{c}.attention.pre_attn_norm.weight", d, "norm", per_layer=n)
    p.vision_linear(f"{c}.attention.attn.relative_position_embedding.pos_proj", d, d, per_layer=n, bias=False)
    p.add(f"{c}.attention.attn.per_dim_scale", d // heads, "other", per_layer=n)
    for proj in ("q_proj", "k_proj", "v_proj"):
        p.vision_linear(f"{c}.attention.attn.{proj}", d, d, per_layer=n, bias=False)
    p.vision_linear(f"{c}.attention.post", d, d, per_layer=n, bias=False)
    p.add(f"{c}.attention.post_norm.weight", d, "norm", per_layer=n)
    # Gemma3nAudioConformerLightConv1d (:841-854): a depthwise Conv1d of conf_conv_kernel_size, no bias
    p.add(f"{c}.lconv1d.pre_layer_norm.weight", d, "norm", per_layer=n)
    p.vision_linear(f"{c}.lconv1d.linear_start", d, 2 * d, per_layer=n, bias=False)
    p.add(f"{c}.lconv1d.depthwise_conv1d.weight", d * int(ac["conf_conv_kernel_size"]), "other", per_layer=n)
    p.add(f"{c}.lconv1d.conv_norm.weight", d, "norm", per_layer=n)
    p.vision_linear(f"{c}.lconv1d.linear_end", d, d, per_layer=n, bias=False)
    p.add(f"{c}.norm.weight", d, "norm", per_layer=n)
    return d


def _embedder(p: Params, prefix: str, vocab: int, width: int, h: int) -> None:
    """``Gemma3nMultimodalEmbedder`` (:1872-1876): the post-projection norm holds no weight."""
    p.add(f"{prefix}.embedding.weight", vocab * width, "other")
    p.add(f"{prefix}.hard_embedding_norm.weight", width, "norm")
    p.add(f"{prefix}.soft_embedding_norm.weight", width, "norm")
    p.vision_linear(f"{prefix}.embedding_projection", width, h, bias=False)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text_cfg = inherit_outer(non_null(cfg.get("text_config")), cfg, ("tie_word_embeddings", *OUTER_KEYS))
    text = build_text(text_cfg, "gemma3n_text", name)
    vc = {**_VISION_DEFAULTS, **non_null(cfg.get("vision_config"))}
    ac = {**_AUDIO_DEFAULTS, **non_null(cfg.get("audio_config"))}
    arch = str(get(vc, "architecture"))
    if arch != "mobilenetv5_300m_enc":
        raise ValueError(f"vision_config.architecture {arch!r}: only timm's mobilenetv5_300m_enc (Gemma 3n's tower) "
                         "is counted")
    p = Params()
    for part, numel in mobilenetv5_300m_enc_tensors():
        p.add(f"vision_tower.timm_model.{part}", numel, "other")
    d_audio = _audio(p, ac)
    h = text.hidden_size
    _embedder(p, "embed_vision", int(vc["vocab_size"]), int(vc["hidden_size"]), h)
    _embedder(p, "embed_audio", int(ac["vocab_size"]), d_audio, h)
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows),
                   traits=replace(text.traits, unmodelled_mixer=UNMODELLED))


GEMMA3N_TEXT = Family(build_text, "modeling_gemma3n.py", required=())
GEMMA3N = Family(build, "modeling_gemma3n.py", required=(("text_config",),), text_model_type="gemma3n_text")
