"""BART (transformers 5.24 ``models/bart/modeling_bart.py``), as ``BartForConditionalGeneration``: ``model.shared``
(``BartScaledWordEmbedding``, scaled by sqrt(d_model) when ``scale_embedding``), an encoder stack and a decoder stack
each with learned positions (``BartLearnedPositionalEmbedding``: ``max_position_embeddings + 2`` rows, the ids offset
by 2) and a ``layernorm_embedding`` after the embeddings' sum, post-norm layers (``residual + sublayer`` then a
LayerNorm: ``self_attn_layer_norm``, the decoder's ``encoder_attn_layer_norm``, ``final_layer_norm``), biased
q/k/v/out projections and ``fc1``/``fc2``.

Tying (``_tied_weights_keys``, applied only while ``tie_word_embeddings``, default True, ``PreTrainedModel
.get_expanded_tied_weights_keys``): ``BartModel`` ties ``encoder.embed_tokens`` and ``decoder.embed_tokens`` to
``shared``, ``BartForConditionalGeneration`` ties ``lm_head`` to ``model.shared``; untied, each of the four is a
tensor of its own.  ``final_logits_bias`` (1 x vocab) is a buffer, not a parameter (stated in the notes).
"""

from __future__ import annotations

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob, required
from vramplan.spec.families.t5 import positive_sizes
from vramplan.spec.model import EncoderDecoderSpec, ModelSpec, Traits

__all__ = ["BART"]

# BartAttention's projections q/k/v_proj and out_proj; the MLP is fc1/fc2; each stack drops the embeddings' output
# (``nn.functional.dropout(hidden_states, p=self.dropout)`` after layernorm_embedding)
TRAITS = Traits(out_proj_module="out_proj", fc_modules=("fc1", "fc2"), embedding_dropout=True)
SOURCE = "transformers 5.24 models/bart/modeling_bart.py BartForConditionalGeneration"
_POSITIVE = ("encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
             "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")
# BartConfig's defaults (configuration_bart.py, facebook/bart-large's shape)
_DEFAULTS = {"encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
             "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "max_position_embeddings": 1024}


def _stack(p: Params, stack: str, d: int, ffn: int, max_pos: int, layers: tuple[int, ...], cross: bool,
           tied: bool, vocab: int) -> None:
    """One stack's tensors, ``model.{stack}.layers.*`` with the layer index dropped."""
    if not tied:
        p.add(f"model.{stack}.embed_tokens.weight", vocab * d, "embedding", tp="vocab")
    p.add(f"model.{stack}.embed_positions.weight", (max_pos + 2) * d, "position")
    bart_layers(p, stack, d, ffn, layers, cross)
    p.norm(f"model.{stack}.layernorm_embedding", d, (), True)


def heads_divide(d: int, *heads: int) -> None:
    """BartAttention.__init__ (and WhisperAttention's, copied from it): "embed_dim must be divisible by num_heads"."""
    for h in heads:
        if d % h:
            raise ValueError(f"d_model {d} is not divisible by {h} heads")


def bart_layers(p: Params, stack: str, d: int, ffn: int, layers: tuple[int, ...], cross: bool,
                k_bias: bool = True) -> None:
    """One stack's layers, ``model.{stack}.layers.*`` with the layer index dropped, in BartEncoderLayer's /
    BartDecoderLayer's order: self-attention (and cross-attention in the decoder), each with its LayerNorm, then
    fc1, fc2 and the final LayerNorm.  Whisper's layers are BART's (modeling_whisper.py, "Copied from
    transformers.models.bart") with ``k_proj`` built without a bias (``k_bias=False``)."""
    pre = f"model.{stack}.layers"
    sublayers = (("self_attn", "self_attn_layer_norm"), ("encoder_attn", "encoder_attn_layer_norm"))
    for attn, norm in sublayers if cross else sublayers[:1]:
        p.linear(f"{pre}.{attn}.k_proj", d, d, layers, k_bias, "column")
        p.linear(f"{pre}.{attn}.v_proj", d, d, layers, True, "column")
        p.linear(f"{pre}.{attn}.q_proj", d, d, layers, True, "column")
        p.linear(f"{pre}.{attn}.out_proj", d, d, layers, True, "row")
        p.norm(f"{pre}.{norm}", d, layers, True)
    p.linear(f"{pre}.fc1", d, ffn, layers, True, "column")
    p.linear(f"{pre}.fc2", ffn, d, layers, True, "row")
    p.norm(f"{pre}.final_layer_norm", d, layers, True)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    c = {**_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    positive_sizes(c, "d_model", *_POSITIVE)
    d, vocab, max_pos = int(c["d_model"]), int(c["vocab_size"]), int(c["max_position_embeddings"])
    n_enc, n_dec = int(c["encoder_layers"]), int(c["decoder_layers"])
    h_enc, h_dec = int(c["encoder_attention_heads"]), int(c["decoder_attention_heads"])
    heads_divide(d, h_enc, h_dec)
    tied = bool(c.get("tie_word_embeddings", True))
    p = Params()
    p.add("model.shared.weight", vocab * d, "embedding", tp="vocab")
    _stack(p, "encoder", d, int(c["encoder_ffn_dim"]), max_pos, tuple(range(n_enc)), False, tied, vocab)
    _stack(p, "decoder", d, int(c["decoder_ffn_dim"]), max_pos, tuple(range(n_dec)), True, tied, vocab)
    if not tied:
        p.lm_head("lm_head", vocab, d)
    notes = ((f"final_logits_bias, a (1, {vocab:,}) buffer added to the logits, is held beside the parameters "
             "(BartForConditionalGeneration.__init__) and not counted among them"),)
    act, drop = str(c.get("activation_function", "gelu")), prob(c, "dropout", 0.1)
    common = {"vocab_size": vocab, "hidden_act": act, "position": "learned", "tie_word_embeddings": tied,
                  "attention_dropout": prob(c, "attention_dropout"), "hidden_dropout": drop,
                  "max_position_embeddings": max_pos, "traits": TRAITS}
    encoder = build_spec(cfg, f"{name} encoder", model_type, Params(), hidden_size=d, num_layers=n_enc,
                         num_attention_heads=h_enc, num_kv_heads=h_enc, intermediate_size=int(c["encoder_ffn_dim"]),
                         encoder_only=True, **common)  # type: ignore[arg-type]
    ed = EncoderDecoderSpec(encoder=encoder, encoder_prefix="model.encoder.", decoder_prefix="model.decoder.",
                            cross_attention_heads=h_dec, source=SOURCE, notes=notes,
                            final_logits_bias=True)
    return build_spec(cfg, name, model_type, p, hidden_size=d, num_layers=n_dec, num_attention_heads=h_dec,
                      num_kv_heads=h_dec, intermediate_size=int(c["decoder_ffn_dim"]), notes=notes,
                      encoder_decoder=ed, **common)  # type: ignore[arg-type]


BART = Family(build, "modeling_bart.py", required("d_model", "vocab_size"))
