"""Which attention kernel runs, as PyTorch's SDPA dispatcher and transformers would pick it on a CUDA GPU.

Shared by the training step and the inference pass.  What a family offers comes from its adapter's traits
(``ModelSpec.traits``: ``attention_kernels``, ``mqa_sdpa_math``), never from its name.
"""

from __future__ import annotations

from vramplan.facts.precisions import PrecisionPolicy
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = ["falls_back_to_eager", "resolve_attention"]


def falls_back_to_eager(want: str, m: ModelSpec) -> bool:
    """``sdpa`` asked of a class without an SDPA path (``_supports_sdpa = False``, e.g. gpt-oss, whose
    per-head attention sinks join the softmax): transformers' default falls back to eager
    (modeling_utils ``get_correct_attn_implementation``), which is what the default ``sdpa`` is taken to mean."""
    return want == "sdpa" and "sdpa" not in m.traits.attention_kernels


def resolve_attention(s: Scenario, m: ModelSpec, pol: PrecisionPolicy) -> tuple[str, bool]:
    """The kernel that runs, and whether K/V are repeated to every query head.

    SDPA picks flash for fp16/bf16 with head_dim <= 256, else memory-efficient (which also
    takes fp32); both save no s x s tensor.  ``eager`` materializes the scores and repeats
    K/V to every query head (transformers' ``repeat_kv``).
    """
    want = s.train.attention if s.task == "train" else s.inference.attention
    if want == "eager" or falls_back_to_eager(want, m):
        return "eager", m.num_kv_heads < m.num_attention_heads
    if want == "flash":
        return "flash", False
    if m.traits.mqa_sdpa_math and m.num_kv_heads == 1 < m.num_attention_heads:
        # FalconAttention (multi_query) hands SDPA one K/V head without enable_gqa; the fused kernels need
        # equal head counts then (sdp_utils_cpp.h check_batch_size_and_num_heads_dense), so SDPA runs math
        return "math", False
    if pol.compute_bytes == 4 or m.head_dim > 256:
        return "efficient", False
    return "flash", False
