"""RWKV-4 (``rwkv``): attention-free blocks of a time-mixing "linear attention" (the wkv recurrence) and a
channel-mixing feed-forward (transformers ``modeling_rwkv.py`` and ``configuration_rwkv.py``, 5.24).

``RwkvModel`` holds ``embeddings``, ``num_hidden_layers`` blocks (``RwkvBlock``) and ``ln_out`` (a LayerNorm with
bias); ``RwkvForCausalLM`` adds ``head`` (no bias), tied to ``rwkv.embeddings`` only when ``tie_word_embeddings``
(``_tied_weights_keys``; ``RwkvConfig`` defaults it to False).  With ``h = hidden_size``, ``A =
attention_hidden_size`` (``RwkvConfig.__post_init__``: ``hidden_size`` when null) and ``I = intermediate_size``
(``4 h`` when null), each block holds

* ``pre_ln`` (block 0 only) , ``ln1`` and ``ln2``: ``nn.LayerNorm(h)``, weight and bias;
* ``attention`` (``RwkvSelfAttention``): ``time_decay`` and ``time_first`` ``[A]``, ``time_mix_key``,
  ``time_mix_value`` and ``time_mix_receptance`` ``[1, 1, h]``, ``key``, ``value`` and ``receptance`` ``[A, h]``,
  ``output`` ``[h, A]``, all without bias;
* ``feed_forward`` (``RwkvFeedForward``): ``time_mix_key`` and ``time_mix_receptance`` ``[1, 1, h]``, ``key`` ``[I, h]``,
  ``receptance`` ``[h, h]``, ``value`` ``[h, I]``, without bias.

Its generate keeps no KV cache: ``RwkvModel.forward`` (``use_cache``) makes ``state``, five tensors of
``batch x hidden_size x num_hidden_layers``: the feed-forward's and the attention's last input (token shift, in the
embeddings' dtype) and the wkv numerator, denominator and running maximum (fp32).  It is written as
``ModelSpec.mamba`` of ``MambaSpec.kind`` "rwkv4" (analytic/ssm_state.py counts it and the prefill's wkv loop).

``configuration_rwkv.py`` defaults: vocab 50277, context_length 1024, hidden 4096, 32 layers, attention_hidden_size
and intermediate_size null, layer_norm_epsilon 1e-5, rescale_every 6, tie_word_embeddings False.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, required
from vramplan.spec.model import MambaSpec, ModelSpec


def widths(cfg: Config) -> tuple[int, int, int]:
    """(hidden, attention_hidden_size, intermediate_size) as ``RwkvConfig.__post_init__`` fills them."""
    h = int(cfg["hidden_size"])
    att = cfg.get("attention_hidden_size")
    inter = cfg.get("intermediate_size")
    return h, h if att is None else int(att), 4 * h if inter is None else int(inter)


def state_spec(h: int, n_layers: int) -> MambaSpec:
    """The recurrent state ``RwkvModel.forward`` keeps per sequence and layer, as a ``MambaSpec``: two token-shift
    vectors of ``h`` in the compute dtype (the "convolution" state: ``intermediate_size`` h, ``conv_kernel`` 2) and the
    wkv numerator, denominator and maximum of ``h`` in fp32 (the "SSM" state: ``h`` heads of width 1, 3 states)."""
    return MambaSpec(layers=tuple(range(n_layers)), n_heads=h, head_dim=1, n_groups=0, state_size=3, conv_kernel=2,
                     intermediate_size=h, chunk_size=1, kind="rwkv4")


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, att, inter = widths(cfg)
    n_layers, vocab = int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    if att != h:
        # RwkvSelfAttention.forward writes its (batch, attention_hidden_size) wkv state into the model's state of
        # (batch, hidden_size, layers): transformers' generate (use_cache) fails on such a config
        raise ValueError(f"attention_hidden_size {att} other than hidden_size {h} is not modelled (RwkvModel's "
                         "state cannot hold its wkv state); set it to null")
    layers = tuple(range(n_layers))
    p = Params()
    p.add("embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("blocks.pre_ln", h, (0,), True)
    p.norm("blocks.ln1", h, layers, True)
    p.norm("blocks.ln2", h, layers, True)
    for vec in ("time_decay", "time_first"):
        p.add(f"blocks.attention.{vec}", att, "other", layers)
    for mix in ("key", "value", "receptance"):
        p.add(f"blocks.attention.time_mix_{mix}", h, "other", layers)
    p.linear("blocks.attention.key", h, att, layers, False, "replicated")
    p.linear("blocks.attention.value", h, att, layers, False, "replicated")
    p.linear("blocks.attention.receptance", h, att, layers, False, "replicated")
    p.linear("blocks.attention.output", att, h, layers, False, "replicated")
    for mix in ("key", "receptance"):
        p.add(f"blocks.feed_forward.time_mix_{mix}", h, "other", layers)
    p.linear("blocks.feed_forward.key", h, inter, layers, False, "replicated")
    p.linear("blocks.feed_forward.receptance", h, h, layers, False, "replicated")
    p.linear("blocks.feed_forward.value", inter, h, layers, False, "replicated")
    p.norm("ln_out", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=1,
                      num_kv_heads=1, head_dim=h, vocab_size=vocab, intermediate_size=inter, hidden_act="relu2",
                      mlp_gated=False, norm="layer", position="none", tie_word_embeddings=tied,
                      attention_dropout=0.0, hidden_dropout=0.0,
                      max_position_embeddings=int(get(cfg, "context_length", "max_position_embeddings",
                                                      default=1024)),
                      mamba=state_spec(h, n_layers))
    # RwkvModel.forward passes the recurrent state as its own ``state`` argument (and returns it as ``out.state``),
    # not through ``past_key_values``
    return replace(spec, traits=replace(spec.traits, state_argument=True))


RWKV = Family(build, "modeling_rwkv.py", required=required("hidden_size", "num_hidden_layers", "vocab_size"))
