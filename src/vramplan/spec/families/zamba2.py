"""Zamba2: a stack of Mamba2 layers with shared transformer blocks (transformers ``modeling_zamba2.py``, 5.24).

Every layer holds a Mamba2 mixer (``Zamba2MambaMixer``: Bamba's tensors, ``in_proj`` and ``out_proj`` with
``add_bias_linear``, a ``conv1d`` that always has a bias, ``dt_bias``, ``A_log``, ``D``, the gated ``norm`` over
``mamba_ngroups`` groups) and an RMSNorm ``input_layernorm``.  The layers ``layers_block_type`` names "hybrid"
(``Zamba2HybridLayer``) also run a shared transformer block (``Zamba2AttentionDecoderLayer``) on the concatenation
of their input with the embeddings (``2 x hidden``), whose output a per-layer ``linear`` (hidden x hidden, no bias)
adds to the mixer's input.  ``Zamba2Model.get_layers`` builds one block per hybrid layer but ties them to the first
``num_mem_blocks`` (``_tied_weights_keys``, the blocks cycling A, B, A, B...), so the model holds ``num_mem_blocks``
blocks:

* ``self_attn``: ``q/k/v_proj`` from ``attention_hidden_size = 2 x hidden`` to ``heads x attention_head_dim``
  (``attention_head_dim = 2 x hidden / heads``), ``o_proj`` back to hidden, no bias; with
  ``use_shared_attention_adapter`` one low-rank adapter (``Linear(2h, adapter_rank)``, ``Linear(adapter_rank, 2h)``)
  per q/k/v for each hybrid layer the block serves (``linear_q/k/v_adapter_list``);
* ``feed_forward`` (``Zamba2MLP``): a fused ``gate_up_proj`` (hidden -> 2 x intermediate) with one adapter per
  hybrid layer it serves (``gate_up_proj_adapter_list``: hidden -> adapter_rank -> 2 x intermediate) and
  ``down_proj``, with ``add_bias_linear``; ``hidden_act`` (default gelu) gates the first half;
* ``input_layernorm`` (RMSNorm over 2 x hidden) and ``pre_ff_layernorm`` (hidden).

Every adapter belongs to one block: the model holds one adapter set per hybrid layer.  Then ``final_layernorm`` and
an ``lm_head`` tied to the embeddings when ``tie_word_embeddings`` (default True).

``configuration_zamba2.py`` defaults (``Zamba2Config``, "Zamba2-2.7B style"): vocab 32000, hidden 2560, 54 layers
(its default ``layers_block_type``), mamba_d_state 64, mamba_d_conv 4, mamba_expand 2, mamba_ngroups 1, n_mamba_heads
8 (``mamba_headdim = mamba_expand x hidden / n_mamba_heads``), chunk_size 256, add_bias_linear False, intermediate
4 x hidden, hidden_act gelu, 32 heads, num_key_value_heads = heads, num_mem_blocks 1,
use_shared_attention_adapter False, adapter_rank 128, use_mem_rope False, max_position_embeddings 4096
(16384 with ``use_long_context``).
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec

# Zamba2Config.__post_init__'s default layers_block_type (54 layers), remap_legacy_layer_types' names
DEFAULT_TYPES = (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7 + ["linear_attention"] * 4
                 + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"] + ["linear_attention"] * 2)


def layer_types(cfg: Config) -> list[str]:
    """Each layer's type: "hybrid" (a shared block before the mixer) or a mixer alone (the published configs'
    "mamba", transformers' "linear_attention")."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        return list(DEFAULT_TYPES)
    return ["hybrid" if str(t) == "hybrid" else "linear_attention" for t in types]


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    types = layer_types(cfg)
    n_layers = len(types)
    if "num_hidden_layers" in cfg and int(cfg["num_hidden_layers"]) != n_layers:
        raise ValueError(f"a zamba2 config's layers_block_type names {n_layers} layers where num_hidden_layers is "
                         f"{cfg['num_hidden_layers']}")
    h, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    attn_h = 2 * h  # Zamba2Config.attention_hidden_size
    hd = attn_h // n_heads  # Zamba2Config.attention_head_dim
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("intermediate_size") or 4 * h)
    expand = int(get(cfg, "mamba_expand", default=2))
    m_heads = int(get(cfg, "n_mamba_heads", default=8))
    m_inter = expand * h
    all_layers = tuple(range(n_layers))
    hybrid = tuple(i for i, t in enumerate(types) if t == "hybrid")
    ms = MambaSpec(layers=all_layers, n_heads=m_heads, head_dim=m_inter // m_heads,
                   n_groups=int(get(cfg, "mamba_ngroups", default=1)),
                   state_size=int(get(cfg, "mamba_d_state", default=64)),
                   conv_kernel=int(get(cfg, "mamba_d_conv", default=4)), intermediate_size=m_inter,
                   chunk_size=int(get(cfg, "chunk_size", default=256)), shared_attention_layers=hybrid,
                   shared_adapter_rank=int(get(cfg, "adapter_rank", default=128)),
                   shared_attention_adapters=bool(get(cfg, "use_shared_attention_adapter", default=False)))
    bias = bool(get(cfg, "add_bias_linear", default=False))
    rank = ms.shared_adapter_rank
    n_mem = int(get(cfg, "num_mem_blocks", default=1))
    tied = bool(cfg.get("tie_word_embeddings", True))
    # the blocks the model holds: the first num_mem_blocks hybrid layers' (the later ones tie to them), unless the
    # embeddings are untied: transformers 5.24 applies _tied_weights_keys only under tie_word_embeddings
    # (PreTrainedModel.get_expanded_tied_weights_keys returns {} otherwise), so every hybrid layer keeps its own copy
    blocks = hybrid[:n_mem] if tied else hybrid
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    mixer(p, ms, h, True, bias)
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.linear("layers.linear", h, h, hybrid, False, "replicated")
    st = "layers.shared_transformer"
    p.linear(f"{st}.self_attn.q_proj", attn_h, n_heads * hd, blocks, False, "column")
    p.linear(f"{st}.self_attn.k_proj", attn_h, n_kv * hd, blocks, False, "column")
    p.linear(f"{st}.self_attn.v_proj", attn_h, n_kv * hd, blocks, False, "column")
    p.linear(f"{st}.self_attn.o_proj", n_heads * hd, h, blocks, False, "row")
    # adapters: block b (hybrid layers b, b + n_mem, ...) holds one per hybrid layer it serves; tied, the model holds
    # each once (one per hybrid layer), untied every copy of block b holds all of block b's
    adapted = [(hybrid[b::n_mem], 1 if tied else len(hybrid[b::n_mem])) for b in range(min(n_mem, len(hybrid)))]
    if ms.shared_attention_adapters:
        for proj in ("q", "k", "v"):
            for span, per in adapted:
                p.linear(f"{st}.self_attn.linear_{proj}_adapter_list.0", attn_h, rank, span, False, "replicated",
                         per_layer=per)
                p.linear(f"{st}.self_attn.linear_{proj}_adapter_list.1", rank, attn_h, span, False, "replicated",
                         per_layer=per)
    p.linear(f"{st}.feed_forward.gate_up_proj", h, 2 * inter, blocks, bias, "column")
    p.linear(f"{st}.feed_forward.down_proj", inter, h, blocks, bias, "row")
    for span, per in adapted:
        p.linear(f"{st}.feed_forward.gate_up_proj_adapter_list.0", h, rank, span, False, "replicated", per_layer=per)
        p.linear(f"{st}.feed_forward.gate_up_proj_adapter_list.1", rank, 2 * inter, span, False, "replicated",
                 per_layer=per)
    p.norm(f"{st}.input_layernorm", attn_h, blocks, False)
    p.norm(f"{st}.pre_ff_layernorm", h, blocks, False)
    p.norm("final_layernorm", h, (), False)
    if not tied:
        p.lm_head("lm_head", vocab, h)
    rope = bool(get(cfg, "use_mem_rope", default=False))
    max_pos = 16384 if cfg.get("use_long_context") else int(get(cfg, "max_position_embeddings", default=4096))
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "gelu")), mlp_gated=True, norm="rms",
                      position="rope" if rope else "none", tie_word_embeddings=tied,
                      attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=max_pos, mamba=ms)
    # only the hybrid layers run the shared block's MLP
    shared = frozenset(hybrid)
    return replace(spec, layers=tuple(replace(ls, intermediate_size=ls.intermediate_size if ls.index in shared else 0)
                                      for ls in spec.layers))


ZAMBA2 = Family(build, "modeling_zamba2.py", required=required("hidden_size", "num_attention_heads", "vocab_size"))
