"""Phi-1, phi-1.5, phi-2 (transformers ``modeling_phi.py``).

One input_layernorm (LayerNorm with bias) feeding attention and MLP in parallel, q/k/v_proj and dense with
bias, fc1/fc2 with bias, partial rotary (``partial_rotary_factor`` of each head), final_layernorm, untied
lm_head *with* bias.  ``configuration_phi.py`` defaults: intermediate_size 8192, tie_word_embeddings False,
qk_layernorm False.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob
from vramplan.spec.model import ModelSpec, Traits

# the one norm's output is saved once for attention and MLP; bitsandbytes' fc1 returns the hidden states'
# dtype; the 4.44 head upcast all logits
TRAITS = Traits(sdpa_since=(4, 39), out_proj_module="dense", fc_modules=("fc1", "fc2"), fc_act_in_output_dtype=True,
                shared_norm_output=True, upcasts_all_logits=True)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(get(cfg, "num_key_value_heads", default=n_heads))
    hd = h // n_heads
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size") or 8192)
    L = tuple(range(n_layers))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, L, True, "dense")
    if cfg.get("qk_layernorm"):
        # one LayerNorm (weight and bias) over head_dim, shared by all heads
        p.norm("layers.self_attn.q_layernorm", hd, L, True)
        p.norm("layers.self_attn.k_layernorm", hd, L, True)
    p.linear("layers.mlp.fc1", h, inter, L, True, "column")
    p.linear("layers.mlp.fc2", inter, h, L, True, "row")
    p.norm("final_layernorm", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h, bias=True)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "gelu_new")), position="rope", tie_word_embeddings=tied,
                      parallel_residual=True, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=prob(cfg, "resid_pdrop"),
                      max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                      qk_norm=bool(cfg.get("qk_layernorm")), traits=TRAITS)


PHI = Family(build, "modeling_phi.py")
