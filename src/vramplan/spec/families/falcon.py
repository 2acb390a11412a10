"""Falcon (transformers ``modeling_falcon.py``).

``configuration_falcon.py`` defaults: ffn_hidden_size = 4h, bias False, parallel_attn True,
new_decoder_architecture False, multi_query True; hidden size as ``hidden_size`` or the legacy ``n_embed``.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob
from vramplan.spec.model import ModelSpec, Traits

# FalconAttention hands SDPA one K/V head without enable_gqa (multi_query), and its eager softmax runs in the
# compute dtype; the fused query_key_value's value is not kept as a view of the fused output; DynamicCache
# from 4.45
TRAITS = Traits(loss_function_since=(4, 49), sdpa_since=None, qkv_modules=("query_key_value",), out_proj_module="dense", mqa_sdpa_math=True,
                eager_softmax_compute_dtype=True, eager_probs_kept_by_loop=True, dynamic_cache_since=(4, 45),
                # the rotary (non-ALiBi) configs: FalconRotaryEmbedding's buffers at max_position_embeddings from 4.36
                # (4.33-4.35 cached only the running sequence's length, analytic/hf_buffers.py)
                rope_cache_in=((4, 36), (4, 45)))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h = int(get(cfg, "hidden_size", "n_embed"))
    n_layers = int(get(cfg, "num_hidden_layers", "n_layer", default=32))
    n_heads = int(get(cfg, "num_attention_heads", "n_head"))
    vocab = int(cfg["vocab_size"])
    hd = h // n_heads
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        n_kv = int(get(cfg, "num_kv_heads", "n_head_kv", default=n_heads))
    else:
        n_kv = 1 if cfg.get("multi_query", True) else n_heads
    inter = int(cfg.get("ffn_hidden_size") or 4 * h)
    bias = bool(cfg.get("bias", False))
    L = tuple(range(n_layers))
    parallel = bool(cfg.get("parallel_attn", True))
    two_norms = new_arch and int(cfg.get("num_ln_in_parallel_attn") or 2) == 2
    # FalconDecoderLayer (transformers 5.24): a parallel block with one norm hands its output to both the
    # attention and the MLP (``mlp_layernorm_out = attention_layernorm_out``), one tensor saved for both
    traits = replace(TRAITS, shared_norm_output=True) if parallel and not two_norms else TRAITS
    if new_arch and not cfg.get("alibi"):
        # the new decoder architecture's grouped K/V (Falcon-40B, Falcon-180B), transformers 5.24 modeling_falcon.py:
        # ``_split_heads`` broadcasts each group's key and value to its query heads and ``flatten(2, 3)`` copies them
        # (lines 258-263: the group and repeat dimensions do not merge), and ``FalconModel.forward`` always
        # materializes the causal mask (``create_causal_mask(..., allow_is_causal_skip=False)``, lines 753-761), so
        # SDPA gets equal head counts and a mask: the memory-efficient kernel, which keeps the mask converted to the
        # query dtype per layer -- the rule of ``Traits.sdpa_mask_always``
        traits = replace(traits, sdpa_mask_always=True)
    p = Params()
    p.add("word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    if two_norms:
        p.norm("h.ln_attn", h, L, True)
        p.norm("h.ln_mlp", h, L, True)
    else:
        p.norm("h.input_layernorm", h, L, True)
        if not parallel:
            p.norm("h.post_attention_layernorm", h, L, True)
    p.linear("h.self_attention.query_key_value", h, (n_heads + 2 * n_kv) * hd, L, bias, "column")
    p.linear("h.self_attention.dense", h, h, L, bias, "row")
    p.linear("h.mlp.dense_h_to_4h", h, inter, L, bias, "column")
    p.linear("h.mlp.dense_4h_to_h", inter, h, L, bias, "row")
    p.norm("ln_f", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, vocab_size=vocab, intermediate_size=inter, hidden_act="gelu",
                      position="alibi" if cfg.get("alibi") else "rope", tie_word_embeddings=tied,
                      parallel_residual=parallel,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=prob(cfg, "hidden_dropout"),
                      max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)), traits=traits)


FALCON = Family(build, "modeling_falcon.py", (("hidden_size", "n_embed"), ("num_attention_heads",), ("vocab_size",)))
