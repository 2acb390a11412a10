"""Bamba: a hybrid of Mamba2 mixers and grouped-query attention (transformers ``modeling_bamba.py``, 5.24).

Every decoder layer (``BambaDecoderLayer``) holds a gated SiLU MLP (``feed_forward.gate_proj/up_proj/down_proj``)
and two RMSNorms (``input_layernorm``, ``pre_ff_layernorm``); its sequence mixer is attention
(``self_attn.q/k/v/o_proj``, RoPE) in the layers ``attn_layer_indices`` names and a Mamba2 mixer
(``BambaMixer``) in the others: ``in_proj`` (hidden -> intermediate + conv_dim + n_heads: the gate z, the
convolution's x|B|C and dt), a depthwise ``conv1d`` (conv_dim channels, ``mamba_d_conv`` taps, bias when
``mamba_conv_bias``), the per-head ``dt_bias``, ``A_log`` and ``D``, the gated RMSNorm ``norm`` (intermediate) and
``out_proj``.  Then ``final_layernorm`` and an untied ``lm_head``.

``configuration_bamba.py`` defaults: vocab 128000, intermediate 14336, 8 KV heads, attention_bias False,
mlp_bias False, mamba_n_heads 128, mamba_d_head "auto" (``mamba_expand * hidden_size // mamba_n_heads``),
mamba_n_groups 1, mamba_d_state 256, mamba_d_conv 4, mamba_expand 2, mamba_chunk_size 256, mamba_conv_bias True,
mamba_proj_bias False, tie_word_embeddings False, max_position_embeddings 262144.
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec


def mamba_spec(cfg: Config, h: int, n_layers: int) -> MambaSpec:
    """The mixers' shape from ``BambaConfig`` (``__post_init__`` resolves ``mamba_d_head == "auto"``)."""
    attn = {int(i) for i in (cfg.get("attn_layer_indices") or ())}
    expand = int(get(cfg, "mamba_expand", default=2))
    n_heads = int(get(cfg, "mamba_n_heads", default=128))
    inter = expand * h
    d_head = get(cfg, "mamba_d_head", default="auto")
    head_dim = inter // n_heads if d_head == "auto" else int(d_head)
    return MambaSpec(layers=tuple(i for i in range(n_layers) if i not in attn), n_heads=n_heads, head_dim=head_dim,
                     n_groups=int(get(cfg, "mamba_n_groups", default=1)),
                     state_size=int(get(cfg, "mamba_d_state", default=256)),
                     conv_kernel=int(get(cfg, "mamba_d_conv", default=4)), intermediate_size=inter,
                     chunk_size=int(get(cfg, "mamba_chunk_size", default=256)))


def mixer(p: Params, ms: MambaSpec, h: int, conv_bias: bool, proj_bias: bool, prefix: str = "layers.mamba",
          out_bias: bool | None = None, gated_norm: bool = True) -> None:
    """``BambaMixer.__init__``'s tensors, in its order, under ``prefix`` (Nemotron-H names its mixer ``mixer``).
    ``out_bias``: ``out_proj``'s bias where a config sets it apart from ``in_proj``'s (Falcon-H1's
    ``projectors_bias``); ``gated_norm`` False: no ``norm`` (Falcon-H1 without ``mamba_rms_norm``: ``nn.Identity``)."""
    L = ms.layers
    # depthwise: weight [conv_dim, 1, d_conv]
    p.add(f"{prefix}.conv1d.weight", ms.conv_dim * ms.conv_kernel, "other", L)
    if conv_bias:
        p.add(f"{prefix}.conv1d.bias", ms.conv_dim, "bias", L)
    p.linear(f"{prefix}.in_proj", h, ms.intermediate_size + ms.conv_dim + ms.n_heads, L, proj_bias, "column")
    for name in ("dt_bias", "A_log"):
        p.add(f"{prefix}.{name}", ms.n_heads, "other", L)
    if gated_norm:
        p.add(f"{prefix}.norm.weight", ms.intermediate_size, "norm", L)
    p.add(f"{prefix}.D", ms.n_heads, "other", L)
    p.linear(f"{prefix}.out_proj", ms.intermediate_size, h, L, proj_bias if out_bias is None else out_bias, "row")


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    # BambaConfig: num_key_value_heads defaults to 8; an explicit null means one KV head per query head
    n_kv = int(cfg.get("num_key_value_heads", 8) or n_heads)
    hd = int(get(cfg, "head_dim", default=h // n_heads))
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "intermediate_size", default=14336))
    ms = mamba_spec(cfg, h, n_layers)
    all_layers = tuple(range(n_layers))
    attn = tuple(i for i in all_layers if i not in ms.layers)
    mlp_bias = bool(cfg.get("mlp_bias", False))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.linear("layers.feed_forward.gate_proj", h, inter, all_layers, mlp_bias, "column")
    p.linear("layers.feed_forward.up_proj", h, inter, all_layers, mlp_bias, "column")
    p.linear("layers.feed_forward.down_proj", inter, h, all_layers, mlp_bias, "row")
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.pre_ff_layernorm", h, all_layers, False)
    mixer(p, ms, h, bool(get(cfg, "mamba_conv_bias", default=True)), bool(get(cfg, "mamba_proj_bias", default=False)))
    if attn:  # Params.add reads an empty layer tuple as one global tensor: a config with no attention layer has none
        p.attention("layers.self_attn", h, n_heads, n_kv, hd, attn, bool(cfg.get("attention_bias", False)), "o_proj")
    p.norm("final_layernorm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "silu")), mlp_gated=True, norm="rms", position="rope",
                      tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=262144)),
                      mamba=ms, partial_rotary_factor=0.5)


BAMBA = Family(build, "modeling_bamba.py", required=required("hidden_size", "num_hidden_layers",
                                                             "num_attention_heads", "vocab_size"))
