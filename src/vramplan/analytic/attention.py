"""Which attention kernel runs, as PyTorch's SDPA dispatcher and transformers would pick it on a CUDA GPU.

Shared by the training step and the inference pass.  What a family offers comes from its adapter's traits
(``ModelSpec.traits``: ``attention_kernels``, ``mqa_sdpa_math``), never from its name.
"""

from __future__ import annotations

from vramplan.facts.precisions import PrecisionPolicy
from vramplan.facts.transformers import OWN_MODEL_FRAMEWORKS
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = [
    "BF16_MATH_NOTE",
    "MEM_EFFICIENT_GQA_TORCH",
    "MQA_MATH_NOTE",
    "TRANSFORMERS_ENABLE_GQA",
    "bf16_math_fallback",
    "falls_back_to_eager",
    "gqa_math_fallback",
    "gqa_math_note",
    "litgpt_kv_repeated",
    "mem_efficient_mask_row",
    "mqa_kv_copied",
    "mqa_math",
    "resolve_attention",
]

# transformers passes ``enable_gqa=True`` to SDPA instead of repeating K/V (integrations/sdpa_attention.py
# ``use_gqa_in_sdpa``: torch >= 2.5 and no attention mask) from 4.54.0; read off the 4.53.0 and 4.54.0 wheels
TRANSFORMERS_ENABLE_GQA = (4, 54)
# the first PyTorch release whose memory-efficient SDPA kernel takes grouped K/V (the 2.14 docstring of
# ``scaled_dot_product_attention``; 2.13's says GQA "works only for Flash_attention and math kernel")
MEM_EFFICIENT_GQA_TORCH = (2, 14)


def _capability(gpu: GpuSpec | None) -> tuple[int, int] | None:
    return gpu.cuda_capability if gpu is not None else None


def _flash_runs(m: ModelSpec, compute_bytes: int, cap: tuple[int, int] | None) -> bool:
    """PyTorch's flash kernel: fp16/bf16, head_dim <= 256, sm80 or newer (``can_use_flash_attention``,
    sdp_utils.cpp); a GPU of unknown capability is taken as sm80+."""
    if compute_bytes == 4 or m.head_dim > 256:
        return False
    return cap is None or cap >= (8, 0)


def gqa_math_fallback(s: Scenario, m: ModelSpec, compute_bytes: int, gpu: GpuSpec | None) -> bool:
    """True when a grouped-query model's SDPA attention runs the math kernel because flash cannot run and
    the memory-efficient kernel refuses grouped K/V.

    transformers >= 4.54 hands SDPA the K/V heads with ``enable_gqa=True`` when no mask is passed (full-length
    sequences; a sliding window reached by the sequence builds a mask, and then K/V are repeated instead);
    flash is ruled out by fp32, a GPU before sm80 (T4, V100) or head_dim > 256; torch <= 2.13's
    memory-efficient kernel requires equal head counts (``check_batch_size_and_num_heads_dense<false>``), so
    ``select_sdp_backend`` falls through to math (measured: benchmarks/gpu/h200-2026-11-26, Qwen3-0.6B fp32).
    """
    if gpu is not None and gpu.vendor != "nvidia":
        return False  # ROCm's kernels have other rules; not modelled here
    if not (m.num_kv_heads < m.num_attention_heads) or m.mla is not None:  # grouped or multi-query K/V
        return False
    if m.traits.sdpa_mask_always:
        return False  # a mask on every forward: K/V repeated to every head, which the efficient kernel takes
    tv, torch_v = s.software.transformers_version, s.software.torch_version
    if tv is not None and tv < TRANSFORMERS_ENABLE_GQA:
        return False
    if torch_v is not None and (torch_v >= MEM_EFFICIENT_GQA_TORCH or torch_v < (2, 5)):
        return False
    seq = s.train.seq_len if s.task == "train" else s.inference.prompt_len
    if any(layer.sliding_window and seq >= layer.sliding_window for layer in m.layers):
        return False
    return not _flash_runs(m, compute_bytes, _capability(gpu))


def mem_efficient_mask_row(keys: int) -> int:
    """Keys per row of the mask SDPA's memory-efficient kernel keeps: aten ``preprocess_mask``
    (transformers/attention.cpp, ``mem_eff_alignment = 8``) pads a mask whose rows are not a multiple of 8
    elements (``pad_bias``: a padded copy, sliced back) and hands the kernel the padded one."""
    return -(-keys // 8) * 8


def falls_back_to_eager(want: str, m: ModelSpec, transformers: tuple[int, ...] | None = None) -> bool:
    """``sdpa`` asked of a class without an SDPA path (``_supports_sdpa = False``, e.g. gpt-oss, whose
    per-head attention sinks join the softmax; Gemma 2 from transformers 5.21, ``Traits.sdpa_dropped_in``):
    transformers' default falls back to eager (modeling_utils ``get_correct_attn_implementation``), which is
    what the default ``sdpa`` is taken to mean.  ``transformers``: the run's release (None: the current one)."""
    if want != "sdpa":
        return False
    dropped = m.traits.sdpa_dropped_in
    if dropped is not None and (transformers is None or transformers >= dropped):
        return True
    ed = m.encoder_decoder
    if ed is not None and ed.relative_bias_layers != "none" and transformers is not None and transformers < (5, 0):
        # T5, mT5, UMT5 before transformers 5.0: T5Attention.forward computes its scores itself and
        # T5PreTrainedModel sets no _supports_sdpa (modeling_t5.py, 4.30.2 to 4.57.1)
        return True
    return "sdpa" not in m.traits.attention_kernels


def bf16_math_fallback(dtype: str, gpu: GpuSpec | None) -> bool:
    """True for a bf16 SDPA call on an NVIDIA GPU before sm80 (T4, V100): flash needs sm80, cuDNN attention sm80,
    and the memory-efficient kernel takes only fp16 and fp32 there (sdp_utils.cpp
    ``less_than_sm80_mem_efficient_dtypes``), so ``select_sdp_backend`` falls to math whatever the heads."""
    cap = _capability(gpu)
    return dtype == "bf16" and cap is not None and cap < (8, 0) and (gpu is None or gpu.vendor == "nvidia")


BF16_MATH_NOTE = ("bf16 on a GPU before sm80: neither flash nor the memory-efficient kernel takes bf16 there "
                  "(sdp_utils.cpp), so SDPA runs its math kernel, which holds the s x s scores and their softmax "
                  "in fp32 (fp16 would run the memory-efficient kernel)")


def gqa_math_note(s: Scenario) -> str:
    """The assumption a report states when ``gqa_math_fallback`` holds."""
    release = f"torch {s.software.torch}" if s.software.torch else "torch <= 2.13 assumed (software.torch not given)"
    return ("grouped K/V handed to SDPA with enable_gqa (transformers >= 4.54, no mask) where flash cannot run "
            f"(fp32, a GPU before sm80 or head_dim > 256): the math kernel saves the s x s softmax in fp32 ({release}; "
            "from torch 2.14 the memory-efficient kernel takes grouped K/V and saves none)")


def mqa_math(m: ModelSpec) -> bool:
    """FalconAttention (multi_query) hands SDPA one K/V head without enable_gqa; the fused kernels need equal head
    counts then (sdp_utils_cpp.h check_batch_size_and_num_heads_dense), so SDPA runs math, training or not."""
    return m.traits.mqa_sdpa_math and m.num_kv_heads == 1 < m.num_attention_heads


MQA_MATH_NOTE = ("one K/V head handed to SDPA without enable_gqa (FalconAttention, multi_query): no fused kernel "
                 "takes unequal head counts, so SDPA runs its math kernel, which holds the s x s scores and their "
                 "softmax in fp32")


def mqa_kv_copied(s: Scenario, m: ModelSpec) -> bool:
    """Whether eager attention's (or Falcon's math kernel's) K/V end up copied to every query head in what the two
    matmuls save.

    Grouped K/V (more than one K/V head) are copied by transformers' ``repeat_kv`` (``expand`` then ``reshape``:
    the K/V-head and repeat dimensions do not merge).  One K/V head is not copied by it: the size-1 K/V-head
    dimension takes no part in the strides, so ``repeat_kv`` returns a stride-0 view; Falcon does not repeat at all.
    ``query @ key.transpose(-1, -2)`` and ``scores @ value`` (eager, or SDPA's math kernel on the fp32 copies)
    then broadcast the one head.  ``matmul`` on 4-D operands (aten LinearAlgebra.cpp
    ``_matmul_impl``) expands each to the common batch shape and reshapes ``[b, heads, ...]`` to
    ``[b * heads, ...]`` for ``bmm``: with b = 1 the size-1 batch dimension takes no part in the strides and the
    stride-0 head dimension becomes the batch, a view of the one head; with b > 1 the two do not merge and
    ``reshape`` copies the head to every query head.  ``bmm`` saves what it is given: one head, or the copy.
    """
    return m.num_kv_heads < m.num_attention_heads and (
        m.num_kv_heads > 1 or (s.train.micro_batch_size if s.task == "train" else s.inference.batch_size) > 1)


def litgpt_kv_repeated(s: Scenario, m: ModelSpec) -> bool:
    """Whether Lit-GPT's ``CausalSelfAttention`` (``framework: lightning``) copies K/V to every query head before SDPA
    in a training step, for a model with fewer K/V heads than query heads.

    lit-gpt 9053b8f8 (2023-08-16) to 50b1974b~1, lit_gpt/model.py: ``if self.config.n_query_groups != 1:
    k = k.expand(B, n_query_groups, q_per_kv, T, head_size)`` then ``k = k.reshape(B, -1, T, head_size)`` (v alike):
    the group and repeat dimensions do not merge, so ``reshape`` copies (at 8641822, the commit of the resource
    tables, lines 208-215).  From 50b1974b (2023-10-24; every tagged release, v0.3.1 on) the condition is
    ``n_query_groups != n_head and (input_pos is None or n_query_groups != 1)``, so a training step (no
    ``input_pos``) copies one K/V head too; from fabf765b (v0.5.5) the copy is ``repeat_interleave(q_per_kv, dim=1)``
    (litgpt/model.py v0.5.9 lines 441-444), the same bytes.  SDPA then gets equal head counts and no mask
    (``is_causal=mask is None``, v0.5.9 line 493): flash where it runs, else the memory-efficient kernel, each
    saving the copied K/V.  One K/V head before 50b1974b is not expanded (SDPA's math kernel, as transformers'
    Falcon); vramplan follows the tagged releases there (no Lit-GPT release field).
    """
    return (s.task == "train" and s.effective_framework == "lightning" and s.train.attention == "sdpa"
            and m.mla is None and m.num_kv_heads < m.num_attention_heads)


def resolve_attention(s: Scenario, m: ModelSpec, pol: PrecisionPolicy,
                      gpu: GpuSpec | None = None) -> tuple[str, bool]:
    """The kernel that runs, and whether K/V are repeated to every query head.

    SDPA picks flash for fp16/bf16 with head_dim <= 256 on sm80+, else memory-efficient (which also
    takes fp32); both save no s x s tensor, except that a grouped-query model falls to the math kernel
    where flash cannot run (``gqa_math_fallback``).  ``eager`` materializes the scores and repeats
    K/V to every query head (transformers' ``repeat_kv``).
    """
    want = s.train.attention if s.task == "train" else s.inference.attention
    if litgpt_kv_repeated(s, m):
        # Lit-GPT's own attention: K/V copied to every query head, SDPA on equal heads without a mask
        if pol.compute_bytes == 2 and bf16_math_fallback(pol.half, gpu):
            return "math", False
        return ("flash" if _flash_runs(m, pol.compute_bytes, _capability(gpu)) else "efficient"), True
    if want == "eager" or falls_back_to_eager(want, m, s.software.transformers_version):
        return "eager", mqa_kv_copied(s, m)
    if want == "flash":
        return "flash", False
    if mqa_math(m):
        return "math", mqa_kv_copied(s, m)
    if gqa_math_fallback(s, m, pol.compute_bytes, gpu) or (
            pol.compute_bytes == 2 and bf16_math_fallback(pol.half, gpu)):
        return "math", False
    ed = m.encoder_decoder
    relative_bias = ed is not None and ed.relative_bias_layers != "none"
    if not _flash_runs(m, pol.compute_bytes, _capability(gpu)) or m.traits.sdpa_mask_always or (
            relative_bias and s.task == "train"):
        # T5's relative position bias is SDPA's additive mask in every layer (integrations/sdpa_attention.py
        # create_position_bias_mask, transformers 5.24)
        # flash takes no attn_mask (sdp_utils.cpp ``check_for_attn_mask``): a model that always passes one
        # (``Traits.sdpa_mask_always``) runs the memory-efficient kernel
        return "efficient", sdpa_repeats_kv(s, m) and not m.traits.sdpa_mask_always and not relative_bias
    return "flash", sdpa_repeats_kv(s, m)


def sdpa_repeats_kv(s: Scenario, m: ModelSpec) -> bool:
    """transformers before 4.54 repeats grouped K/V to every query head before calling SDPA (``repeat_kv`` in each
    ``*SdpaAttention.forward`` of 4.36-4.47, in ``integrations/sdpa_attention.py`` ``sdpa_attention_forward`` of
    4.48-4.53; 4.54 passes ``enable_gqa=True`` instead, ``TRANSFORMERS_ENABLE_GQA``), so the kernel saves the
    repeated copies for its backward, the query heads' width, not the K/V heads'.  One K/V head is repeated as a
    stride-0 view (no copy); a scenario without ``software.transformers`` is the current release."""
    tv = s.software.transformers_version
    return (tv is not None and tv < TRANSFORMERS_ENABLE_GQA and 1 < m.num_kv_heads < m.num_attention_heads
            and m.mla is None and s.effective_framework not in OWN_MODEL_FRAMEWORKS)
