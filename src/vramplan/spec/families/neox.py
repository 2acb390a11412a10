"""GPT-NeoX / Pythia (transformers ``modeling_gpt_neox.py``).

Fused query_key_value with bias, parallel residual (``use_parallel_residual``, default True), untied embed_out.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob
from vramplan.spec.model import ModelSpec, Traits

# q and k are rotated into new tensors while the value handed to the kernel is a view of the fused output;
# generate uses a DynamicCache from 4.45
TRAITS = Traits(loss_function_since=(4, 49), sdpa_since=(4, 42), qkv_modules=("query_key_value",), out_proj_module="dense", fused_qkv_view=True,
                dynamic_cache_since=(4, 45))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size", 4 * h))
    bias = bool(cfg.get("attention_bias", True))
    L = tuple(range(n_layers))
    p = Params()
    p.add("embed_in.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    p.norm("layers.post_attention_layernorm", h, L, True)
    p.linear("layers.attention.query_key_value", h, 3 * h, L, bias, "column")
    p.linear("layers.attention.dense", h, h, L, bias, "row")
    p.linear("layers.mlp.dense_h_to_4h", h, inter, L, True, "column")
    p.linear("layers.mlp.dense_4h_to_h", inter, h, L, True, "row")
    p.norm("final_layer_norm", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("embed_out", vocab, h)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "gelu")), position="rope", tie_word_embeddings=tied,
                      parallel_residual=bool(cfg.get("use_parallel_residual", True)),
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=prob(cfg, "hidden_dropout"),
                      max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)), traits=TRAITS)


GPT_NEOX = Family(build, "modeling_gpt_neox.py")
