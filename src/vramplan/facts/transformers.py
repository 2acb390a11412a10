"""The first transformers release that knows each model family, as data.

``data/transformers_model_types.json`` lists, for every ``model_type`` transformers has shipped, the first
release whose ``AutoConfig`` maps it (read off the release wheels on PyPI by
``benchmarks/transformers_first_release.py``).  A scenario that names ``software.transformers`` older than
its model's first release describes a run that cannot load the model (``spec/checks.py`` refuses it), where
the loss code of that release would otherwise be applied to a family it never ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["CURRENT_RELEASE_NOTE", "MAMBA2_SCAN_EINSUM_RELEASE", "OWN_MODEL_FRAMEWORKS", "QWEN_VL_PACKED_ATTENTION",
           "STACKED_EXPERT_CHECKPOINTS", "PackedAttention", "first_release", "mamba2_scan_broadcasts",
           "qwen_vl_packed_attention", "release_tuple"]


@cache
def _table() -> dict[str, object]:
    text = resources.files("vramplan.facts").joinpath("data/transformers_model_types.json").read_text()
    doc: dict[str, object] = json.loads(text)
    return doc


def release_tuple(text: str) -> tuple[int, ...]:
    """A release string as a comparable tuple of three numbers: "4.45" -> (4, 45, 0)."""
    parts = [int(x) for x in text.split(".")]
    return tuple((parts + [0, 0, 0])[:3])


def first_release(model_type: str) -> str | None:
    """The first transformers release whose AutoConfig knows ``model_type``; None when the table does not
    list it or when the type is in the oldest release read (4.26.0), whose own first release is unknown.

    >>> first_release("qwen3"), first_release("llama"), first_release("gpt2")
    ('4.51.0', '4.28.0', None)
    """
    doc = _table()
    rows = doc["first_release"]
    assert isinstance(rows, dict)
    found = rows.get(model_type)
    if not isinstance(found, str) or found == doc["oldest_release_read"]:
        return None
    return found


# The first transformers release whose torch Mamba2 scan (``mamba2_chunk_scan``, shared by bamba, falcon_h1,
# granitemoehybrid, mamba2, nemotron_h and zamba2) contracts with ``torch.einsum``.  Before it (read in the 5.17.0
# wheel, ``models/bamba/modeling_bamba.py``) the scan multiplies broadcast views and sums the product:
# ``G = (C[:, :, :, None, :, :] * B[:, :, None, :, :, :]).sum(dim=-1)``, ``Y_diag = (M[..., None] *
# hidden_states[:, :, None]).sum(dim=3)``, ``states = (B_decay[..., None, :] * hidden_states[..., None]).sum(dim=2)``,
# ``new_states = (decay_chunk[..., None, None] * states[:, :, None, ...]).sum(dim=1)`` and ``C_times_states = C[...,
# None, :] * states[:, :, None, ...]``, each product a full fp32 tensor of the broadcast shape (the 5.18.0, 5.19.0,
# 5.20.0, 5.22.0, 5.23.0 and 5.24.0 wheels have the einsums).  Measured on an H100 (torch 2.11, transformers 5.17.0,
# benchmarks/gpu/h100-2026-11-27): a synthetic Bamba at 8 x 2,048 prompt tokens asked for G's product,
# 8 x 8 x 256 x 256 x 64 x 128 x 4 B = 128 GiB.
MAMBA2_SCAN_EINSUM_RELEASE: tuple[int, int, int] = (5, 18, 0)


def mamba2_scan_broadcasts(transformers_version: tuple[int, ...] | None) -> bool:
    """Whether the torch Mamba2 scan of that transformers release materializes its broadcast products (before
    5.18.0); False when the release is unset (the current release's einsum scan is modelled).

    >>> mamba2_scan_broadcasts((5, 17)), mamba2_scan_broadcasts((5, 18)), mamba2_scan_broadcasts(None)
    (True, False, False)
    """
    if transformers_version is None:
        return False
    padded = tuple((list(transformers_version) + [0, 0, 0])[:3])  # "5.18" is (5, 18): the same release as 5.18.0
    return padded < MAMBA2_SCAN_EINSUM_RELEASE


# The frameworks whose jobs run their own model code, not transformers' ``modeling_*.py``: what a transformers
# release does (its buffers, its attention defaults, its cache) does not apply to them.  AutoAWQ runs transformers'
# model but its own fused attention and cache (analytic/autoawq.py).
OWN_MODEL_FRAMEWORKS = frozenset({"torchtitan", "lightning", "litgpt", "torchtune", "megatron", "vllm", "autoawq"})

# said by a report of a job that runs transformers' model code without ``software.transformers``
CURRENT_RELEASE_NOTE = ("transformers: the current release's code is assumed (software.transformers not given); an older "
                        "release differs in its loss, registered buffers, attention default, SDPA's grouped K/V and the "
                        "training forward's cache (docs/conventions.md): set software.transformers for a run on one")


# MoE model types whose checkpoints hold each routed expert's projections as their own tensors and whose transformers
# 5 load stacks them into the fused 3-D parameters (transformers 5.24 conversion_mapping.py: a ``WeightConverter`` with
# ``MergeModulelist``, and ``Concatenate`` for gate and up, ``force_cpu`` off; core_model_loading.py materializes each
# checkpoint tensor on the parameter's device, ``spawn_materialize(..., param_device, ...)``, then ``torch.stack`` /
# ``torch.cat`` there).  Listed with ``get_checkpoint_conversion_mapping`` for every MoE model type of the catalog;
# gpt-oss, Llama 4, DBRX and GraniteMoE ship fused experts (no converter).
STACKED_EXPERT_CHECKPOINTS: frozenset[str] = frozenset({
    "deepseek_v2", "deepseek_v3", "ernie4_5_moe", "glm4_moe", "mixtral", "nemotron_h", "olmoe", "phimoe", "qwen2_moe",
    "qwen3_moe", "qwen3_next", "qwen3_omni_moe",
})


@dataclass(frozen=True)
class PackedAttention:
    """How a Qwen2-VL / Qwen2.5-VL vision tower of one transformers release runs a non-flash attention over the
    micro-batch's images, packed into one sequence of ``S`` patches (``cu_seqlens`` marks each image's; the window
    blocks of Qwen2.5-VL mark its windows): every layer builds a block-diagonal ``[1, S, S]`` mask and attends over
    all ``S`` patches at once, so the scores are ``heads x S^2`` however many images the pack holds.

    ``kernel``: what runs, ``"math"`` (SDPA on 3-D q/k/v: aten ``check_tensor_shapes`` admits only 4-D inputs to the
    fused kernels, so ``select_sdp_backend`` falls through to ``_scaled_dot_product_attention_math``),
    ``"efficient"`` (SDPA on 4-D q/k/v with the mask: the memory-efficient kernel, which takes a mask and keeps it
    for the backward) or ``"eager"`` (``matmul`` -> ``softmax(dtype=float32)`` -> ``matmul`` over the scores);
    ``bool_mask``: the model builds the mask as ``torch.bool`` (SDPA converts it to the query's dtype,
    aten ``convert_boolean_attn_mask``: one byte and one copy more per score), else in the query's dtype."""

    first: tuple[int, int, int]
    last: tuple[int, int, int]
    attention: str  # train.attention / inference.attention this row is for ("sdpa" or "eager")
    kernel: str
    bool_mask: bool
    source: str


# Read in the release wheels on PyPI (models/qwen2_vl/modeling_qwen2_vl.py, models/qwen2_5_vl/modeling_qwen2_5_vl.py;
# Qwen2-VL from 4.45.0, Qwen2.5-VL from 4.49.0):
# * 4.45.0-4.51.x: ``VisionSdpaAttention.forward`` builds ``torch.zeros([1, seq_length, seq_length],
#   dtype=torch.bool)``, sets each cu_seqlens block True and calls ``F.scaled_dot_product_attention(q, k, v,
#   attention_mask)`` on q/k/v of shape [heads, S, head_dim] (3-D: 4.49.0 modeling_qwen2_5_vl.py lines 314-320);
#   ``VisionAttention`` (eager) builds ``torch.full([1, S, S], finfo.min, dtype=q.dtype)`` and runs
#   ``matmul(q, k^T) / sqrt(d)`` + mask -> ``softmax(dtype=torch.float32).to(q.dtype)`` -> ``matmul`` (lines 265-277);
# * 4.52.x: the same masks, SDPA now on ``q.unsqueeze(0)`` (4-D: 4.52.4 modeling_qwen2_5_vl.py lines 302-312);
# * 4.53.x: one ``VisionAttention`` through ``ALL_ATTENTION_FUNCTIONS`` with ``torch.full([1, 1, S, S], finfo.min,
#   dtype=value.dtype)`` for every implementation but flash (4.53.0 lines 236-268);
# * 4.54.0 on: non-flash implementations split q/k/v at cu_seqlens and attend within each chunk ("Other
#   implementations: Process each chunk separately", 4.54.0 modeling_qwen2_5_vl.py line 265): the per-image
#   attention the engines model for the current release.
# flash_attention_2 runs varlen over cu_seqlens in every release (no mask).
QWEN_VL_PACKED_ATTENTION: tuple[PackedAttention, ...] = (
    PackedAttention((4, 45, 0), (4, 51, 99), "sdpa", "math", True,
                    "transformers 4.45.0-4.51 VisionSdpaAttention: 3-D q/k/v, bool [1, S, S] mask"),
    PackedAttention((4, 52, 0), (4, 52, 99), "sdpa", "efficient", True,
                    "transformers 4.52 VisionSdpaAttention: 4-D q/k/v, bool [1, S, S] mask"),
    PackedAttention((4, 53, 0), (4, 53, 99), "sdpa", "efficient", False,
                    "transformers 4.53 VisionAttention via sdpa_attention_forward: [1, 1, S, S] mask in value's dtype"),
    PackedAttention((4, 45, 0), (4, 53, 99), "eager", "eager", False,
                    "transformers 4.45.0-4.53 VisionAttention (eager): [1, S, S] mask in the query's dtype"),
)


def qwen_vl_packed_attention(transformers_version: tuple[int, ...] | None, attention: str) -> PackedAttention | None:
    """The row of ``QWEN_VL_PACKED_ATTENTION`` for a release and the run's attention setting; None for the current
    release (unset), 4.54 and later (per-image chunks), and flash attention (varlen).

    >>> qwen_vl_packed_attention((4, 49), "sdpa").kernel, qwen_vl_packed_attention((4, 53, 1), "sdpa").kernel
    ('math', 'efficient')
    >>> qwen_vl_packed_attention((4, 54), "sdpa"), qwen_vl_packed_attention(None, "eager")
    (None, None)
    """
    if transformers_version is None:
        return None
    v = tuple((list(transformers_version) + [0, 0, 0])[:3])
    for row in QWEN_VL_PACKED_ATTENTION:
        if row.attention == attention and row.first <= v <= row.last:
            return row
    return None
