"""Nemotron-H (``nemotron_h``): a stack of single-purpose blocks, Mamba2 mixers, attention and MLPs (transformers
``modeling_nemotron_h.py``, 5.24).

Every block (``NemotronHBlock``) holds one RMSNorm (``norm``) and one ``mixer`` chosen by its layer type
(``layers_block_type``, or the older ``hybrid_override_pattern``: "M" Mamba2, "*" attention, "-" MLP, "E" MoE,
``configuration_nemotron_h.py`` ``_pattern_to_list``):

* "M": ``NemotronHMamba2Mixer``, Bamba's mixer tensors (``in_proj`` and ``out_proj`` with ``use_bias``, ``conv1d``
  with ``use_conv_bias``, ``dt_bias``, ``A_log``, the gated ``norm`` over ``n_groups`` groups, ``D``) with an
  intermediate width of ``mamba_num_heads x mamba_head_dim``;
* "*": ``NemotronHAttention``, ``q/k/v/o_proj`` without bias, ``head_dim`` from the config, no positional encoding
  (the attention takes no rotary embedding);
* "-": ``NemotronHMLP``, ``up_proj`` and ``down_proj`` (``mlp_bias``) around ``mlp_hidden_act`` (relu2: not gated).

Then ``norm_f`` and an ``lm_head`` tied when ``tie_word_embeddings``.  Refused: "E" blocks (Nemotron 3's routed
experts beside a shared expert, optionally in a latent space) and multi-token-prediction layers.

``configuration_nemotron_h.py`` defaults: vocab 131072, hidden 4096, 32 heads, 8 KV heads, head_dim 128,
intermediate 21504, mlp_hidden_act relu2, mlp_bias False, ssm_state_size 128, mamba_num_heads 128, mamba_head_dim
64, n_groups 8, conv_kernel 4, chunk_size 128, use_conv_bias True, use_bias False, tie_word_embeddings False,
max_position_embeddings 4096.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec

# configuration_nemotron_h.py _pattern_to_list, and the layer types transformers names (remap_legacy_layer_types)
PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def layer_types(cfg: Config) -> list[str]:
    """Each block's type, from ``layers_block_type`` (or ``layer_types``) or ``hybrid_override_pattern``."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("hybrid_override_pattern")
        if pattern is None:
            raise ValueError("a nemotron_h config needs layers_block_type or hybrid_override_pattern")
        types = [PATTERN[ch] for ch in str(pattern)]
    return [LEGACY.get(str(t), str(t)) for t in types]


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    types = layer_types(cfg)
    if "moe" in types:
        raise ValueError("a nemotron_h model with MoE blocks (\"E\": Nemotron 3's routed experts) is not modelled; "
                         "the models of Mamba2, attention and MLP blocks are")
    if int(cfg.get("num_nextn_predict_layers") or 0):
        raise ValueError("a nemotron_h model with multi-token-prediction layers is not modelled")
    n_layers = len(types)
    h, n_heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    hd = int(get(cfg, "head_dim", default=128))
    vocab, inter = int(cfg["vocab_size"]), int(get(cfg, "intermediate_size", default=21504))
    m_heads, m_hd = int(get(cfg, "mamba_num_heads", default=128)), int(get(cfg, "mamba_head_dim", default=64))
    ms = MambaSpec(layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"), n_heads=m_heads,
                   head_dim=m_hd, n_groups=int(get(cfg, "n_groups", default=8)),
                   state_size=int(get(cfg, "ssm_state_size", default=128)),
                   conv_kernel=int(get(cfg, "conv_kernel", default=4)), intermediate_size=m_heads * m_hd,
                   chunk_size=int(get(cfg, "chunk_size", default=128)),
                   ffn_only_layers=tuple(i for i, t in enumerate(types) if t == "mlp"),
                   ssm_cache_dtype=cfg.get("mamba_ssm_cache_dtype"))
    attn = tuple(i for i, t in enumerate(types) if t == "full_attention")
    p = Params()
    p.add("embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.norm", h, tuple(range(n_layers)), False)
    use_bias = bool(get(cfg, "use_bias", default=False))
    mixer(p, ms, h, bool(get(cfg, "use_conv_bias", default=True)), use_bias, prefix="layers.mixer")
    p.attention("layers.mixer", h, n_heads, n_kv, hd, attn, False, "o_proj")
    mlp_bias = bool(cfg.get("mlp_bias", False))
    p.linear("layers.mixer.up_proj", h, inter, ms.ffn_only_layers, mlp_bias, "column")
    p.linear("layers.mixer.down_proj", inter, h, ms.ffn_only_layers, mlp_bias, "row")
    p.norm("norm_f", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("mlp_hidden_act", "relu2")), mlp_gated=False, norm="rms_fp32",
                      position="none", tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=0.0, max_position_embeddings=int(get(cfg, "max_position_embeddings", default=4096)),
                      mamba=ms)
    # only the MLP blocks hold an MLP
    mlp = frozenset(ms.ffn_only_layers)
    return replace(spec, traits=replace(spec.traits, norm_weight_to_fp32=True),
                   layers=tuple(replace(ls, intermediate_size=ls.intermediate_size if ls.index in mlp else 0)
                                      for ls in spec.layers))


NEMOTRON_H = Family(build, "modeling_nemotron_h.py",
                    required=required("hidden_size", "num_attention_heads", "vocab_size"))
