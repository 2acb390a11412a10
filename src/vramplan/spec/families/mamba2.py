"""Mamba2 (``mamba2``): a stack of Mamba2 mixers without attention or MLP (transformers ``modeling_mamba2.py``, 5.24).

``Mamba2Model`` holds ``embeddings``, ``num_hidden_layers`` blocks (``Mamba2Block``: one ``Mamba2RMSNorm`` ``norm`` and
one ``Mamba2Mixer`` ``mixer``) and ``norm_f``; ``Mamba2ForCausalLM`` adds ``lm_head``, tied to ``backbone.embeddings``
when ``tie_word_embeddings`` (``_tied_weights_keys``).  ``Mamba2Mixer`` is Bamba's mixer (``BambaMixer`` says it is
Mamba2's with the hybrid cache; its ``__init__`` and ``forward`` hold the same tensors and calls, 5.24): ``in_proj``
(hidden -> intermediate + conv_dim + num_heads, bias ``use_bias``), the depthwise ``conv1d`` over ``conv_dim =
intermediate + 2 n_groups state_size`` channels (bias ``use_conv_bias``), ``dt_bias``, ``A_log``, the gated
``norm`` over ``n_groups`` groups, ``D`` and ``out_proj``, with ``intermediate = expand x hidden_size``
(``Mamba2Config.validate_architecture`` requires ``num_heads x head_dim`` to equal it).

``Mamba2Block.forward`` casts the residual to fp32 when ``residual_in_fp32`` (``Traits.residual_in_fp32``).

``configuration_mamba2.py`` defaults (Mamba-Codestral-7B's shape): num_heads 128, head_dim 64, vocab 32768, hidden
4096, state_size 128, 64 layers, expand 2, conv_kernel 4, n_groups 8, use_bias False, use_conv_bias True,
residual_in_fp32 True, chunk_size 256, tie_word_embeddings False.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.spec.families.bamba import mixer
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, required
from vramplan.spec.model import MambaSpec, ModelSpec

# Mamba2Config (and MambaConfig) has no max_position_embeddings: the model has no position embeddings and no context
# limit of its own; ModelSpec's field is set to this bound (vramplan's largest size, spec/hf_config.py MAX_SIZE).  No
# memory term reads it; the longest-prompt searches stop there (plan/solvers.py: "longest prompt" answers at most
# 2^20 tokens) and serving, which takes its default length from it, is refused (spec/checks.py)
MAX_POSITIONS = 1 << 20


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    n_heads, head_dim = int(get(cfg, "num_heads", default=128)), int(get(cfg, "head_dim", default=64))
    inter = int(get(cfg, "expand", default=2)) * h
    if n_heads * head_dim != inter:
        # Mamba2Config.validate_architecture: "Inconsistent configuration: hidden_size * expand ..."
        raise ValueError(f"a mamba2 config needs num_heads x head_dim ({n_heads} x {head_dim}) = expand x hidden_size "
                         f"({inter}), as transformers' Mamba2Config checks")
    layers = tuple(range(n_layers))
    ms = MambaSpec(layers=layers, n_heads=n_heads, head_dim=head_dim, n_groups=int(get(cfg, "n_groups", default=8)),
                   state_size=int(get(cfg, "state_size", default=128)),
                   conv_kernel=int(get(cfg, "conv_kernel", default=4)), intermediate_size=inter,
                   chunk_size=int(get(cfg, "chunk_size", default=256)))
    p = Params()
    p.add("embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.norm", h, layers, False)
    mixer(p, ms, h, bool(get(cfg, "use_conv_bias", default=True)), bool(get(cfg, "use_bias", default=False)),
          prefix="layers.mixer")
    p.norm("norm_f", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
                      num_kv_heads=n_heads, head_dim=head_dim, vocab_size=vocab, intermediate_size=0,
                      hidden_act=str(cfg.get("hidden_act", "silu")), mlp_gated=False, norm="rms", position="none",
                      tie_word_embeddings=tied, attention_dropout=0.0, hidden_dropout=0.0,
                      max_position_embeddings=MAX_POSITIONS, mamba=ms)
    # peft 0.21 tuners_utils.py _check_lora_target_modules_mamba: out_proj and conv1d of mamba, mamba2 and falcon_mamba
    return replace(spec, traits=replace(spec.traits, residual_in_fp32=bool(get(cfg, "residual_in_fp32", default=True)),
                                        peft_refused_targets=("out_proj", "conv1d")))


MAMBA2 = Family(build, "modeling_mamba2.py", required=required("hidden_size", "num_hidden_layers", "vocab_size"))
