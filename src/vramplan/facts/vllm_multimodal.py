"""vLLM's multimodal profile run by release, as data (serve/vllm_mm.py applies it).

Read in the wheels of vLLM 0.8.0 and 0.8.2 (``pip download vllm==X --no-deps``):

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

Before 0.8.0 (the V0 engine) the encoder ran inside the dummy sequences' forward (``vllm/worker/model_runner.py``
``profile_run``); that path, and releases after 0.8.x (whose profile run was rewritten), are not read here.
"""

from __future__ import annotations

__all__ = ["MAX_FRAMES_PER_VIDEO", "MM_LIMIT_DEFAULT", "MM_PROFILE_FROM", "MM_PROFILE_READ_AT", "MM_PROFILE_SOURCES",
           "MM_PROFILE_UNTIL", "QWEN_VL_CHECKPOINT_MAX_PIXELS", "mm_profile_read"]

Release = tuple[int, int, int]

# the releases whose profile run was read and follows the rules above
MM_PROFILE_READ_AT: tuple[str, ...] = ("0.8.0", "0.8.2")
# the first release modelled and the first that is not (0.9.0 on: not read)
MM_PROFILE_FROM: Release = (0, 8, 0)
MM_PROFILE_UNTIL: Release = (0, 9, 0)
# vllm/config.py MultiModalConfig.get_limit_per_prompt: "If not set by the user, this defaults to `1`."
MM_LIMIT_DEFAULT = 1
# vllm/model_executor/models/qwen2_vl.py _MAX_FRAMES_PER_VIDEO (0.8.0, 0.8.2)
MAX_FRAMES_PER_VIDEO = 16
# max_pixels in preprocessor_config.json of the Qwen2-VL and Qwen2.5-VL Instruct releases (3,584 x 3,584 =
# 12,845,056; the processor's own default is 28 x 28 x 1280 = 1,003,520).  vLLM 0.8.2 logged an encoder budget
# of 16,384 tokens for Qwen2.5-VL-7B-Instruct (QwenLM/Qwen3-VL issue 1057): (3,584 / 14)^2 / 4 = 16,384.
QWEN_VL_CHECKPOINT_MAX_PIXELS = 12_845_056

MM_PROFILE_SOURCES: tuple[str, ...] = (
    "vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run (0.8.0, 0.8.2)",
    "vllm/v1/core/encoder_cache_manager.py _compute_encoder_budget_multimodal (0.8.0, 0.8.2)",
    "vllm/model_executor/models/qwen2_vl.py Qwen2VLProcessingInfo (0.8.0, 0.8.2)",
    "vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionTransformer.forward (0.8.2)",
)


def mm_profile_read(release: Release, checkpoint_max_pixels: int) -> bool:
    """Whether vLLM ``release``'s multimodal profile run is modelled for a tower whose released checkpoints'
    ``max_pixels`` is ``checkpoint_max_pixels`` (0: not known): a release from ``MM_PROFILE_FROM`` up to
    ``MM_PROFILE_UNTIL`` and a known ``max_pixels``."""
    return MM_PROFILE_FROM <= release < MM_PROFILE_UNTIL and checkpoint_max_pixels > 0
