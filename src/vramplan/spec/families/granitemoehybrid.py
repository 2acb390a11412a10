"""Granite 4.0 hybrid (``granitemoehybrid``): Bamba's Mamba2 mixers and grouped-query attention under Granite's
multipliers (transformers ``modeling_granitemoehybrid.py``, 5.24).

Every decoder layer (``GraniteMoeHybridDecoderLayer``) holds ``input_layernorm`` and ``post_attention_layernorm``
(RMSNorm), a sequence mixer and a shared MLP (``GraniteMoeHybridMLP``: ``shared_mlp.input_linear`` hidden ->
2 x ``shared_intermediate_size``, chunked into gate and up, and ``shared_mlp.output_linear``, no biases); the mixer is
a Mamba2 layer (``GraniteMoeHybridMambaLayer``: the tensors of Bamba's ``BambaMixer``, ``in_proj``, ``conv1d``,
``dt_bias``, ``A_log``, the gated ``norm``, ``D``, ``out_proj``) where ``layer_types`` says "mamba" (transformers
remaps it to "linear_attention", ``configuration_utils.py`` ``_LEGACY_LAYER_TYPE_REMAP``) and attention
(``q/k/v/o_proj`` with ``attention_bias``) elsewhere.  Then ``norm`` and an ``lm_head`` tied when
``tie_word_embeddings``.  Positions: RoPE only when ``position_embedding_type`` is "rope" (``GraniteMoeHybridModel``
builds no rotary embedding otherwise: the Granite 4.0-H releases use none).  The multipliers (embedding, attention
scale, residual, logits) scale by Python floats and hold no parameter.

With ``num_local_experts`` > 0 (Granite 4.0-H-Tiny and -Small) every layer also holds a ``block_sparse_moe``
beside the shared MLP, the two outputs summed: ``router`` (``GraniteMoeHybridTopKRouter``, a ``[experts, hidden]``
weight: top-k of the fp32 logits, then a softmax over the k) and ``experts`` (``GraniteMoeHybridExperts``: fused
``gate_up_proj [experts, 2 x intermediate_size, hidden]`` and ``down_proj [experts, hidden, intermediate_size]``
parameters, not ``nn.Linear``); the shared MLP is then the MoE spec's one shared expert.  The dense releases
(Granite 4.0-H-Micro, -1B, -350M) set ``num_local_experts`` to 0.

``configuration_granitemoehybrid.py`` defaults: vocab 32000, num_key_value_heads = heads, attention_bias False,
tie_word_embeddings False, max_position_embeddings 2048, shared_intermediate_size 1024, num_local_experts 8,
position_embedding_type None, layer_types all "linear_attention", mamba_n_heads 128, mamba_n_groups 1,
mamba_d_state 256, mamba_d_head "auto" (``mamba_expand * hidden_size // mamba_n_heads``), mamba_d_conv 4,
mamba_expand 2, mamba_chunk_size 256, mamba_conv_bias True, mamba_proj_bias False.
"""

from __future__ import annotations

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec, MoESpec, Traits

# transformers' names for a mixer layer in ``layer_types`` (the released configs say "mamba")
MIXER_TYPES = frozenset({"mamba", "linear_attention"})


def mamba_spec(cfg: Config, h: int, n_layers: int) -> MambaSpec:
    """The mixers' shape from ``GraniteMoeHybridConfig`` (``__post_init__`` resolves ``mamba_d_head == "auto"``)."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["linear_attention"] * n_layers
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {n_layers} layers")
    n_heads = int(get(cfg, "mamba_n_heads", default=128))
    inter = int(get(cfg, "mamba_expand", default=2)) * h
    d_head = get(cfg, "mamba_d_head", default="auto")
    return MambaSpec(layers=tuple(i for i, t in enumerate(types) if t in MIXER_TYPES), n_heads=n_heads,
                     head_dim=inter // n_heads if d_head == "auto" else int(d_head),
                     n_groups=int(get(cfg, "mamba_n_groups", default=1)),
                     state_size=int(get(cfg, "mamba_d_state", default=256)),
                     conv_kernel=int(get(cfg, "mamba_d_conv", default=4)), intermediate_size=inter,
                     chunk_size=int(get(cfg, "mamba_chunk_size", default=256)))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    experts = int(get(cfg, "num_local_experts", default=8) or 0)
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    hd = int(get(cfg, "head_dim", default=h // n_heads))
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "shared_intermediate_size", default=1024))
    ms = mamba_spec(cfg, h, n_layers)
    all_layers = tuple(range(n_layers))
    attn = tuple(i for i in all_layers if i not in ms.layers)
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.post_attention_layernorm", h, all_layers, False)
    p.linear("layers.shared_mlp.input_linear", h, 2 * inter, all_layers, False, "column")
    p.linear("layers.shared_mlp.output_linear", inter, h, all_layers, False, "row")
    moe = _experts(p, cfg, experts, h, all_layers)
    mixer(p, ms, h, bool(get(cfg, "mamba_conv_bias", default=True)), bool(get(cfg, "mamba_proj_bias", default=False)))
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, attn, bool(cfg.get("attention_bias", False)), "o_proj")
    p.norm("norm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    rope = cfg.get("position_embedding_type") == "rope"
    # GraniteMoeHybridMLP: one input_linear output chunked into gate and up; the MoE's router as GraniteMoE's
    # (top-k before the softmax), its experts fused parameters
    roles = (("input_linear", "gate_up_proj"), ("output_linear", "down_proj"))
    traits = Traits(fused_gate_up=True, router_topk_first=True, experts_are_linears=False, mlp_module_roles=roles) \
        if moe else Traits(fused_gate_up=True, mlp_module_roles=roles)
    return build_spec(cfg, name, model_type, p, moe_layers=frozenset(all_layers) if moe else frozenset(), moe=moe,
                      num_layers=n_layers, num_attention_heads=n_heads, hidden_size=h,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab,
                      intermediate_size=moe.expert_intermediate_size if moe else inter,
                      hidden_act=str(cfg.get("hidden_act", "silu")), mlp_gated=True, norm="rms",
                      position="rope" if rope else "none", tie_word_embeddings=tied,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=2048)), mamba=ms,
                      traits=traits)


def _experts(p: Params, cfg: Config, experts: int, h: int, layers: tuple[int, ...]) -> MoESpec | None:
    """``block_sparse_moe``'s router and fused experts in every layer, and the MoE spec whose one shared expert is
    the shared MLP (None without experts)."""
    if not experts:
        return None
    ei = int(get(cfg, "intermediate_size", default=11008))
    p.linear("layers.block_sparse_moe.router", h, experts, layers, False, "replicated", role="router")
    p.linear("layers.block_sparse_moe.experts.gate_up_proj", h, 2 * ei, layers, False, "expert", "expert", experts)
    p.linear("layers.block_sparse_moe.experts.down_proj", ei, h, layers, False, "expert", "expert", experts)
    shared = int(get(cfg, "shared_intermediate_size", default=1024))
    return MoESpec(experts, int(get(cfg, "num_experts_per_tok", default=2)), ei, 1, shared)


GRANITEMOEHYBRID = Family(build, "modeling_granitemoehybrid.py",
                          required=required("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"))
