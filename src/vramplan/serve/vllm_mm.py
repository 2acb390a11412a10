"""vLLM's multimodal profile run (V1, 0.8.x): the encoder-cache budget, the dummy items of the maximum feature size,
the vision encoder's forward peak on them and the encoder outputs kept through the language model's dummy batch
(facts/vllm_multimodal.py has the rules and their source).

Modelled for a tower whose processor resizes with ``smart_resize`` under the checkpoint's ``max_pixels``
(``VisionSpec.checkpoint_max_pixels``: Qwen2-VL, Qwen2.5-VL); any other multimodal model keeps the "not modelled"
assumption of serve/vllm.py.

The encoder's forward peak, per patch (``N`` patches of all items in one batch, width ``d``, ``hd`` per head, MLP
width ``I``, ``c`` bytes of the model's dtype; vLLM 0.8.2 ``qwen2_5_vl.py`` / ``qwen2_vl.py``; no autograd):

* held through every block: the pixel values as the processor gave them (float32, ``C x T x P^2`` a patch, moved to
  the device by ``MultiModalKwargs.as_kwargs``) and their copy in the dtype (``_process_image_input``:
  ``pixel_values.type(self.visual.dtype)``), the 2-D rotary table (``hd / 2`` float32);
* attention's moment (``VisionAttention.forward``, the xformers path of a plain install: ``get_vit_attn_backend``
  takes FLASH_ATTN only when the flash-attn package is installed): the block's input (the residual) and
  ``norm1``'s output (d each), the qkv output (3d), the contiguous q, k, v copies (3d), then the torch rotary
  of q (``apply_rotary_pos_emb_vision``: ``t.float()``, ``x * cos``, ``rotate_half(x)`` and its product with
  ``sin``, four float32 tensors of d) with ``cos``, ``sin`` and their two repeats (float32, ``hd / 2`` and ``hd``):
  ``8 d c + 16 d + 12 hd`` bytes;
* the MLP's moment: residual and ``norm2``'s output (2d), then gated (Qwen2.5-VL: the activated gate, the up
  projection and their product, 3I, with the down projection's output d): ``(3 d + 3 I) c``; plain (Qwen2-VL:
  fc1's output, QuickGELU's native ``x * sigmoid(1.702 x)``: the scaled copy and the sigmoid, 3I): ``(2 d + 3 I) c``.

The encoder moment is ``N x (held + max(attention, MLP))``: a bound in that the xformers kernel's own workspace,
the window reordering's copies and the merger (smaller: N d at most) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.facts.vllm_multimodal import (
    MAX_FRAMES_PER_VIDEO,
    MM_LIMIT_DEFAULT,
    mm_profile_read,
)
from vramplan.facts.vllm_releases import Release
from vramplan.spec.model import ModelSpec, VisionSpec
from vramplan.spec.vision import smart_resize
from vramplan.units import ceil_div

__all__ = ["MmProfile", "mm_profile", "mm_profile_modelled", "qwen_vl_item"]

# get_image_size_with_most_features: smart_resize of a square this many pixels a side
_HUGE_SIDE = 9_999_999
_F32 = 4


@dataclass(frozen=True)
class MmProfile:
    """What vLLM's V1 profile run does for a multimodal model before the language model's dummy batch."""

    modality: str  # "image" or "video": the modality of the most tokens per item
    tokens_per_item: int  # the item's tokens in the language model's sequence (after the merge)
    patches_per_item: int  # the tower's tokens per item
    frames: int  # video frames per item (1 for an image)
    budget_tokens: int  # "Encoder cache will be initialized with a budget of N tokens"
    items: int  # "... and profiled with M image items"
    output_bytes: int  # the encoder outputs kept: items x tokens x LM hidden x dtype bytes
    encoder_peak_bytes: int  # the tower's forward peak over all items at once
    held_per_patch: int  # bytes a patch holds through every block (pixel values, rotary table)
    attention_per_patch: int  # bytes a patch holds at attention's moment
    mlp_per_patch: int  # bytes a patch holds at the MLP's moment

    @property
    def patches(self) -> int:
        return self.items * self.patches_per_item


def mm_profile_modelled(release: Release, m: ModelSpec) -> bool:
    """Whether the profile run of this release and model is modelled (facts/vllm_multimodal.py)."""
    v = m.vision
    return v is not None and v.tower is not None and mm_profile_read(release, v.checkpoint_max_pixels)


def qwen_vl_item(v: VisionSpec) -> tuple[int, int]:
    """(patches, tokens) of the image with the most features: ``smart_resize`` of a 9,999,999-pixel square under
    ``checkpoint_max_pixels``, factor patch x merge.  Qwen2.5-VL-7B: 3,584 x 3,584, (3,584 / 14)^2 = 65,536
    patches, / 4 = 16,384 tokens."""
    factor = v.patch_size * v.merge_size
    h, w = smart_resize(_HUGE_SIDE, _HUGE_SIDE, factor, v.min_pixels, v.checkpoint_max_pixels)
    patches = (h // v.patch_size) * (w // v.patch_size)
    return patches, patches // (v.merge_size * v.merge_size)


def _video_frames(tokens_per_frame: int, temporal: int, seq_len: int, images: int, videos: int) -> int:
    """``get_num_frames_with_most_features``: the frames of the largest size that fit in ``seq_len`` less the images'
    tokens (``_get_max_video_frames``: the most frames whose tokens stay within it), shared by ``videos``, at most
    16 and at least 1."""
    room = seq_len - tokens_per_frame * images
    total = 0
    while _video_grid_t(total + 1, temporal) * tokens_per_frame <= room:
        total += 1
    return max(min(total // max(videos, 1), MAX_FRAMES_PER_VIDEO), 1)


def _video_grid_t(frames: int, temporal: int) -> int:
    """Temporal patches of ``frames`` frames, padded to a multiple of ``temporal`` (``_get_vision_info``:
    ``padded_num_frames = num_frames + num_frames % temporal_patch_size``)."""
    return max((frames + frames % temporal) // temporal, 1)


def mm_profile(m: ModelSpec, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int,
               limit: int | None) -> MmProfile | None:
    """The profile run's multimodal part for ``m`` (``mm_profile_modelled``); None when ``limit`` is 0 (vLLM:
    "All non-text modalities ... disabled via limit_mm_per_prompt. Encoder cache will not be initialized")."""
    v = m.vision
    assert v is not None and v.tower is not None
    per_prompt = MM_LIMIT_DEFAULT if limit is None else limit
    if per_prompt == 0:
        return None
    patches_img, tokens_img = qwen_vl_item(v)
    temporal = max(v.temporal_patch_size, 1)
    frames = _video_frames(tokens_img, temporal, max_model_len, per_prompt, per_prompt)
    grid_t = _video_grid_t(frames, temporal)
    # the registry's dict lists image first and max() keeps the first of equals
    if grid_t * tokens_img > tokens_img:
        modality, tokens, patches, item_frames = "video", grid_t * tokens_img, grid_t * patches_img, frames
    else:
        modality, tokens, patches, item_frames = "image", tokens_img, patches_img, 1
    # encoder_compute_budget and encoder_cache_size are both max(max_num_batched_tokens, tokens)
    budget = max(max_num_batched_tokens, tokens)
    items = min(ceil_div(budget, tokens), max_num_seqs * per_prompt)
    d, i, c = v.hidden_size, v.intermediate_size, dtype_bytes
    hd = d // v.num_attention_heads
    pixels = v.num_channels * temporal * v.patch_size * v.patch_size
    held = pixels * _F32 + pixels * c + hd // 2 * _F32
    attention = 8 * d * c + 4 * d * _F32 + 3 * hd * _F32
    mlp = (3 * d + 3 * i) * c if v.tower.mlp_gated else (2 * d + 3 * i) * c
    n = items * patches
    return MmProfile(modality=modality, tokens_per_item=tokens, patches_per_item=patches, frames=item_frames,
                     budget_tokens=budget, items=items, output_bytes=items * tokens * m.hidden_size * c,
                     encoder_peak_bytes=n * (held + max(attention, mlp)), held_per_patch=held,
                     attention_per_patch=attention, mlp_per_patch=mlp)
