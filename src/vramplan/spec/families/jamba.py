"""Jamba (``jamba``): Mamba-1 mixers and grouped-query attention, dense MLPs and mixture-of-experts layers
(transformers ``modeling_jamba.py`` and ``configuration_jamba.py``, 5.24).

``JambaModel`` holds ``embed_tokens``, ``num_hidden_layers`` decoder layers and ``final_layernorm``;
``JambaForCausalLM`` adds ``lm_head`` (tied to ``embed_tokens`` when ``tie_word_embeddings``, default False).
The layer mix comes from four config keys (``JambaConfig.layers_block_type`` and ``layers_num_experts``, properties):

* layer ``i`` runs attention where ``i % attn_layer_period == attn_layer_offset`` (``JambaAttentionDecoderLayer``:
  ``self_attn.q/k/v/o_proj`` without bias, ``head_dim = hidden_size // num_attention_heads``, no positional
  encoding: ``JambaAttention`` takes no rotary embedding), a Mamba-1 mixer elsewhere (``JambaMambaDecoderLayer``:
  ``mamba``);
* its ``feed_forward`` is a ``JambaSparseMoeBlock`` where ``i % expert_layer_period == expert_layer_offset`` and
  ``num_experts`` > 1 (``router.weight [experts, hidden]``; ``experts.gate_up_proj [experts, 2 x intermediate,
  hidden]`` and ``experts.down_proj [experts, hidden, intermediate]``, 3-D parameters, not ``nn.Linear``), else a
  ``JambaMLP`` (``gate_proj``, ``up_proj``, ``down_proj`` without bias);
* every layer has ``input_layernorm`` and ``pre_ff_layernorm`` (``JambaRMSNorm``, a weight each).

``JambaMambaMixer.__init__``, with ``I = mamba_expand x hidden_size`` (the config's ``intermediate_size`` is the MLP's),
``n = mamba_d_state``, ``r = mamba_dt_rank`` (``"auto"``: ``ceil(hidden_size / 16)``, ``JambaConfig.__post_init__``)
and ``k = mamba_d_conv``: ``conv1d`` (depthwise, weight ``[I, 1, k]``, bias ``[I]`` when ``mamba_conv_bias``),
``in_proj [2 I, hidden]`` and ``out_proj [hidden, I]`` (bias when ``mamba_proj_bias``), ``x_proj [r + 2 n, I]``
without bias, ``dt_proj [I, r]`` with bias, ``A_log [I, n]``, ``D [I]``, and ``dt_layernorm`` (r), ``b_layernorm``
and ``c_layernorm`` (n): ``JambaRMSNorm``s whose weights are parameters (FalconMamba's are non-persistent buffers).
The mixer's inference forward is FalconMamba's (the same ``mamba_selective_scan`` and
``mamba_selective_state_update``, the norms rebinding dt, B and C), so ``analytic/ssm_state.py``'s Mamba-1 terms with
``MambaSpec.bc_dt_norms`` are Jamba's; in training the weighted norms also save, for their weights' gradients, the
normalized tensors they multiply (``analytic/terms/mamba1.py``, ``MambaSpec.bc_dt_norm_params``).

``configuration_jamba.py`` defaults: vocab 65536, hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads
(null: one per head), num_experts 16, num_experts_per_tok 2, expert_layer_period 2, expert_layer_offset 1,
attn_layer_period 8, attn_layer_offset 4, mamba_d_state 16, mamba_d_conv 4, mamba_expand 2, mamba_dt_rank "auto",
mamba_conv_bias True, mamba_proj_bias False, use_mambapy False, tie_word_embeddings False,
max_position_embeddings 262144.
"""

from __future__ import annotations

import math

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.families.mamba import mamba1_mixer_params
from vramplan.spec.model import MambaSpec, ModelSpec, MoESpec, Traits


def layer_kinds(cfg: Config, n_layers: int) -> tuple[list[bool], list[bool]]:
    """(attention?, MoE?) per layer: ``JambaConfig.layers_block_type`` and ``layers_num_experts``."""
    if cfg.get("layers_block_type") is not None:
        # JambaConfig.layers_block_type is a property without a setter: transformers 5.24 raises "property
        # 'layers_block_type' of 'JambaConfig' object has no setter" on a config that sets it
        raise ValueError("a jamba config with layers_block_type is not modelled: JambaConfig derives the layer mix "
                         "from attn_layer_period and attn_layer_offset (its layers_block_type is a read-only "
                         "property that transformers refuses to set); give those two keys instead")
    a_period, a_offset = int(get(cfg, "attn_layer_period", default=8)), int(get(cfg, "attn_layer_offset", default=4))
    e_period = int(get(cfg, "expert_layer_period", default=2))
    e_offset = int(get(cfg, "expert_layer_offset", default=1))
    # JambaConfig.validate_architecture
    if a_offset >= a_period:
        raise ValueError(f"attention layer offset ({a_offset}) must be smaller than attention layer period "
                         f"({a_period})")
    if e_offset >= e_period:
        raise ValueError(f"expert layer offset ({e_offset}) must be smaller than expert layer period ({e_period})")
    experts = int(get(cfg, "num_experts", "num_local_experts", default=16))
    attn = [i % a_period == a_offset for i in range(n_layers)]
    moe = [experts > 1 and i % e_period == e_offset for i in range(n_layers)]
    return attn, moe


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    if cfg.get("use_mambapy"):
        # mamba_selective_scan: with use_mambapy and the mambapy package, pscan over the whole sequence replaces the
        # recurrent loop whose tensors analytic/ssm_state.py counts
        raise ValueError("a jamba config with use_mambapy (mambapy's parallel scan) is not modelled: the torch "
                         "recurrent loop is (set use_mambapy: false)")
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads", 8) or n_heads)
    hd = h // n_heads
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "intermediate_size", default=14336))
    experts = int(get(cfg, "num_experts", "num_local_experts", default=16))
    attn_flags, moe_flags = layer_kinds(cfg, n_layers)
    attn = tuple(i for i in range(n_layers) if attn_flags[i])
    mixers = tuple(i for i in range(n_layers) if not attn_flags[i])
    moe_layers = tuple(i for i in range(n_layers) if moe_flags[i])
    dense = tuple(i for i in range(n_layers) if not moe_flags[i])
    all_layers = tuple(range(n_layers))
    mi = int(get(cfg, "mamba_expand", default=2)) * h
    n = int(get(cfg, "mamba_d_state", default=16))
    k = int(get(cfg, "mamba_d_conv", default=4))
    r_cfg = get(cfg, "mamba_dt_rank", default="auto")
    r = math.ceil(h / 16) if r_cfg == "auto" else int(r_cfg)
    # one state row of n per channel: Mamba-1 written as I heads of width 1 without groups (MambaSpec.kind)
    ms = MambaSpec(layers=mixers, n_heads=mi, head_dim=1, n_groups=0, state_size=n, conv_kernel=k,
                   intermediate_size=mi, chunk_size=1, kind="mamba1", time_step_rank=r, bc_dt_norms=True,
                   bc_dt_norm_params=True)
    proj_bias = bool(get(cfg, "mamba_proj_bias", default=False))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, attn, False, "o_proj")
    mamba1_mixer_params(p, "layers.mamba", h, mi, k, r, n, mixers, bool(get(cfg, "mamba_conv_bias", default=True)),
                        proj_bias)
    p.norm("layers.mamba.dt_layernorm", r, mixers, False)
    p.norm("layers.mamba.b_layernorm", n, mixers, False)
    p.norm("layers.mamba.c_layernorm", n, mixers, False)
    p.linear("layers.feed_forward.gate_proj", h, inter, dense, False, "column")
    p.linear("layers.feed_forward.up_proj", h, inter, dense, False, "column")
    p.linear("layers.feed_forward.down_proj", inter, h, dense, False, "row")
    moe = None
    if moe_layers:
        p.linear("layers.feed_forward.router", h, experts, moe_layers, False, "replicated", role="router")
        p.linear("layers.feed_forward.experts.gate_up_proj", h, 2 * inter, moe_layers, False, "expert", "expert",
                 experts)
        p.linear("layers.feed_forward.experts.down_proj", inter, h, moe_layers, False, "expert", "expert", experts)
        moe = MoESpec(experts, int(get(cfg, "num_experts_per_tok", default=2)), inter)
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.pre_ff_layernorm", h, all_layers, False)
    p.norm("final_layernorm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    # JambaExperts: fused gate_up_proj / down_proj parameters, not nn.Linear modules
    traits = Traits(experts_are_linears=False) if moe else Traits()
    return build_spec(cfg, name, model_type, p, moe_layers=frozenset(moe_layers), moe=moe, hidden_size=h,
                      num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=hd,
                      vocab_size=vocab, intermediate_size=inter, hidden_act=str(cfg.get("hidden_act", "silu")),
                      mlp_gated=True, norm="rms", position="none", tie_word_embeddings=tied,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=262144)), mamba=ms,
                      traits=traits)


JAMBA = Family(build, "modeling_jamba.py",
               required=required("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"))
