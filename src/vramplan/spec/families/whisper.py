"""Whisper (transformers 5.24 ``models/whisper/modeling_whisper.py``, ``configuration_whisper.py``), as
``WhisperForConditionalGeneration``: a speech encoder over log-mel features and a text decoder with cross-attention.

* Encoder (``WhisperEncoder``): ``conv1`` (``nn.Conv1d(num_mel_bins, d_model, kernel_size=3, padding=1)``) and
  ``conv2`` (``nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)``), each followed by a GELU, over the
  feature extractor's 3,000 frames (``max_source_positions`` x the strides 1 and 2; any other length raises a
  ValueError); ``embed_positions``, an ``nn.Embedding(max_source_positions, d_model)`` filled with sinusoids
  (``WhisperPreTrainedModel._init_weights``) and frozen (``self.embed_positions.requires_grad_(False)``): a parameter
  that full fine-tuning gives no gradient; pre-norm layers (``self_attn_layer_norm`` before the attention,
  ``final_layer_norm`` before ``fc1``/``fc2``), and a final ``layer_norm``.
* Decoder (``WhisperDecoder``): ``embed_tokens`` (vocab x d_model), learned positions ``embed_positions``
  (``WhisperPositionalEmbedding``: ``max_target_positions`` rows, no offset), pre-norm layers with self-attention,
  cross-attention ``encoder_attn`` (with ``encoder_attn_layer_norm``) and the MLP, and a final ``layer_norm``.
* Attention (``WhisperAttention``): ``k_proj`` without bias (``nn.Linear(embed_dim, embed_dim, bias=False)``),
  ``v_proj``, ``q_proj`` and ``out_proj`` with bias.
* The head ``proj_out`` (``nn.Linear(d_model, vocab_size, bias=False)``) is tied to ``model.decoder.embed_tokens``
  (``_tied_weights_keys``) while ``tie_word_embeddings`` (default True); untied, a tensor of its own.

``WhisperConfig`` defaults (whisper-tiny's shape): 4 + 4 layers, 6 heads, d_model 384, FFN 1536, 80 mel bins, 1,500
source and 448 target positions, GELU, no dropout.
"""

from __future__ import annotations

from vramplan.spec.families.bart import bart_layers, heads_divide
from vramplan.spec.families.base import Config, Family, Params, build_spec, prob
from vramplan.spec.families.t5 import positive_sizes
from vramplan.spec.model import AudioSpec, EncoderDecoderSpec, ModelSpec, Traits

__all__ = ["WHISPER"]

# WhisperAttention's projections q/k/v_proj and out_proj; the MLP is fc1/fc2; each stack drops the embeddings' sum
# (``nn.functional.dropout(hidden_states, p=self.dropout)``, WhisperEncoder.forward / WhisperDecoder.forward)
TRAITS = Traits(out_proj_module="out_proj", fc_modules=("fc1", "fc2"), embedding_dropout=True)
SOURCE = "transformers 5.24 models/whisper/modeling_whisper.py WhisperForConditionalGeneration"
_POSITIVE = ("encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
             "encoder_ffn_dim", "decoder_ffn_dim", "max_source_positions", "max_target_positions", "num_mel_bins")
# WhisperConfig's defaults (configuration_whisper.py, whisper-tiny's shape)
_DEFAULTS = {"encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
             "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "max_source_positions": 1500,
             "max_target_positions": 448, "num_mel_bins": 80, "d_model": 384, "vocab_size": 51865}
# the encoder's convolutions: kernel 3, strides 1 and 2 (WhisperEncoder.__init__)
_KERNEL = 3
_STRIDES = (1, 2)
FROZEN = ("model.encoder.embed_positions.weight",)


def _layers(p: Params, stack: str, d: int, ffn: int, layers: tuple[int, ...], cross: bool) -> None:
    """One stack's layers (BART's, ``k_proj`` without a bias: WhisperAttention) and the stack's final LayerNorm."""
    bart_layers(p, stack, d, ffn, layers, cross, k_bias=False)
    p.norm(f"model.{stack}.layer_norm", d, (), True)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    c = {**_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    positive_sizes(c, "d_model", "vocab_size", *_POSITIVE)
    d, vocab, mels = int(c["d_model"]), int(c["vocab_size"]), int(c["num_mel_bins"])
    src, tgt = int(c["max_source_positions"]), int(c["max_target_positions"])
    n_enc, n_dec = int(c["encoder_layers"]), int(c["decoder_layers"])
    h_enc, h_dec = int(c["encoder_attention_heads"]), int(c["decoder_attention_heads"])
    heads_divide(d, h_enc, h_dec)
    tied = bool(c.get("tie_word_embeddings", True))
    p = Params()
    p.add("model.encoder.conv1.weight", d * mels * _KERNEL, "other")
    p.add("model.encoder.conv1.bias", d, "bias")
    p.add("model.encoder.conv2.weight", d * d * _KERNEL, "other")
    p.add("model.encoder.conv2.bias", d, "bias")
    p.add("model.encoder.embed_positions.weight", src * d, "position")
    _layers(p, "encoder", d, int(c["encoder_ffn_dim"]), tuple(range(n_enc)), False)
    p.add("model.decoder.embed_tokens.weight", vocab * d, "embedding", tp="vocab")
    p.add("model.decoder.embed_positions.weight", tgt * d, "position")
    _layers(p, "decoder", d, int(c["decoder_ffn_dim"]), tuple(range(n_dec)), True)
    if not tied:
        p.lm_head("proj_out", vocab, d)
    audio = AudioSpec(mel_bins=mels, input_frames=src * _STRIDES[0] * _STRIDES[1], conv_strides=_STRIDES)
    notes = ((f"the encoder takes {mels} x {audio.input_frames:,} log-mel features per sample (30 s of audio, padded "
              f"or cut by WhisperFeatureExtractor) and runs over {src:,} positions after its stride-2 convolution"),)
    act, drop = str(c.get("activation_function", "gelu")), prob(c, "dropout", 0.0)
    common = {"vocab_size": vocab, "hidden_act": act, "position": "learned", "tie_word_embeddings": tied,
              "attention_dropout": prob(c, "attention_dropout"), "hidden_dropout": drop, "traits": TRAITS}
    encoder = build_spec(cfg, f"{name} encoder", model_type, Params(), hidden_size=d, num_layers=n_enc,
                         num_attention_heads=h_enc, num_kv_heads=h_enc, intermediate_size=int(c["encoder_ffn_dim"]),
                         encoder_only=True, max_position_embeddings=src, **common)  # type: ignore[arg-type]
    ed = EncoderDecoderSpec(encoder=encoder, encoder_prefix="model.encoder.", decoder_prefix="model.decoder.",
                            cross_attention_heads=h_dec, source=SOURCE, notes=notes, audio=audio, frozen_params=FROZEN)
    return build_spec(cfg, name, model_type, p, hidden_size=d, num_layers=n_dec, num_attention_heads=h_dec,
                      num_kv_heads=h_dec, intermediate_size=int(c["decoder_ffn_dim"]), notes=notes,
                      max_position_embeddings=tgt, encoder_decoder=ed, **common)  # type: ignore[arg-type]


WHISPER = Family(build, "modeling_whisper.py", ())
