"""Qwen3-Next (``qwen3_next``): Gated DeltaNet linear-attention layers and gated full attention, a high-sparsity
mixture of experts with a gated shared expert (transformers ``modeling_qwen3_next.py`` and
``configuration_qwen3_next.py``, 5.24).

``Qwen3NextModel`` holds ``embed_tokens``, ``num_hidden_layers`` decoder layers and ``norm`` (``Qwen3NextRMSNorm``,
zero-centred: ``x * (1 + weight)``); ``Qwen3NextForCausalLM`` adds ``lm_head`` (tied to ``embed_tokens`` when
``tie_word_embeddings``, default False).  Layer ``i``'s mixer is ``layer_types[i]``; a config without
``layer_types`` gets ``"full_attention"`` where ``(i + 1) % full_attention_interval == 0`` (default 4) and
``"linear_attention"`` elsewhere (``Qwen3NextConfig.__post_init__``):

* ``"linear_attention"``: ``linear_attn`` (``Qwen3NextGatedDeltaNet``), with ``key_dim = linear_key_head_dim x
  linear_num_key_heads``, ``value_dim = linear_value_head_dim x linear_num_value_heads`` and ``conv_dim = 2 key_dim +
  value_dim``: ``conv1d`` (depthwise, weight ``[conv_dim, 1, linear_conv_kernel_dim]``, no bias), ``in_proj_qkvz``
  ``[2 key_dim + 2 value_dim, hidden]`` and ``in_proj_ba`` ``[2 linear_num_value_heads, hidden]`` without bias,
  ``dt_bias`` and ``A_log`` (one per value head), ``norm`` (``Qwen3NextRMSNormGated``, a weight of
  ``linear_value_head_dim``) and ``out_proj`` ``[hidden, value_dim]`` without bias;
* ``"full_attention"``: ``self_attn`` (``Qwen3NextAttention``): ``q_proj`` of ``2 x num_attention_heads x head_dim``
  outputs (the query and its output gate, ``attn_output * sigmoid(gate)``), ``k_proj``, ``v_proj``, ``o_proj`` (bias
  when ``attention_bias``) and ``q_norm``/``k_norm`` over ``head_dim``; RoPE over ``partial_rotary_factor`` (0.25)
  of ``head_dim``;
* its ``mlp`` is a ``Qwen3NextSparseMoeBlock`` where ``i`` is not in ``mlp_only_layers``, ``num_experts`` > 0 and
  ``(i + 1) % decoder_sparse_step == 0`` (``gate.weight [experts, hidden]``; ``experts.gate_up_proj [experts,
  2 x moe_intermediate_size, hidden]`` and ``experts.down_proj [experts, hidden, moe_intermediate_size]``, 3-D
  parameters; ``shared_expert`` gate/up/down of ``shared_expert_intermediate_size``; ``shared_expert_gate [1,
  hidden]``), else a ``Qwen3NextMLP`` of ``intermediate_size``;
* every layer has ``input_layernorm`` and ``post_attention_layernorm``.

The checkpoints' multi-token-prediction layers (``mtp.*``) are not built by transformers
(``Qwen3NextPreTrainedModel._keys_to_ignore_on_load_unexpected = [r"^mtp.*"]``) and vLLM's MTP facts
(``facts/vllm_mtp.py``) do not cover ``Qwen3NextForCausalLM``: they are not counted.

The Gated DeltaNet layers keep a recurrent state in place of a KV cache: ``ModelSpec.mamba`` with ``MambaSpec.kind``
"gated_deltanet" (their convolution over ``conv_dim`` channels; ``linear_num_value_heads`` heads of a
``linear_key_head_dim x linear_value_head_dim`` state).

``configuration_qwen3_next.py`` defaults: vocab 151936, hidden 2048, intermediate 5632, 48 layers, 16 heads, 2 KV
heads, head_dim 256, linear_conv_kernel_dim 4, linear key/value head dims 128, 16 linear key heads, 32 linear value
heads, decoder_sparse_step 1, moe_intermediate_size 512, shared_expert_intermediate_size 512, num_experts_per_tok 10,
num_experts 512, attention_bias False, tie_word_embeddings False, max_position_embeddings 32768.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec, MoESpec, Traits


def layer_types(cfg: Config, n_layers: int) -> list[str]:
    """``Qwen3NextConfig.layer_types``: the config's own, else every ``full_attention_interval``-th layer (from the
    ``interval - 1``-th) full attention."""
    given = cfg.get("layer_types")
    if given is not None:
        types = [str(t) for t in given]
        if len(types) != n_layers or not set(types) <= {"linear_attention", "full_attention"}:
            raise ValueError(f"a qwen3_next config's layer_types must list {n_layers} entries (num_hidden_layers), each "
                             f"'linear_attention' or 'full_attention'; got {types!r}")
        return types
    interval = int(get(cfg, "full_attention_interval", default=4))
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]


def gated_deltanet_spec(cfg: Config, linear: tuple[int, ...]) -> MambaSpec:
    """The Gated DeltaNet layers' shape as a ``MambaSpec`` (kind "gated_deltanet"): the convolution runs over
    ``conv_dim = 2 key_dim + value_dim`` channels (``intermediate_size`` here, no groups), the state is
    ``linear_num_value_heads`` heads of ``linear_value_head_dim`` (``head_dim``) by ``linear_key_head_dim``
    (``state_size``): ``torch_chunk_gated_delta_rule``'s ``last_recurrent_state [batch, num_v_heads, k_head_dim,
    v_head_dim]``."""
    nk = int(get(cfg, "linear_num_key_heads", default=16))
    nv = int(get(cfg, "linear_num_value_heads", default=32))
    dk = int(get(cfg, "linear_key_head_dim", default=128))
    dv = int(get(cfg, "linear_value_head_dim", default=128))
    if nv % nk:
        # fix_query_key_value_ordering reshapes to num_k_heads groups of num_v_heads // num_k_heads value heads
        raise ValueError(f"linear_num_value_heads ({nv}) must be a multiple of linear_num_key_heads ({nk})")
    # torch_chunk_gated_delta_rule's default chunk_size (64); Qwen3NextGatedDeltaNet passes none
    return MambaSpec(layers=linear, n_heads=nv, head_dim=dv, n_groups=0, state_size=dk,
                     conv_kernel=int(get(cfg, "linear_conv_kernel_dim", default=4)),
                     intermediate_size=2 * nk * dk + nv * dv, chunk_size=64, kind="gated_deltanet",
                     key_heads=nk)


def _gated_deltanet(p: Params, ms: MambaSpec, h: int) -> None:
    """``Qwen3NextGatedDeltaNet.__init__``'s tensors, in its order."""
    linear = ms.layers
    key_dim, value_dim = ms.key_heads * ms.state_size, ms.n_heads * ms.head_dim
    p.add("layers.linear_attn.conv1d.weight", ms.conv_dim * ms.conv_kernel, "other", linear)
    p.linear("layers.linear_attn.in_proj_qkvz", h, 2 * key_dim + 2 * value_dim, linear, False, "column")
    p.linear("layers.linear_attn.in_proj_ba", h, 2 * ms.n_heads, linear, False, "column")
    p.add("layers.linear_attn.dt_bias", ms.n_heads, "other", linear)
    p.add("layers.linear_attn.A_log", ms.n_heads, "other", linear)
    p.add("layers.linear_attn.norm.weight", ms.head_dim, "norm", linear)
    p.linear("layers.linear_attn.out_proj", value_dim, h, linear, False, "row")


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(get(cfg, "num_key_value_heads", default=2))
    hd = int(get(cfg, "head_dim", default=256) or h // n_heads)
    vocab = int(cfg["vocab_size"])
    inter = int(get(cfg, "intermediate_size", default=5632))
    types = layer_types(cfg, n_layers)
    linear = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    all_layers = tuple(range(n_layers))
    ms = gated_deltanet_spec(cfg, linear)
    experts = int(get(cfg, "num_experts", default=512))
    step = int(get(cfg, "decoder_sparse_step", default=1))
    only = {int(i) for i in (cfg.get("mlp_only_layers") or [])}
    moe_layers = tuple(i for i in all_layers if i not in only and experts > 0 and (i + 1) % step == 0)
    dense = tuple(i for i in all_layers if i not in moe_layers)
    ei = int(get(cfg, "moe_intermediate_size", default=512))
    si = int(get(cfg, "shared_expert_intermediate_size", default=512))
    bias = bool(cfg.get("attention_bias", False))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    # an empty layer tuple would count a tensor once (Params.add): each group only where its layers exist
    if linear:
        _gated_deltanet(p, ms, h)
    if full:
        # Qwen3NextAttention: q_proj holds the query and its output gate
        p.linear("layers.self_attn.q_proj", h, 2 * n_heads * hd, full, bias, "column")
        p.linear("layers.self_attn.k_proj", h, n_kv * hd, full, bias, "column")
        p.linear("layers.self_attn.v_proj", h, n_kv * hd, full, bias, "column")
        p.linear("layers.self_attn.o_proj", n_heads * hd, h, full, bias, "row")
        p.norm("layers.self_attn.q_norm", hd, full, False)
        p.norm("layers.self_attn.k_norm", hd, full, False)
    moe = None
    if moe_layers:
        p.linear("layers.mlp.gate", h, experts, moe_layers, False, "replicated", role="router")
        p.linear("layers.mlp.experts.gate_up_proj", h, 2 * ei, moe_layers, False, "expert", "expert", experts)
        p.linear("layers.mlp.experts.down_proj", ei, h, moe_layers, False, "expert", "expert", experts)
        p.linear("layers.mlp.shared_expert.gate_proj", h, si, moe_layers, False, "column")
        p.linear("layers.mlp.shared_expert.up_proj", h, si, moe_layers, False, "column")
        p.linear("layers.mlp.shared_expert.down_proj", si, h, moe_layers, False, "row")
        p.linear("layers.mlp.shared_expert_gate", h, 1, moe_layers, False, "replicated", role="router")
        moe = MoESpec(experts, int(get(cfg, "num_experts_per_tok", default=10)), ei, 1 if si else 0, si)
    if dense:
        p.linear("layers.mlp.gate_proj", h, inter, dense, False, "column")
        p.linear("layers.mlp.up_proj", h, inter, dense, False, "column")
        p.linear("layers.mlp.down_proj", inter, h, dense, False, "row")
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.post_attention_layernorm", h, all_layers, False)
    p.norm("norm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    # Qwen3NextConfig.__post_init__: partial_rotary_factor 0.25 unless the config (or its rope_parameters) sets one
    rope = cfg.get("rope_parameters")
    partial = float(get(rope if isinstance(rope, dict) else {}, "partial_rotary_factor",
                        default=get(cfg, "partial_rotary_factor", default=0.25)))
    # Qwen3NextRMSNorm (the layers' norms, the final norm, q_norm and k_norm) normalizes x.float() and multiplies by
    # 1 + weight in fp32 before casting back: Gemma's form (norm "gemma_rms")
    # Qwen3NextExperts: fused gate_up_proj / down_proj parameters, not nn.Linear modules
    traits = Traits(experts_are_linears=False) if moe else Traits()
    return build_spec(cfg, name, model_type, p, moe_layers=frozenset(moe_layers), moe=moe, hidden_size=h,
                      num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=hd,
                      vocab_size=vocab, intermediate_size=inter, hidden_act=str(cfg.get("hidden_act", "silu")),
                      mlp_gated=True, norm="gemma_rms", position="rope", qk_norm=True, tie_word_embeddings=tied,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=32768)), mamba=ms if ms.layers else None,
                      partial_rotary_factor=partial, traits=traits)


QWEN3_NEXT = Family(build, "modeling_qwen3_next.py",
                    required=required("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"))
