"""Falcon-H1: attention and a Mamba2 mixer side by side in every layer (transformers ``modeling_falcon_h1.py``, 5.24).

Every decoder layer (``FalconH1DecoderLayer``) holds a gated SiLU MLP (``feed_forward.gate_proj/up_proj/down_proj``,
bias ``mlp_bias``), a Mamba2 mixer ``mamba`` (``FalconH1Mixer``), grouped-query attention ``self_attn`` (``q/k/v/o_proj``,
bias ``attention_bias``, RoPE, ``head_dim`` from the config where it names one, else hidden / heads: ``getattr(config,
"head_dim", ...)``) and two RMSNorms (``input_layernorm``, ``pre_ff_layernorm``).  ``forward`` normalizes the layer's
input once, runs the mixer on it, then the attention on ``hidden_states * attention_in_multiplier``, and adds the two
outputs (each times its muP multiplier) to the residual; then the MLP.  So every layer keeps a KV cache and a Mamba2
state (``MambaSpec.parallel_attention``).

``FalconH1Mixer`` is Mamba2's mixer with two differences its docstring names: the width ``intermediate =
mamba_d_ssm`` (``mamba_expand x hidden_size`` when null), and the gated RMSNorm ``norm`` only when
``mamba_rms_norm`` (else ``nn.Identity``).  Its tensors, in ``__init__``'s order: the depthwise ``conv1d`` over
``conv_dim = intermediate + 2 n_groups d_state`` channels (bias ``mamba_conv_bias``), ``in_proj`` (hidden ->
intermediate + conv_dim + n_heads, bias ``mamba_proj_bias``), ``dt_bias``, ``A_log``, ``norm``, ``D``, ``out_proj``
(intermediate -> hidden, bias ``projectors_bias``).  ``mamba_d_head`` "auto" is ``intermediate // mamba_n_heads``
(``FalconH1Config.__post_init__``).  The model registers a non-persistent ``mup_vector`` buffer in every mixer
(``FalconH1Model.__init__``: ``2 intermediate + 2 n_groups d_state + n_heads`` elements), not a parameter.  Then
``final_layernorm`` and ``lm_head`` (tied to ``embed_tokens`` when ``tie_word_embeddings``, ``_tied_weights_keys``).

``configuration_falcon_h1.py`` defaults (5.24): vocab 128000, hidden 4096, intermediate 14336, 32 layers, 32 heads,
8 KV heads, mamba_d_ssm 1024, mamba_n_heads 128, mamba_d_head "auto", mamba_n_groups 1, mamba_d_state 256,
mamba_d_conv 4, mamba_expand 2, mamba_chunk_size 256, mamba_conv_bias True, mamba_proj_bias False, mamba_rms_norm
False, projectors_bias False, attention_bias False, mlp_bias False, tie_word_embeddings False,
max_position_embeddings 8192.
"""

from __future__ import annotations

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec, Traits


def mamba_spec(cfg: Config, h: int, n_layers: int) -> MambaSpec:
    """The mixers' shape from ``FalconH1Config`` and ``FalconH1Mixer.__init__`` (one in every layer)."""
    d_ssm = cfg.get("mamba_d_ssm", 1024)
    inter = int(get(cfg, "mamba_expand", default=2)) * h if d_ssm is None else int(d_ssm)
    n_heads = int(get(cfg, "mamba_n_heads", default=128))
    d_head = get(cfg, "mamba_d_head", default="auto")
    head_dim = inter // n_heads if d_head == "auto" else int(d_head)
    if n_heads * head_dim != inter:
        # FalconH1Config.validate_architecture: "The dimensions for the Mamba head state do not match the model
        # intermediate_size"
        raise ValueError(f"a falcon_h1 config needs mamba_n_heads x mamba_d_head ({n_heads} x {head_dim}) = the "
                         f"mixer's width ({inter}: mamba_d_ssm, or mamba_expand x hidden_size when it is null), as "
                         "transformers' FalconH1Config checks")
    return MambaSpec(layers=tuple(range(n_layers)), n_heads=n_heads, head_dim=head_dim,
                     n_groups=int(get(cfg, "mamba_n_groups", default=1)),
                     state_size=int(get(cfg, "mamba_d_state", default=256)),
                     conv_kernel=int(get(cfg, "mamba_d_conv", default=4)), intermediate_size=inter,
                     chunk_size=int(get(cfg, "mamba_chunk_size", default=256)), parallel_attention=True,
                     gated_norm=bool(get(cfg, "mamba_rms_norm", default=False)))


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    # FalconH1Config.__post_init__: a null num_key_value_heads is one KV head per query head; the default is 8
    n_kv = int(cfg.get("num_key_value_heads", 8) or n_heads)
    hd = int(get(cfg, "head_dim", default=h // n_heads))
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "intermediate_size", default=14336))
    ms = mamba_spec(cfg, h, n_layers)
    layers = tuple(range(n_layers))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    # FalconH1DecoderLayer.__init__'s order: feed_forward, mamba, self_attn, the two norms
    p.linear("layers.feed_forward.gate_proj", h, inter, layers, mlp_bias, "column")
    p.linear("layers.feed_forward.up_proj", h, inter, layers, mlp_bias, "column")
    p.linear("layers.feed_forward.down_proj", inter, h, layers, mlp_bias, "row")
    mixer(p, ms, h, bool(get(cfg, "mamba_conv_bias", default=True)), bool(get(cfg, "mamba_proj_bias", default=False)),
          out_bias=bool(get(cfg, "projectors_bias", default=False)),
          gated_norm=ms.gated_norm)
    p.attention("layers.self_attn", h, n_heads, n_kv, hd, layers, bool(cfg.get("attention_bias", False)), "o_proj")
    p.norm("layers.input_layernorm", h, layers, False)
    p.norm("layers.pre_ff_layernorm", h, layers, False)
    p.norm("final_layernorm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    return build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("hidden_act", "silu")), mlp_gated=True, norm="rms", position="rope",
                      tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"), hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "max_position_embeddings", default=8192)), mamba=ms,
                      # peft 0.21 tuners_utils.py _check_lora_target_modules_mamba: out_proj and conv1d of falcon_h1
                      traits=Traits(peft_refused_targets=("out_proj", "conv1d")))


FALCON_H1 = Family(build, "modeling_falcon_h1.py", required=required("hidden_size", "num_hidden_layers",
                                                                     "num_attention_heads", "vocab_size"))
