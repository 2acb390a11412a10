"""OPT (transformers ``modeling_opt.py``).

Learned positions with an offset of 2, biased projections (``enable_bias``), optional project_in/out when
``word_embed_proj_dim`` differs from the hidden size, tied lm_head.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob, required
from vramplan.spec.model import ModelSpec, Traits

# OPTDecoder drops the embeddings' sum (``dropout``); DynamicCache from 4.49
TRAITS = Traits(loss_function_since=(4, 49), sdpa_since=(4, 46), out_proj_module="out_proj", fc_modules=("fc1", "fc2"), embedding_dropout=True,
                dynamic_cache_since=(4, 49))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, ffn = int(cfg["vocab_size"]), int(cfg["ffn_dim"])
    proj = int(cfg.get("word_embed_proj_dim", h) or h)
    max_pos = int(cfg.get("max_position_embeddings", 2048))
    bias = bool(cfg.get("enable_bias", True))
    L = tuple(range(n_layers))
    p = Params()
    p.add("embed_tokens.weight", vocab * proj, "embedding", tp="vocab")
    p.add("embed_positions.weight", (max_pos + 2) * h, "position")
    if proj != h:
        p.linear("project_in", proj, h, (), False, "replicated")
        p.linear("project_out", h, proj, (), False, "replicated")
    p.attention("layers.self_attn", h, n_heads, n_heads, h // n_heads, L, bias, "out_proj")
    ln_affine = bool(cfg.get("layer_norm_elementwise_affine", True))
    if ln_affine:
        p.norm("layers.self_attn_layer_norm", h, L, True)
        p.norm("layers.final_layer_norm", h, L, True)
    p.linear("layers.fc1", h, ffn, L, bias, "column")
    p.linear("layers.fc2", ffn, h, L, bias, "row")
    if cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False) and ln_affine:
        p.norm("final_layer_norm", h, (), True)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, vocab_size=vocab, intermediate_size=ffn,
                      hidden_act=str(cfg.get("activation_function", "relu")), position="learned",
                      tie_word_embeddings=True, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=prob(cfg, "dropout", 0.1), max_position_embeddings=max_pos, traits=TRAITS)


OPT = Family(build, "modeling_opt.py",
             required("hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "vocab_size"))
