"""A training step of an encoder-decoder model (T5, mT5, UMT5, BART; ``ModelSpec.encoder_decoder``), as transformers
5.24 runs ``T5ForConditionalGeneration`` / ``BartForConditionalGeneration`` (``models/t5/modeling_t5.py``,
``models/bart/modeling_bart.py``) with the Trainer's collator making the decoder's inputs from the labels
(``data/data_collator.py`` ``DataCollatorForSeq2Seq``).

b samples of S source tokens (``train.source_len``, default ``seq_len``) and T target tokens (``train.seq_len``), h =
d_model, q = heads x head_dim, I the MLP width, D decoder layers, E encoder layers; r the residual (parameter) bytes,
c the compute bytes.  The decoder stack is the model's own layers (``ModelSpec.layers``) over the b x T target
tokens, so its self-attention and MLP, the final norm, the head and the loss are the engine's decoder terms with
seq_len = T.  What an encoder-decoder model adds:

* **The encoder stack** (``encoder_saved``), run before the decoder, its saved tensors alive from the forward to the
  encoder's backward, which runs once every decoder layer has sent its gradient back into the encoder output (the
  cross-attentions' k and v): after the first decoder layer's backward, as a vision tower's (``TIED_EMBEDDING``).
  Per layer over the b x S source tokens: ``activations.layer_tensors`` of the encoder's layer shape
  (``EncoderDecoderSpec.encoder``), with T5's feed-forward extras (``t5_mlp_extra``); per stack: the embedding
  dropout's mask, the final norm (T5) or the embedding LayerNorm (BART), the final dropout's mask.
* **The relative position bias** (T5): ``T5Attention.compute_bias`` in each stack's first layer (UMT5: in every
  self-attention, each with its own table), an ``nn.Embedding(buckets, heads)`` lookup over the S x S (T x T) pairs
  whose int64 bucket indices the embedding's backward keeps while the table is trained (8 B per pair), the bias
  [1, heads, S, S] shared by the stack's layers (``T5Stack.forward``: "the first layer stores them").  Under SDPA
  it is the additive mask (``integrations/sdpa_attention.py`` ``create_position_bias_mask``), which the
  memory-efficient kernel keeps (flash takes no mask; T5 has ``_supports_flash_attn = False``): each encoder layer
  hands the kernel a new tensor (the contiguous copy of the permuted lookup, or autocast's compute-dtype copy), and
  each decoder layer ``torch.where``'s output over its causal mask (its bool condition, T x T, kept by ``where``'s
  backward while the table is trained), or its copy; the bias itself is kept by nothing and freed when the stack
  returns.  A row of keys not a multiple of 8 is what the kernel pads and keeps (``attention.mem_efficient_mask_row``).
  Checked against the trace: one compute-dtype mask per layer, cast or not.
* **Cross-attention** in every decoder layer (``cross_tensors``): per target token its norm, q's input (an autocast
  copy when cast), q, the kernel's output and logsumexp, the residual dropout's mask; per source token the k and v
  projections of the encoder output and their inputs (one autocast copy each per layer when the encoder output is
  fp32 and the compute dtype is not; else the encoder output itself, one tensor for every layer: ``encoder_output``);
  T5's zero bias [1, heads, T, S] in the compute dtype, made by the first decoder layer and shared.
* **T5LayerNorm** (``t5_norm_extra``): ``hidden_states * torch.rsqrt(variance + eps)`` multiplies the input, not
  the fp32 copy ``pow`` keeps, so a residual stream that is not fp32 is kept as well (r x h per norm).
* **T5's feed-forward** (``t5_mlp_extra``): ``T5DenseActDense`` / ``T5DenseGatedActDense`` drop the activation
  before ``wo`` (a 1-byte mask per element of I when dropout_rate > 0) and then cast to ``wo``'s weight dtype
  (``hidden_states.to(self.wo.weight.dtype)``), so wo saves the dropout's output (or its autocast copy), not the
  activation's (ReLU: a second c x I tensor; gated: in place of the product, which nothing keeps); gated-gelu
  under autocast keeps an fp32 activation output (``NewGELUActivation``'s ``torch.pow`` is on autocast's fp32 list).
* **transformers 4.x's eager T5Attention** (T5, mT5, UMT5 before 5.0, whose ``T5PreTrainedModel`` sets no
  ``_supports_sdpa``: the default falls back to eager, ``attention.falls_back_to_eager``; modeling_t5.py 4.46.3
  ``T5Attention.forward`` l.520-563, 4.30.2 l.530-572, 4.41.2 l.524-566, 4.51.3 l.527-570, 4.57.1 l.529-572; the same in
  modeling_mt5.py / modeling_umt5.py): ``scores = torch.matmul(q, k.transpose(3, 2))`` (no scaling; saves q and
  k), ``scores += position_bias_masked`` (in place on the matmul's output: saves nothing), ``softmax(scores.float(),
  dim=-1)`` (saves its fp32 output; the ``.float()`` copy is an input it does not keep), ``.type_as(scores)`` (the
  compute-dtype copy), ``dropout`` (a 1-byte mask and its output, which ``matmul(attn_weights, v)`` keeps with v,
  in place of the cast copy), then ``o``'s input (the contiguous transpose): ``activations._eager_tensors`` per
  self-attention, the same per cross-attention over the S keys (``cross_tensors``).  The bias is not a kernel's mask:
  ``position_bias = compute_bias(...) + causal_mask`` ([b, heads, n, n]; the cross-attention's
  ``torch.zeros((1, heads, T, S)) + encoder_extended_attention_mask``, [b, heads, T, S]) is made by the stack's first
  layer, handed to the next ones through ``layer_outputs`` and kept by nothing autograd saves (``add`` and ``add_``
  save no operand): it is freed when its stack returns, before the head, and is not a term (stated).  The bucket
  indices stay (the embedding's backward).  The loss is 5.24's (``T5ForConditionalGeneration.forward`` 4.46.3
  l.1924-1926: ``CrossEntropyLoss(ignore_index=-100)`` on ``lm_logits`` as they are, no upcast).
* **The loss** (terms/loss.py, ``analytic/logits.py`` ``unshifted_no_upcast``): ``CrossEntropyLoss`` on the logits
  in their own dtype, the labels not shifted.

Whisper (``EncoderDecoderSpec.audio``, ``models/whisper/modeling_whisper.py``): the source is the batch's
``input_features`` (b x mel_bins x F log-mel frames, F = 3,000: 30 s of audio, the only length ``WhisperEncoder``
takes), in the residual dtype, and the encoder runs over S = F / 2 positions (``train.source_len`` is the model's
own; another value is refused).  The front end (``gelu(conv1(x))``, ``gelu(conv2(...))``), while its convolutions
are trained, saves conv1's input (the features, and under autocast their compute-dtype copy: c x mel_bins x F),
conv1's output (the GELU's input, c x F x h), the first GELU's output (conv2's input, c x F x h) and conv2's output
(the second GELU's input, c x S x h); the positions' sum and the dropout (0.0 in every published config) save
nothing more.  The layers are pre-norm (``activations.layer_tensors`` of the encoder's shape), followed by the
stack's final ``layer_norm``; no embedding LayerNorm.  The frozen sinusoidal positions (``embed_positions``,
``requires_grad_(False)``) take no gradient and no optimizer state (``EncoderDecoderSpec.frozen_params``).  The
features are counted as saved to the encoder's backward (the batch holds them to the step's end: a few MiB).

Not modelled, stated in the assumptions: the encoder's own backward (its layers' gradients while the decoder's are
all there: the peak is at the forward's end or at the decoder's backward for the shapes checked against the trace),
T5's fp16 clamps (``torch.clamp`` in ``T5Block.forward``: made and freed within the layer), BART's
``lm_logits + final_logits_bias`` copy of the logits (made and freed at the head).
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic import activations as act
from vramplan.analytic.attention import mem_efficient_mask_row
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, LOSS, TIED_EMBEDDING
from vramplan.spec.model import ModelSpec

__all__ = [
    "AUDIO_NOTE",
    "EAGER_T5_NOTE",
    "ENCODER_DECODER_NOTE",
    "cross_tensors",
    "encoder_decoder_notes",
    "encoder_output",
    "encoder_saved",
    "encoder_sequence",
    "encoder_tensors",
    "relative",
    "source_len",
    "source_len_note",
    "t5_mlp_extra",
    "t5_norm_extra",
    "t5_stack",
]

ENCODER_DECODER_NOTE = ("encoder-decoder training (analytic/terms/encoder_decoder.py): the encoder's saved tensors "
                        "over source_len tokens (seq_len when not set) alive to its backward, after the decoder's; "
                        "the decoder over the seq_len target tokens with self- and cross-attention; T5's relative "
                        "position bias is SDPA's mask (memory-efficient kernel); the encoder's own backward "
                        "transients are not a moment of the step")


AUDIO_NOTE = ("a speech encoder (analytic/terms/encoder_decoder.py): the batch's input_features, {mels} x {frames:,} "
              "log-mel frames per sample (30 s of audio) in the residual dtype, counted to the encoder's backward; the "
              "front end's saved convolution inputs and GELU inputs; the encoder over its {positions:,} positions "
              "(train.source_len is the model's own); its frozen sinusoidal positions take no gradient or optimizer "
              "state; the autocast copies of the convolution weights are not counted; WhisperForConditionalGeneration "
              "computes its loss as BART does (CrossEntropyLoss on lm_logits)")


EAGER_T5_NOTE = ("transformers 4.x's T5Attention is eager (analytic/terms/encoder_decoder.py): per self- and "
                 "cross-attention its fp32 softmax output, the dropout's mask and output (or the compute-dtype copy) "
                 "over the keys; the bias plus mask ([b, heads, n, n], one per stack and one for the cross-attention) "
                 "lives through its stack's forward only and is not counted")


def encoder_decoder_notes(m: ModelSpec, attention: str = "efficient") -> list[str]:
    """The assumptions an encoder-decoder model's training step adds (none for another model); ``attention``: the
    resolved kernel (eager: transformers 4.x's T5Attention)."""
    ed = m.encoder_decoder
    if ed is None:
        return []
    if attention == "eager" and relative(m):
        return [ENCODER_DECODER_NOTE.replace("is SDPA's mask (memory-efficient kernel)", "is added to eager "
                                             "attention's scores"), EAGER_T5_NOTE]
    if ed.audio is None:
        return [ENCODER_DECODER_NOTE]
    a = ed.audio
    return [ENCODER_DECODER_NOTE.replace("over source_len tokens (seq_len when not set)",
                                         f"over its {a.encoder_frames:,} positions"),
            AUDIO_NOTE.format(mels=a.mel_bins, frames=a.input_frames, positions=a.encoder_frames)]


def source_len_note(source: int | None, m: ModelSpec) -> list[str]:
    """The assumption saying ``train.source_len`` is not read, for a model without an encoder stack (docs/conventions.md,
    No silent inputs)."""
    if source is None or m.encoder_decoder is not None:
        return []
    return [(f"train.source_len is not read: {m.name} has no encoder stack (the key is an encoder-decoder model's "
             "source tokens)")]


def relative(m: ModelSpec) -> bool:
    """A relative position bias (T5, mT5, UMT5), not BART's learned positions."""
    ed = m.encoder_decoder
    return ed is not None and ed.relative_bias_layers != "none"


def source_len(c: StepContext) -> int:
    """S: ``train.source_len``, or ``seq_len`` when not given; a speech encoder's own positions."""
    ed = c.m.encoder_decoder
    if ed is not None and ed.audio is not None:
        return ed.audio.encoder_frames
    return c.s.train.source_len or c.s.train.seq_len


def front_end_saved(c: StepContext, ctx: act.ActContext) -> list[int]:
    """A speech encoder's front end, per micro-batch (module docstring): the features, their autocast copy,
    conv1's output, the first GELU's, conv2's output; the features alone while the convolutions are frozen."""
    ed = c.m.encoder_decoder
    if ed is None or ed.audio is None:
        return []
    a, b, h, cb = ed.audio, c.s.train.micro_batch_size, c.m.hidden_size, ctx.compute_bytes
    features = b * a.mel_bins * a.input_frames
    out = [ctx.residual_bytes * features]
    if c.peft is not None:
        return out  # nothing in the front end requires grad: autograd records nothing
    frames = a.input_frames // a.conv_strides[0]
    if _casts(ctx):
        out.append(cb * features)
    return out + [cb * b * frames * h, cb * b * frames * h, cb * b * a.encoder_frames * h]


def _casts(ctx: act.ActContext) -> bool:
    """Autocast makes a compute-dtype copy of an fp32 (residual-dtype) tensor for each consumer."""
    return ctx.autocast and ctx.residual_bytes != ctx.compute_bytes


def t5_stack(m: ModelSpec) -> bool:
    """``m`` (an encoder-decoder model or its encoder's shape) is a T5 stack: T5LayerNorm, wi / wo feed-forward."""
    return m.norm == "rms" and m.traits.fc_modules == ("wi", "wo")


def t5_norm_extra(m: ModelSpec, ctx: act.ActContext) -> int:
    """Per token, what a ``T5LayerNorm`` saves beyond ``activations.norm_saved_per_token``: it multiplies the input
    itself, not its fp32 copy, by the fp32 ``rsqrt`` (``hidden_states * torch.rsqrt(variance + eps)``, modeling_t5.py
    ``T5LayerNorm.forward``), so the product keeps the input beside the fp32 copy ``pow`` keeps, a second tensor
    when the residual stream is not fp32 (r x h)."""
    if not t5_stack(m) or ctx.residual_bytes == 4:
        return 0
    return ctx.residual_bytes * m.hidden_size


def t5_mlp_extra(m: ModelSpec, ctx: act.ActContext, inter: int) -> int:
    """Per token, what a T5 stack's (``m``: the model or its encoder's shape; T5's MLP is ``wi``/``wo``)
    feed-forward saves beyond ``activations.mlp_tensors`` (module docstring): the dropout mask before ``wo`` (I),
    and for ReLU, whose output ``mlp_tensors`` counts once as fc2's input too, wo's own input (c x I) when wo
    records its input (trained, or adapted)."""
    if not t5_stack(m) or not (ctx.dropout and m.hidden_dropout > 0):
        return 0
    wo_saves = not ctx.frozen_base or "wo" in ctx.lora_targets
    own_input = ctx.compute_bytes * inter if (not m.mlp_gated and m.hidden_act == "relu" and wo_saves) else 0
    # gated-gelu under autocast: NewGELUActivation's torch.pow is on autocast's fp32 list, so the activation's
    # output, which ``hidden_gelu * hidden_linear`` keeps, is fp32, not the compute dtype mlp_tensors counts
    fp32_gelu = (4 - ctx.ew) * inter if (m.mlp_gated and m.hidden_act == "gelu_new" and ctx.autocast) else 0
    return inter + own_input + fp32_gelu


def _bias_masks(ctx: act.ActContext, heads: int, n: int, layers: int, causal: bool, trained: bool) -> int:
    """The position-bias masks one stack's kernels keep over n tokens per sample (module docstring): per layer the
    mask the kernel takes, in the compute dtype, padded to a row of a multiple of 8 keys (a new tensor in every
    layer: the encoder's is the contiguous copy, or the autocast copy, of the permuted lookup,
    ``create_position_bias_mask``; the decoder's is ``torch.where``'s output, or its copy); the bias itself is kept
    by nothing (the embedding's backward needs only the bucket indices) and freed when the stack returns.  The
    decoder's ``where`` keeps its bool condition (T x T) when the bias takes a gradient (the table trained)."""
    kept = heads * n * mem_efficient_mask_row(n) * ctx.compute_bytes
    condition = n * n if (causal and trained) else 0
    return layers * (kept + condition)


def _bias_tables(m: ModelSpec, layers: int) -> int:
    """The layers of a stack that look the bias up in a table of their own (``EncoderDecoderSpec
    .relative_bias_layers``)."""
    ed = m.encoder_decoder
    return layers if ed is not None and ed.relative_bias_layers == "every" else 1


def encoder_tensors(c: StepContext) -> tuple[int, ...]:
    """The encoder stack's saved tensors over the micro-batch's source tokens, in bytes, in the forward's order:
    the embedding's, each layer's (or, with full checkpointing, each layer's input), the final norm's."""
    return c.memo("encoder_decoder_encoder", lambda: _encoder(c))


def _encoder(c: StepContext) -> tuple[int, ...]:
    m = c.m
    ed = m.encoder_decoder
    if ed is None or not c.rp.has_embedding:
        return ()
    enc = ed.encoder
    s = source_len(c)
    tokens = c.s.train.micro_batch_size * s
    ctx = replace(c.act, seq_len=s)
    r, h = ctx.residual_bytes, m.hidden_size
    drop = 1 if (ctx.dropout and m.hidden_dropout > 0) else 0
    out = [*front_end_saved(c, ctx), drop * h * tokens]  # the front end (Whisper), the embedding dropout's mask
    if not relative(m) and ed.audio is None:
        # BART: layernorm_embedding's input and statistics
        out.append(act.norm_saved_per_token(enc, ctx) * tokens)
    full = checkpoint_policy(c.s) == "full"
    layer = [t.nbytes * t.copies * tokens for t in act.layer_tensors(enc, enc.layers[0], ctx)]
    layer.append((t5_mlp_extra(enc, ctx, enc.intermediate_size) + 2 * t5_norm_extra(enc, ctx)) * tokens)
    per_layer = [r * h * tokens] if full else layer
    first = list(per_layer)
    if c.peft is not None and not full:
        # the frozen embedding's output requires no grad: the first layer's input norm (layer_tensors' first
        # record) records nothing (analytic/terms/frozen_prefix.py)
        first[0] -= act.norm_saved_per_token(enc, ctx) * tokens
    out += first + per_layer * (enc.num_layers - 1)
    if relative(m):
        heads = enc.num_attention_heads
        bias_bytes = c.pol.param_bytes if c.peft is None else c.pol.frozen_param_bytes
        # the int64 bucket indices, kept by the bias embedding's backward when the table is trained: the first
        # layer's (T5, mT5), every layer's (UMT5: a table per self-attention, modeling_umt5.py UMT5Attention)
        out.append(8 * s * s * _bias_tables(m, enc.num_layers) if c.peft is None else 0)
        if full:
            out.append(heads * s * s * bias_bytes)  # the bias, held by every checkpointed block's arguments
        elif ctx.attention != "eager":  # (eager: the bias is added to the scores, kept by nothing)
            out.append(_bias_masks(ctx, heads, s, enc.num_layers, False, c.peft is None))
        # the final norm, and the dropout after it
        out += [(act.norm_saved_per_token(enc, ctx) + t5_norm_extra(enc, ctx)) * tokens, drop * h * tokens]
    if ed.audio is not None:
        out.append(act.norm_saved_per_token(enc, ctx) * tokens)  # WhisperEncoder's final layer_norm
    return tuple(x for x in out if x) * c.in_flight


def _output_bytes(m: ModelSpec, ctx: act.ActContext) -> int:
    """The bytes per element of the encoder's last hidden state: its last norm's output, fp32 for a LayerNorm under
    autocast (``layer_norm`` is on autocast's fp32 list: BART's and Whisper's last ``LayerNorm``), the residual
    stream's dtype for ``T5LayerNorm`` (which casts back to its weight's dtype)."""
    ed = m.encoder_decoder
    assert ed is not None
    return act._norm_out_bytes(ed.encoder.norm, ctx)


def _output_casts(c: StepContext) -> int:
    """How many of a decoder layer's k and v projections of the encoder output save an autocast copy of it: each
    trained projection, or adapted one (LoRA's ``lora_A`` input), when the output is not in the compute dtype."""
    ctx = c.act
    if not ctx.autocast or _output_bytes(c.m, ctx) == ctx.compute_bytes:
        return 0
    if not ctx.frozen_base:
        return 2
    names = ("k", "v") if c.m.traits.qkv_modules == ("q", "k", "v") else ("k_proj", "v_proj")
    return sum(n in ctx.lora_targets for n in names)


def encoder_output(c: StepContext) -> tuple[int, bool]:
    """The encoder's last hidden state [b, S, h] in its last norm's dtype (``_output_bytes``), and whether the
    backward keeps it (the decoder layers' k and v save it themselves: no autocast copy, or full checkpointing, whose
    blocks hold it in their arguments); otherwise it is the model output's ``encoder_last_hidden_state``, dropped
    with the output before the backward."""
    if c.m.encoder_decoder is None or not c.rp.has_embedding:
        return 0, False
    tokens = c.s.train.micro_batch_size * source_len(c)
    out_b = _output_bytes(c.m, c.act)
    kept = checkpoint_policy(c.s) == "full" or not (c.act.autocast and out_b != c.act.compute_bytes)
    return out_b * c.m.hidden_size * tokens, kept


def cross_tensors(c: StepContext) -> tuple[act.SavedTensor, ...]:
    """What each decoder layer's cross-attention saves, in bytes (part "attention"), and T5's decoder
    self-attention bias masks and feed-forward extras (module docstring)."""
    return c.memo("encoder_decoder_cross", lambda: _cross(c))


def _cross(c: StepContext) -> tuple[act.SavedTensor, ...]:
    m, ctx = c.m, c.act
    ed = m.encoder_decoder
    if ed is None:
        return ()
    b, t, s = c.s.train.micro_batch_size, c.s.train.seq_len, source_len(c)
    cb, h = ctx.compute_bytes, m.hidden_size
    heads = ed.cross_attention_heads
    qw = heads * m.head_dim
    drop = 1 if (ctx.dropout and m.hidden_dropout > 0) else 0
    trained = not ctx.frozen_base
    # the cross-attention's norm; T5's three norms' inputs (t5_norm_extra)
    per_target = act.norm_saved_per_token(m, ctx) + 3 * t5_norm_extra(m, ctx)
    in_b = act._norm_out_bytes(m.norm, ctx)
    if trained or "q" in ctx.lora_targets or "q_proj" in ctx.lora_targets:
        per_target += cb * h if (ctx.autocast and in_b != cb) else 0
    eager = ctx.attention == "eager"
    if eager:
        # transformers 4.x's T5Attention over the S keys: q, the fp32 softmax output, the dropout's mask and output
        # (or the compute-dtype copy), o's input (activations._eager_tensors, module docstring)
        probs = [x for x in act._eager_tensors(m, ctx, heads, qw, qw, s) if x.name not in ("attention.k", "attention.v")]
        per_target += act.total_bytes(probs) + cb * qw + drop * h
    else:
        # q, the kernel's output (o's input) and fp32 logsumexp
        per_target += 2 * cb * qw + 4 * heads + drop * h
    per_source = 2 * cb * qw  # k and v, which the kernel (the two matmuls) keeps
    # k's and v's (or their adapters') autocast copies of the fp32 encoder output
    per_source += _output_casts(c) * cb * h
    out = [act.SavedTensor("cross_attention.per_target", per_target * b * t),
           act.SavedTensor("cross_attention.per_source", per_source * b * s)]
    if relative(m) and not eager:
        # the decoder's causal position-bias masks
        out.append(act.SavedTensor("self_attention.bias_mask", _bias_masks(ctx, m.num_attention_heads, t, 1, True,
                                                                            c.peft is None)))
        if s % 8:
            # the kernel's padded copy of the shared zero bias, per layer (a row of S keys, not a multiple of 8)
            out.append(act.SavedTensor("cross_attention.bias_padded", heads * t * mem_efficient_mask_row(s) * cb))
    if relative(m):
        out.append(act.SavedTensor("mlp.t5_extra", t5_mlp_extra(m, ctx, m.intermediate_size) * b * t, 1, "mlp"))
    return tuple(x for x in out if x.nbytes)


def _decoder_shared(c: StepContext) -> int:
    """T5's decoder tensors shared by its layers: the bucket indices, the cross-attention's zero bias, the final
    norm's input (``t5_norm_extra``)."""
    ed = c.m.encoder_decoder
    if ed is None or not relative(c.m):
        return 0
    t, s = c.s.train.seq_len, source_len(c)
    shared = (8 * t * t * _bias_tables(c.m, c.m.num_layers) if c.peft is None else 0)
    if c.act.attention != "eager":  # (eager: the zero bias plus the mask lives through the decoder's forward only)
        shared += ed.cross_attention_heads * t * s * c.act.compute_bytes
    return shared + t5_norm_extra(c.m, c.act) * c.s.train.micro_batch_size * t


def encoder_sequence(c: StepContext) -> tuple[tuple[int, bool], ...]:
    """``encoder_saved``'s tensors as (bytes, freed before the backward), in the order the forward makes them, for
    the allocator's event stream (analytic/events.py, beside a vision tower's); empty for another model."""
    if c.m.encoder_decoder is None or not c.rp.has_embedding:
        return ()
    nbytes, kept = encoder_output(c)
    out = [(n, False) for n in encoder_tensors(c)] + [(nbytes, not kept), (_decoder_shared(c), False)]
    return tuple(x for x in out if x[0])


def encoder_saved(c: StepContext) -> list[Term]:
    """The encoder stack's saved tensors, from the forward's start to the encoder's backward; the encoder output
    (kept by the decoder's k and v, or held by the model output to the loss); T5's shared biases: the decoder's
    first layer's bucket indices and the cross-attention's zero bias."""
    if c.m.encoder_decoder is None or not c.rp.has_embedding:
        return []
    out = []
    tensors = encoder_tensors(c)
    if tensors:
        out.append(Term(K.SAVED, sum(tensors), FORWARD, TIED_EMBEDDING, "saved.encoder", tensors=tensors))
    nbytes, kept = encoder_output(c)
    out.append(Term(K.SAVED, nbytes, FORWARD, TIED_EMBEDDING if kept else LOSS, "saved.encoder_output"))
    if shared := _decoder_shared(c):
        out.append(Term(K.SAVED, shared, FORWARD, TIED_EMBEDDING, "saved.decoder_bias"))
    return out
