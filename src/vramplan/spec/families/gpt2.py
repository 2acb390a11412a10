"""GPT-2 (transformers ``modeling_gpt2.py``) and GPT-BigCode (``modeling_gpt_bigcode.py``: StarCoder, OctoCoder).

Conv1D (GPT-2) or nn.Linear (BigCode) layers with biases, learned positions, LayerNorm with bias, tied lm_head.
``c_attn`` projects to h + 2 * n_kv * head_dim: 3h for multi-head attention, h + 2 * head_dim with BigCode's
``multi_query`` (configuration default True: one shared K and V head).
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob, required
from vramplan.spec.model import ModelSpec, Traits

# modeling_gpt2.py: fused c_attn and c_proj, c_fc/c_proj MLP, embedding dropout (embd_pdrop); its eager
# softmax runs in the compute dtype and ``GPT2Block`` keeps the attention output through the MLP; generate
# uses a DynamicCache from 4.52 (the first modeling_gpt2.py with ``_supports_cache_class``)
GPT2_TRAITS = Traits(loss_function_since=(4, 49), sdpa_since=(4, 42), qkv_modules=("c_attn",), out_proj_module="c_proj", fc_modules=("c_fc", "c_proj"),
                     embedding_dropout=True, eager_softmax_compute_dtype=True, keeps_attn_output=True,
                     hidden_kept_through_mlp=4, dynamic_cache_since=(4, 52))
# The activation model counts GPT-BigCode with Llama's module names (three q/k/v casts, o_proj, dense_h_to_4h),
# as it always has; transformers' GPTBigCodeAttention has one c_attn, c_proj and c_fc (docs/checklists/model-family.md)
BIGCODE_TRAITS = Traits(loss_function_since=(4, 49), dynamic_cache_since=(4, 56))


def _layout(cfg: Config, name: str, model_type: str, n_kv: int, act_default: str, traits: Traits) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["n_embd"]), int(cfg["n_layer"]), int(cfg["n_head"])
    vocab, npos = int(cfg["vocab_size"]), int(cfg.get("n_positions", 1024))
    inter = int(cfg.get("n_inner") or 4 * h)
    hd = h // n_heads
    L = tuple(range(n_layers))
    p = Params()
    p.add("wte.weight", vocab * h, "embedding", tp="vocab")
    p.add("wpe.weight", npos * h, "position")
    p.norm("h.ln_1", h, L, True)
    p.linear("h.attn.c_attn", h, h + 2 * n_kv * hd, L, True, "column")
    p.linear("h.attn.c_proj", h, h, L, True, "row")
    p.norm("h.ln_2", h, L, True)
    p.linear("h.mlp.c_fc", h, inter, L, True, "column")
    p.linear("h.mlp.c_proj", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("activation_function", act_default)), position="learned",
                      tie_word_embeddings=True, attention_dropout=prob(cfg, "attn_pdrop", 0.1),
                      hidden_dropout=prob(cfg, "resid_pdrop", 0.1), max_position_embeddings=npos, traits=traits)


def build_gpt2(cfg: Config, model_type: str, name: str) -> ModelSpec:
    return _layout(cfg, name, model_type, int(cfg["n_head"]), "gelu_new", GPT2_TRAITS)


def build_bigcode(cfg: Config, model_type: str, name: str) -> ModelSpec:
    n_kv = 1 if bool(cfg.get("multi_query", True)) else int(cfg["n_head"])
    return _layout(cfg, name, model_type, n_kv, "gelu_pytorch_tanh", BIGCODE_TRAITS)


_GPT2_KEYS = required("n_embd", "n_layer", "n_head", "vocab_size")
GPT2 = Family(build_gpt2, "modeling_gpt2.py", _GPT2_KEYS)
GPT_BIGCODE = Family(build_bigcode, "modeling_gpt_bigcode.py", _GPT2_KEYS)
