"""LFM2 (``lfm2``): gated short-convolution blocks and grouped-query attention layers (transformers
``modeling_lfm2.py`` and ``configuration_lfm2.py``, 5.24).

``Lfm2Model`` holds ``embed_tokens``, ``num_hidden_layers`` decoder layers and ``embedding_norm`` (an RMSNorm applied
after the last layer, the final norm despite its name); ``Lfm2ForCausalLM`` adds ``lm_head``, tied to ``embed_tokens``
by default (``tie_word_embeddings`` True; the checkpoints' ``tie_embedding`` is its alias, ``Lfm2Config.__post_init__``).
Layer ``i`` is a convolution block where ``layer_types[i] == "conv"`` and attention otherwise; a config without
``layer_types`` gets attention at ``full_attn_idxs`` (default: every layer) and "conv" elsewhere:

* attention (``Lfm2Attention``): ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` without bias, ``q_layernorm`` and
  ``k_layernorm`` over ``head_dim`` (``hidden_size // num_attention_heads`` unless the config names one); RoPE;
* convolution (``Lfm2ShortConv``): ``conv`` (depthwise, weight ``[hidden, 1, conv_L_cache]``, bias when
  ``conv_bias``), ``in_proj [3 hidden, hidden]`` and ``out_proj [hidden, hidden]`` (bias when ``conv_bias``); its
  forward is ``C * conv(B * x)`` on the three thirds of ``in_proj``'s output;
* every layer has ``feed_forward`` (``Lfm2MLP``: ``w1``, ``w3`` ``[ff, hidden]`` and ``w2 [hidden, ff]`` without bias),
  ``operator_norm`` and ``ffn_norm``.  ``ff`` is ``intermediate_size`` (which the checkpoints' ``block_ff_dim``
  replaces), and with ``block_auto_adjust_ff_dim`` ``int(2 ff / 3)``, times ``block_ffn_dim_multiplier`` (when not
  null) rounded up to a multiple of ``block_multiple_of``.

The convolution blocks keep a convolution state in place of a KV cache: ``ModelSpec.mamba`` with ``MambaSpec.kind``
"short_conv" (``conv_L_cache`` columns of ``hidden`` channels, no recurrent state; its generate's terms:
``analytic/ssm_state.py``).

``configuration_lfm2.py`` defaults: vocab 65536, hidden 2560, intermediate 12288, 32 layers, 32 heads, 8 KV heads,
max_position_embeddings 128000, tie_word_embeddings True, conv_bias False, conv_L_cache 3, block_multiple_of 256,
block_ffn_dim_multiplier 1.0, block_auto_adjust_ff_dim True.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get
from vramplan.spec.model import MambaSpec, ModelSpec, Traits


def layer_types(cfg: Config, n_layers: int) -> list[str]:
    """``Lfm2Config.layer_types``: the config's own, else attention at ``full_attn_idxs`` (every layer without it)."""
    given = cfg.get("layer_types")
    if given is not None:
        types = [str(t) for t in given]
        if len(types) != n_layers:
            raise ValueError(f"an lfm2 config's layer_types must list {n_layers} entries (num_hidden_layers); got "
                             f"{len(types)}")
        return types
    idxs = cfg.get("full_attn_idxs")
    full = set(range(n_layers)) if idxs is None else {int(i) for i in idxs}
    return ["full_attention" if i in full else "conv" for i in range(n_layers)]


def ff_width(cfg: Config) -> int:
    """``Lfm2MLP.__init__``'s width (module docstring)."""
    ff = int(get(cfg, "block_ff_dim", "intermediate_size", default=12288))
    if not bool(cfg.get("block_auto_adjust_ff_dim", True)):
        return ff
    ff = int(2 * ff / 3)
    mult = cfg.get("block_ffn_dim_multiplier", 1.0)
    if mult is not None:
        of = int(cfg.get("block_multiple_of", 256))
        ff = of * ((int(float(mult) * ff) + of - 1) // of)
    return ff


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(get(cfg, "num_key_value_heads", default=8))
    hd = int(cfg.get("head_dim") or h // n_heads)
    vocab = int(cfg["vocab_size"])
    ff = ff_width(cfg)
    types = layer_types(cfg, n_layers)
    conv = tuple(i for i, t in enumerate(types) if t == "conv")
    attn = tuple(i for i, t in enumerate(types) if t != "conv")
    all_layers = tuple(range(n_layers))
    for key in ("conv_dim", "conv_dim_out"):
        if key in cfg and int(cfg[key]) != h:
            # transformers 5.24's Lfm2ShortConv convolves hidden_size channels, vLLM's ShortConv config.conv_dim
            # (lfm2.py:266 at 0.10.2); the released configs set both to hidden_size
            raise ValueError(f"an lfm2 config's {key} ({cfg[key]}) differs from hidden_size ({h}): transformers' "
                             "Lfm2ShortConv convolves hidden_size channels, so such a checkpoint is not modelled")
    k = int(get(cfg, "conv_L_cache", default=3))
    bias = bool(cfg.get("conv_bias", False))
    # no recurrent state: n_heads 0; the convolution runs over the hidden size's channels (no groups)
    ms = MambaSpec(layers=conv, n_heads=0, head_dim=0, n_groups=0, state_size=0, conv_kernel=k, intermediate_size=h,
                   chunk_size=1, kind="short_conv")
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    # an empty layer tuple would count a tensor once (Params.add): each group only where its layers exist
    if attn:
        p.linear("layers.self_attn.q_proj", h, n_heads * hd, attn, False, "column")
        p.linear("layers.self_attn.k_proj", h, n_kv * hd, attn, False, "column")
        p.linear("layers.self_attn.v_proj", h, n_kv * hd, attn, False, "column")
        p.linear("layers.self_attn.out_proj", n_heads * hd, h, attn, False, "row")
        p.norm("layers.self_attn.q_layernorm", hd, attn, False)
        p.norm("layers.self_attn.k_layernorm", hd, attn, False)
    if conv:
        p.add("layers.conv.conv.weight", h * k, "other", conv)
        if bias:
            p.add("layers.conv.conv.bias", h, "bias", conv)
        p.linear("layers.conv.in_proj", h, 3 * h, conv, bias, "column")
        p.linear("layers.conv.out_proj", h, h, conv, bias, "row")
    p.linear("layers.feed_forward.w1", h, ff, all_layers, False, "column")
    p.linear("layers.feed_forward.w3", h, ff, all_layers, False, "column")
    p.linear("layers.feed_forward.w2", ff, h, all_layers, False, "row")
    p.norm("layers.operator_norm", h, all_layers, False)
    p.norm("layers.ffn_norm", h, all_layers, False)
    p.norm("embedding_norm", h, (), False)
    tied = bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True)))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=ff, hidden_act="silu",
                      mlp_gated=True, norm="rms", position="rope", qk_norm=True, tie_word_embeddings=tied,
                      attention_dropout=0.0, hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=128000)), mamba=ms if ms.layers else None,
                      traits=Traits(mlp_module_roles=(("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))))


LFM2 = Family(build, "modeling_lfm2.py",
              required=(("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("vocab_size",)))
