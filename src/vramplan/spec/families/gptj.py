"""GPT-J (transformers ``modeling_gptj.py``).

Separate q/k/v/out_proj without bias, one ``ln_1`` feeding attention and MLP in parallel, fc_in/fc_out with
bias, partial rotary (``rotary_dim``), untied lm_head *with* bias.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob, required
from vramplan.spec.model import ModelSpec, Traits

# The activation model counts GPT-J's attention output and MLP with Llama's/NeoX's module names (o_proj,
# dense_h_to_4h/dense_4h_to_h), as it always has; modeling_gptj.py names them out_proj and fc_in/fc_out
TRAITS = Traits(loss_function_since=(4, 49))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["n_embd"]), int(cfg["n_layer"]), int(cfg["n_head"])
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("n_inner") or 4 * h)
    L = tuple(range(n_layers))
    p = Params()
    p.add("wte.weight", vocab * h, "embedding", tp="vocab")
    p.norm("h.ln_1", h, L, True)
    p.attention("h.attn", h, n_heads, n_heads, h // n_heads, L, False, "out_proj")
    p.linear("h.mlp.fc_in", h, inter, L, True, "column")
    p.linear("h.mlp.fc_out", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h, bias=True)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("activation_function", "gelu_new")), position="rope",
                      tie_word_embeddings=tied, parallel_residual=True, attention_dropout=prob(cfg, "attn_pdrop"),
                      hidden_dropout=prob(cfg, "resid_pdrop"), max_position_embeddings=int(cfg.get("n_positions", 2048)),
                      traits=TRAITS)


GPTJ = Family(build, "modeling_gptj.py", required("n_embd", "n_layer", "n_head", "vocab_size"))
