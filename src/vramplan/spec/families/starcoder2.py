"""StarCoder2 (transformers ``modeling_starcoder2.py``).

Llama-style q/k/v/o_proj and a non-gated c_fc -> act -> c_proj MLP, all with bias when ``use_bias``
(configuration default True); input/post_attention LayerNorms with bias, a final LayerNorm; GQA; a sliding
window on every layer from ``sliding_window``; residual_dropout after attention and MLP.
``configuration_starcoder2.py``: tie_word_embeddings True, hidden_act gelu_pytorch_tanh.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob
from vramplan.spec.model import ModelSpec, Traits

# StarCoder2 drops the embeddings with embedding_dropout (0.1 in the published configs, as is its
# residual_dropout, which hidden_dropout holds); bitsandbytes' c_fc returns the hidden states' dtype; the 4.44
# head upcast all logits
TRAITS = Traits(fc_modules=("c_fc", "c_proj"), fc_act_in_output_dtype=True, embedding_dropout=True,
                upcasts_all_logits=True, rope_cache_in=((4, 39), (4, 45)))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(get(cfg, "num_key_value_heads", default=n_heads))
    hd = int(get(cfg, "head_dim", default=h // n_heads))
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size") or 4 * h)
    bias = bool(cfg.get("use_bias", True))
    L = tuple(range(n_layers))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, L, bias, "o_proj")
    p.norm("layers.post_attention_layernorm", h, L, True)
    p.linear("layers.mlp.c_fc", h, inter, L, bias, "column")
    p.linear("layers.mlp.c_proj", inter, h, L, bias, "row")
    p.norm("norm", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    window = cfg.get("sliding_window")
    windows: list[int | None] = [int(window) if window else None] * n_layers
    return build_spec(cfg, name, model_type, p, windows=windows, hidden_size=h, num_layers=n_layers,
                      num_attention_heads=n_heads, num_kv_heads=n_kv, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "gelu_pytorch_tanh")), position="rope",
                      tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=prob(cfg, "residual_dropout"),
                      max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)), head_dim=hd,
                      traits=TRAITS)


STARCODER2 = Family(build, "modeling_starcoder2.py")
