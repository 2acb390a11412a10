"""MiniMax-Text-01: lightning (linear) attention layers interleaved with softmax attention, mixture-of-experts MLPs
(transformers ``modeling_minimax.py``, 5.24).

Every layer (``MiniMaxDecoderLayer``) holds ``input_layernorm`` and ``post_attention_layernorm`` (RMSNorm) and a
``MiniMaxSparseMoeBlock`` (``mlp``: the router ``gate.weight [experts, hidden]``, 3-D expert parameters
``experts.gate_up_proj [experts, 2 x intermediate, hidden]`` and ``experts.down_proj [experts, hidden,
intermediate]``).  Its ``self_attn`` is chosen by ``layer_types``:

* "full_attention" (``MiniMaxAttention``): ``q/k/v/o_proj`` without bias, grouped-query, RoPE;
* "linear_attention" (``MiniMaxLightningAttention``): a fused ``qkv_proj`` (hidden -> 3 x heads x head_dim),
  ``output_gate`` (hidden -> heads x head_dim), the RMSNorm ``norm`` over heads x head_dim and ``out_proj``, no bias
  (its decay factors are buffers).

Then ``norm`` and an untied ``lm_head`` (``tie_word_embeddings`` default False).

The lightning attention layers keep no KV cache but a state per layer in ``MiniMaxCache.linear_cache``
(``[batch, heads, head_dim, head_dim]`` in ``value_states``' dtype, the compute dtype: lines 204-211, 271):
``ModelSpec.mamba`` of ``MambaSpec.kind`` "lightning" (analytic/ssm_state.py counts it and the block-wise prefill);
the model's forward takes no other cache class (``Traits.cache_class``).  Through its MLP the decoder layer keeps two
hidden-sized tensors, its input and the normalized input (``residual`` is rebound to ``post_attention_layernorm``'s
output, lines 565-577: ``Traits.hidden_kept_through_mlp`` 2).  Generate is estimated; so is a full fine-tune
(the lightning layers' saved tensors: analytic/terms/lightning.py); serving and the rest are refused (spec/checks.py
``_lightning_problems``).

``configuration_minimax.py`` defaults: vocab 32000, hidden 4096, intermediate 14336, 32 layers alternating full and
linear attention from a full one (``__post_init__``), 32 heads, 8 KV heads, head_dim = hidden / heads, 8 experts, 2
per token, tie_word_embeddings False.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.families.llama_like import MIXTRAL_EXPERT_NAMES
from vramplan.spec.model import MambaSpec, ModelSpec, MoESpec


def layer_types(cfg: Config, n_layers: int) -> list[str]:
    """``MiniMaxConfig.layer_types``, or its default: full attention at even layers, linear at odd ones."""
    types = cfg.get("layer_types")
    if types is None:
        return ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n_layers)]
    return [str(t) for t in types]


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_layers = int(get(cfg, "num_hidden_layers", default=32))
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    hd = int(cfg.get("head_dim") or h // n_heads)
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "intermediate_size", default=14336))
    experts = int(get(cfg, "num_local_experts", default=8))
    types = layer_types(cfg, n_layers)
    if len(types) != n_layers:
        raise ValueError(f"a minimax config's layer_types names {len(types)} layers where num_hidden_layers is "
                         f"{n_layers}")
    all_layers = tuple(range(n_layers))
    full = tuple(i for i, t in enumerate(types) if t != "linear_attention")
    linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, full, False, "o_proj")
    p.add("layers.self_attn.norm.weight", n_heads * hd, "norm", linear)
    p.linear("layers.self_attn.qkv_proj", h, 3 * n_heads * hd, linear, False, "column")
    p.linear("layers.self_attn.out_proj", n_heads * hd, h, linear, False, "row")
    p.linear("layers.self_attn.output_gate", h, n_heads * hd, linear, False, "column")
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.post_attention_layernorm", h, all_layers, False)
    p.linear("layers.mlp.gate", h, experts, all_layers, False, "replicated", role="router")
    p.linear("layers.mlp.experts.gate_up_proj", h, 2 * inter, all_layers, False, "expert", "expert", experts)
    p.linear("layers.mlp.experts.down_proj", inter, h, all_layers, False, "expert", "expert", experts)
    p.norm("norm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, moe_layers=frozenset(all_layers),
                      moe=MoESpec(experts, int(get(cfg, "num_experts_per_tok", default=2)), inter), hidden_size=h,
                      num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=hd,
                      vocab_size=vocab, intermediate_size=inter, hidden_act=str(cfg.get("hidden_act", "silu")),
                      mlp_gated=True, norm="rms", position="rope", tie_word_embeddings=tied,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=4096 * 32)))
    state = MambaSpec(layers=linear, n_heads=n_heads, head_dim=hd, n_groups=0, state_size=hd, conv_kernel=0,
                      intermediate_size=0, chunk_size=int(get(cfg, "block_size", default=256)), kind="lightning")
    return replace(spec, mamba=state if linear else None,
                   traits=replace(spec.traits, experts_are_linears=False, cache_class="MiniMaxCache",
                                                 # peft converts w1/w3/w2 (the "mixtral" pattern), which
                                                 # scenarios may spell as the experts' names, as for Mixtral
                                                 expert_module_aliases=tuple(MIXTRAL_EXPERT_NAMES.items()),
                                                 hidden_kept_through_mlp=2))


MINIMAX = Family(build, "modeling_minimax.py", required=required("hidden_size", "num_attention_heads", "vocab_size"))
