"""Mistral Small 3.x (``model_type: mistral3``, ``Mistral3ForConditionalGeneration``).

transformers 5.24 ``models/mistral3/modeling_mistral3.py``: ``Mistral3Model`` holds ``vision_tower``
(``AutoModel.from_config(config.vision_config)``: a ``PixtralVisionModel``), ``multi_modal_projector``
(``Mistral3MultiModalProjector``) and ``language_model`` (``AutoModel.from_config(text_config)``, a Mistral);
``lm_head`` is tied to the text embeddings unless the outer config's ``tie_word_embeddings`` (True by default)
is false.

The Pixtral tower (``models/pixtral/modeling_pixtral.py`` ``PixtralVisionModel``):

- ``patch_conv``: ``Conv2d(channels, d, patch, stride=patch, bias=False)``; ``ln_pre``: ``PixtralRMSNorm(d)``;
- ``transformer.layers`` (``PixtralAttentionLayer``): ``attention_norm`` (RMSNorm), ``attention.{q,k,v,o}_proj``
  (d x d, no bias), ``ffn_norm`` (RMSNorm), ``feed_forward.{gate,up,down}_proj`` (a gated MLP, no bias);
- ``patch_positional_embedding``: 2-D (axial) RoPE over each patch's row and column, a buffer, no parameter.

The projector: ``norm`` (``Mistral3RMSNorm(d)``), ``patch_merger.merging_layer`` (``Linear(d x merge^2, d)``, no
bias, over each ``spatial_merge_size`` x ``spatial_merge_size`` square of patches, ``unfold``), ``linear_1``
(d x feature layers -> d_text), ``projector_hidden_act`` (GELU), ``linear_2`` (d_text -> d_text), biased with
``multimodal_projector_bias`` (False by default).  Sub-configs given as dicts are built with their classes'
defaults (``PixtralVisionConfig``, ``MistralConfig``; ``SubConfigSpec.create_subconfig``); both are required.

Images: ``PixtralImageProcessor`` keeps each image's aspect ratio, scales it down to fit ``size.longest_edge``
(``get_resize_output_image_size``: floor of side / ratio) and rounds each side up to a multiple of patch x merge
(``_num_image_tokens``); ``PixtralProcessor.replace_image_token`` writes, per row of merged patches, one
``[IMG]`` token per merged patch and an ``[IMG_BREAK]``, the last one replaced by ``[IMG_END]``: (w + 1) x h
tokens for h x w merged patches (``_get_num_multimodal_tokens``).  The processor's ``longest_edge`` is in
``preprocessor_config.json``, which vramplan does not read: it is taken as ``vision_config.image_size`` (1540 in
``Mistral3Config``'s init_kwargs), stated in the report.

The tower packs the images of a forward into one sequence (``torch.cat`` of every image's patches) and, except
under flash attention (``cu_seq_lens``, one varlen segment per image), hands every layer a block-diagonal float
mask over the whole pack (``generate_block_attention_mask``).  Under flash the tower's saved tensors per patch are
those of a decoder layer of its shape, whatever the packing; SDPA runs the memory-efficient kernel on the mask,
which it keeps (analytic/terms/vision.py ``_block_mask``, ``VisionSpec.block_mask_unless_flash``); eager, which
scores the whole pack, is refused when the batch holds images (spec/vision.py ``image_problems``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import (
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
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["MISTRAL3"]

PREFIX = "vision_tower"
# MistralConfig's defaults (transformers 5.24 configuration_mistral.py) for the keys a text_config leaves out
_MISTRAL: dict[str, Any] = {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 14_336,
                            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                            "hidden_act": "silu", "max_position_embeddings": 131_072, "sliding_window": 4096,
                            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
# PixtralVisionConfig's defaults (configuration_pixtral.py)
_PIXTRAL: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                            "num_attention_heads": 16, "num_channels": 3, "image_size": 1024, "patch_size": 16,
                            "hidden_act": "gelu"}


def _text_config(cfg: Config) -> dict[str, Any]:
    inner = non_null(cfg["text_config"])
    kind = str(inner.get("model_type") or "mistral")
    text = {**(_MISTRAL if kind == "mistral" else {}), **inner, "model_type": kind}
    if "sliding_window" in dict(cfg["text_config"]) and cfg["text_config"]["sliding_window"] is None:
        text["sliding_window"] = None  # an explicit null: no window (Mistral Small 3.1)
    inherit_outer(text, cfg)
    # the outer config's flag ties lm_head to the text embeddings (modeling_utils.py
    # get_expanded_tied_weights_keys reads the top model's config; Mistral3Config's default is True), whatever
    # the text config says
    text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    if kind not in LLAMA_FAMILIES:
        raise ValueError(f"a mistral3 language model of model_type {kind!r} is not modelled "
                         f"(known: {', '.join(sorted(LLAMA_FAMILIES))})")
    return text


def _tower(p: Params, vc: Config) -> dict[str, int]:
    """Add a ``PixtralVisionModel``'s tensors to ``p``; returns its sizes."""
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_attention_heads"))
    patch, ch = square_side(get(vc, "patch_size")), int(get(vc, "num_channels"))
    p.add(f"{PREFIX}.patch_conv.weight", d * ch * patch * patch, "other")
    p.add(f"{PREFIX}.ln_pre.weight", d, "norm")
    layer = f"{PREFIX}.transformer.layers"
    for name, fan_in, fan_out in (("attention.q_proj", d, d), ("attention.k_proj", d, d), ("attention.v_proj", d, d),
                                  ("attention.o_proj", d, d), ("feed_forward.gate_proj", d, i),
                                  ("feed_forward.up_proj", d, i), ("feed_forward.down_proj", i, d)):
        # role "other": not adapted (spec/families/gemma3.py's tower); quantized as nn.Linear (VisionSpec.linears)
        p.vision_linear(f"{layer}.{name}", fan_in, fan_out, per_layer=n, bias=False)
    for name in ("attention_norm", "ffn_norm"):
        p.add(f"{layer}.{name}.weight", d, "norm", per_layer=n)
    return {"d": d, "i": i, "layers": n, "heads": heads, "patch": patch, "channels": ch,
            "image": square_side(get(vc, "image_size")), "head_dim": d // heads}


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    tc = _text_config(cfg)
    kind = str(tc["model_type"])
    text = LLAMA_FAMILIES[kind].build(tc, kind, name)
    vc = {**_PIXTRAL, **non_null(cfg["vision_config"])}
    p = Params()
    t = _tower(p, vc)
    d, d_text, merge = t["d"], text.hidden_size, int(cfg.get("spatial_merge_size", 2))
    sel = cfg.get("vision_feature_layer", -1)
    feats, unused = feature_layers({"vision_feature_layer": sel}, t["layers"])
    if feats != 1 or isinstance(sel, (list, tuple)):
        # Mistral3MultiModalProjector.norm is d wide: a concatenation of several layers' states does not pass it
        raise ValueError(f"vision_feature_layer {sel!r}: only one layer is modelled (Mistral3MultiModalProjector "
                         "normalizes d features)")
    bias = bool(cfg.get("multimodal_projector_bias", False))
    p.add("multi_modal_projector.norm.weight", d, "norm")
    p.add("multi_modal_projector.patch_merger.merging_layer.weight", d * merge * merge * d, "other")
    p.add("multi_modal_projector.linear_1.weight", d * d_text, "other")
    p.add("multi_modal_projector.linear_2.weight", d_text * d_text, "other")
    if bias:
        p.add("multi_modal_projector.linear_1.bias", d_text, "bias")
        p.add("multi_modal_projector.linear_2.bias", d_text, "bias")
    # the projector's nn.Linear (rows added above: weights, then biases)
    p.vision_linears += [("multi_modal_projector.patch_merger.merging_layer.weight", d * merge * merge, d),
                         ("multi_modal_projector.linear_1.weight", d, d_text),
                         ("multi_modal_projector.linear_2.weight", d_text, d_text)]
    act = str(vc["hidden_act"])
    side = t["image"]  # the largest image: longest_edge, taken as vision_config.image_size (module docstring)
    unit = t["patch"] * merge
    n = (side - 1) // unit + 1
    patches = (n * merge) ** 2
    tower = build_spec({}, f"{name} vision tower", "pixtral", Params(), hidden_size=d, num_layers=t["layers"],
                       num_attention_heads=t["heads"], num_kv_heads=t["heads"], vocab_size=1, intermediate_size=t["i"],
                       hidden_act=act, mlp_gated=True, norm="rms", position="rope", tie_word_embeddings=False,
                       attention_dropout=float(vc.get("attention_dropout", 0.0)), hidden_dropout=0.0,
                       max_position_embeddings=patches, encoder_only=True)
    per_merge = merge * merge
    if d % per_merge or (2 * d_text) % per_merge:
        raise ValueError(f"hidden sizes {d} / {d_text} do not divide by spatial_merge_size^2 {per_merge}")
    vision = VisionSpec(hidden_size=d, num_layers=t["layers"], num_attention_heads=t["heads"], intermediate_size=t["i"],
                        image_size=side, patch_size=t["patch"], patches_per_image=patches,
                        tokens_per_image=(n + 1) * n, hidden_act=act,
                        source="transformers 5.24 PixtralImageProcessor (longest_edge, sides rounded up to patch x "
                               "merge) and PixtralProcessor ([IMG] per merged patch, [IMG_BREAK] per row, [IMG_END])",
                        tower=tower, num_channels=t["channels"], merge_size=merge, longest_edge=side,
                        block_mask_unless_flash=True,
                        # ln_pre's saved tensors and RoPE's cos and sin (residual dtype: PixtralVisionRotaryEmbedding
                        # returns them in the patch embeddings' dtype), kept by q's and k's rotations
                        stem_saved_per_token=(("norm", 1), ("residual", 2 * (d // t["heads"]))),
                        # the projector, per patch: its norm, merging_layer's input (the unfolded norm output in the
                        # compute dtype, d per patch), then per merged token linear_1's input (d), the GELU's and
                        # linear_2's inputs (2 d_text), each spread over the merge^2 patches
                        head_saved_per_patch=(("norm", 1), ("compute", d), ("compute", d // per_merge),
                                              ("compute", 2 * d_text // per_merge)),
                        unused_layers=unused, notes=_notes(unused), linears=tuple(p.vision_linears),
                        # PixtralVisionModel.forward binds ln_pre's output (patch_embeds) through the transformer's
                        # layers, and get_image_features' select_hidden_states keeps vision_feature_layer's state;
                        # besides, patch_embeds_list holds views of patch_conv's output (modeling_pixtral.py
                        # l.416-420) through the whole tower: one state more
                        kept_hidden_states=1 + held_tower_states(t["layers"],
                                                                 selected_layers({"vision_feature_layer": sel})),
                        # the rotary cos and sin in the compute dtype (PixtralRotaryEmbedding: .to(x.dtype); head_dim
                        # d / heads, PixtralVisionConfig.__post_init__) and their
                        # int64 (row, column) position ids, bound through the layers (l.426-436)
                        held_per_patch=(("compute", 2 * t["head_dim"]), ("int64", 2)))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision)


def _notes(unused: int) -> tuple[str, ...]:
    out = [("the processor's size.longest_edge (preprocessor_config.json, not read) is taken as "
            "vision_config.image_size")]
    if unused:
        out.append(f"the tower's last {unused} layer(s) after vision_feature_layer run in the forward and their saved "
                   "tensors, which no gradient reaches, are freed before the backward")
    return tuple(out)


MISTRAL3 = Family(build, "modeling_mistral3.py", required=(("vision_config",), ("text_config",)),
                  text_model_type="mistral")
