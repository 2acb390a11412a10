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

* "E": ``NemotronHMoE`` (Nemotron 3): a ``NemotronHTopkRouter`` (``gate.weight``, experts x hidden, kept in fp32 by
  ``_keep_in_fp32_modules_strict``, and the buffer ``e_score_correction_bias``; sigmoid scores, DeepSeek-V3's grouped
  top-k), ``NemotronHExperts``: plain (not gated) experts held as two 3-D parameters, ``up_proj`` [E, I, h] and
  ``down_proj`` [E, h, I] of ``moe_intermediate_size`` I, run by transformers' grouped experts with
  ``has_gate=False`` (integrations/moe.py ``grouped_mm_experts_forward``: up, the activation, down), and a shared
  expert ``shared_experts``, a ``NemotronHMLP`` of ``moe_shared_expert_intermediate_size``.

Then ``norm_f`` and an ``lm_head`` tied when ``tie_word_embeddings``.  Refused: MoE blocks in a latent space
(``moe_latent_size``: ``fc1_latent_proj``/``fc2_latent_proj`` around the experts) and multi-token-prediction layers.

``configuration_nemotron_h.py`` defaults: vocab 131072, hidden 4096, 32 heads, 8 KV heads, head_dim 128,
intermediate 21504, mlp_hidden_act relu2, mlp_bias False, ssm_state_size 128, mamba_num_heads 128, mamba_head_dim
64, n_groups 8, conv_kernel 4, chunk_size 128, use_conv_bias True, use_bias False, tie_word_embeddings False,
max_position_embeddings 4096; MoE: n_routed_experts 8, num_experts_per_tok 2, moe_intermediate_size 7688,
moe_shared_expert_intermediate_size 7688.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, prob, required
from vramplan.spec.model import MambaSpec, ModelSpec, MoESpec, Traits

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
    if "moe" in types and cfg.get("moe_latent_size") is not None:
        raise ValueError("a nemotron_h model whose MoE blocks run in a latent space (moe_latent_size: fc1_latent_proj "
                         "and fc2_latent_proj around the experts) is not modelled; MoE blocks without it are")
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
                   ffn_only_layers=tuple(i for i, t in enumerate(types) if t in ("mlp", "moe")),
                   ssm_cache_dtype=cfg.get("mamba_ssm_cache_dtype"))
    attn = tuple(i for i, t in enumerate(types) if t == "full_attention")
    p = Params()
    p.add("embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.norm", h, tuple(range(n_layers)), False)
    use_bias = bool(get(cfg, "use_bias", default=False))
    mixer(p, ms, h, bool(get(cfg, "use_conv_bias", default=True)), use_bias, prefix="layers.mixer")
    p.attention("layers.mixer", h, n_heads, n_kv, hd, attn, False, "o_proj")
    mlp_bias = bool(cfg.get("mlp_bias", False))
    dense = tuple(i for i, t in enumerate(types) if t == "mlp")
    if dense:  # (an empty span would mean a tensor outside the blocks)
        p.linear("layers.mixer.up_proj", h, inter, dense, mlp_bias, "column")
        p.linear("layers.mixer.down_proj", inter, h, dense, mlp_bias, "row")
    moe_layers = tuple(i for i, t in enumerate(types) if t == "moe")
    moe = _moe(p, cfg, h, moe_layers, mlp_bias) if moe_layers else None
    p.norm("norm_f", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
                      hidden_act=str(cfg.get("mlp_hidden_act", "relu2")), mlp_gated=False, norm="rms_fp32",
                      position="none", tie_word_embeddings=tied, attention_dropout=prob(cfg, "attention_dropout"),
                      hidden_dropout=0.0, max_position_embeddings=int(get(cfg, "max_position_embeddings", default=4096)),
                      mamba=ms, moe=moe, moe_layers=frozenset(moe_layers),
                      # the MLPs' linears are up_proj and down_proj (NemotronHMLP); the experts are 3-D parameters,
                      # not nn.Linear modules, which bitsandbytes does not convert nor peft's all-linear adapt
                      traits=Traits(fc_modules=("up_proj", "down_proj"), experts_are_linears=False,
                                    peft_refused_targets=("out_proj", "conv1d"),
                                    unadaptable_modules=(("experts", "NemotronHExperts"), ("gate", "NemotronHTopkRouter"))
                                    if moe_layers else ()))
    # only the MLP blocks hold a dense MLP
    mlp = frozenset(dense)
    return replace(spec, traits=replace(spec.traits, norm_weight_to_fp32=True),
                   layers=tuple(replace(ls, intermediate_size=ls.intermediate_size if ls.index in mlp else 0)
                                      for ls in spec.layers))


def _moe(p: Params, cfg: Config, h: int, on: tuple[int, ...], mlp_bias: bool) -> MoESpec:
    """The "E" blocks' tensors (``NemotronHMoE``): router, plain routed experts and the shared expert."""
    e = int(get(cfg, "n_routed_experts", "num_local_experts", default=8))
    ei = int(get(cfg, "moe_intermediate_size", default=7688))
    si = int(get(cfg, "moe_shared_expert_intermediate_size", default=7688))
    p.linear("layers.mixer.gate", h, e, on, False, "replicated", role="router")
    # a buffer, counted as DeepSeek-V3's is (tests/test_catalog_transformers.py BUFFERS_COUNTED)
    p.add("layers.mixer.gate.e_score_correction_bias", e, "other", on)
    p.add("layers.mixer.experts.up_proj", ei * h, "expert", on, e, h, ei, "expert", module="experts")
    p.add("layers.mixer.experts.down_proj", h * ei, "expert", on, e, ei, h, "expert", module="experts")
    p.linear("layers.mixer.shared_experts.up_proj", h, si, on, mlp_bias, "column")
    p.linear("layers.mixer.shared_experts.down_proj", si, h, on, mlp_bias, "row")
    return MoESpec(e, int(get(cfg, "num_experts_per_tok", default=2)), ei, int(get(cfg, "n_shared_experts", default=1)),
                   si, gated=False)


NEMOTRON_H = Family(build, "modeling_nemotron_h.py",
                    required=required("hidden_size", "num_attention_heads", "vocab_size"))
