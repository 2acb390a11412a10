"""Hugging Face ``generate`` of a model that reads its images through cross-attention layers (Llama 3.2 Vision,
mllama; transformers 5.24 ``models/mllama/modeling_mllama.py``).

The images are not tokens of the language model's sequence: ``MllamaProcessor`` writes one ``<|image|>`` token per
image and ``MllamaImageProcessor`` (``pack_images``) pads every image to ``max_image_tiles`` tiles (T), so the tower
always runs T tiles whatever the image's size.  With P = (image_size // patch_size)^2 + 1 positions per tile (the
patches and the class token) and m images per prompt, each sequence's image is L = m x T x P vision positions.

* **Vision model** (``MllamaVisionModel.forward``): the positions of a tile are padded to a multiple of 8
  (``num_padding_patches``: Pp = 1,032 for P = 1,025), the local encoder (``transformer``) and the global one
  (``global_transformer``) both run over all T x Pp positions of an image as one sequence (S = T x Pp) under the
  4-D aspect-ratio mask (``_prepare_aspect_ratio_attention_mask``: [images, 1, S, S] in the model dtype, kept
  through both encoders).  ``MllamaVisionEncoder.forward`` keeps every layer's output (``encoder_states``), so the
  local encoder's states stay alive through the global encoder (``output.hidden_states`` feeds the intermediate
  layers).  At the end the padding is sliced off and the last global state and the ``intermediate_layers_indices``
  states are copied and concatenated into ``vision_output_dim`` (``torch.stack``, ``reshape``, ``torch.cat``).
* **Projector and mask** (``MllamaModel.forward``): the projector's output ([b, L, h], ``cross_attention_states``)
  and the vision model's output (``image_outputs``) stay alive through the prompt's forward;
  ``_prepare_cross_attention_mask`` expands the processor's int64 mask [b, p, m, T] to [b, 1, p, L]: int64
  ``repeat_interleave`` (8 B), ``1.0 - mask`` in fp32 (4 B), ``.to(dtype)`` (c), ``.to(torch.bool)`` (1 B) and
  ``masked_fill`` (c); the final mask (c) is kept for every layer.
* **KV cache**: generate's default cache is ``DynamicCache(config=...)`` (``MllamaTextModel.forward``); a
  cross-attention layer writes the k_norm'ed keys and the values of the L positions once, in the prefill
  (``MllamaTextCrossAttention.forward``'s ``cache.update``), in the model dtype, and the decode steps read them
  (``prepare_inputs_for_generation`` drops the pixel values after the first step).  The self-attention layers
  cache the text tokens only; with no image the cross-attention layers are skipped and cache nothing.
* **Cross-attention layer** (``MllamaTextCrossAttention``): the mask is given, so SDPA gets K and V repeated to
  every query head (``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa`` is False with a mask; ``repeat_kv``)
  and runs its memory-efficient kernel, which pads a mask whose rows are not a multiple of 8 (aten
  ``preprocess_mask``); eager adds the scores, their fp32 softmax and the probabilities, which the decoder layer
  keeps bound (``hidden_states, attn_weights = self.cross_attn(...)``) through its MLP.  A decode step (one query)
  under SDPA packs the query heads onto the KV heads (``pack_gqa``) instead of repeating K and V; eager repeats the
  cached K and V again at every step.  Flash attention is refused by the class (``_supports_flash_attn = False``).
* The pixel values (``pack_images``: fp32) stay in generate's ``model_kwargs`` for the whole call.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.attention import mem_efficient_mask_row
from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div

__all__ = ["CrossImages", "cross_cache_note", "cross_images", "cross_kv_bytes", "cross_layer_bytes", "cross_probs_bytes",
           "mask_prep_bytes", "vision_model_bytes"]


@dataclass(frozen=True)
class CrossImages:
    """The shapes of one ``generate`` call's images through a cross-attention model's vision model."""

    batch: int        # prompts
    per_sample: int   # images per prompt (m)
    tiles: int        # max_num_tiles (T): every image padded to it
    positions: int    # P: patches per tile and the class token
    d: int            # the vision model's hidden size
    inter: int        # its MLP width
    heads: int        # its attention heads
    local: int        # local encoder layers
    global_: int      # global encoder layers
    out_dim: int      # vision_output_dim
    pixels: int       # pixel values per image: T x channels x image_size^2

    @property
    def images(self) -> int:
        return self.batch * self.per_sample

    @property
    def padded(self) -> int:
        """Pp: a tile's positions padded to a multiple of 8 (``num_padding_patches``)."""
        return ceil_div(self.positions, 8) * 8

    @property
    def seq(self) -> int:
        """S: the encoders' sequence per image, every tile's padded positions."""
        return self.tiles * self.padded

    @property
    def vision_tokens(self) -> int:
        """L: the vision positions one prompt's cross-attention layers attend to, m x T x P."""
        return self.per_sample * self.tiles * self.positions


def cross_images(m: ModelSpec, batch: int, per_sample: int) -> CrossImages | None:
    """The call's images for a cross-attention model (None: another model, or no image)."""
    v = m.vision
    if v is None or not v.cross_attention_tokens_per_image or per_sample == 0:
        return None
    per_tile = (v.image_size // v.patch_size) ** 2
    tiles = v.patches_per_image // per_tile
    return CrossImages(batch=batch, per_sample=per_sample, tiles=tiles,
                       positions=v.cross_attention_tokens_per_image // tiles, d=v.hidden_size,
                       inter=v.intermediate_size, heads=v.num_attention_heads, local=v.num_layers - v.global_layers,
                       global_=v.global_layers, out_dim=v.output_dim,
                       pixels=tiles * v.num_channels * v.image_size ** 2)


def cross_kv_bytes(m: ModelSpec, ci: CrossImages | None, c: int) -> int:
    """The cross-attention layers' keys and values of the images: layers x b x L x 2 x kv_heads x head_dim x c."""
    if ci is None or m.vision is None:
        return 0
    return len(m.vision.cross_attention_layers) * ci.batch * ci.vision_tokens * 2 * m.num_kv_heads * m.head_dim * c


def _softmax_bytes(c: int) -> int:
    """Per score at eager's ``softmax(..., dtype=float32).to(query.dtype)``: the scores (c), the fp32 softmax (4)
    and its cast (c); in fp32 the cast is a no-op."""
    return 2 * c + 4 if c < 4 else 8


def _encoder_layer_bytes(ci: CrossImages, c: int, attention: str) -> int:
    """``MllamaVisionEncoderLayer`` running over every image's S positions (mask excluded: it is kept apart).

    SDPA, at ``o_proj``: the residual, the normalised input, q, k and v (the attention's locals), the attention
    output and o_proj's output (7d); eager at the softmax: the residual, the normalised input, q, k, v (5d) and
    heads x S^2 scores (``_softmax_bytes``), the probabilities (c) kept through the MLP; the MLP: the residual, the
    normalised input, fc1's output and the activation's (2d + 2I)."""
    t = ci.images * ci.seq
    scores = ci.images * ci.heads * ci.seq * ci.seq
    mlp = (2 * ci.d + 2 * ci.inter) * t * c
    if attention == "eager":
        return max(5 * ci.d * t * c + scores * _softmax_bytes(c), mlp + scores * c)
    return max(7 * ci.d * t * c, mlp)


def vision_model_bytes(ci: CrossImages, c: int, attention: str) -> int:
    """The vision model's peak beyond the weights and pixel values (module docstring): the patch embedding's output
    and the aspect-ratio mask kept with the encoders' states, and the larger of the global encoder's last layer running and the output's
    assembly (the stack of the kept local states, its unpadded copy, the last state's copy and the concatenation).
    """
    # patch_embedding's output stays bound to ``patch_embeds`` (the flattened hidden states are views of it) until
    # the forward returns: images x T x patches x d
    patch_embeds = ci.images * ci.tiles * (ci.positions - 1) * ci.d * c
    per_state = ci.images * ci.seq * ci.d * c
    unpadded = ci.images * ci.tiles * ci.positions * ci.d * c
    kept = ci.out_dim // ci.d - 1  # the intermediate layers' states in the output
    mask = ci.images * ci.seq * ci.seq * c
    # the running global layer's input is the last kept state, counted in the layer's own terms
    running = (ci.local + ci.global_ - 1) * per_state + _encoder_layer_bytes(ci, c, attention)
    states = (ci.local + ci.global_) * per_state
    stacked = states + kept * per_state + kept * unpadded + unpadded
    concat = states + kept * unpadded + unpadded + (kept + 1) * unpadded
    return patch_embeds + mask + max(running, stacked, concat)


def mask_prep_bytes(ci: CrossImages, prompt: int, c: int) -> int:
    """``_prepare_cross_attention_mask``'s peak over b x p x L elements: the int64 repeat (8), the fp32 ``1.0 -
    mask`` (4) and its cast (c, none in fp32); then the int64 repeat, the cast, its bool copy and ``masked_fill``'s
    output (9 + 2c)."""
    elems = ci.batch * prompt * ci.vision_tokens
    return elems * max(12 + (c if c < 4 else 0), 9 + 2 * c)


def cross_layer_bytes(m: ModelSpec, ci: CrossImages, queries: int, c: int, attention: str, prefill: bool = True) -> int:
    """One cross-attention layer's own tensors for ``queries`` text positions per prompt (the prompt, or 1 at
    decode), its cached K/V and the kept mask excluded.

    SDPA (a mask is given, so K and V are repeated to every head, unless there is one query, and the
    memory-efficient kernel runs): the layer input, the normalised input, the q_norm'ed queries and the output
    (2h + 2q per text token), K and V repeated (2q per vision position) and the mask's padded copy when L is not a
    multiple of 8.  Eager: the input, the
    normalised input and the queries (2h + q), the repeated K and V, the scores at the softmax; the probabilities
    then stay through the MLP (the larger of the two is taken with the MLP's own tensors bounded by the
    self-attention layer's, ``prefill_layer_bytes``, added by the caller).  In the prefill (``prefill``), before the
    cache is written: k_proj's output, its fp32 upcast and normalised fp32 product in ``k_norm`` and v_proj's output
    (2c + 8 per kv element); a decode step reads the cache without ``cross_attention_states``.
    """
    b, L = ci.batch, ci.vision_tokens
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
    # sdpa_attention_forward: with a mask, K and V are repeated (repeat_kv), except for a single query, whose heads
    # are packed onto the KV heads (pack_gqa, a view); eager always repeats
    packed = attention != "eager" and queries == 1
    repeat = 2 * q * b * L * c if m.num_kv_heads < m.num_attention_heads and not packed else 0
    k_norm = (2 * c + 8) * kv * b * L + 2 * h * b * queries * c if prefill else 0
    if attention == "eager":
        attn = (2 * h + q) * b * queries * c + repeat + b * m.num_attention_heads * queries * L * _softmax_bytes(c)
    else:
        padded = b * queries * mem_efficient_mask_row(L) * c if L % 8 else 0
        attn = (2 * h + 2 * q) * b * queries * c + repeat + padded
    return max(attn, k_norm)


def cross_probs_bytes(m: ModelSpec, ci: CrossImages, queries: int, c: int, attention: str) -> int:
    """Eager's cross-attention probabilities, kept through the layer's MLP (0 under SDPA)."""
    return ci.batch * m.num_attention_heads * queries * ci.vision_tokens * c if attention == "eager" else 0


def cross_cache_note(m: ModelSpec, c: int) -> str | None:
    """What a per-token KV table leaves out for a cross-attention model: the cross-attention layers' cache of one
    image per sequence, on one GPU (None for another model)."""
    ci = cross_images(m, 1, 1)
    if ci is None or m.vision is None:
        return None
    return (f"not in the table: the {len(m.vision.cross_attention_layers)} cross-attention layers cache the images "
            f"instead of text tokens, {cross_kv_bytes(m, ci, c):,} B per image and sequence on one GPU "
            f"({ci.tiles} tiles x {ci.positions:,} positions; analytic/cross_attention.py)")
