"""Llama's gated MLP and q/k/v/o projections with LayerNorm-family norms: StableLM, Command-R, OLMo-1.

* stablelm (``modeling_stablelm.py``): nn.LayerNorm with bias; q/k/v bias when use_qkv_bias, o_proj without;
  a post_attention_layernorm unless use_parallel_residual; per-head q/k LayerNorms (weight only, one per head)
  when qk_layernorm; partial rotary; untied lm_head (configuration default).
* cohere (``modeling_cohere.py``, Command-R): CohereLayerNorm, weight only, computed in fp32 by eager ops; one
  input_layernorm feeding attention and MLP in parallel; q/k/v/o bias when attention_bias; per-head q/k norms
  over (heads, head_dim) when use_qk_norm; tied lm_head; logits * logit_scale.
* cohere2 (``modeling_cohere2.py``, Command R7B / Command A): Command-R's parallel block and fp32 LayerNorm
  without q/k norms; sliding-window attention on three layers of four (``layer_types``, or the legacy
  ``sliding_window_pattern`` 4: layer i slides unless (i + 1) % 4 == 0), RoPE on the sliding layers only
  (the full-attention layers are NoPE, which changes no saved tensor's size).
* olmo (``modeling_olmo.py``, OLMo-1): OlmoLayerNorm without weight or bias (F.layer_norm on fp32); q/k/v/o
  bias when attention_bias; untied lm_head unless tie_word_embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob
from vramplan.spec.model import ModelSpec, Norm, Traits


@dataclass(frozen=True)
class Variant:
    norm: Norm
    norm_params: bool  # the norms hold a weight (OLMo-1's hold nothing)
    norm_bias: bool
    intermediate_default: int  # configuration_*.py's intermediate_size
    max_position_default: int
    qk_norm_key: str
    qk_norm_names: tuple[str, str]
    tied_default: bool
    traits: Traits


VARIANTS: dict[str, Variant] = {
    # StableLmDecoderLayer keeps five hidden-sized tensors through the MLP (analytic/inference.py)
    "stablelm": Variant("layer", True, True, 6912, 4096, "qk_layernorm", ("q_layernorm", "k_layernorm"), False,
                        Traits(hidden_kept_through_mlp=5, sdpa_since=(4, 39))),
    "cohere": Variant("layer_fp32", True, False, 22528, 8192, "use_qk_norm", ("q_norm", "k_norm"), True,
                      Traits(shared_norm_output=True, upcasts_all_logits=True)),
    # Cohere2Config defaulted cache_implementation="hybrid" from its first release (4.48) through 4.52, which generate
    # honoured (and Cohere2Model.forward built a HybridCache when given none, modeling_cohere2.py 4.50.0:600); from
    # 4.53 it is the checkpoint's generation_config.json, not read: the DynamicCache of those releases is assumed
    "cohere2": Variant("layer_fp32", True, False, 22528, 8192, "", ("q_norm", "k_norm"), True,
                       Traits(shared_norm_output=True, static_hybrid_cache_before=(4, 53))),
    "olmo": Variant("layer_nonparam", False, False, 11008, 2048, "use_qk_norm", ("q_norm", "k_norm"), False,
                    Traits(upcasts_all_logits=True)),
}


def _attention(p: Params, cfg: Config, model_type: str, dims: tuple[int, int, int, int], layers: tuple[int, ...],
               v: Variant) -> tuple[bool, list[str]]:
    """q/k/v/o projections and the optional per-head q/k norms; returns (qk_norm, notes)."""
    h, n_heads, n_kv, hd = dims
    if model_type == "stablelm":
        qkv_bias, o_bias = bool(cfg.get("use_qkv_bias", False)), False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, layers, qkv_bias, "o_proj", o_bias)
    qk_norm = bool(v.qk_norm_key) and bool(cfg.get(v.qk_norm_key, False))
    notes: list[str] = []
    if qk_norm and v.norm_params:
        # one weight per head: StableLmLayerNormPerHead (a LayerNorm without bias per head) or CohereLayerNorm
        # over (heads, head_dim)
        p.norm(f"layers.self_attn.{v.qk_norm_names[0]}", n_heads * hd, layers, False)
        p.norm(f"layers.self_attn.{v.qk_norm_names[1]}", n_kv * hd, layers, False)
        notes.append("per-head q/k LayerNorm activations are counted as RMSNorm's (approximation)")
    return qk_norm, notes


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    v = VARIANTS[model_type]
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(get(cfg, "num_key_value_heads", default=n_heads))
    hd = h // n_heads
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("intermediate_size") or v.intermediate_default)
    L = tuple(range(n_layers))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    parallel = model_type in ("cohere", "cohere2") or (model_type == "stablelm" and bool(cfg.get("use_parallel_residual")))
    if v.norm_params:
        p.norm("layers.input_layernorm", h, L, v.norm_bias)
        if not parallel:
            p.norm("layers.post_attention_layernorm", h, L, v.norm_bias)
    qk_norm, notes = _attention(p, cfg, model_type, (h, n_heads, n_kv, hd), L, v)
    p.linear("layers.mlp.gate_proj", h, inter, L, False, "column")
    p.linear("layers.mlp.up_proj", h, inter, L, False, "column")
    p.linear("layers.mlp.down_proj", inter, h, L, False, "row")
    if v.norm_params:
        p.norm("norm", h, (), v.norm_bias)
    tied = bool(cfg.get("tie_word_embeddings", v.tied_default))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    if model_type == "olmo" and cfg.get("clip_qkv"):
        notes.append("clip_qkv clamps q/k/v in place; its saved tensors are not modelled")
    # StableLM's parallel variant feeds attention and MLP from its one norm, saved once
    traits = replace(v.traits, shared_norm_output=True) if (model_type == "stablelm" and parallel) else v.traits
    return build_spec(cfg, name, model_type, p, windows=_windows(cfg, model_type, n_layers), hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "silu")), position="rope", tie_word_embeddings=tied,
                      parallel_residual=parallel, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=prob(cfg, "hidden_dropout") if model_type == "stablelm" else 0.0,
                      max_position_embeddings=int(cfg.get("max_position_embeddings", v.max_position_default)),
                      mlp_gated=True, norm=v.norm, qk_norm=qk_norm, notes=tuple(notes), traits=traits)


def _windows(cfg: Config, model_type: str, n_layers: int) -> list[int | None] | None:
    """Cohere2's sliding window per layer (Cohere2Config: ``layer_types``, else the legacy
    ``sliding_window_pattern``, default 4); the other families here attend in full."""
    if model_type != "cohere2" or not cfg.get("sliding_window", 4096):
        return None
    window = int(cfg.get("sliding_window", 4096))
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return [window if t == "sliding_attention" else None for t in types]
    pattern = int(cfg.get("sliding_window_pattern", 4))
    return [window if (i + 1) % pattern else None for i in range(n_layers)]


STABLELM = Family(build, "modeling_stablelm.py")
COHERE = Family(build, "modeling_cohere.py")
COHERE2 = Family(build, "modeling_cohere2.py")
OLMO = Family(build, "modeling_olmo.py")
