"""RecurrentGemma (Griffin): RG-LRU recurrent blocks and local attention (transformers ``modeling_recurrent_gemma.py``,
5.24).

Every layer (``RecurrentGemmaDecoderLayer``) holds two RMSNorms (``temporal_pre_norm``, ``channel_pre_norm``), a
temporal block and a gated MLP (``mlp_block``: ``gate_proj``, ``up_proj`` of ``intermediate_size // 2`` and
``down_proj``, all with a bias).  ``RecurrentGemmaConfig.layers_block_type`` tiles ``block_types`` (default recurrent,
recurrent, attention) over the layers:

* "recurrent" (``RecurrentGemmaRecurrentBlock``): ``linear_y``, ``linear_x`` (hidden -> ``lru_width``) and
  ``linear_out`` (back), with biases; a depthwise ``conv_1d`` (``lru_width`` channels, ``conv1d_width`` taps, bias);
  the RG-LRU (``rg_lru``): ``recurrent_param`` (``lru_width``), and per head (``num_attention_heads`` blocks of
  ``lru_width / heads``) the block-diagonal ``input_gate_weight``/``recurrent_gate_weight`` with their biases;
* "attention" (``RecurrentGemmaAttention``, local over ``attention_window_size``): ``q_proj``, ``k_proj``, ``v_proj``
  (``attention_bias``) and ``o_proj`` (always a bias), ``head_dim = hidden / heads`` (``__post_init__`` sets it,
  whatever the config says).

Then ``final_norm`` and the ``lm_head`` tied to the embeddings when ``tie_word_embeddings`` (default True).

The recurrent blocks keep their state on the modules (``conv1d_state``, ``rg_lru.recurrent_states``: lines 413,
434-451), not in the cache: ``ModelSpec.mamba`` of ``MambaSpec.kind`` "rg_lru" (analytic/ssm_state.py counts it and the
prefill's ``_rnn_scan``) and ``Traits.module_state`` (the traced engine counts those attributes as the cache).  The
decoder layer keeps four hidden-sized tensors through its MLP (``raw_activations``, ``inputs_normalized``,
``residual`` and the normalized MLP input, lines 511-529: ``Traits.hidden_kept_through_mlp`` 4).  Generate is
estimated; training and serving are refused (spec/checks.py ``_rg_lru_problems``).

``configuration_recurrent_gemma.py`` defaults: 26 layers, vocab 256000, hidden 2560, intermediate 7680, 10 heads,
lru_width = hidden, attention_window_size 2048, conv1d_width 4, num_key_value_heads = heads, attention_bias False,
hidden_activation gelu_pytorch_tanh, tie_word_embeddings True.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec


def block_types(cfg: Config, n_layers: int) -> list[str]:
    """``RecurrentGemmaConfig.layers_block_type``: ``block_types`` repeated over the layers."""
    types = cfg.get("block_types") or ("recurrent", "recurrent", "attention")
    return [str(t) for t in (list(types) * 100)[:n_layers]]


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_layers = int(get(cfg, "num_hidden_layers", default=26))
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    hd = h // n_heads  # RecurrentGemmaConfig.__post_init__
    vocab = int(cfg["vocab_size"])
    inter = int(get(cfg, "intermediate_size", default=7680))
    lru = int(cfg.get("lru_width") or h)
    width = int(get(cfg, "conv1d_width", default=4))
    types = block_types(cfg, n_layers)
    all_layers = tuple(range(n_layers))
    rec = tuple(i for i, t in enumerate(types) if t == "recurrent")
    attn = tuple(i for i, t in enumerate(types) if t != "recurrent")
    bw = lru // n_heads
    p = Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.temporal_pre_norm", h, all_layers, False)
    p.linear("layers.temporal_block.linear_y", h, lru, rec, True, "column")
    p.linear("layers.temporal_block.linear_x", h, lru, rec, True, "column")
    p.linear("layers.temporal_block.linear_out", lru, h, rec, True, "row")
    p.add("layers.temporal_block.conv_1d.weight", lru * width, "other", rec)
    p.add("layers.temporal_block.conv_1d.bias", lru, "bias", rec)
    p.add("layers.temporal_block.rg_lru.recurrent_param", lru, "other", rec)
    for gate in ("input_gate", "recurrent_gate"):
        p.add(f"layers.temporal_block.rg_lru.{gate}_weight", n_heads * bw * bw, "other", rec)
        p.add(f"layers.temporal_block.rg_lru.{gate}_bias", n_heads * bw, "bias", rec)
    p.attention("layers.temporal_block", h, n_heads, n_kv, hd, attn, bool(cfg.get("attention_bias", False)), "o_proj",
                o_bias=True)
    p.norm("layers.channel_pre_norm", h, all_layers, False)
    half = inter // 2  # RecurrentGemmaMlp.intermediate_size
    p.linear("layers.mlp_block.gate_proj", h, half, all_layers, True, "column")
    p.linear("layers.mlp_block.up_proj", h, half, all_layers, True, "column")
    p.linear("layers.mlp_block.down_proj", half, h, all_layers, True, "row")
    p.norm("final_norm", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    window = int(get(cfg, "attention_window_size", default=2048))
    spec = build_spec(cfg, name, model_type, p, windows=[window if t != "recurrent" else None for t in types],
                      hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv,
                      head_dim=hd, vocab_size=vocab, intermediate_size=half,
                      hidden_act=str(cfg.get("hidden_activation", "gelu_pytorch_tanh")), mlp_gated=True, norm="rms",
                      position="rope", tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=0.0, max_position_embeddings=window)
    state = MambaSpec(layers=rec, n_heads=lru, head_dim=1, n_groups=0, state_size=1, conv_kernel=width,
                      intermediate_size=lru, chunk_size=1, kind="rg_lru")
    return replace(spec, mamba=state if rec else None,
                   traits=replace(spec.traits, module_state=("conv1d_state", "recurrent_states"),
                                                 hidden_kept_through_mlp=4))


RECURRENT_GEMMA = Family(build, "modeling_recurrent_gemma.py",
                         required=required("hidden_size", "num_attention_heads", "vocab_size"))
