"""Hugging Face ``generate`` of an encoder-decoder model (T5, mT5, UMT5, BART; ``ModelSpec.encoder_decoder``), as
transformers 5.24 runs it under SDPA: ``generation/utils.py``, ``cache_utils.py``, ``models/t5/modeling_t5.py``,
``models/bart/modeling_bart.py``, ``integrations/sdpa_attention.py``.

b sequences of S source tokens (``inference.prompt_len``), n new tokens (``inference.new_tokens``), h = d_model,
q = the attention width (heads x head_dim: T5's ``num_heads x d_kv``, BART's d_model), I the MLP width, c the bytes
of the dtype, D decoder layers.

* **Encoder** (``GenerationMixin._prepare_text_encoder_decoder_kwargs_for_generation``: ``encoder(**encoder_kwargs)``
  once, before any decoder step, under no grad).  The stack keeps its embedding output bound to ``inputs_embeds``
  for the whole loop (BART also its learned positions, ``embed_pos``, [b, S, h]: ``BartEncoder.forward``); T5 keeps
  the first layer's relative position bias (``position_bias``, the ``relative_attention_bias`` lookup [S, S, heads]
  in the dtype, shared by every layer: ``T5Stack.forward``).  The running layer, per source token:

  - BART (post-norm ``BartEncoderLayer``): at ``out_proj`` the layer input, q, k, v, the attention output and
    ``out_proj``'s output (2h + 4q); the MLP: the layer input (still bound in ``BartEncoder.forward``'s loop), the
    normalised residual, ``fc1``'s output and the activation's (2h + 2I), then the layer input, the residual, the
    activation's output and ``fc2``'s (3h + I).
  - T5 (pre-norm ``T5Block``): the layer input (from the second layer on; the first layer's input is
    ``inputs_embeds`` itself, the dropout of an eval model returning its input), the normalised input, q, k and v
    (``T5Attention.forward`` keeps them to its end) and the attention output (2h + 4q), with, at the SDPA call, the
    position bias made contiguous as the additive mask (``create_position_bias_mask``: ``position_bias_mask.
    contiguous()`` of the permuted lookup, heads x S^2 x c; CUDA's memory-efficient kernel pads it to rows of a
    multiple of 8 keys when S is not one, a second copy); then ``o``'s output (3h + 4q).  The MLP
    (``T5LayerFF``): the block's input, the attention sublayer's sum (the MLP's input) and its normalised copy, then
    ``wi``'s output and the ReLU's (3h + 2I), or for the gated ``T5DenseGatedActDense`` the GELU's output, ``wi_1``'s
    and their product (3h + 3I; ``gelu_new`` as a chain of elementwise ops holds ``wi_0``'s output and three I-wide
    temporaries at once: 3h + 4I), and at ``wo`` (4h + I).
  - T5's first layer computes the bias (``T5Attention.compute_bias``): over the S^2 query-key pairs the int64
    ``relative_position`` (held by the caller), and in ``_relative_position_bucket`` the int64 ``relative_buckets``,
    ``torch.abs``'s int64 copy and the bool ``is_small`` (25 B per pair), while the large-distance bucket is made:
    its int64 value, ``torch.full_like``'s int64 and ``torch.min``'s int64 output (24 B): 49 B per pair at once,
    with ``compute_bias``'s int64 ``context_position`` and ``memory_position`` (16 B per source token).

* **Encoder output**: ``model_kwargs["encoder_outputs"]`` holds the last hidden state (b S h c) for the whole call.
* **Caches** (``GenerationMixin._prepare_cache_for_generation``: ``EncoderDecoderCache(DynamicCache(...),
  DynamicCache(...))``): the decoder's self-attention keys and values grow by ``torch.cat`` one token per step
  (``DynamicLayer.update``), ending at n tokens (the decoder starts from ``decoder_start_token_id``; the last new
  token is not fed back): D x 2 x b x n x q x c; the cross-attention keys and values of the encoder output are
  written once, at the first decoder step (``T5Attention.forward`` / ``BartAttention.forward``: ``curr_cache.
  update`` then ``is_updated[layer_idx] = True``), and read by every later step: D x 2 x b x S x q x c.  Writing
  them copies the k and v projections into the cache (``torch.cat`` onto an empty layer), so the last decoder
  layer of the first step holds its projections beside their copies (2 b S q c more).
* **Logits**: the last position's (``logits_bytes``: the head's output, its fp32 copy, the sampling warpers);
  BART adds ``final_logits_bias`` into a new tensor (b V c more).

Whisper (``EncoderDecoderSpec.audio``; ``models/whisper/modeling_whisper.py``, ``generation_whisper.py``): the
source is the caller's ``input_features``, b x mel_bins x F log-mel frames in the dtype (F = 3,000: 30 s of audio,
the only length ``WhisperEncoder.forward`` takes), held by the caller for the whole call, and generate's copy of them
(``WhisperGenerationMixin._get_input_segment``: ``torch.cat`` of each sequence's 3,000-frame slice, the segment the
loop decodes, held to the call's end): 2 b mel_bins F c (``ENCODER_INPUT``); the encoder runs over S = F / 2
positions (``max_source_positions``), so ``inference.prompt_len`` is not read.

* **Front end** (``WhisperEncoder.forward``: ``inputs_embeds = gelu(conv1(input_features))`` then
  ``gelu(conv2(inputs_embeds))``): while the first GELU runs, conv1's output and the GELU's (2 x b F h c); while
  the second runs, the first GELU's output (still bound to ``inputs_embeds``), conv2's output and the GELU's
  (b F h c + 2 b S h c): 4 b S h c either way.  The convolutions' cuDNN workspace is not modelled (stated).
* **Kept through the layers**: ``inputs_embeds`` (b S h c) and ``all_positions`` (int64, S); the positions' lookup
  [S, h] is added and freed before the first layer.
* **Running layer** (pre-norm ``WhisperEncoderLayer``, per source token): the layer input (the caller's
  ``hidden_states``), the normalised input, q, k, v (each a contiguous copy, bound to the attention's end), SDPA's
  output and its transposed contiguous copy (``sdpa_attention_forward``): 2h + 5q; at ``out_proj``: 3h + 4q; in the
  MLP, the layer input, the attention sublayer's sum (the MLP's residual), its normalised copy, ``fc1``'s output and
  the GELU's: 3h + 2I; at ``fc2``: 3h + I.
* **Decoder step**: ``inputs_embeds`` (the token embedding) and ``positions`` (``WhisperDecoder.forward`` always
  builds ``position_ids``, so ``WhisperPositionalEmbedding.forward`` indexes the table: a copy, [b, 1, h]), both kept
  through the loop, the layer input, the self-attention sublayer's sum, its normalised copy and the
  cross-attention's query: 5h + q per sequence.  No ``final_logits_bias``.
* The decoder starts from ``decoder_start_token_id`` alone, as ``WhisperGenerationMixin.generate`` builds its
  ``init_tokens`` for a generation config without language and task tables (a model made from its config); a
  checkpoint's generation_config.json forcing language, task and no-timestamps tokens starts from up to 4 tokens
  (stated).
"""

from __future__ import annotations

from vramplan.analytic.attention import mem_efficient_mask_row
from vramplan.analytic.inference import (
    PACKED_NOTE,
    GenerateCall,
    InferenceResult,
    beam_logits_bytes,
    beam_note,
    beam_terms,
    cache_bytes,
    cache_growth_bytes,
    logits_bytes,
    weights_term,
)
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.errors import Problem, ScenarioError
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec

__all__ = ["BUCKET_BYTES_PER_PAIR", "bucket_bytes", "cross_cache_bytes", "decoder_step_bytes",
           "encoder_decoder_cache_note", "encoder_decoder_step", "encoder_kept_bytes", "encoder_layer_bytes"]

# T5's ``_relative_position_bucket`` at its largest: the caller's int64 relative_position, relative_buckets,
# torch.abs's copy (8 each), is_small (1), and the large-distance bucket, full_like's and torch.min's (8 each)
BUCKET_BYTES_PER_PAIR = 49


def _relative(m: ModelSpec) -> bool:
    ed = m.encoder_decoder
    return ed is not None and ed.relative_bias_layers != "none"


def encoder_kept_bytes(m: ModelSpec, b: int, s: int, c: int) -> int:
    """What the encoder stack keeps through its layers: ``inputs_embeds`` (b S h c), BART's positions (b S h c),
    T5's position bias (heads x S^2 x c), Whisper's int64 ``all_positions`` (8 S)."""
    ed = m.encoder_decoder
    assert ed is not None
    embeds = b * s * m.hidden_size * c
    if ed.audio is not None:
        return embeds + 8 * s
    if _relative(m):
        return embeds + ed.encoder.num_attention_heads * s * s * c
    return 2 * embeds


def _mlp_width(enc: ModelSpec) -> int:
    """The encoder MLP's I-wide tensors alive at once (module docstring)."""
    if not enc.mlp_gated:
        return 2
    return 4 if enc.hidden_act == "gelu_new" else 3


def encoder_layer_bytes(m: ModelSpec, b: int, s: int, c: int) -> int:
    """The largest encoder layer's live tensors over the b x S source tokens, beyond the kept embeddings (module
    docstring; T5's bias buckets are ``bucket_bytes``)."""
    ed = m.encoder_decoder
    assert ed is not None
    enc, t = ed.encoder, b * s
    h, i = m.hidden_size, enc.intermediate_size
    q = enc.num_attention_heads * enc.head_dim
    if ed.audio is not None:
        # pre-norm WhisperEncoderLayer (module docstring)
        return t * c * max(2 * h + 5 * q, 3 * h + 4 * q, 3 * h + 2 * i, 3 * h + i)
    if not _relative(m):
        return t * c * max(2 * h + 4 * q, 2 * h + 2 * i, 3 * h + i)
    # from the second layer on the layer input is a tensor of its own (the first layer's is inputs_embeds)
    own_input = h if enc.num_layers > 1 else 0
    mask = enc.num_attention_heads * s * s * c
    if s % 8:
        # CUDA's memory-efficient kernel takes the float mask padded to rows of a multiple of 8 keys (a padded copy:
        # aten preprocess_mask, analytic/attention.py mem_efficient_mask_row)
        mask += enc.num_attention_heads * s * mem_efficient_mask_row(s) * c
    at_sdpa = (own_input + h + 4 * q) * t * c + mask
    at_o = (own_input + 2 * h + 4 * q) * t * c
    mlp = (own_input + 2 * h + _mlp_width(enc) * i) * t * c
    at_wo = (own_input + 3 * h + i) * t * c
    return max(at_sdpa, at_o, mlp, at_wo)


def bucket_bytes(m: ModelSpec, b: int, s: int, c: int) -> int:
    """T5's first encoder layer building its bias (0 for BART): the buckets' temporaries (``BUCKET_BYTES_PER_PAIR``
    per query-key pair) beside the layer's normalised input, q, k and v (``T5Attention.forward`` projects before it
    computes the bias)."""
    ed = m.encoder_decoder
    if ed is None or not _relative(m):
        return 0
    q = ed.encoder.num_attention_heads * ed.encoder.head_dim
    # compute_bias holds context_position [S, 1] and memory_position [1, S] (int64) while the buckets are made
    return s * s * BUCKET_BYTES_PER_PAIR + 16 * s + (m.hidden_size + 3 * q) * b * s * c


def cross_cache_bytes(m: ModelSpec, b: int, s: int, c: int) -> int:
    """The decoder layers' cross-attention keys and values of the encoder output: D x 2 x b x S x q x c."""
    ed = m.encoder_decoder
    assert ed is not None
    return m.num_layers * 2 * b * s * ed.cross_attention_heads * m.head_dim * c


def decoder_step_bytes(m: ModelSpec, b: int, s: int, c: int) -> int:
    """The decoder's own tensors while a one-token step's last layer writes its cross-attention cache: the kept
    embeddings, the layer input, the self-attention sublayer's output and the cross-attention's query, with T5's
    normalised input (4h + q per sequence) and the bias tensors it keeps through the stack (the cross-attention's
    zero bias [1, heads, 1, S] and the self-attention's [1, heads, 1, 1]: ``T5Attention.forward``), or BART's
    post-norm hidden states (3h + q) and its position embedding's row (h, batch 1)."""
    ed = m.encoder_decoder
    assert ed is not None
    h, q = m.hidden_size, ed.cross_attention_heads * m.head_dim
    if ed.audio is not None:
        # Whisper's pre-norm decoder layer and its kept embeddings and positions (module docstring)
        return b * (5 * h + q) * c
    if _relative(m):
        return b * (4 * h + q) * c + ed.cross_attention_heads * (s + 1) * c
    return b * (3 * h + q) * c + h * c


def encoder_decoder_cache_note(m: ModelSpec, c: int) -> str | None:
    """What a per-token KV table (the decoder's self-attention) leaves out for an encoder-decoder model: the
    cross-attention cache per source token and sequence (None for another model)."""
    if m.encoder_decoder is None:
        return None
    return (f"the table is the decoder's self-attention cache per generated token; not in it: the "
            f"{m.num_layers} decoder layers' cross-attention keys and values of the encoder output, "
            f"{cross_cache_bytes(m, 1, 1, c):,} B per source token and sequence on one GPU, and the encoder output "
            f"kept by generate, {m.hidden_size * c:,} B per source token and sequence (analytic/encoder_decoder.py)")


def audio_input_bytes(m: ModelSpec, b: int, c: int) -> int:
    """A speech encoder's ``input_features`` (b x mel_bins x frames in the dtype) and generate's segment copy of them
    (module docstring), 0 for a token encoder."""
    ed = m.encoder_decoder
    if ed is None or ed.audio is None:
        return 0
    return 2 * b * ed.audio.mel_bins * ed.audio.input_frames * c


def front_end_bytes(m: ModelSpec, b: int, c: int) -> int:
    """A speech encoder's convolutional front end at its peak (module docstring): 4 b S h c over its S positions
    (the first GELU's input and output over 2S frames, or that output beside conv2's output and its GELU's)."""
    ed = m.encoder_decoder
    if ed is None or ed.audio is None:
        return 0
    frames = ed.audio.input_frames // ed.audio.conv_strides[0]
    after = ed.audio.encoder_frames
    return b * m.hidden_size * c * max(2 * frames, frames + 2 * after)


def source_tokens(m: ModelSpec, prompt: int) -> int:
    """S: the encoder's positions, ``prompt_len`` for a token encoder, the model's own for a speech encoder."""
    ed = m.encoder_decoder
    return ed.audio.encoder_frames if ed is not None and ed.audio is not None else prompt


def _logits(m: ModelSpec, b: int, c: int) -> int:
    """``logits_bytes``, and BART's ``lm_logits + final_logits_bias`` (a new b x V tensor in the dtype)."""
    ed = m.encoder_decoder
    bias = b * m.vocab_size * c if ed is not None and ed.final_logits_bias else 0
    return logits_bytes(m, b, c, 1) + bias


def _encoder_moments(g: GenerateCall, weights: int, cublas: int) -> list[Moment]:
    """The encoder's running layer with the kept embeddings (and T5's bias), and T5's bias being built.  The encoder
    runs over the prompts before beam search repeats its output (``GenerationMixin.generate`` calls
    ``_prepare_encoder_decoder_kwargs_for_generation`` before ``_expand_inputs_for_generation``)."""
    m, b, c = g.m, g.sequences, g.c
    s = source_tokens(m, g.prompt)
    out = []
    for kept, layer in ((0, front_end_bytes(m, b, c)),
                        (encoder_kept_bytes(m, b, s, c), encoder_layer_bytes(m, b, s, c)),
                        (b * s * m.hidden_size * c, bucket_bytes(m, b, s, c))):
        if layer == 0:
            continue
        mo = Moment("encoder")
        mo.add(K.PARAMETERS, weights)
        mo.add(K.ENCODER_INPUT, audio_input_bytes(m, b, c))
        mo.add(K.ENCODER_KEPT, kept)
        mo.add(K.ENCODER_LAYER, layer)
        mo.add(K.CUBLAS, cublas)
        out.append(mo)
    return out


def _expand_moment(g: GenerateCall, weights: int, cublas: int) -> list[Moment]:
    """Beam search's ``repeat_interleave`` of the encoder output: the prompts' output and its num_beams-fold copy
    together, once (``GenerationMixin._expand_inputs_for_generation``: ``encoder_outputs`` expanded in place of the
    original, which is then freed)."""
    if g.beams == 1:
        return []
    mo = Moment("encoder")
    mo.add(K.PARAMETERS, weights)
    mo.add(K.ENCODER_INPUT, audio_input_bytes(g.m, g.sequences, g.c))
    mo.add(K.ENCODER_OUTPUT_EXPAND, (g.sequences + g.batch) * source_tokens(g.m, g.prompt) * g.m.hidden_size * g.c)
    mo.add(K.CUBLAS, cublas)
    return [mo]


def encoder_decoder_step(r: Resolved) -> InferenceResult:
    """The peak of one encoder-decoder ``generate`` call over its encoder, first decoder step and last decode step
    (module docstring)."""
    g = GenerateCall.of(r)
    if g.attention != "sdpa":
        # bf16 before sm80: SDPA runs its math kernel (analytic/attention.py bf16_math_fallback), whose scores are not
        # modelled for an encoder-decoder model
        raise ScenarioError([Problem("inference.dtype", f"{g.m.name} under SDPA runs its math kernel here "
                                     f"({r.scenario.inference.dtype} on {r.gpu.name}), whose scores are not modelled "
                                     "for an encoder-decoder model", "set inference.dtype: fp16")])
    m, b, n, c = g.m, g.batch, g.new, g.c
    s = source_tokens(m, g.prompt)
    # the caller's features and generate's copy, held for the whole call (the prompts' own: beam search repeats the
    # encoder output)
    features = audio_input_bytes(m, g.sequences, c)
    weights, _ = weights_term(g)
    cublas = cublas_workspace_bytes(g.r.gpu, handles=1)
    enc_out = b * s * m.hidden_size * c
    cross = cross_cache_bytes(m, b, s, c)
    ed = m.encoder_decoder
    assert ed is not None
    q = ed.cross_attention_heads * m.head_dim
    # the first decoder step, which writes the cross-attention cache: at its last layer's write (the k and v
    # projections beside their cached copies, with the step's own tensors), then at its logits
    logits = _logits(m, b, c) + beam_logits_bytes(g)
    beam_prefill, beam_decode = beam_terms(g, n + 1, 1)  # decoder_start_token_id, then n new tokens
    write = ((K.CROSS_KV_WRITE, 2 * b * s * q * c), (K.DECODER_STEP, decoder_step_bytes(m, b, s, c)))
    firsts = []
    for extra in (write, ((K.LAST_LOGITS, logits),)):
        mo = Moment("prefill")
        mo.add(K.PARAMETERS, weights)
        mo.add(K.ENCODER_INPUT, features)
        mo.add(K.ENCODER_OUTPUT, enc_out)
        mo.add(K.KV_CROSS_ENCODER, cross)
        mo.add(K.KV_ALL, cache_bytes(m, b, 1, c, 1, "auto", prefill=False))
        for key, nbytes in extra:
            mo.add(key, nbytes)
        mo.add(K.BEAM_STATE, beam_prefill)
        mo.add(K.CUBLAS, cublas)
        firsts.append(mo)
    moments = [*_encoder_moments(g, weights, cublas), *_expand_moment(g, weights, cublas), *firsts]
    if n >= 2:
        last = Moment("decode")
        last.add(K.PARAMETERS, weights)
        last.add(K.ENCODER_INPUT, features)
        last.add(K.ENCODER_OUTPUT, enc_out)
        last.add(K.KV_CROSS_ENCODER, cross)
        last.add(K.KV_ALL, cache_bytes(m, b, n, c, 1, "auto", prefill=False))
        last.add(K.CACHE_GROWTH, cache_growth_bytes(g, n))
        last.add(K.LAST_LOGITS, logits)
        last.add(K.BEAM_STATE, beam_decode)
        last.add(K.CUBLAS, cublas)
        moments.append(last)
    peak = max(moments, key=lambda mo: mo.total)
    notes = [
        (f"Hugging Face generate of an encoder-decoder model (transformers 5.24, {ed.source}): the encoder runs once "
        f"over the {s:,} source tokens (prompt_len) and its output stays in generate's model_kwargs; the decoder "
        f"starts from decoder_start_token_id and generates {n:,} tokens (new_tokens), its self-attention cache "
        f"ending at {n:,} tokens; the cross-attention cache holds the encoder output's keys and values in every "
        f"decoder layer ({cross:,} B), written at the first decoder step (EncoderDecoderCache)"),
        f"weights in {r.scenario.inference.dtype}; attention: sdpa",
        ("sampling with top-k/top-p warpers (greedy decoding needs about 26 B less per vocabulary entry and row); "
        "one sequence per prompt (no beam search: num_beams 1)" if g.beams == 1 else beam_note(g)),
        "prompts of equal length (no padding mask)",
        PACKED_NOTE,
    ]
    if ed.audio is not None:
        a = ed.audio
        notes[0] = notes[0].replace(f"over the {s:,} source tokens (prompt_len)", f"over the {s:,} positions of "
                                    f"{a.input_frames:,} log-mel frames (30 s of audio; prompt_len is not read)")
        notes[3] = (f"input_features of {a.mel_bins} x {a.input_frames:,} per sequence in "
                    f"{r.scenario.inference.dtype}, held by the caller for the whole call, with generate's segment copy "
                    f"(WhisperGenerationMixin._get_input_segment): {features:,} B; the "
                    "convolutions' cuDNN workspace is not counted; the decoder starts from decoder_start_token_id "
                    "alone (a generation_config.json forcing language, task and no-timestamps tokens starts from up "
                    "to 4, a few KiB more)")
    self_final = cache_bytes(m, b, n, c, 1, "auto", prefill=False)
    return InferenceResult(moments, peak, notes, cross, self_final + cross)
