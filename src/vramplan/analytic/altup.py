"""Gemma 3n's prefill tensors under ``generate`` (``ModelSpec.altup``): AltUp's streams, the per-layer inputs, LAuReL.

Read from transformers 5.24 ``models/gemma3n/modeling_gemma3n.py`` (lines cited).  T = batch x prompt tokens, h the
hidden size, n = ``altup_num_inputs``, L the layers, P = ``hidden_size_per_layer_input``, I the widest layer's MLP
width, c the bytes of the compute dtype.  No autograd graph is kept, so a tensor lives while a Python name binds it.

Kept by ``Gemma3nTextModel.forward`` through the whole layer loop:

* ``inputs_embeds`` (:1649; ``hidden_states_0``), T h c, counted as every decoder's (``kept_embeddings_bytes``);
* the per-layer inputs (``per_layer_inputs``, :1652): ``project_per_layer_inputs`` returns
  ``(per_layer_projection + per_layer_inputs) * scale``, [b, p, L, P]: T L P c (each layer reads a view);
* AltUp's expansion (:1684-1694): ``temp_hidden_states`` keeps the n - 1 rescaled projections and the name
  ``altup_proj`` the last raw projection (``.to`` the same dtype returns it), all bound until the loop ends:
  T n h c (the stacked streams themselves are the first layer's input, freed once it returns);
* the rotary cos/sin of each layer type (``position_embeddings[layer_type]``, :1697, batch 1): 2 p d c per type;
* under SDPA, the sliding layers' boolean mask [1, 1, p, p] (``create_sliding_window_causal_mask``, :1675), which
  masking_utils.py ``_ignore_causal_mask_sdpa`` (:286) does not skip once the prompt reaches the window: p^2 bytes
  (the full-attention layers' mask is skipped for an unpadded prompt: SDPA's ``is_causal``).

The running ``Gemma3nTextDecoderLayer.forward`` (:1281-1325) holds its input streams [n, b, p, h] (bound by the model's
loop) and ``predictions`` (``Gemma3nTextAltUp.predict``'s ``contiguous`` copy, :1029), 2 n h per token, and binds each
h-wide result to a local name until it returns: ``active_prediction_normed``, ``laurel_output`` (LAuReL's rank-r
branch is freed inside ``Gemma3nTextLaurelBlock.forward``), ``attn`` (the post-attention norm's output), ``attn_gated``,
``attn_laurel``, ``attn_norm``, ``attn_ffw``, ``attn_ffw_norm``, ``attn_ffw_laurel_gated``.  Its moments, per token:

* ``predict``: the input, the permuted input's copy for the batched matmul (or its output) and the contiguous
  predictions: 3 n h c;
* the MLP (``Gemma3nTextMLP.forward``, :950-957; ``gate_proj`` stays bound while the activation, the up projection
  and their product exist): 2 n h + 6 h (input streams, predictions, the six locals up to ``attn_norm``) + 4 I + h
  (``down_proj``'s output) = ((2n + 7) h + 4 I) c.  The Gaussian top-k of a sparse layer (``_gaussian_topk``,
  :959-973: ``inputs - cutoff_x`` and its ``relu`` beside the gate) holds 3 I before the activation, below the 4 I;
  its mean and standard deviation are one value per token;
* the post-feed-forward RMSNorm over ``attn_ffw``: (2n + 7) h c and the norm's fp32 copy and product, 8 h
  (``Gemma3nRMSNorm.forward``, :132-136: ``self._norm(hidden_states.float())``, then the weight's product);
* ``correct`` (:1031-1061): the nine locals, the innovation ``repeat``-ed to the n streams (n h) and the product
  ``torch.mul(innovation, all_coefs)`` (n h), beside the input and the predictions: (4 n + 9) h c;
* the per-layer-input path after it (:1308-1323), with ``corrected_predictions`` (n h) bound: the first stream's
  clone and its scaled copy, (3 n + 11) h c; then ``per_layer_projection``'s output and its RMSNorm's fp32 tensors:
  (3 n + 10) h c + 8 h (the P-wide gate, activation and product are freed by then);
* attention: the input streams, the predictions and the normed input's LAuReL output beside what an attention
  layer holds (``prefill_layer_bytes``, whose count of the layer's input and normed input covers
  ``active_prediction_normed``): that count + (2 n + 1) h c, a bound from above.

Under eager attention the model's 4-D additive masks (one per layer kind) are alive in every moment and the
layer's attention probabilities (b heads p^2 c, bound to ``_``) in every moment after its attention
(``eager_kept_bytes``); the SDPA mask above is then not made.

The largest of these is the running layer.  Two moments of the model's forward outside the layers stay below it, so
they are not counted: the per-layer inputs' preparation (the embedding lookup and the projection, L P c each, and the
projection norm's fp32 tensors, 8 L P, beside ``inputs_embeds``: E4B 111,616 B per token against the running layer's
230,912 in the kept terms' company) and the unembedding after the loop (:1718-1731: the last layer's streams, n - 1 new
projections and their stack, about (3 n + 2) h c beside the embeddings and per-layer inputs, below the (3 n + 8) h c
that the running layer's MLP moment alone keeps with them).  Per-token row statistics (the norms' mean squares, AltUp's router
outputs, the top-k's mean and deviation: a few values per token) are left out.  E4B (h 2048, n 4, I 16,384, L 35,
P 256), 2 x 1,024 tokens, bf16: the MLP moment, (15 x 2,048 + 4 x 16,384) x 2,048 x 2 = 394,264,576 B; the kept
per-layer inputs 35 x 256 x 2,048 x 2 = 36,700,160 B and AltUp's expansion 4 x 2,048 x 2,048 x 2 = 33,554,432 B.
"""

from __future__ import annotations

from vramplan.spec.model import AltUpSpec, ModelSpec

__all__ = ["NORM_FP32_BYTES", "altup_expansion_bytes", "altup_layer_bytes", "altup_of", "eager_kept_bytes", "per_layer_inputs_bytes",
           "sliding_sdpa_mask_bytes"]

# Gemma3nRMSNorm (modeling_gemma3n.py:132-136) per element: its fp32 copy of the input and the normalised fp32
# product (4 + 4), or the product and the weight's product in fp32
NORM_FP32_BYTES = 8


def altup_of(m: ModelSpec) -> AltUpSpec:
    if m.altup is None:
        raise ValueError(f"{m.name} has no AltUp streams")
    return m.altup


def per_layer_inputs_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """The per-layer inputs ``[b, p, L, P]`` kept through the layers: b p L P c.  E4B, 2 x 1,024 tokens, bf16:
    2,048 x 35 x 256 x 2 = 36,700,160 B."""
    return batch * prompt * m.num_layers * altup_of(m).per_layer_input_width * c


def altup_expansion_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """AltUp's n - 1 rescaled projections and the last raw one, bound until the layer loop ends: b p n h c
    (nothing for one stream)."""
    n = altup_of(m).num_inputs
    return batch * prompt * n * m.hidden_size * c if n > 1 else 0


def sliding_sdpa_mask_bytes(m: ModelSpec, prompt: int, attention: str) -> int:
    """The sliding layers' boolean [1, 1, p, p] mask that SDPA receives once the prompt reaches the window (module
    docstring); 0 under eager (``prefill_layer_bytes`` counts its masks), flash, or a prompt shorter than the window."""
    windows = [ls.sliding_window for ls in m.layers if ls.sliding_window]
    if attention not in ("sdpa", "math") or not windows or prompt < min(windows):
        return 0
    return prompt * prompt


def eager_kept_bytes(m: ModelSpec, batch: int, prompt: int, c: int, heads: int) -> tuple[int, int]:
    """Under eager attention, (the 4-D additive masks the model's forward keeps, one per layer kind; the running
    layer's attention probabilities, bound to ``_`` in ``Gemma3nTextDecoderLayer.forward`` (:1289) until it
    returns): ``len(kinds) b p^2 c`` and ``b heads p^2 c``, as ``prefill_layer_bytes`` counts them."""
    masks = len({ls.sliding_window for ls in m.layers}) * batch * prompt * prompt * c
    return masks, batch * heads * prompt * prompt * c


def altup_layer_bytes(m: ModelSpec, batch: int, prompt: int, c: int, attention_layer: int,
                      eager: tuple[int, int] = (0, 0)) -> int:
    """The running decoder layer's largest moment (module docstring); ``attention_layer``: what an attention layer
    of the same shape holds (``prefill_layer_bytes``); ``eager``: ``eager_kept_bytes`` under eager attention (the
    masks alive in every moment, the probabilities in those after the attention), else (0, 0)."""
    a = altup_of(m)
    t, h, n = batch * prompt, m.hidden_size, a.num_inputs
    inter = max(ls.intermediate_size for ls in m.layers)
    norm = NORM_FP32_BYTES * h * t
    masks, probs = eager
    after = (
        ((2 * n + 7) * h + 4 * inter) * t * c,               # the MLP's product and down projection
        (2 * n + 7) * h * t * c + norm,                      # the post-feed-forward norm
        (4 * n + 9) * h * t * c,                             # correct
        (3 * n + 11) * h * t * c,                            # the first stream's clone and its scaled copy
        (3 * n + 10) * h * t * c + norm,                     # the per-layer projection's norm
    )
    return max(3 * n * h * t * c + masks,                    # predict
               attention_layer + (2 * n + 1) * h * t * c,    # attention (its count holds the eager masks)
               max(after) + masks + probs)
