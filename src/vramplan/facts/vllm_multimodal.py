"""vLLM's multimodal profile run by release, as data (serve/vllm_mm.py applies it).

The 0.8.x row, read in the wheels of vLLM 0.8.0 and 0.8.2 (``pip download vllm==X --no-deps``):

* ``vllm/v1/worker/gpu_model_runner.py`` ``GPUModelRunner.profile_run`` (0.8.2 lines 1419-1507): for a multimodal
  model, before the language model's dummy batch, the modality whose item has the most tokens
  (``MULTIMODAL_REGISTRY.get_max_tokens_per_item_by_nonzero_modality``; the first listed wins a tie) is profiled:
  ``encoder_budget = min(max_num_encoder_input_tokens, encoder_cache_size)``, ``items = min(cdiv(encoder_budget,
  max_tokens_per_item), max_num_reqs x limit_per_prompt[modality])``; the log line "Encoder cache will be
  initialized with a budget of N tokens, and profiled with M image items of the maximum feature size"; the dummy
  item (the largest) is copied ``items`` times and encoded in one batch by ``model.get_multimodal_embeddings``;
  the outputs are kept in ``self.encoder_cache["tmp"]`` through ``self._dummy_run(self.max_num_tokens)`` and the
  sampler's dummy run, then cleared.  The worker's torch peak (``gpu_worker.py`` ``determine_available_memory``)
  spans both moments.
* ``vllm/v1/core/encoder_cache_manager.py`` ``_compute_encoder_budget_multimodal``: the compute budget is
  ``max(scheduler_config.max_num_encoder_input_tokens, max_tokens_per_item)``, the cache
  ``max(scheduler_config.encoder_cache_size, max_tokens_per_item)``; both scheduler values are
  ``max_num_batched_tokens`` (``vllm/config.py`` ``SchedulerConfig.__post_init__``).
* ``vllm/config.py`` ``MultiModalConfig.get_limit_per_prompt``: ``limit_mm_per_prompt`` of the modality, 1 when
  not set.
* ``vllm/model_executor/models/qwen2_vl.py`` ``Qwen2VLProcessingInfo`` (also Qwen2.5-VL's): the image of the most
  features is ``smart_resize`` of a 9,999,999-pixel square under the checkpoint processor's ``max_pixels``
  (``get_image_size_with_most_features``), one temporal patch (a single frame padded to 2); a video is as many
  frames of that size as fit in ``max_model_len`` less the images' tokens (``limit_per_prompt["image"]`` of them),
  shared by ``limit_per_prompt["video"]`` videos, at most ``_MAX_FRAMES_PER_VIDEO`` 16 and at least 1
  (``get_num_frames_with_most_features``); frames are padded to an even count, two a temporal patch.

From 0.9.1 on the rules changed release by release; ``MM_PROFILE_RULES`` below holds one row per change, each
read in the wheels of the releases in its ``read_at`` (``pip download vllm==X --no-deps``):

* what the registry counts as an item's tokens (the budget's and the modality's): 0.9.1-0.10.x build the dummy data of
  one item per modality (``MultiModalProfiler.get_mm_max_tokens(seq_len, {modality: 1 ...})``, registry.py), so a
  video's frames fill ``max_model_len`` less one image's tokens; 0.11.0 on, ``get_num_frames_with_most_features``
  subtracts no image (qwen2_vl.py) and ``_MAX_FRAMES_PER_VIDEO`` is 14;
* the dummy item that is encoded (``_get_mm_dummy_batch``; 0.8.x ``dummy_data_for_profiling``): built for a sequence
  of ``max_num_batched_tokens`` (``self.max_num_tokens``) with the limits per prompt (0.8.x) or one item (0.9.1,
  0.10.1-0.10.x), of the item's own tokens (0.10.0) or of ``max_model_len`` (0.11.0 on).  A video item can then be
  shorter than the tokens it was counted with: 0.8.2 with the default limit of 1 on a 16,384-token batch encodes a
  1-frame video (16,384 - 16,384 tokens of room: 0 frames, at least 1);
* the number of items: ``min(cdiv(budget, tokens), max_num_seqs x limit)`` (0.8.0-0.9.x),
  ``max(1, min(budget // tokens, max_num_seqs x limit))`` (0.10.0), ``MultiModalBudget.get_max_items`` (0.10.1 on,
  v1/worker/utils.py, vllm/multimodal/encoder_budget.py from 0.16.0): the per-prompt count is ``max(1, min(limit,
  max_model_len // tokens))`` and the items ``max(1, min(budget // tokens, max_num_seqs x per prompt))`` (chunked
  prefill on, V1's default);
* the outputs kept: all items' embeddings (``encoder_cache["tmp"]``); 0.11.0 first scatters each into zeros of
  ``encoder_budget`` rows when its rows are fewer, 0.12.0 into zeros of the modality's tokens per item (the loop
  variable ``output`` keeps the encoder's own outputs alive beside them, a view of one tensor); 0.13.0 on keeps
  each output as it is (``encoder_cache[f"tmp_{i}"]``);
* the modality of the most tokens: the first listed wins a tie (image) up to 0.16.x; 0.17.0 on ``max(..., key=lambda
  x: (x[1], x[0]))``, the later name (video);
* the image of the most features: ``smart_resize`` of a 9,999,999-pixel square up to 0.12.x; 0.13.0 on the factor
  pair of ``max_pixels // (patch x merge)^2`` merged tokens closest to a square whose sides differ at most 200-fold
  (``get_image_size_with_most_features``; ``image_processor.max_pixels`` or ``size["longest_edge"]``, the checkpoint's
  ``max_pixels`` as transformers' Qwen2-VL image processor keeps it);
* the tower's rotary embedding (qwen2_vl.py ``apply_rotary_pos_emb_vision``): PyTorch's ``apply_rotary_emb_torch``
  with the xformers backend in 0.8.x; 0.9.1-0.10.x call vllm_flash_attn's Triton ``apply_rotary_emb`` on CUDA
  (``t.float()``, ``cos``/``sin`` of ``hd / 2``, ``torch.empty_like`` output, ``.type_as(t)``), the attention itself
  still xformers (``get_vit_attn_backend``: FLASH_ATTN only with the flash-attn package; xformers is a dependency of
  the wheel).  0.11.0 (``Qwen2_5_VisionAttention.forward``, ``Qwen2VisionAttention.forward``) rotates
  ``torch.cat([q, k])`` at once (the concatenation stays alive beside the rotated copy), the backend is vllm_flash_attn
  on an sm80+ GPU (``CudaPlatform.get_vit_attn_backend``), the pixels go to the dtype inside the tower
  (``x.to(dtype)``, freed by the patch embedding) and Qwen2.5-VL's block keeps its input and the attention's output
  through the MLP (``norm2(x, residual=x_attn)``).  0.12.0 rewrote it (``tower`` "view"): the rotary table is
  built once per forward from ``get_rope(..., dtype=torch.get_default_dtype())`` (the model's dtype while loading),
  ``cos`` and ``sin`` of ``hd / 2`` each held through every block; ``apply_rotary_pos_emb_vision`` dispatches to
  vllm_flash_attn's Triton ``apply_rotary_emb`` on CUDA, which asserts ``x.dtype == cos.dtype`` (no float32 copy)
  and writes ``torch.empty_like(x)``; Qwen2.5-VL rotates ``qk_reshaped``, a view of the qkv output (2d rotated),
  Qwen2-VL ``torch.cat([q, k])`` (2d, alive beside the rotated 2d); the default backend on an sm80+ GPU is
  FLASH_ATTN (``CudaPlatform.get_vit_attn_backend``), whose q, k, v and output reshapes are views for one batch
  row; ``compile_mm_encoder`` is False by default (``config/compilation.py``), the tower runs eagerly.  0.13.0 and
  0.14.0 call ``ApplyRotaryEmb(enforce_enable=True)`` (``forward_cuda``: the same kernel, ``enable_fp32_compute``
  False) and ``MMEncoderAttention`` (views, ``vit_flash_attn_wrapper``) on the same view.  0.15.0 on (``tower``
  "copy"): Qwen2.5-VL copies ``qk_reshaped.contiguous()`` before rotating it, the rest as 0.13.0 (read at 0.15.0,
  0.15.1, 0.16.0, 0.17.0, 0.18.0, 0.21.0; after 0.21.0 not read, 0.21.0's assumed: 0.31.0 and 0.33.0 keep the
  same attention forward but normalize the pixels on the device by default for Qwen-VL, ``mm_device_do_normalize``
  with ``supports_mm_device_do_normalize = True``, whose input dtype is not read).

0.9.0 was not read for Qwen-VL: the 0.8.x row is assumed for it (the nearest earlier).  Before 0.8.0 (the V0 engine) the encoder
runs inside the dummy sequences' forward: ``MM_V0_RULES`` below.

The V0 engine (``V0_MM_RULES``, every release before 0.8.0; 0.8.x under ``VLLM_USE_V1=0`` is the 0.7.3 row, its
``model_runner.py`` and ``multimodal/profiling.py`` read at 0.8.0, but the scenario has no switch for it), read in the
wheels of 0.6.3, 0.6.5, 0.6.6, 0.7.0, 0.7.2 and 0.7.3:

* ``vllm/worker/model_runner.py`` ``ModelRunner.profile_run`` / ``_dummy_run`` (0.6.6 lines 1268-1296, 0.7.3 lines
  1279-1303, 0.8.0 lines 1287-1310; 0.6.3 lines 1242-1266): ``max_mm_tokens = mm_registry.get_max_multimodal_tokens(model_config)``, the sum
  over the modalities of ``limit_per_prompt x max tokens per item``; when positive, ``max_num_seqs = min(max_num_seqs,
  max_num_batched_tokens // max_mm_tokens)``, at least 1; sequence ``i`` gets ``max_num_batched_tokens //
  max_num_seqs`` tokens, one more while ``i < max_num_batched_tokens % max_num_seqs``, and the dummy data of
  ``dummy_data_for_profiling(model_config, seq_len, mm_registry)``; the whole batch runs in one forward;
* the per-item maxima the registry sums: 0.6.x ``get_max_qwen2_vl_mm_tokens`` (one image; a "video" of one temporal
  patch, the same tokens); 0.7.x ``Qwen2VLProcessingInfo.get_mm_max_tokens_per_item(max_model_len)`` (the image, and
  the video of as many frames as fit in ``max_model_len`` less the images' tokens, as the V1 0.8.x row);
* the dummy data of one sequence: 0.6.3 and 0.6.5 ``qwen2_vl.py`` ``dummy_data_for_qwen2_vl`` (``limit["image"]``
  images, no video, ``max_pixels`` capped at 1280 x 28 x 28 = 1,003,520 by ``_get_max_image_info`` and
  ``min_pixels`` raised to 28 x 28; a ``RuntimeError`` "Qwen2-VL cannot process N images in a prompt" when the
  sequence is shorter than their tokens + 2, or than ``max(limit["video"] // 2, 1)`` temporal patches + 2);
  0.6.6 ``Qwen2VLMultiModalProcessor._get_dummy_mm_inputs`` through ``multimodal/processing.py``
  ``BaseMultiModalProcessor.get_dummy_data`` (``limit["image"]`` images at the checkpoint's ``max_pixels``, no
  video; a sequence too short only logs a warning and keeps its items); 0.7.x ``multimodal/profiling.py``
  ``MultiModalProfiler.get_dummy_data`` (0.8.0 ``get_decoder_dummy_data``) with ``Qwen2VLDummyInputsBuilder``
  (also Qwen2.5-VL's): ``limit["image"]`` images and ``limit["video"]`` videos whose frames fit in the sequence less
  the images (``get_num_frames_with_most_features(seq_len)``), and none of them at all when the prompt is longer
  than the sequence ("total_len > seq_len and not envs.VLLM_USE_V1": the sequence is text only);
* the frames of a video: 0.7.3 pads an odd count (``padded_num_frames``, as the V1 rows); 0.7.0 and 0.7.2 count
  ``max(frames // 2, 1)`` temporal patches and round an odd count above 1 up ("Temporary workaround for
  transformers issue 35412"), so a video can take one temporal patch more than its room;
* the forward (``Qwen2VLForConditionalGeneration.forward``): the tower runs on all the batch's images at once
  (``pixel_values`` concatenated over the sequences, float32 as the processor gave them, held in the model's kwargs
  through the whole forward), then on all its videos; 0.7.x (``get_input_embeddings_v0``) builds ``inputs_embeds``
  of every token of the batch first, keeps the images' outputs (``image_embeds``, a local) through the videos' and
  frees them before the language model; 0.6.3 builds ``inputs_embeds`` first too, but its ``image_embeds`` is a
  local of ``forward``, alive through the language model; 0.6.5 and 0.6.6 encode first
  (``get_multimodal_embeddings``), build ``inputs_embeds`` after and keep the outputs through the language model.
  The tower's forward itself was compared at 0.7.0, 0.7.2 and 0.7.3 with 0.8.0's (the xformers path and the PyTorch
  rotary unchanged: the ``torch`` row's bytes per patch); 0.6.x's (the qkv split and the backend's choice differ) was
  not read for its bytes: the same are assumed, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GEMMA3_MM_FROM", "GEMMA3_MM_ROWS", "GEMMA3_MM_SOURCES", "MM_LIMIT_DEFAULT", "MM_LIMIT_DEFAULT_V1",
           "MM_PROFILE_FROM", "MM_PROFILE_RULES", "MM_PROFILE_SOURCES", "MM_V0_FROM", "MM_V0_RULES", "MM_V0_SOURCES",
           "QWEN_VL_CHECKPOINT_MAX_PIXELS", "Gemma3MmRow", "MmProfileRule", "MmV0Rule", "gemma3_mm_row",
           "mm_profile_read", "mm_profile_rule", "mm_v0_read", "mm_v0_rule"]

Release = tuple[int, int, int]

# What of the limits per prompt a count uses: every modality's limit, one item of each, or no image (videos only)
Counts = Literal["limits", "one", "no-image"]


@dataclass(frozen=True, kw_only=True)
class MmProfileRule:
    """One row: vLLM's multimodal profile run from release ``first`` on (module docstring)."""

    first: Release
    read_at: tuple[Release, ...]
    # the counts a video's frames are fitted with when its tokens per item are counted (images subtracted from
    # max_model_len, videos sharing it): "limits" (0.8.x), "one" (1 image, 1 video), "no-image" (1 video, no image)
    token_counts: Counts
    # the sequence the encoded dummy item is built for: max_num_batched_tokens, the item's own tokens, max_model_len
    dummy_seq: Literal["batched", "item", "max_model_len"]
    # the counts the encoded dummy item is built with: "limits" (0.8.x) or the modality alone ("no-image")
    dummy_counts: Counts
    # how many items: "cdiv" min(cdiv(budget, t), seqs x limit); "floor" max(1, min(budget // t, seqs x limit));
    # "budget" MultiModalBudget.get_max_items (per prompt max(1, min(limit, max_model_len // t)))
    items: Literal["cdiv", "floor", "budget"]
    max_frames: int  # qwen2_vl.py _MAX_FRAMES_PER_VIDEO
    # outputs scattered into zeros of the encoder budget's rows, of the tokens per item, or kept as they are
    expand: Literal["none", "budget", "item"]
    tie: Literal["first", "name"]  # the modality a tie of tokens per item goes to: the first listed (image) or by name
    image_size: Literal["smart_resize", "factor"]  # how the image of the most features is found
    # the tower's forward by patch: PyTorch's rotary (0.8.x), vllm_flash_attn's Triton rotary on q and k (0.9.1-0.10.x),
    # the Triton rotary on q and k concatenated, without the dtype copy of the pixels (0.11.0); the rotary in the
    # model's dtype on a view of the qkv output (Qwen2.5-VL) or a concatenation (Qwen2-VL), cos and sin in the dtype
    # (0.12.0-0.14.x: "view"); Qwen2.5-VL's q and k copied contiguous first (0.15.0 on: "copy")
    tower: Literal["torch", "triton", "concat", "view", "copy"]
    sources: tuple[str, ...]
    # the releases at which the tower's forward was read (None: the same as read_at)
    tower_read_at: tuple[Release, ...] | None = None

    def tower_read(self, release: Release) -> bool:
        """Whether the vision tower's forward was read at ``release`` (False: this row's tower is assumed)."""
        return release in (self.read_at if self.tower_read_at is None else self.tower_read_at)


_RUNNER = "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run"
_QWEN = "vllm/model_executor/models/qwen2_vl.py Qwen2VLProcessingInfo"

MM_PROFILE_RULES: tuple[MmProfileRule, ...] = (
    MmProfileRule(
        first=(0, 8, 0), read_at=((0, 8, 0), (0, 8, 2)), token_counts="limits", dummy_seq="batched",
        dummy_counts="limits", items="cdiv", max_frames=16, expand="none", tie="first", image_size="smart_resize",
        tower="torch",
        sources=(f"{_RUNNER} (0.8.2 lines 1419-1507)", "vllm/inputs/registry.py dummy_data_for_profiling (0.8.2)",
                 "vllm/v1/core/encoder_cache_manager.py _compute_encoder_budget_multimodal (0.8.0, 0.8.2)",
                 f"{_QWEN} get_num_frames_with_most_features (0.8.2)",
                 "vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionTransformer.forward (0.8.2)")),
    MmProfileRule(
        first=(0, 9, 1), read_at=((0, 9, 1),), token_counts="one", dummy_seq="batched", dummy_counts="no-image",
        items="cdiv", max_frames=16, expand="none", tie="first", image_size="smart_resize", tower="triton",
        sources=(f"{_RUNNER} (0.9.1): get_decoder_dummy_data(seq_len=self.max_num_tokens, mm_counts={{modality: 1}})",
                 "vllm/multimodal/registry.py get_max_tokens_per_item_by_modality (0.9.1): {modality: 1}",
                 "vllm/model_executor/models/qwen2_vl.py apply_rotary_pos_emb_vision (0.9.1): vllm_flash_attn rotary")),
    MmProfileRule(
        first=(0, 10, 0), read_at=((0, 10, 0),), token_counts="one", dummy_seq="item", dummy_counts="no-image",
        items="floor", max_frames=16, expand="none", tie="first", image_size="smart_resize", tower="triton",
        sources=((f"{_RUNNER} (0.10.0): encoder_budget // max_tokens_per_mm_item, max(1, ...), "
                 "get_decoder_dummy_data(seq_len=max_tokens_per_mm_item)"),)),
    MmProfileRule(
        first=(0, 10, 1), read_at=((0, 10, 1), (0, 10, 2)), token_counts="one", dummy_seq="batched",
        dummy_counts="no-image", items="budget", max_frames=16, expand="none", tie="first", image_size="smart_resize",
        tower="triton",
        sources=("vllm/v1/worker/utils.py MultiModalBudget.get_max_items (0.10.1, 0.10.2)",
                 ("vllm/v1/worker/gpu_model_runner.py GPUModelRunner._get_mm_dummy_batch (0.10.1): "
                 "seq_len=self.max_num_tokens"))),
    MmProfileRule(
        first=(0, 11, 0), read_at=((0, 11, 0),), token_counts="no-image", dummy_seq="max_model_len",
        dummy_counts="no-image", items="budget", max_frames=14, expand="budget", tie="first", image_size="smart_resize",
        tower="concat",
        sources=(f"{_RUNNER} (0.11.0): expanded = output.new_zeros((encoder_budget, hidden))",
                 f"{_QWEN} get_num_frames_with_most_features, _MAX_FRAMES_PER_VIDEO = 14 (0.11.0)",
                 ("vllm/v1/worker/gpu_model_runner.py GPUModelRunner._get_mm_dummy_batch (0.11.0): "
                 "seq_len=self.max_model_len"))),
    MmProfileRule(
        first=(0, 12, 0), read_at=((0, 12, 0),), token_counts="no-image", dummy_seq="max_model_len",
        dummy_counts="no-image", items="budget", max_frames=14, expand="item", tie="first", image_size="smart_resize",
        tower="view",
        sources=(f"{_RUNNER} (0.12.0): new_zeros((max_mm_tokens_per_item, hidden))",
                 ("vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionAttention.forward (0.12.0 lines 358-425): "
                  "qk_reshaped = einops.rearrange(qk, ...), apply_rotary_pos_emb_vision"),
                 "vllm/model_executor/models/qwen2_vl.py Qwen2VisionAttention.forward (0.12.0): torch.cat([q, k])",
                 ("vllm/vllm_flash_attn/ops/triton/rotary.py apply_rotary (0.12.0): x.dtype == cos.dtype, "
                  "torch.empty_like(x)"),
                 "vllm/platforms/cuda.py CudaPlatform.get_vit_attn_backend (0.12.0): FLASH_ATTN on sm80+",
                 "vllm/config/compilation.py CompilationConfig.compile_mm_encoder = False (0.12.0-0.33.0)")),
    MmProfileRule(
        first=(0, 13, 0), read_at=((0, 13, 0), (0, 14, 0)), token_counts="no-image",
        dummy_seq="max_model_len", dummy_counts="no-image", items="budget", max_frames=14, expand="none", tie="first",
        image_size="factor", tower="view",
        sources=(f"{_QWEN} get_image_size_with_most_features (0.13.0-0.16.0): closest_factor_pair",
                 f"{_RUNNER} (0.13.0-0.16.0): self.encoder_cache[f\"tmp_{{i}}\"] = output",
                 ("vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionAttention.forward (0.13.0, 0.14.0): qk_reshaped "
                  "rotated as it is by ApplyRotaryEmb(enforce_enable=True), MMEncoderAttention._forward_fa"))),
    MmProfileRule(
        first=(0, 15, 0), read_at=((0, 15, 0), (0, 15, 1), (0, 16, 0)), token_counts="no-image",
        dummy_seq="max_model_len", dummy_counts="no-image", items="budget", max_frames=14, expand="none", tie="first",
        image_size="factor", tower="copy",
        sources=("vllm/multimodal/encoder_budget.py MultiModalBudget (0.16.0; vllm/v1/worker/utils.py before)",
                 f"{_RUNNER} (0.15.1): as 0.15.0 and 0.16.0",
                 ("vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionAttention.forward (0.15.0-0.33.0): "
                  "qk_reshaped = qk_reshaped.contiguous(), ApplyRotaryEmb(enforce_enable=True), MMEncoderAttention"),
                 ("vllm/model_executor/layers/rotary_embedding/common.py ApplyRotaryEmb.forward_cuda (0.15.0-0.33.0): "
                  "vllm_flash_attn apply_rotary_emb, enable_fp32_compute False"))),
    MmProfileRule(
        first=(0, 17, 0), read_at=((0, 17, 0), (0, 19, 0), (0, 20, 0), (0, 24, 0), (0, 28, 0), (0, 33, 0)),
        token_counts="no-image", dummy_seq="max_model_len", dummy_counts="no-image", items="budget", max_frames=14,
        expand="none", tie="name", image_size="factor", tower="copy",
        tower_read_at=((0, 17, 0), (0, 18, 0), (0, 21, 0)),
        sources=(("vllm/multimodal/encoder_budget.py MultiModalBudget.get_modality_with_max_tokens (0.17.0-0.33.0): "
                 "key=lambda x: (x[1], x[0])"),
                 ("vllm/model_executor/layers/attention/mm_encoder_attention.py MMEncoderAttention._forward_fa "
                  "(0.21.0): views, vit_flash_attn_wrapper"))),
)

# the first release modelled (V1 by default)
MM_PROFILE_FROM: Release = MM_PROFILE_RULES[0].first
# vllm/config.py MultiModalConfig.get_limit_per_prompt: "If not set by the user, this defaults to `1`."
MM_LIMIT_DEFAULT = 1
# max_pixels in preprocessor_config.json of the Qwen2-VL and Qwen2.5-VL Instruct releases (3,584 x 3,584 =
# 12,845,056; the processor's own default is 28 x 28 x 1280 = 1,003,520).  vLLM 0.8.2 logged an encoder budget
# of 16,384 tokens for Qwen2.5-VL-7B-Instruct (QwenLM/Qwen3-VL issue 1057): (3,584 / 14)^2 / 4 = 16,384.
QWEN_VL_CHECKPOINT_MAX_PIXELS = 12_845_056

MM_PROFILE_SOURCES: tuple[str, ...] = tuple(src for row in MM_PROFILE_RULES for src in row.sources)


def mm_profile_rule(release: Release) -> tuple[MmProfileRule, bool]:
    """The row for ``release`` (the last whose ``first`` is not after it) and whether that release was read
    (False: the nearest earlier row is assumed).  ``release`` must be from ``MM_PROFILE_FROM`` on."""
    row = [r for r in MM_PROFILE_RULES if r.first <= release][-1]
    return row, release in row.read_at


def mm_profile_read(release: Release, checkpoint_max_pixels: int, fixed_image: bool = False) -> bool:
    """Whether vLLM ``release``'s multimodal profile run is modelled for a tower whose released checkpoints'
    ``max_pixels`` is ``checkpoint_max_pixels`` (0: not known): a V1 release from ``MM_PROFILE_FROM`` on and a known
    ``max_pixels``; for a tower fed one fixed-size image (``fixed_image``: Gemma 3's SigLIP), a release from
    ``GEMMA3_MM_FROM`` on (``GEMMA3_MM_ROWS``)."""
    if fixed_image:
        return release >= GEMMA3_MM_FROM
    return release >= MM_PROFILE_FROM and checkpoint_max_pixels > 0


@dataclass(frozen=True, kw_only=True)
class MmV0Rule:
    """One row of the V0 engine's multimodal profile run for Qwen2-VL and Qwen2.5-VL (module docstring)."""

    first: Release
    read_at: tuple[Release, ...]
    # the dummy data of a sequence: dummy_data_for_qwen2_vl (images, capped max_pixels, RuntimeError when too short),
    # the 0.6.6 processor (images, kept when too short), the 0.7.x profiler (images and videos, none when too short)
    dummy: Literal["registry", "processor", "profiler"]
    # how a video's frames are counted: one temporal patch whatever the limit (0.6.x), rounded up to even with
    # max(frames // 2, 1) temporal patches (0.7.0-0.7.2), padded (0.7.3)
    frames: Literal["one", "even", "pad"]
    max_pixels_cap: int  # the cap on the checkpoint's max_pixels (0: none)
    max_frames: int  # qwen2_vl.py _MAX_FRAMES_PER_VIDEO
    # whether inputs_embeds (every token of the batch) is built before the tower runs (0.6.3, 0.7.x) or after
    # (0.6.5-0.6.6: get_multimodal_embeddings first)
    embeds_first: bool
    # whether the tower's outputs stay alive through the language model (a local of forward: 0.6.x) or are freed
    # with get_input_embeddings_v0 (0.7.x)
    outputs_kept: bool
    sources: tuple[str, ...]
    # the first release with Qwen2.5-VL (qwen2_5_vl.py; 0.7.2)
    qwen2_5_from: Release = (0, 7, 2)
    # releases whose vision tower's forward was read or compared (the others assume the 0.8.x "torch" row's bytes)
    tower_read_at: tuple[Release, ...] = ()


_V0_RUNNER = "vllm/worker/model_runner.py ModelRunner._dummy_run"
# 1280 x 28 x 28: qwen2_vl.py _get_max_image_info, 0.6.3 and 0.6.5
_V0_PIXEL_CAP = 1_003_520

MM_V0_RULES: tuple[MmV0Rule, ...] = (
    MmV0Rule(
        first=(0, 6, 1), read_at=((0, 6, 3),), dummy="registry", frames="one", max_pixels_cap=_V0_PIXEL_CAP,
        max_frames=1, embeds_first=True, outputs_kept=True,
        sources=(f"{_V0_RUNNER} (0.6.3 lines 1242-1266): max_num_batched_tokens // max_mm_tokens sequences",
                 ("vllm/model_executor/models/qwen2_vl.py dummy_data_for_qwen2_vl, _get_max_image_info (0.6.3 lines "
                  "658-730): min(max_pixels, 1280 * 28 * 28), RuntimeError when seq_len < tokens + 2"),
                 ("vllm/model_executor/models/qwen2_vl.py Qwen2VLForConditionalGeneration.forward (0.6.3 lines "
                  "1061-1099): embed_tokens, then _process_image_input, image_embeds a local through self.model"))),
    MmV0Rule(
        first=(0, 6, 5), read_at=((0, 6, 5),), dummy="registry", frames="one", max_pixels_cap=_V0_PIXEL_CAP,
        max_frames=1, embeds_first=False, outputs_kept=True,
        sources=(f"{_V0_RUNNER} (0.6.5 lines 1268-1292)",
                 ("vllm/model_executor/models/qwen2_vl.py dummy_data_for_qwen2_vl, _get_max_image_info (0.6.5 lines "
                  "756-850)"),
                 ("vllm/model_executor/models/qwen2_vl.py Qwen2VLForConditionalGeneration.forward (0.6.5 line 1358): "
                  "multimodal_embeddings = self.get_multimodal_embeddings(**kwargs) first, a local through the model"))),
    MmV0Rule(
        first=(0, 6, 6), read_at=((0, 6, 6),), dummy="processor", frames="one", max_pixels_cap=0, max_frames=1,
        embeds_first=False, outputs_kept=True,
        sources=(f"{_V0_RUNNER} (0.6.6 lines 1270-1296)",
                 "vllm/model_executor/models/qwen2_vl.py Qwen2VLMultiModalProcessor._get_dummy_mm_inputs (0.6.6 847-873)",
                 "vllm/multimodal/processing.py BaseMultiModalProcessor.get_dummy_data (0.6.6 lines 848-893): a warning")),
    MmV0Rule(
        first=(0, 7, 0), read_at=((0, 7, 0), (0, 7, 2)), dummy="profiler", frames="even", max_pixels_cap=0,
        max_frames=16, embeds_first=True, outputs_kept=False, tower_read_at=((0, 7, 0), (0, 7, 2)),
        sources=(f"{_V0_RUNNER} (0.7.0, 0.7.2 lines 1279-1303)",
                 "vllm/multimodal/profiling.py MultiModalProfiler.get_dummy_data (0.7.0 line 183, 0.7.2 line 186)",
                 ("vllm/model_executor/models/qwen2_vl.py Qwen2VLProcessingInfo.get_num_frames_with_most_features "
                  "(0.7.0 line 874, 0.7.2 line 880): an odd count above 1 rounded up"))),
    MmV0Rule(
        first=(0, 7, 3), read_at=((0, 7, 3),), dummy="profiler", frames="pad", max_pixels_cap=0, max_frames=16,
        embeds_first=True, outputs_kept=False, tower_read_at=((0, 7, 3),),
        sources=(f"{_V0_RUNNER} (0.7.3 lines 1279-1303; 0.8.0 lines 1287-1310 the same)",
                 "vllm/multimodal/profiling.py MultiModalProfiler.get_dummy_data (0.7.3; 0.8.0 get_decoder_dummy_data)",
                 "vllm/model_executor/models/qwen2_vl.py Qwen2VLForConditionalGeneration.get_input_embeddings_v0 (0.7.3)",
                 "vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VLForConditionalGeneration.forward (0.7.3 line 1012)")),
)

MM_V0_FROM: Release = MM_V0_RULES[0].first
MM_V0_SOURCES: tuple[str, ...] = tuple(src for row in MM_V0_RULES for src in row.sources)


def mm_v0_rule(release: Release) -> tuple[MmV0Rule, bool] | None:
    """The V0 row for ``release`` (before ``MM_PROFILE_FROM``; None before ``MM_V0_FROM``) and whether that
    release was read (False: the nearest earlier row is assumed)."""
    rows = [r for r in MM_V0_RULES if r.first <= release]
    if not rows or release >= MM_PROFILE_FROM:
        return None
    return rows[-1], release in rows[-1].read_at


def mm_v0_read(release: Release, checkpoint_max_pixels: int, fixed_image: bool = False, gated: bool = False) -> bool:
    """Whether the V0 engine's profile run of ``release`` is modelled for a Qwen2-VL-style tower (``MM_V0_RULES``):
    a known ``checkpoint_max_pixels``, not a fixed-size image, a release from ``MM_V0_FROM`` to before
    ``MM_PROFILE_FROM``; Qwen2.5-VL's tower (``gated``: its gated MLP) from the row's ``qwen2_5_from``."""
    found = mm_v0_rule(release)
    if found is None or fixed_image or checkpoint_max_pixels <= 0:
        return False
    return not gated or release >= found[0].qwen2_5_from


# -- Gemma 3 (Gemma3ForConditionalGeneration) --------------------------------------------------------------------
#
# vllm/model_executor/models/gemma3_mm.py, read at 0.8.2 (below), 0.9.0, 0.10.0, 0.11.0, 0.12.0, 0.13.0, 0.21.0 and 0.33.0 (compared at
# 0.14.0-0.18.0, 0.22.0-0.32.0: ``get_num_crops`` 0 without pan-and-scan, no ``get_mm_max_tokens_per_item``):
#
# * ``Gemma3ProcessingInfo.get_supported_mm_limits``: ``{"image": None}``; ``get_num_crops`` returns 0 unless
#   ``do_pan_and_scan`` (off by default in the processor), so every image, the dummy one of
#   ``get_image_size_with_most_features`` too (50 x 50 max_num_crops up to 0.12.x, image_size x image_size
#   max_num_crops later), is resized to one ``image_size`` square: 896 / 14 = 64, 64^2 = 4,096 patches, pooled to
#   ``image_seq_length`` 256 embeddings; ``Gemma3DummyInputsBuilder.get_dummy_mm_data`` ignores ``seq_len``.
# * ``get_image_repl``: the placeholder is ``processor.full_image_sequence`` ("\n\n" <start_of_image> 256 x
#   <image_soft_token> <end_of_image> "\n\n"; "\n\n" is one token, ``vocab["\n\n"]`` in ``_apply_token_matches``),
#   260 tokens of which the 256 image tokens are embeddings (``PromptUpdateDetails.select_token_id``).
# * what the budget counts per item (vllm/multimodal/registry.py ``get_max_tokens_per_item_by_modality``): the
#   embeddings (``get_num_embeds``, 256) in 0.9.0-0.10.x (``profiler.get_mm_max_tokens``); the whole placeholder
#   (``get_mm_max_contiguous_tokens``, ``item.length``, 260) in 0.11.0-0.12.x; the embeddings again from 0.13.0
#   (profiling.py ``get_mm_max_tokens``, 0.15.0 registry.py, 0.16.0 on encoder_budget.py ``get_num_embeds``).
# * the V1 default of ``limit_mm_per_prompt`` (config ``MultiModalConfig.get_limit_per_prompt``): 999 per modality
#   (0.9.0-0.10.x ``999 if envs.VLLM_USE_V1 else 1``; 0.12.0 on "Unspecified modality is set to 999 by default").
# * the encoder path (``_process_image_input``): ``vision_tower(pixel_values)`` (siglip.py ``SiglipVisionModel``),
#   then ``multi_modal_projector`` (avg pool 4 x 4, ``mm_soft_emb_norm``, the projection to the text width),
#   ``image_embeds.split(num_patches)``: one output of 256 rows of the text width an item.
# * the pixels: 0.9.0 passes the processor's float32 (``SiglipVisionEmbeddings.forward`` copies them to the dtype,
#   freed by the patch embedding); from 0.10.0 the processor context casts every floating output to the model's dtype
#   (0.10.0 inputs/registry.py ``maybe_cast_dtype``, 0.11.0 multimodal/processing.py and 0.21.0
#   processing/context.py ``_postprocess_output``).
# * the tower's forward by patch (siglip.py ``SiglipEncoder.forward``, ``SiglipEncoderLayer.forward``, ``SiglipMLP``;
#   the same code 0.10.0-0.33.0, 0.9.0 adds the residual out of place): the embeddings are held through every layer
#   (``hidden_states_pool = [inputs_embeds]`` and the caller's local), the block's input by the loop; attention's
#   moment: input, ``layer_norm1``'s output, qkv (3d), the attention's output and ``out_proj``'s (d each), 7 d c (q,
#   k, v are ``chunk`` views, reshaped as views by the vision attention: xformers in 0.9.0 (``MultiHeadAttention``
#   maps FLASH_ATTN to XFORMERS), FLASH_ATTN on sm80/sm90 from 0.11.0 (``get_vit_attn_backend``; head 72), 0.21.0
#   ``MMEncoderAttention._forward_fa``); the MLP's moment: input, the residual, ``layer_norm2``'s output, fc1's output
#   and the activation's (I each): (3 d + 2 I) c.  ``compile_mm_encoder`` False: eager.  The tower was read at 0.9.0,
#   0.10.0, 0.11.0, 0.21.0; ``SiglipAttention.forward``, ``SiglipEncoderLayer.forward``, ``SiglipMLP.forward`` and
#   ``SiglipEncoder.forward`` compared unchanged (but for a docstring) at 0.12.0-0.18.0, 0.22.0-0.33.0 (0.19.0 and
#   0.20.0 not read: the 0.13.0 row is assumed for them, and said so).  For
#   Gemma 3's SigLIP (d 1,152, I 4,304) the MLP's moment is the larger whatever the backend does with q, k and v:
#   copying all three contiguous would make attention's 10 d = 11,520 elements, below 3 d + 2 I = 12,064.
#
# vLLM 0.8.2 (read in its wheel) counts an item as ``get_num_image_tokens``, the tokens of the placeholder stripped
# of its newlines (<start_of_image>, 256 image tokens, <end_of_image>: 258), and ``get_multimodal_embeddings``
# scatters each item's 256 outputs into a NaN-filled tensor of those 258 rows (``scatter_patch_features``), which is
# what the runner keeps; the limit is 1 when not set.  0.8.0 and 0.8.1 were not read: not modelled.
#
# The runner's part (the number of items, the outputs kept and scattered into zeros) is ``MM_PROFILE_RULES``'s row of
# the release (read in the runner, the same for every model); 0.9.0's runner (``profile_run``: ``cdiv(encoder_budget,
# max_tokens_per_mm_item)``, one item of the modality, ``encoder_cache["tmp"]``) agrees with the 0.8.x row.

# the V1 default of limit_mm_per_prompt (0.9.0-0.33.0, above); MM_LIMIT_DEFAULT is the 0.8.x value
MM_LIMIT_DEFAULT_V1 = 999


@dataclass(frozen=True, kw_only=True)
class Gemma3MmRow:
    """One row: what of vLLM's profile run is Gemma 3's own, from release ``first`` on (comment above)."""

    first: Release
    read_at: tuple[Release, ...]  # releases whose gemma3_mm.py and registry were read
    # what the encoder budget counts per item: the embeddings or the whole placeholder (begin/end of image, newlines)
    # ("features": the placeholder less its two "\n\n" tokens, into whose rows the outputs are scattered, 0.8.x)
    item_tokens: Literal["embeds", "placeholder", "features"]
    pixels: Literal["float32", "dtype"]  # the pixel values as they reach the tower
    tower_read_at: tuple[Release, ...]  # releases whose siglip.py forward was read or compared unchanged
    sources: tuple[str, ...]
    limit_default: int = MM_LIMIT_DEFAULT_V1  # limit_mm_per_prompt when not set


_G3 = "vllm/model_executor/models/gemma3_mm.py"
_SIGLIP = "vllm/model_executor/models/siglip.py SiglipEncoder.forward, SiglipEncoderLayer.forward, SiglipMLP.forward"
# 0.13.0 on: the registry's count and siglip.py's forward read or compared unchanged at these releases
_G3_LATER = ((0, 13, 0), (0, 14, 0), (0, 15, 0), (0, 15, 1), (0, 16, 0), (0, 17, 0), (0, 18, 0), (0, 21, 0), (0, 22, 0),
             (0, 23, 0), (0, 24, 0), (0, 25, 0), (0, 26, 0), (0, 27, 0), (0, 28, 0), (0, 29, 0), (0, 30, 0), (0, 31, 0),
             (0, 32, 0), (0, 33, 0))

GEMMA3_MM_ROWS: tuple[Gemma3MmRow, ...] = (
    Gemma3MmRow(
        first=(0, 8, 2), read_at=((0, 8, 2),), item_tokens="features", pixels="float32", tower_read_at=((0, 8, 2),),
        limit_default=MM_LIMIT_DEFAULT,
        sources=((f"{_G3} Gemma3ProcessingInfo.get_mm_max_tokens_per_item -> get_max_image_tokens -> "
                  "get_num_image_tokens (0.8.2): len(encode_tokens(repl_full.strip(\"\\n\"))), 258"),
                 (f"{_G3} Gemma3ForConditionalGeneration.get_multimodal_embeddings (0.8.2): scatter_patch_features "
                  "into new_full((num_embeds, hidden), nan)"),
                 "vllm/config.py MultiModalConfig.get_limit_per_prompt (0.8.2): limit_per_prompt.get(modality, 1)",
                 f"{_SIGLIP} (0.8.2): hidden_states = residual + hidden_states; MultiHeadAttention xformers")),
    Gemma3MmRow(
        first=(0, 9, 0), read_at=((0, 9, 0),), item_tokens="embeds", pixels="float32", tower_read_at=((0, 9, 0),),
        sources=(f"{_G3} Gemma3ProcessingInfo.get_num_crops, get_image_repl, get_supported_mm_limits (0.9.0)",
                 "vllm/multimodal/profiling.py MultiModalProfiler.get_mm_max_tokens: get_num_embeds (0.9.0)",
                 "vllm/config.py MultiModalConfig.get_limit_per_prompt: 999 if envs.VLLM_USE_V1 (0.9.0)",
                 f"{_SIGLIP} (0.9.0): hidden_states = residual + hidden_states")),
    Gemma3MmRow(
        first=(0, 10, 0), read_at=((0, 10, 0),), item_tokens="embeds", pixels="dtype", tower_read_at=((0, 10, 0),),
        sources=("vllm/inputs/registry.py InputProcessingContext.call_hf_processor maybe_cast_dtype (0.10.0)",
                 f"{_SIGLIP} (0.10.0-0.33.0): hidden_states += residual")),
    Gemma3MmRow(
        first=(0, 11, 0), read_at=((0, 11, 0), (0, 12, 0)), item_tokens="placeholder", pixels="dtype",
        tower_read_at=((0, 11, 0), (0, 12, 0)),
        sources=(("vllm/multimodal/registry.py get_max_tokens_per_item_by_modality (0.11.0, 0.12.0): "
                  "profiler.get_mm_max_contiguous_tokens (item.length)"),
                 f"{_G3} _apply_token_matches (0.11.0): vocab[\"\\n\\n\"] one token",
                 "vllm/platforms/cuda.py CudaPlatform.get_vit_attn_backend (0.11.0): FLASH_ATTN on sm80+")),
    Gemma3MmRow(
        first=(0, 13, 0), read_at=_G3_LATER, item_tokens="embeds", pixels="dtype", tower_read_at=_G3_LATER,
        sources=("vllm/multimodal/profiling.py get_mm_max_tokens: get_num_embeds (0.13.0, 0.14.0)",
                 "vllm/multimodal/encoder_budget.py: get_num_embeds (0.16.0-0.18.0, 0.21.0-0.33.0; 0.15.x registry.py)",
                 "vllm/multimodal/processing/context.py _postprocess_output: floats to the model's dtype (0.21.0-0.33.0)",
                 ("vllm/model_executor/layers/attention/mm_encoder_attention.py MMEncoderAttention._forward_fa "
                  "(0.21.0): views"))),
)

GEMMA3_MM_FROM: Release = GEMMA3_MM_ROWS[0].first
GEMMA3_MM_SOURCES: tuple[str, ...] = tuple(src for row in GEMMA3_MM_ROWS for src in row.sources)


def gemma3_mm_row(release: Release) -> tuple[Gemma3MmRow, bool]:
    """Gemma 3's row for ``release`` (from ``GEMMA3_MM_FROM`` on) and whether that release was read (False: the
    nearest earlier row is assumed)."""
    row = [r for r in GEMMA3_MM_ROWS if r.first <= release][-1]
    return row, release in row.read_at
