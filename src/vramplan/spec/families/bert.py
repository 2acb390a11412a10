"""BERT (transformers ``modeling_bert.py``), as ``BertForMaskedLM``: the encoder plus the MLM head whose
decoder is tied to the word embeddings (no pooler)."""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, required
from vramplan.spec.model import ModelSpec, Traits

# BertEmbeddings drops the embeddings' sum (hidden_dropout_prob).  The activation model counts the attention
# output projection as o_proj (modeling_bert.py: attention.output.dense), as it always has
TRAITS = Traits(sdpa_since=(4, 41), qkv_modules=("query", "key", "value"), fc_modules=("dense", "dense"), embedding_dropout=True)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, inter = int(cfg["vocab_size"]), int(cfg["intermediate_size"])
    max_pos = int(cfg.get("max_position_embeddings", 512))
    L = tuple(range(n_layers))
    p = Params()
    p.add("embeddings.word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.add("embeddings.position_embeddings.weight", max_pos * h, "position")
    p.add("embeddings.token_type_embeddings.weight", int(cfg.get("type_vocab_size", 2)) * h, "position")
    p.norm("embeddings.LayerNorm", h, (), True)
    for m in ("query", "key", "value"):
        p.linear(f"encoder.layer.attention.self.{m}", h, h, L, True, "column")
    p.linear("encoder.layer.attention.output.dense", h, h, L, True, "row")
    p.norm("encoder.layer.attention.output.LayerNorm", h, L, True)
    p.linear("encoder.layer.intermediate.dense", h, inter, L, True, "column")
    p.linear("encoder.layer.output.dense", inter, h, L, True, "row")
    p.norm("encoder.layer.output.LayerNorm", h, L, True)
    p.linear("cls.predictions.transform.dense", h, h, (), True, "replicated")
    p.norm("cls.predictions.transform.LayerNorm", h, (), True)
    p.add("cls.predictions.bias", vocab, "bias")
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "gelu")), position="learned", tie_word_embeddings=True,
                      attention_dropout=float(cfg.get("attention_probs_dropout_prob", 0.1)),
                      hidden_dropout=float(cfg.get("hidden_dropout_prob", 0.1)), max_position_embeddings=max_pos,
                      encoder_only=True, traits=TRAITS)


BERT = Family(build, "modeling_bert.py",
              required("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"))
