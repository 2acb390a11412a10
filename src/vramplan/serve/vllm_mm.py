"""vLLM's multimodal profile run (V1, 0.8.0 on, by release): the encoder-cache budget, the dummy items of the maximum
feature size, the vision encoder's forward peak on them and the encoder outputs kept through the language model's
dummy batch (facts/vllm_multimodal.py has the rules by release and their source).

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
  ``norm1``'s output (d each), the qkv output (3d), the contiguous q, k, v copies (3d), then the rotary of q or k:

  - 0.8.x, PyTorch's (``apply_rotary_pos_emb_vision``: ``t.float()``, ``x * cos``, ``rotate_half(x)`` and its product
    with ``sin``, four float32 tensors of d) with ``cos``, ``sin`` and their two repeats (float32, ``hd / 2`` and
    ``hd``): ``8 d c + 16 d + 12 hd`` bytes;
  - 0.9.1-0.10.x, vllm_flash_attn's Triton kernel (``t.float()`` and the ``empty_like`` output, float32 of d each,
    ``cos`` and ``sin`` of ``hd / 2`` float32, then ``.type_as(t)``, d in the dtype): ``9 d c + 8 d + 4 hd`` bytes;
  - 0.11.0, the same kernel on ``torch.cat([q, k])`` (2d, alive beside its rotated copy, 2d): ``12 d c + 16 d + 4 hd``
    bytes, the pixels' dtype copy no longer held (``x.to(dtype)`` is freed by the patch embedding);
  - 0.12.0 on, the kernel in the model's dtype (``cos`` and ``sin`` of ``hd / 2`` each in it, built once: ``hd c``
    held instead of the float32 table), flash attention's reshapes views: at the output projection the residual,
    ``norm1``'s output, qkv (3d), the rotated q and k (2d), the attention's output and the projection's (d each),
    ``9 d c``, plus the 2d that q and k are joined in (Qwen2-VL's ``torch.cat``; Qwen2.5-VL's
    ``qk_reshaped.contiguous()`` from 0.15.0, a view of qkv in 0.12.0-0.14.x): ``11 d c`` (Qwen2.5-VL 0.12.0-0.14.x:
    ``9 d c``);

* the MLP's moment: residual and ``norm2``'s output (2d), then gated (Qwen2.5-VL: the activated gate, the up
  projection and their product, 3I, with the down projection's output d): ``(3 d + 3 I) c``, from 0.11.0 ``(5 d +
  3 I) c`` (the block's input and the attention's output stay alive beside ``norm2``'s fused outputs; the same from
  0.12.0 on); plain (Qwen2-VL:
  fc1's output, QuickGELU's native ``x * sigmoid(1.702 x)``: the scaled copy and the sigmoid, 3I): ``(2 d + 3 I) c``.

The encoder moment is ``N x (held + max(attention, MLP))``: a bound in that the attention kernel's own workspace,
the window reordering's copies and the merger (smaller: N d at most) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.vllm_multimodal import (
    MM_LIMIT_DEFAULT,
    MM_LIMIT_DEFAULT_V1,
    Gemma3MmRow,
    MmProfileRule,
    MmV0Rule,
    gemma3_mm_row,
    mm_profile_read,
    mm_profile_rule,
    mm_v0_read,
    mm_v0_rule,
)
from vramplan.facts.vllm_releases import Release
from vramplan.spec.model import ModelSpec, VisionSpec
from vramplan.spec.vision import smart_resize
from vramplan.units import ceil_div

__all__ = ["EncoderBound", "MmProfile", "MmV0Batch", "encoder_bound", "mm_profile", "mm_profile_modelled", "mm_profile_v0", "mm_v0_modelled",
           "qwen_vl_item"]

# get_image_size_with_most_features: smart_resize of a square this many pixels a side (up to 0.12.x)
_HUGE_SIDE = 9_999_999
# get_image_size_with_most_features (0.13.0 on): the factor pair's sides differ at most this many times
_MAX_ASPECT = 200
_F32 = 4


@dataclass(frozen=True)
class MmProfile:
    """What vLLM's V1 profile run does for a multimodal model before the language model's dummy batch."""

    modality: str  # "image" or "video": the modality of the most tokens per item
    tokens_per_item: int  # the item's tokens in the language model's sequence (after the merge), as counted
    patches_per_item: int  # the tower's tokens per encoded item
    frames: int  # video frames per encoded item (1 for an image)
    budget_tokens: int  # "Encoder cache will be initialized with a budget of N tokens"
    items: int  # "... and profiled with M image items"
    output_bytes: int  # the encoder outputs kept (with the zeros they are scattered into, where the release does)
    encoder_peak_bytes: int  # the tower's forward peak over all items at once
    held_per_patch: int  # bytes a patch holds through every block (pixel values, rotary table)
    attention_per_patch: int  # bytes a patch holds at attention's moment
    mlp_per_patch: int  # bytes a patch holds at the MLP's moment
    encoded_tokens_per_item: int = 0  # the encoded item's output rows (fewer than tokens_per_item for a short video)
    rule: MmProfileRule | None = None  # the release's row (facts/vllm_multimodal.py)
    exact: bool = True  # the release's own source was read (False: the nearest earlier row)
    # a fixed-size image tower (Gemma 3): its row (facts/vllm_multimodal.py GEMMA3_MM_ROWS) and the per-prompt limit
    # taken when none is given (999 from 0.9.0, 1 in 0.8.x)
    fixed: Gemma3MmRow | None = None
    limit_default: int = MM_LIMIT_DEFAULT
    # the V0 engine's dummy batch (mm_profile_v0); None under V1
    v0: MmV0Batch | None = None

    @property
    def patches(self) -> int:
        return self.items * self.patches_per_item


@dataclass(frozen=True)
class MmV0Batch:
    """The V0 engine's dummy batch (``mm_profile_v0``): its sequences, the items they carry and the moments."""

    rule: MmV0Rule
    exact: bool  # the release's own source was read (False: the nearest earlier row)
    max_mm_tokens: int  # the registry's sum of limit x the most tokens an item, at max_model_len
    seqs: int  # dummy sequences: max(1, min(max_num_seqs, max_num_batched_tokens // max_mm_tokens))
    seqs_with_items: int  # those whose prompt holds their items (0.7.x drops them from a shorter sequence)
    images: int  # image items over the batch
    image_patches: int  # patches of all the batch's images
    videos: int  # video items over the batch
    video_patches: int  # patches of all the batch's videos
    video_tokens: int  # the videos' tokens in the language model's sequence
    embeds_bytes: int  # inputs_embeds of the batch's tokens, alive at the tower's moments where built first
    image_moment_bytes: int  # the tower on every image, with what is alive beside it
    video_moment_bytes: int  # the tower on every video, with what is alive beside it
    longest_seq: int = 0  # the longest dummy prompt (0.6.6 keeps a prompt longer than its share)


V1_LIMIT_FROM: Release = (0, 9, 0)  # the first release whose unset limit_mm_per_prompt is 999 (V1)
PIXELS_IN_DTYPE_FROM: Release = (0, 10, 0)  # the processor's float outputs cast to the model dtype (0.9.0: not)

def mm_profile_modelled(release: Release, m: ModelSpec) -> bool:
    """Whether the profile run of this release and model is modelled (facts/vllm_multimodal.py)."""
    v = m.vision
    return v is not None and v.tower is not None and mm_profile_read(release, v.checkpoint_max_pixels,
                                                                      v.fixed_image_profile)


def mm_v0_modelled(release: Release, m: ModelSpec) -> bool:
    """Whether the V0 engine's profile run of this release and model is modelled (facts/vllm_multimodal.py
    ``MM_V0_RULES``): a Qwen2-VL-style tower (``checkpoint_max_pixels`` known, not a fixed-size image) at a release
    from ``MM_V0_FROM`` to before ``MM_PROFILE_FROM``, Qwen2.5-VL's (the gated MLP tower) from the row's
    ``qwen2_5_from`` (vLLM had no Qwen2.5-VL before 0.7.2)."""
    v = m.vision
    return v is not None and v.tower is not None and mm_v0_read(release, v.checkpoint_max_pixels,
                                                                v.fixed_image_profile, v.tower.mlp_gated)


def _closest_factor_pair(n: int) -> tuple[int, int]:
    """qwen2_vl.py ``closest_factor_pair`` (0.13.0 on): the divisor pair of ``n`` closest to a square, smaller first."""
    d = math.isqrt(n)
    while n % d:
        d -= 1
    return d, n // d


def qwen_vl_item(v: VisionSpec, image_size: str = "smart_resize") -> tuple[int, int]:
    """(patches, tokens) of the image with the most features.  ``smart_resize`` (up to 0.12.x): a 9,999,999-pixel
    square under ``checkpoint_max_pixels``, factor patch x merge.  Qwen2.5-VL-7B: 3,584 x 3,584, (3,584 / 14)^2 =
    65,536 patches, / 4 = 16,384 tokens.  ``factor`` (0.13.0 on): ``max_pixels // (patch x merge)^2`` merged tokens
    as the factor pair closest to a square with sides at most 200-fold apart, fewer tokens until one is found; the
    image of those sides is left as it is by ``smart_resize`` (multiples of the factor, within max_pixels)."""
    factor = v.patch_size * v.merge_size
    if image_size == "factor":
        tokens = max(v.checkpoint_max_pixels // (factor * factor), 1)
        while tokens > 1:
            lo, hi = _closest_factor_pair(tokens)
            if hi / lo <= _MAX_ASPECT:
                break
            tokens -= 1
        return tokens * v.merge_size * v.merge_size, tokens
    h, w = smart_resize(_HUGE_SIDE, _HUGE_SIDE, factor, v.min_pixels, v.checkpoint_max_pixels)
    patches = (h // v.patch_size) * (w // v.patch_size)
    return patches, patches // (v.merge_size * v.merge_size)


def _v0_video_grid_t(rule: MmV0Rule, tokens_per_frame: int, seq_len: int, images: int, videos: int) -> int:
    """Temporal patches of the dummy video of a V0 release in a sequence of ``seq_len`` (``images`` images and
    ``videos`` videos a prompt): one (0.6.x, ``grid_t = max(count // 2, 1)`` of one video); 0.7.3 as V1's
    ``_video_frames`` (padded frames); 0.7.0-0.7.2 the most frames whose ``max(frames // 2, 1)`` patches fit, shared,
    at most 16, an odd count above 1 rounded up, then ``max(frames // 2, 1)``."""
    if rule.frames == "one":
        return 1
    if rule.frames == "pad":
        return _video_grid_t(_video_frames(tokens_per_frame, 2, seq_len, images, videos, rule.max_frames), 2)
    room = seq_len - tokens_per_frame * images
    total = 0
    while max((total + 1) // 2, 1) * tokens_per_frame <= room:
        total += 1
    frames = min(max(total // max(videos, 1), 1), rule.max_frames)
    frames += 1 if frames > 1 and frames % 2 else 0
    return max(frames // 2, 1)


def _video_frames(tokens_per_frame: int, temporal: int, seq_len: int, images: int, videos: int,
                  max_frames: int) -> int:
    """``get_num_frames_with_most_features``: the frames of the largest size that fit in ``seq_len`` less the images'
    tokens (``_get_max_video_frames``: the most frames whose tokens stay within it), shared by ``videos``, at most
    ``max_frames`` and at least 1."""
    room = seq_len - tokens_per_frame * images
    total = 0
    while _video_grid_t(total + 1, temporal) * tokens_per_frame <= room:
        total += 1
    return max(min(total // max(videos, 1), max_frames), 1)


def _counts(kind: str, limit: int) -> tuple[int, int]:
    """(images subtracted, videos sharing the room) of a count kind (facts/vllm_multimodal.py ``Counts``)."""
    return {"limits": (limit, limit), "one": (1, 1)}.get(kind, (0, 1))


def _video_grid_t(frames: int, temporal: int) -> int:
    """Temporal patches of ``frames`` frames, padded to a multiple of ``temporal`` (``_get_vision_info``:
    ``padded_num_frames = num_frames + num_frames % temporal_patch_size``)."""
    return max((frames + frames % temporal) // temporal, 1)


def _items(rule: MmProfileRule, budget: int, tokens: int, max_num_seqs: int, per_prompt: int, max_model_len: int) -> int:
    """The items profiled (facts/vllm_multimodal.py ``MmProfileRule.items``)."""
    if rule.items == "cdiv":
        return min(ceil_div(budget, tokens), max_num_seqs * per_prompt)
    if rule.items == "floor":
        return max(1, min(budget // tokens, max_num_seqs * per_prompt))
    prompt = max(1, min(per_prompt, max_model_len // tokens))
    return max(1, min(budget // tokens, max_num_seqs * prompt))


def _kept_rows(rule: MmProfileRule, encoded: int, tokens: int, budget: int) -> int:
    """Rows of the model's hidden size kept per item: the encoder's output, plus the zeros it is scattered into
    where the release does so (0.11.0: the budget's rows; 0.12.0: the tokens per item) and the output has
    fewer rows; the output stays alive beside them (the loop variable keeps a view of it)."""
    target = {"budget": budget, "item": tokens}.get(rule.expand, 0)
    return encoded + (target if encoded < target else 0)


def mm_profile(m: ModelSpec, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int,
               limit: int | None, release: Release = (0, 8, 2)) -> MmProfile | None:
    """The profile run's multimodal part for ``m`` at vLLM ``release`` (``mm_profile_modelled``); None when ``limit``
    is 0 (vLLM: "All non-text modalities ... disabled via limit_mm_per_prompt. Encoder cache will not be
    initialized")."""
    v = m.vision
    assert v is not None and v.tower is not None
    rule, exact = mm_profile_rule(release)
    if v.fixed_image_profile:
        return _fixed_image_profile(m, v, rule, max_model_len, max_num_batched_tokens, max_num_seqs, dtype_bytes,
                                    limit, release)
    # limit_mm_per_prompt unset: 1 in 0.8.x (MultiModalConfig.get_limit_per_prompt, "this defaults to `1`"), 999 under
    # V1 from 0.9.0 ("999 if envs.VLLM_USE_V1 else 1", read in 0.9.0 and 0.11.0)
    default = MM_LIMIT_DEFAULT if release < V1_LIMIT_FROM else MM_LIMIT_DEFAULT_V1
    per_prompt = default if limit is None else limit
    if per_prompt == 0:
        return None
    patches_img, tokens_img = qwen_vl_item(v, rule.image_size)
    temporal = max(v.temporal_patch_size, 1)
    frames = _video_frames(tokens_img, temporal, max_model_len, *_counts(rule.token_counts, per_prompt),
                           rule.max_frames)
    video_tokens = _video_grid_t(frames, temporal) * tokens_img
    # the registry's dict lists image first: max() keeps the first of equals up to 0.16.x, the later name from 0.17.0
    if video_tokens > tokens_img or (video_tokens == tokens_img and rule.tie == "name"):
        modality, tokens = "video", video_tokens
        seq = {"batched": max_num_batched_tokens, "item": tokens}.get(rule.dummy_seq, max_model_len)
        item_frames = _video_frames(tokens_img, temporal, seq, *_counts(rule.dummy_counts, per_prompt),
                                    rule.max_frames)
        grid_t = _video_grid_t(item_frames, temporal)
        encoded, patches = grid_t * tokens_img, grid_t * patches_img
    else:
        modality, tokens, encoded, patches, item_frames = "image", tokens_img, tokens_img, patches_img, 1
    # encoder_compute_budget and encoder_cache_size are both max(max_num_batched_tokens, tokens)
    budget = max(max_num_batched_tokens, tokens)
    items = _items(rule, budget, tokens, max_num_seqs, per_prompt, max_model_len)
    d, i, c = v.hidden_size, v.intermediate_size, dtype_bytes
    hd = d // v.num_attention_heads
    pixels = v.num_channels * temporal * v.patch_size * v.patch_size
    # the pixel values reach the tower in float32 up to 0.9.x and in the model dtype from 0.10.0 (0.10.0
    # inputs/registry.py maybe_cast_dtype, 0.11.0 multimodal/processing.py _postprocess_output: floating tensors
    # .to(model_config.dtype)); then the patch embedding's .to(dtype) makes no copy
    pix = c if release >= PIXELS_IN_DTYPE_FROM else _F32
    copy = pixels * c if pix == _F32 else 0
    if rule.tower in ("torch", "triton"):
        held = pixels * pix + copy + hd // 2 * _F32
        mlp = (3 * d + 3 * i) * c if v.tower.mlp_gated else (2 * d + 3 * i) * c
    elif rule.tower in ("view", "copy"):
        # 0.12.0 on: cos and sin (hd / 2 each) in the model's dtype, built once and held through every block
        held = pixels * pix + hd * c
        mlp = (5 * d + 3 * i) * c if v.tower.mlp_gated else (2 * d + 3 * i) * c
    else:
        # 0.11.0: the dtype copy of the pixels is freed by the patch embedding; Qwen2.5-VL's block keeps its input
        # and the attention's output beside norm2's two outputs through the MLP
        held = pixels * pix + hd // 2 * _F32
        mlp = (5 * d + 3 * i) * c if v.tower.mlp_gated else (2 * d + 3 * i) * c
    if rule.tower == "torch":
        attention = 8 * d * c + 4 * d * _F32 + 3 * hd * _F32
    elif rule.tower == "triton":
        attention = 9 * d * c + 2 * d * _F32 + hd * _F32
    elif rule.tower == "concat":
        # q and k concatenated (2d) and rotated together: float32 input and output of 2d each, the rotated copy 2d
        attention = 12 * d * c + 4 * d * _F32 + hd * _F32
    else:
        # at the output projection: residual, norm1's output, qkv (3d), q and k rotated (2d), the attention's output
        # and the projection's (d each), plus Qwen2-VL's torch.cat([q, k]) or Qwen2.5-VL's contiguous copy (0.15.0
        # on) of 2d; Qwen2.5-VL (the gated MLP's tower) rotates a view of qkv in 0.12.0-0.14.x
        joined = 0 if rule.tower == "view" and v.tower.mlp_gated else 2 * d
        attention = (9 * d + joined) * c
    n = items * patches
    rows = _kept_rows(rule, encoded, tokens, budget)
    return MmProfile(modality=modality, tokens_per_item=tokens, patches_per_item=patches, frames=item_frames,
                     budget_tokens=budget, items=items, output_bytes=items * rows * m.hidden_size * c,
                     encoder_peak_bytes=n * (held + max(attention, mlp)), held_per_patch=held,
                     attention_per_patch=attention, mlp_per_patch=mlp, encoded_tokens_per_item=encoded, rule=rule,
                     exact=exact, limit_default=default)


def _fixed_image_profile(m: ModelSpec, v: VisionSpec, rule: MmProfileRule, max_model_len: int,
                         max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int, limit: int | None,
                         release: Release) -> MmProfile | None:
    """Gemma 3's profile run (facts/vllm_multimodal.py ``GEMMA3_MM_ROWS``; the runner's part from ``rule``): one
    ``image_size`` square an item (pan-and-scan off), ``patches_per_image`` patches, ``tokens_per_image`` embeddings;
    the budget counts the embeddings, or the whole placeholder (``image_wrap_tokens`` more) in 0.11.0-0.12.x, or in
    0.8.x the placeholder less its two newline tokens, whose rows the outputs are scattered into and kept.

    Per patch (``d`` the tower's width, ``I`` its MLP width, ``c`` the dtype's bytes; siglip.py): held through every
    layer, the pixel values (``C x P^2``, float32 in 0.9.0, in the dtype from 0.10.0) and the embeddings (d); the
    attention's moment 7 d c (the block's input, ``layer_norm1``'s output, qkv 3d, the attention's and
    ``out_proj``'s outputs), the MLP's (3 d + 2 I) c (input, residual, ``layer_norm2``'s output, fc1's output and its
    activation).  Gemma 3 4B (d 1,152, I 4,304, bf16): held 3 x 14 x 14 x 2 + 1,152 x 2 = 1,176 + 2,304 = 3,480 B,
    attention 7 x 1,152 x 2 = 16,128 B, MLP (3,456 + 8,608) x 2 = 24,128 B: 27,608 B a patch.  The projector after
    the tower (the tower's output, its norm and the pooled 1/16) is smaller and left out."""
    row, exact = gemma3_mm_row(release)
    per_prompt = row.limit_default if limit is None else limit
    if per_prompt == 0:
        return None
    embeds = v.tokens_per_image
    # the placeholder's wrap tokens: all of them (0.11.0-0.12.x), or all but the two "\n\n" tokens stripped from it
    # (0.8.x), into whose rows the 256 outputs are scattered (scatter_patch_features: the rows kept)
    wrap = {"placeholder": v.image_wrap_tokens, "features": max(v.image_wrap_tokens - 2, 0)}.get(row.item_tokens, 0)
    tokens = embeds + wrap
    if row.item_tokens == "features":
        embeds = tokens
    budget = max(max_num_batched_tokens, tokens)
    items = _items(rule, budget, tokens, max_num_seqs, per_prompt, max_model_len)
    d, i, c = v.hidden_size, v.intermediate_size, dtype_bytes
    pixels = v.num_channels * v.patch_size * v.patch_size * (_F32 if row.pixels == "float32" else c)
    held = pixels + d * c
    attention, mlp = 7 * d * c, (3 * d + 2 * i) * c
    patches = v.patches_per_image
    rows = _kept_rows(rule, embeds, tokens, budget)
    return MmProfile(modality="image", tokens_per_item=tokens, patches_per_item=patches, frames=1,
                     budget_tokens=budget, items=items, output_bytes=items * rows * m.hidden_size * c,
                     encoder_peak_bytes=items * patches * (held + max(attention, mlp)), held_per_patch=held,
                     attention_per_patch=attention, mlp_per_patch=mlp, encoded_tokens_per_item=embeds, rule=rule,
                     exact=exact, fixed=row, limit_default=row.limit_default)


def _tower_per_patch(v: VisionSpec, pix: int, c: int, tower: str) -> tuple[int, int, int]:
    """(held, attention, MLP) bytes per patch of the tower rows ``torch`` and ``triton`` (module docstring), the pixel
    values in ``pix`` bytes an element (float32: 4, with their copy in the dtype)."""
    d, i = v.hidden_size, v.intermediate_size
    hd = d // v.num_attention_heads
    pixels = v.num_channels * max(v.temporal_patch_size, 1) * v.patch_size * v.patch_size
    assert v.tower is not None
    held = pixels * pix + (pixels * c if pix == _F32 else 0) + hd // 2 * _F32
    mlp = (3 * d + 3 * i) * c if v.tower.mlp_gated else (2 * d + 3 * i) * c
    attention = (8 * d * c + 4 * d * _F32 + 3 * hd * _F32 if tower == "torch"
                 else 9 * d * c + 2 * d * _F32 + hd * _F32)
    return held, attention, mlp


def mm_profile_v0(m: ModelSpec, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int,
                  dtype_bytes: int, limit: int | None, release: Release) -> MmProfile | None:
    """The V0 engine's profile run for Qwen2-VL / Qwen2.5-VL at ``release`` (``mm_v0_modelled``; facts/vllm_multimodal.py
    ``MM_V0_RULES``): ``max_num_seqs`` dummy sequences sharing ``max_num_batched_tokens``, each with ``limit`` images
    (and from 0.7.0 ``limit`` videos) of the most features, all encoded in the one forward.  None when ``limit`` is 0
    (the registry counts no multimodal token and the dummy prompts hold no item); a profile of no item (zero bytes)
    when every sequence is too short for its items (0.7.x).

    The moments (``c`` the dtype's bytes, ``h`` the language model's width; per patch as ``torch`` of the module
    docstring, the pixels float32 as the processor gave them in every V0 release):

    * the images': all images' patches x per patch, plus ``inputs_embeds`` (the batch's tokens x h x c) where it is
      built first (0.6.3, 0.7.x), plus the videos' float32 pixel values (in the model's kwargs);
    * the videos': all videos' patches x per patch, plus ``inputs_embeds``, the images' float32 pixel values and the
      images' outputs (``image_embeds``: patches / merge^2 rows of h);
    * the language model's dummy batch runs with every item's float32 pixel values alive, and in 0.6.x the images'
      outputs (a local of ``forward``): ``output_bytes``.

    0.6.3 and 0.6.5 raise "Qwen2-VL cannot process N images in a prompt" when a sequence is shorter than its
    images' tokens + 2: refused here with the same words (ScenarioError)."""
    v = m.vision
    assert v is not None and v.tower is not None
    found = mm_v0_rule(release)
    assert found is not None
    rule, exact = found
    per_prompt = MM_LIMIT_DEFAULT if limit is None else limit
    if per_prompt == 0:
        return None
    merge2 = v.merge_size * v.merge_size
    if rule.max_pixels_cap:
        capped = replace(v, checkpoint_max_pixels=min(v.checkpoint_max_pixels, rule.max_pixels_cap),
                         min_pixels=max(v.min_pixels, 28 * 28))
        patches_img, tokens_img = qwen_vl_item(capped)
    else:
        patches_img, tokens_img = qwen_vl_item(v)
    # the registry's maximum per item at max_model_len, times the limit of each modality (image and video)
    vid_max = _v0_video_grid_t(rule, tokens_img, max_model_len, per_prompt, per_prompt) * tokens_img
    max_mm = per_prompt * tokens_img + per_prompt * vid_max
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens // max_mm))
    base, extra = divmod(max_num_batched_tokens, seqs)
    images = videos = img_patches = vid_patches = vid_tokens = with_items = longest = 0
    tokens = 0
    for seq_len, count in ((base + 1, extra), (base, seqs - extra)):
        if count == 0:
            continue
        if rule.dummy == "registry":
            need = max(per_prompt * tokens_img, max(per_prompt // 2, 1) * tokens_img)
            if seq_len < need + 2:
                raise ScenarioError([Problem(
                    "serve.max_num_batched_tokens",
                    f"vLLM {'.'.join(map(str, release))} cannot start: its profile run builds {seqs} dummy "
                    f"sequence(s) of {seq_len:,} tokens, shorter than {per_prompt} image(s) of {tokens_img:,} tokens "
                    f"+ 2 (qwen2_vl.py dummy_data_for_qwen2_vl: \"Qwen2-VL cannot process {per_prompt} images in a "
                    "prompt\")",
                    f"use serve.max_num_batched_tokens >= {seqs * (need + 2):,} or serve.max_num_seqs "
                    f"<= {max(max_num_batched_tokens // (need + 2), 1)}, or a smaller serve.limit_mm_per_prompt")])
            n_vid, grid_t = 0, 0
        elif rule.dummy == "processor":
            n_vid, grid_t = 0, 0
        else:
            n_vid = per_prompt
            grid_t = _v0_video_grid_t(rule, tokens_img, seq_len, per_prompt, per_prompt)
        prompt = per_prompt * tokens_img + n_vid * grid_t * tokens_img + (2 if rule.dummy == "registry" else 0)
        longest = max(longest, prompt)
        if rule.dummy == "profiler" and prompt > seq_len:
            tokens += count * seq_len
            continue  # "total_len > seq_len and not envs.VLLM_USE_V1": a text-only sequence of seq_len tokens
        tokens += count * max(seq_len, prompt)
        with_items += count
        images += count * per_prompt
        img_patches += count * per_prompt * patches_img
        videos += count * n_vid
        vid_patches += count * n_vid * grid_t * patches_img
        vid_tokens += count * n_vid * grid_t * tokens_img
    c = dtype_bytes
    tower = "torch"
    held, attention, mlp = _tower_per_patch(v, _F32, c, tower)
    pixel_bytes = v.num_channels * max(v.temporal_patch_size, 1) * v.patch_size * v.patch_size * _F32
    embeds = tokens * m.hidden_size * c if rule.embeds_first else 0
    img_out = img_patches // merge2 * m.hidden_size * c
    per_patch = held + max(attention, mlp)
    img_moment = img_patches * per_patch + embeds + vid_patches * pixel_bytes
    img_moment = img_moment if img_patches else 0
    vid_moment = (vid_patches * per_patch + embeds + img_patches * pixel_bytes + img_out) if vid_patches else 0
    kept = (img_patches + vid_patches) * pixel_bytes + (img_out if rule.outputs_kept else 0)
    batch = MmV0Batch(rule=rule, exact=exact, max_mm_tokens=max_mm, seqs=seqs, seqs_with_items=with_items,
                      images=images, image_patches=img_patches, videos=videos, video_patches=vid_patches,
                      video_tokens=vid_tokens, embeds_bytes=embeds, image_moment_bytes=img_moment,
                      video_moment_bytes=vid_moment, longest_seq=longest)
    return MmProfile(modality="image+video" if videos else "image", tokens_per_item=tokens_img,
                     patches_per_item=patches_img, frames=1, budget_tokens=max_mm, items=images + videos,
                     output_bytes=kept, encoder_peak_bytes=max(img_moment, vid_moment), held_per_patch=held,
                     attention_per_patch=attention, mlp_per_patch=mlp, encoded_tokens_per_item=tokens_img,
                     rule=None, exact=exact, limit_default=MM_LIMIT_DEFAULT, v0=batch)


@dataclass(frozen=True)
class EncoderBound:
    """An upper bound of what an unmodelled multimodal profile run takes from the KV pool (``encoder_bound``)."""

    tokens: int  # the items' tokens in the language model's sequence the profile can encode at most
    patches: int  # the tower's patches of those tokens
    per_patch: int  # bytes a patch can hold at the tower's peak
    encoder_bytes: int  # patches x per_patch
    output_bytes: int  # the outputs kept, with zeros of as many rows scattered into

    @property
    def bytes(self) -> int:
        return self.encoder_bytes + self.output_bytes


def encoder_bound(m: ModelSpec, max_model_len: int, max_num_batched_tokens: int, dtype_bytes: int,
                  limit: int | None, v0: bool) -> EncoderBound | None:
    """An upper bound of the encoder's part of a profile run that is not modelled (None: no tower in the spec, so
    none can be derived; a zero bound when ``limit`` is 0, every modality disabled).

    * tokens: an item is assumed to hold at most ``T = max(max_model_len, tokens_per_image)`` tokens (the registry
      sizes a video to ``max_model_len`` and an image to the processor's largest); V1 encodes ``cdiv(budget, T)``
      items at most, ``budget = max(max_num_batched_tokens, T)``: at most ``budget + T`` tokens; V0's dummy
      sequences share ``max_num_batched_tokens``, but a prompt too long for its share keeps its items in some releases
      (0.6.6): at most ``max(max_num_batched_tokens, T) + 2 x limit x T`` (an image and a video modality);
    * patches: tokens x ``(patches_per_image + extra_tokens) / tokens_per_image`` (the spec's image; assumed the same
      ratio for every item of the model);
    * per patch, the largest of the towers read (module docstring; siglip.py): the pixel values in float32 with
      their copy in the dtype, the rotary table (hd float32) and the embeddings (d) held; attention the larger of
      0.11.0's concatenated rotary ``12 d c + 16 d + 12 hd`` and the copies ``11 d c``; the gated MLP's ``(5 d + 3 I) c``
      (above a plain MLP's ``(3 d + 2 I) c``);
    * outputs: twice the tokens' rows of the language model's width (0.11.0 scatters into zeros of the budget).

    Qwen2.5-VL-7B (d 1,280, hd 80, I 3,420, 1,176 pixel values, bf16): held 1,176 x 6 + 80 x 4 + 1,280 x 2 = 9,936 B;
    attention 12 x 1,280 x 2 + 16 x 1,280 + 12 x 80 = 52,160 B; MLP (6,400 + 10,260) x 2 = 33,320 B: 62,096 B."""
    v = m.vision
    if v is None or v.tower is None or v.tokens_per_image <= 0:
        return None
    per_prompt = (MM_LIMIT_DEFAULT if v0 else MM_LIMIT_DEFAULT_V1) if limit is None else limit
    if per_prompt == 0:
        return EncoderBound(0, 0, 0, 0, 0)
    item = max(max_model_len, v.tokens_per_image)
    budget = max(max_num_batched_tokens, item)
    tokens = budget + (2 * per_prompt * item if v0 else item)
    patches = ceil_div(tokens * (v.patches_per_image + v.extra_tokens), v.tokens_per_image)
    d, i, c = v.hidden_size, v.intermediate_size, dtype_bytes
    hd = d // max(v.num_attention_heads, 1)
    pixels = v.num_channels * max(v.temporal_patch_size, 1) * v.patch_size * v.patch_size
    held = pixels * (_F32 + c) + hd * _F32 + d * c
    attention = max(12 * d * c + 16 * d + 12 * hd, 11 * d * c)
    mlp = max((5 * d + 3 * i) * c, (3 * d + 2 * i) * c)
    per_patch = held + max(attention, mlp)
    return EncoderBound(tokens=tokens, patches=patches, per_patch=per_patch, encoder_bytes=patches * per_patch,
                        output_bytes=2 * tokens * m.hidden_size * c)
