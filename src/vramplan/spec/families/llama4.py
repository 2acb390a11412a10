"""Llama 4 (``model_type: llama4_text``, ``Llama4ForCausalLM``; ``llama4``, ``Llama4ForConditionalGeneration``).

transformers 5.24 ``models/llama4/modeling_llama4.py`` and ``configuration_llama4.py``:

- ``Llama4TextAttention``: q/k/v/o projections (``attention_bias``, default False).  ``no_rope_layers[i]`` is 1 where
  layer i rotates q and k (by default every ``no_rope_layer_interval``-th layer, 4, is NoPE: ``int((i + 1) % 4 !=
  0)``); on the RoPE layers ``use_qk_norm`` adds ``Llama4TextL2Norm``, an RMS norm without a weight (no parameter);
  on the NoPE layers ``attn_temperature_tuning`` scales q by ``log1p(floor((pos + 1) / floor_scale)) * attn_scale
  + 1`` (no parameter).  ``Llama4TextConfig.layer_types``: the RoPE layers are "chunked_attention" when
  ``attention_chunk_size`` is set (default 8192), the NoPE layers "full_attention".
- ``Llama4TextDecoderLayer``: ``feed_forward`` is a ``Llama4TextMoe`` on the layers of ``moe_layers`` (default
  ``range(interleave_moe_layer_step - 1, n, interleave_moe_layer_step)``: every layer for step 1, every other one
  for step 2), else a ``Llama4TextMLP`` of ``intermediate_size_mlp``; ``input_layernorm`` and
  ``post_attention_layernorm`` (RMSNorm, weight only).
- ``Llama4TextMoe``: ``router`` (``Llama4Router``, an ``nn.Linear(h, num_local_experts)`` without bias, top
  ``num_experts_per_tok`` (1) logits through a sigmoid), ``experts`` (``Llama4TextExperts``: ``gate_up_proj`` [E, h,
  2 I] and ``down_proj`` [E, I, h] parameters, I = ``intermediate_size``) and ``shared_expert`` (a
  ``Llama4TextMLP`` of ``intermediate_size``).  Its forward runs every expert on every token
  (``hidden_states.repeat(num_experts, 1)`` scaled by the router scores): ``Traits.experts_run_every_token``.
- ``Llama4ForCausalLM``: ``model.embed_tokens``, ``model.norm``, ``lm_head`` (untied by default).

The multimodal model (``Llama4ForConditionalGeneration``) adds ``vision_model`` (``Llama4VisionModel``) and
``multi_modal_projector`` (``Llama4MultiModalProjector``: ``linear_1``, ``vision_output_dim`` -> text hidden, no
bias).  ``Llama4VisionModel``: ``patch_embedding.linear`` (``Llama4UnfoldConvolution``: ``channels x patch^2`` ->
d, no bias), ``class_embedding`` [d], ``positional_embedding_vlm`` [(image / patch)^2 + 1, d], ``layernorm_pre``
and ``layernorm_post`` (LayerNorm, weight and bias), ``model.layers`` (``Llama4VisionEncoderLayer``: ``self_attn``
q/k/v/o d -> d with biases, ``mlp`` fc1 d -> I and fc2 I -> d with biases, ``input_layernorm`` and
``post_attention_layernorm`` LayerNorms) and ``vision_adapter.mlp`` (``Llama4VisionMLP2``: fc1 ``intermediate_size``
-> ``projector_input_dim`` and fc2 ``projector_output_dim`` -> ``projector_output_dim``, no biases).  The image path
(tiles, pixel shuffle) is not modelled: the multimodal model's tasks are refused (``Traits.image_path_unmodelled``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, non_null, prob, square_side
from vramplan.spec.families.llama_like import nope_pattern
from vramplan.spec.model import ModelSpec, MoESpec, Traits, VisionSpec

__all__ = ["LLAMA4", "LLAMA4_TEXT", "moe_layers"]

# Llama4TextConfig's defaults (transformers 5.24 configuration_llama4.py) for the keys a config leaves out
_TEXT: dict[str, Any] = {"vocab_size": 202_048, "hidden_size": 5120, "intermediate_size": 8192,
                         "intermediate_size_mlp": 16_384, "num_hidden_layers": 48, "num_attention_heads": 40,
                         "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                         "max_position_embeddings": 4096 * 32, "num_experts_per_tok": 1, "num_local_experts": 16,
                         "interleave_moe_layer_step": 1, "use_qk_norm": True, "attention_chunk_size": 8192,
                         "attention_bias": False, "tie_word_embeddings": False}
# Llama4VisionConfig's defaults
_VISION: dict[str, Any] = {"hidden_size": 768, "num_hidden_layers": 34, "num_attention_heads": 16, "num_channels": 3,
                           "intermediate_size": 5632, "vision_output_dim": 7680, "image_size": 448, "patch_size": 14,
                           "projector_input_dim": 4096, "projector_output_dim": 4096, "hidden_act": "gelu",
                           "pixel_shuffle_ratio": 0.5}
VISION_PREFIXES = ("vision_model.", "multi_modal_projector.")


def moe_layers(cfg: Config, n_layers: int) -> set[int]:
    """``Llama4TextConfig.moe_layers``, or its default ``range(step - 1, n, step)`` for ``interleave_moe_layer_step``."""
    given = cfg.get("moe_layers")
    if isinstance(given, list):
        return {int(i) for i in given if 0 <= int(i) < n_layers}
    step = int(cfg.get("interleave_moe_layer_step", 1))
    return set(range(step - 1, n_layers, step))


def build_text(cfg: Config, model_type: str, name: str) -> ModelSpec:
    c = {**_TEXT, **non_null(cfg)}
    h, n, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv, hd = int(get(c, "num_key_value_heads", default=heads)), int(get(c, "head_dim", default=h // heads))
    inter, inter_mlp = int(c["intermediate_size"]), int(c["intermediate_size_mlp"])
    e, k = int(c["num_local_experts"]), int(c["num_experts_per_tok"])
    vocab, tied = int(c["vocab_size"]), bool(c["tie_word_embeddings"])
    bias = bool(c["attention_bias"])
    layers = tuple(range(n))
    sparse = moe_layers(c, n)
    on, dense = tuple(sorted(sparse)), tuple(i for i in layers if i not in sparse)
    rope = nope_pattern(c, n)
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.attention("layers.self_attn", h, heads, kv, hd, layers, bias, "o_proj")
    # Llama4TextL2Norm (the q/k norm of the RoPE layers) has no weight: no parameter
    p.norm("layers.input_layernorm", h, layers, False)
    p.norm("layers.post_attention_layernorm", h, layers, False)
    if dense:  # Llama4TextMLP(config, intermediate_size=config.intermediate_size_mlp)
        p.linear("layers.feed_forward.gate_proj", h, inter_mlp, dense, False, "column")
        p.linear("layers.feed_forward.up_proj", h, inter_mlp, dense, False, "column")
        p.linear("layers.feed_forward.down_proj", inter_mlp, h, dense, False, "row")
    if on:
        p.linear("layers.feed_forward.router", h, e, on, False, "replicated", role="router")
        p.linear("layers.feed_forward.experts.gate_up_proj", h, 2 * inter, on, False, "expert", "expert", e)
        p.linear("layers.feed_forward.experts.down_proj", inter, h, on, False, "expert", "expert", e)
        p.linear("layers.feed_forward.shared_expert.gate_proj", h, inter, on, False, "column")
        p.linear("layers.feed_forward.shared_expert.up_proj", h, inter, on, False, "column")
        p.linear("layers.feed_forward.shared_expert.down_proj", inter, h, on, False, "row")
    p.norm("norm", h, (), False)
    if not tied:
        p.lm_head("lm_head", vocab, h)
    # an explicit null: no chunked layers (Llama4TextConfig.layer_types: "full_attention" everywhere)
    chunk = cfg["attention_chunk_size"] if "attention_chunk_size" in cfg else c["attention_chunk_size"]
    traits = Traits(experts_run_every_token=bool(on),
                    # Llama4TextConfig.layer_types: "chunked_attention" on the RoPE layers when the chunk is set
                    attention_chunk_size=int(chunk) if chunk and any(rope) else 0,
                    # Llama4TextExperts holds nn.Parameter stacks, not nn.Linear modules
                    experts_are_linears=False)
    return build_spec(
        c, name, model_type, p, moe_layers=frozenset(sparse), hidden_size=h, num_layers=n, num_attention_heads=heads,
        num_kv_heads=kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter_mlp,
        hidden_act=str(c["hidden_act"]), mlp_gated=True, norm="rms", position="rope", tie_word_embeddings=tied,
        # the q/k norm is weightless and only on the RoPE layers: no parameter, and no per-layer q/k norm modelled
        qk_norm=False, attention_dropout=prob(c, "attention_dropout", 0.0), hidden_dropout=0.0,
        max_position_embeddings=int(c["max_position_embeddings"]), moe=MoESpec(e, k, inter, 1, inter) if on else None,
        traits=traits)


def _tower(p: Params, vc: Config, d_text: int) -> dict[str, int]:
    """Add ``Llama4VisionModel``'s and ``Llama4MultiModalProjector``'s tensors to ``p``."""
    d, i = int(vc["hidden_size"]), int(vc["intermediate_size"])
    n, heads, ch = int(vc["num_hidden_layers"]), int(vc["num_attention_heads"]), int(vc["num_channels"])
    patch, image = square_side(vc["patch_size"]), square_side(vc["image_size"])
    v = "vision_model"
    p.vision_linear(f"{v}.patch_embedding.linear", ch * patch * patch, d, bias=False)
    p.add(f"{v}.class_embedding", d, "other")
    patches = (image // patch) ** 2 + 1  # Llama4VisionModel.num_patches: the patches and the class token
    p.add(f"{v}.positional_embedding_vlm", patches * d, "other")
    for ln in ("layernorm_pre", "layernorm_post"):
        p.add(f"{v}.{ln}.weight", d, "norm")
        p.add(f"{v}.{ln}.bias", d, "bias")
    layer = f"{v}.model.layers"
    for name, fan_in, fan_out in (("self_attn.q_proj", d, d), ("self_attn.k_proj", d, d), ("self_attn.v_proj", d, d),
                                  ("self_attn.o_proj", d, d), ("mlp.fc1", d, i), ("mlp.fc2", i, d)):
        p.vision_linear(f"{layer}.{name}", fan_in, fan_out, per_layer=n, bias=True)
    for ln in ("input_layernorm", "post_attention_layernorm"):
        p.add(f"{layer}.{ln}.weight", d, "norm", per_layer=n)
        p.add(f"{layer}.{ln}.bias", d, "bias", per_layer=n)
    p.vision_linear(f"{v}.vision_adapter.mlp.fc1", i, int(vc["projector_input_dim"]), bias=False)
    p.vision_linear(f"{v}.vision_adapter.mlp.fc2", int(vc["projector_output_dim"]), int(vc["projector_output_dim"]),
                    bias=False)
    p.vision_linear("multi_modal_projector.linear_1", int(vc["vision_output_dim"]), d_text, bias=False)
    return {"d": d, "i": i, "layers": n, "heads": heads, "patch": patch, "image": image, "patches": patches}


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text_cfg = non_null(cfg["text_config"])
    # the outer tie_word_embeddings (Llama4Config default False) and dtype reach the language model
    for k in ("torch_dtype", "dtype", "quantization_config"):
        if k in cfg and k not in text_cfg:
            text_cfg[k] = cfg[k]
    text = build_text(text_cfg, "llama4_text", name)
    vc = {**_VISION, **non_null(cfg["vision_config"])}
    p = Params()
    t = _tower(p, vc, text.hidden_size)
    ratio = float(vc["pixel_shuffle_ratio"])
    side = t["image"] // t["patch"]
    # one tile's image tokens after Llama4VisionPixelShuffleMLP: (side x ratio)^2 (pixel_shuffle), the class token
    # dropped (Llama4VisionModel.forward: ``hidden_state[:, :-1, :]``)
    tokens = int(side * ratio) ** 2
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=tokens, hidden_act=str(vc["hidden_act"]),
                        source="transformers 5.24 modeling_llama4.py Llama4VisionModel (one tile; the processor's "
                               "tiling is not modelled)",
                        param_prefixes=VISION_PREFIXES, num_channels=int(vc["num_channels"]),
                        notes=("the image path (tiles, pixel shuffle) is not modelled: parameters only",),
                        linears=tuple(p.vision_linears))
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision,
                   traits=replace(text.traits, image_path_unmodelled=True))


LLAMA4_TEXT = Family(build_text, "modeling_llama4.py", required=())
LLAMA4 = Family(build, "modeling_llama4.py", required=(("vision_config",), ("text_config",)),
                text_model_type="llama4_text")
