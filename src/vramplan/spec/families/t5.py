"""T5, mT5 and UMT5 (transformers 5.24 ``models/t5/modeling_t5.py``, ``models/mt5/modeling_mt5.py``,
``models/umt5/modeling_umt5.py``), as ``T5ForConditionalGeneration``: an encoder stack and a decoder stack sharing
one embedding (``shared``), each block a pre-norm residual of sublayers (``layer.0`` self-attention, the decoder's
``layer.1`` cross-attention ``EncDecAttention``, then the feed-forward ``DenseReluDense``), RMS norms without bias
(``T5LayerNorm``), bias-free linears, and a final norm per stack.

* Feed-forward (``T5Config.__post_init__``): ``feed_forward_proj`` "relu" (T5 v1.0) is ``T5DenseActDense``
  (``wi``, ``wo``); "gated-gelu" (T5 v1.1, Flan-T5, mT5, UMT5) is ``T5DenseGatedActDense`` (``wi_0``, ``wi_1``,
  ``wo``) with ``gelu_new``.
* Positions: a relative position bias, an ``nn.Embedding(relative_attention_num_buckets, num_heads)`` in the
  self-attention of the first block of each stack only (``T5Stack``: ``has_relative_attention_bias=bool(i == 0)``;
  mT5 the same); UMT5 holds one in every self-attention layer (``UMT5LayerSelfAttention``:
  ``has_relative_attention_bias=True``).  Cross-attention holds none.
* Attention width: ``num_heads x d_kv``, which may differ from ``d_model`` (t5-11b: 128 x 128 against 1,024).
* The LM head: 5.24's configuration classes force ``tie_word_embeddings = True`` (``T5Config.__post_init__``: "we
  tie weights always"; ``MT5Config``, ``UMT5Config`` alike), so ``lm_head.weight`` is ``shared.weight``
  (``_tied_weights_keys``) even for a v1.1 checkpoint whose config says ``tie_word_embeddings: false``; that
  checkpoint's separate ``lm_head`` tensor is then not held apart (stated in the spec's notes), and the decoder's
  output is not rescaled by ``d_model ** -0.5`` (``scale_decoder_outputs``).
* transformers 4.x keeps the key as given (``T5Config.__init__``, 4.30.2 to 4.57.1): with
  ``tie_word_embeddings: false`` ``T5ForConditionalGeneration`` holds ``lm_head`` apart from ``shared`` and projects
  the decoder output as it is (``if self.config.tie_word_embeddings: sequence_output = sequence_output *
  (self.model_dim**-0.5)``, modeling_t5.py 4.46.3 l.1915-1918; modeling_mt5.py, modeling_umt5.py alike):
  ``untied_head`` gives that model, a separate ``lm_head.weight`` of vocab x d_model (its gradient and optimizer
  states follow from the parameter row), for a scenario on a 4.x release (catalog/resolve.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob, required
from vramplan.spec.model import EncoderDecoderSpec, ModelSpec, Traits

__all__ = ["MAX_SIZE", "MT5", "T5", "UMT5", "positive_sizes", "untied_head"]

# T5Attention's projections are q, k, v, o (the names PEFT's target_modules match: "q", "v"); T5DenseActDense's
# are wi and wo; T5Stack drops the embeddings' output (``self.dropout(inputs_embeds)``, dropout_rate)
TRAITS = Traits(qkv_modules=("q", "k", "v"), out_proj_module="o", fc_modules=("wi", "wo"), embedding_dropout=True)
SOURCE = "transformers 5.24 models/t5/modeling_t5.py T5ForConditionalGeneration"


# spec/hf_config.py MAX_SIZE (the shared keys' bound), for the sizes under this family's own spellings
MAX_SIZE = 1 << 20


def positive_sizes(cfg: Config, *keys: str) -> None:
    """Each of ``keys`` the config holds is a positive integer no larger than ``MAX_SIZE`` (a config.json is untrusted
    input; ``model_from_config`` turns the ValueError into the user's problem)."""
    bad = [k for k in keys if k in cfg and (not isinstance(cfg[k], int) or isinstance(cfg[k], bool)
                                            or not 0 < cfg[k] <= MAX_SIZE)]
    if bad:
        raise ValueError(f"{', '.join(bad)} must be positive integers of at most {MAX_SIZE:,}")


def feed_forward(cfg: Config, model_type: str) -> tuple[bool, str]:
    """(gated, activation) from ``feed_forward_proj`` as ``T5Config.__post_init__`` reads it (default "relu";
    ``MT5Config`` and ``UMT5Config`` default to "gated-gelu")."""
    proj = str(cfg.get("feed_forward_proj", "relu" if model_type == "t5" else "gated-gelu"))
    parts = proj.split("-")
    if (len(parts) > 1 and parts[0] != "gated") or len(parts) > 2:
        # T5Config.validate_architecture
        raise ValueError(f"feed_forward_proj {proj!r} is not 'gated-{{ACT_FN}}' or '{{ACT_FN}}'")
    return parts[0] == "gated", "gelu_new" if proj == "gated-gelu" else parts[-1]


def _block(p: Params, stack: str, d: int, inner: int, ff: int, gated: bool, layers: tuple[int, ...],
           cross: bool) -> None:
    """One stack's blocks: ``{stack}.block.layer.{0,1[,2]}...`` with the block index dropped."""
    for sub, attn in ((0, "SelfAttention"), (1, "EncDecAttention")) if cross else ((0, "SelfAttention"),):
        for m in ("q", "k", "v"):
            p.linear(f"{stack}.block.layer.{sub}.{attn}.{m}", d, inner, layers, False, "column")
        p.linear(f"{stack}.block.layer.{sub}.{attn}.o", inner, d, layers, False, "row")
        p.norm(f"{stack}.block.layer.{sub}.layer_norm", d, layers, False)
    ffn = f"{stack}.block.layer.{2 if cross else 1}"
    for m in ("wi_0", "wi_1") if gated else ("wi",):
        p.linear(f"{ffn}.DenseReluDense.{m}", d, ff, layers, False, "column")
    p.linear(f"{ffn}.DenseReluDense.wo", ff, d, layers, False, "row")
    p.norm(f"{ffn}.layer_norm", d, layers, False)
    p.norm(f"{stack}.final_layer_norm", d, (), False)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    positive_sizes(cfg, "d_model", "num_layers", "num_heads", "d_ff", "d_kv", "num_decoder_layers",
                   "relative_attention_num_buckets")
    d, heads, ff = int(cfg["d_model"]), int(cfg["num_heads"]), int(cfg["d_ff"])
    n_enc, vocab = int(cfg["num_layers"]), int(cfg["vocab_size"])
    n_dec = int(cfg.get("num_decoder_layers") or n_enc)  # T5Config.__post_init__: "default = symmetry"
    head_dim = int(cfg.get("d_kv", 64))
    inner, buckets = heads * head_dim, int(cfg.get("relative_attention_num_buckets", 32))
    gated, act = feed_forward(cfg, model_type)
    every = model_type == "umt5"
    drop = prob(cfg, "dropout_rate", 0.1)
    p = Params()
    p.add("shared.weight", vocab * d, "embedding", tp="vocab")
    for stack, n, cross in (("encoder", n_enc, False), ("decoder", n_dec, True)):
        layers = tuple(range(n))
        _block(p, stack, d, inner, ff, gated, layers, cross)
        # the bias table: the first block's self-attention (T5, mT5) or every one (UMT5); listed after the block's
        # rows (a count, not an order, is what the meta-device test checks)
        bias_layers = layers if every else (0,)
        p.add(f"{stack}.block.layer.0.SelfAttention.relative_attention_bias.weight", buckets * heads, "position",
              bias_layers)
    notes: list[str] = []
    if _untied_in_4x(cfg, model_type):
        notes.append(f"the checkpoint's config gives tie_word_embeddings: false (mT5: also when it names none, "
                     f"MT5Config's 4.x default; a separate lm_head of {vocab:,} x "
                     f"{d:,}); transformers 5.24's {type_name(model_type)}.__post_init__ forces tie_word_embeddings = "
                     "True, so lm_head.weight is shared.weight and one tensor is held")
    common = {"num_attention_heads": heads, "num_kv_heads": heads, "head_dim": head_dim, "vocab_size": vocab,
                  "hidden_act": act, "mlp_gated": gated, "norm": "rms", "position": "relative", "tie_word_embeddings": True,
                  "attention_dropout": drop, "hidden_dropout": drop, "max_position_embeddings": int(cfg.get("n_positions", 512)),
                  "traits": TRAITS}
    encoder = build_spec(cfg, f"{name} encoder", model_type, Params(), hidden_size=d, num_layers=n_enc,
                         intermediate_size=ff, encoder_only=True, **common)  # type: ignore[arg-type]
    ed = EncoderDecoderSpec(encoder=encoder, encoder_prefix="encoder.", decoder_prefix="decoder.",
                            cross_attention_heads=heads, relative_bias_layers="every" if every else "first",
                            relative_attention_num_buckets=buckets, source=SOURCE, notes=tuple(notes),
                            config_untied_head=_untied_in_4x(cfg, model_type))
    return build_spec(cfg, name, model_type, p, hidden_size=d, num_layers=n_dec, intermediate_size=ff,
                      notes=tuple(notes), encoder_decoder=ed, **common)  # type: ignore[arg-type]


def _untied_in_4x(cfg: Mapping[str, Any], model_type: str) -> bool:
    """Whether transformers 4.x builds a separate ``lm_head``: the config's ``tie_word_embeddings``, or when it has
    none the 4.x configuration class's default: False for ``MT5Config`` (configuration_mt5.py 4.46.3 and 4.57.1
    l.100), True for ``T5Config`` and ``UMT5Config``."""
    return not cfg.get("tie_word_embeddings", model_type != "mt5")


def untied_head(m: ModelSpec, transformers_version: tuple[int, ...] | None) -> ModelSpec:
    """``m`` as ``transformers_version`` builds it: on a 4.x release a config saying ``tie_word_embeddings: false``
    (``EncoderDecoderSpec.config_untied_head``) gives a separate ``lm_head`` (module docstring), so the spec holds its
    parameter row and ``tie_word_embeddings`` False; otherwise ``m`` itself (5.x ties the head)."""
    ed = m.encoder_decoder
    if ed is None or not ed.config_untied_head or transformers_version is None or transformers_version >= (5, 0):
        return m
    p = Params()
    p.lm_head("lm_head", m.vocab_size, m.hidden_size)
    note = (f"the checkpoint's config gives tie_word_embeddings: false (mT5: also when it names none, MT5Config's "
            f"4.x default), which transformers 4.x's {type_name(m.model_type)} "
            f"keeps: a separate lm_head of {m.vocab_size:,} x {m.hidden_size:,} (its own gradient and optimizer states), "
            "and the decoder output projected without the d_model ** -0.5 rescale")
    untied = tuple(n for n in m.notes if "tie_word_embeddings: false" not in n) + (note,)
    return replace(m, params=m.params + tuple(p.rows), tie_word_embeddings=False, notes=untied,
                   encoder_decoder=replace(ed, notes=tuple(n for n in ed.notes if "tie_word_embeddings: false"
                                                           not in n) + (note,)))


def type_name(model_type: str) -> str:
    """The configuration class that forces the tie."""
    return {"mt5": "MT5Config", "umt5": "UMT5Config"}.get(model_type, "T5Config")


_REQUIRED = required("d_model", "num_layers", "num_heads", "d_ff", "vocab_size")
T5 = Family(build, "modeling_t5.py", _REQUIRED)
MT5 = Family(build, "modeling_mt5.py", _REQUIRED)
UMT5 = Family(build, "modeling_umt5.py", _REQUIRED)
