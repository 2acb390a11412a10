"""BLOOM (transformers ``modeling_bloom.py``).

word_embeddings + word_embeddings_layernorm, fused query_key_value with bias, ALiBi (no position table),
LayerNorms with bias, tied lm_head.  ``configuration_bloom.py`` spells hidden_size as ``hidden_size`` or the
legacy ``n_embed`` (default 64), and heads as ``n_head`` (default 8).
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import ModelSpec, Traits

# generate uses a DynamicCache from 4.44.  The activation model counts BLOOM's attention with Llama's module
# names (three q/k/v casts), as it always has; modeling_bloom.py has one fused query_key_value
TRAITS = Traits(loss_function_since=(4, 49), dynamic_cache_since=(4, 44))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h = int(get(cfg, "hidden_size", "n_embed", default=64))
    n_layers = int(cfg["n_layer"])
    n_heads = int(get(cfg, "n_head", "num_attention_heads", default=8))
    vocab = int(cfg["vocab_size"])
    inter = 4 * h
    L = tuple(range(n_layers))
    p = Params()
    p.add("word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("word_embeddings_layernorm", h, (), True)
    p.norm("h.input_layernorm", h, L, True)
    p.linear("h.self_attention.query_key_value", h, 3 * h, L, True, "column")
    p.linear("h.self_attention.dense", h, h, L, True, "row")
    p.norm("h.post_attention_layernorm", h, L, True)
    p.linear("h.mlp.dense_h_to_4h", h, inter, L, True, "column")
    p.linear("h.mlp.dense_4h_to_h", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, vocab_size=vocab, intermediate_size=inter, hidden_act="gelu",
                      position="alibi", tie_word_embeddings=True, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=prob(cfg, "hidden_dropout"),
                      max_position_embeddings=int(cfg.get("seq_length", 2048) or 2048), traits=TRAITS)


BLOOM = Family(build, "modeling_bloom.py", required("n_layer", "vocab_size"))
