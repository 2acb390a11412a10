"""A real CPU run of Qwen2.5-VL's vision tower as transformers releases run it: how its attention sees the images.

Checks, on the code of the release that is installed, what facts/transformers.py ``QWEN_VL_PACKED_ATTENTION`` says:
before 4.54 every tower layer hands attention one sequence of all the forward's patches (``S``) with a block-diagonal
``[1, S, S]`` mask (4.45-4.51 SDPA: 3-D q/k/v, which aten's fused kernels refuse, so the math kernel runs), from 4.54
one call per image.  It wraps ``torch.nn.functional.scaled_dot_product_attention`` (and records the eager path's
softmax inputs), runs the tower without grad over two 448 x 448 images (1,024 patches each) in bf16 with Qwen2.5-VL-3B's
tower shapes at depth 2, and measures the forward's peak CPU allocation with torch's profiler (``profile_memory``:
every allocation of the CPU allocator, a composite kernel's temporaries included) above the inputs and weights.

The peak is printed against the analytic engine's running layer (analytic/inference.py ``tower_forward_bytes``)
without the pixels and rotary tables, which exist before the measured window: 9 B per score is the CUDA math
kernel's figure measured on an H200 (the fp32 scores, the softmax's output and one byte per score more); aten's
CPU ``_safe_softmax`` is a composite of softmax, ``eq``, ``all`` and ``where`` whose temporaries a CPU run may hold at
once (13 B per score), so the CPU figure is expected between the two.

Run with a transformers release in the environment (``pip install transformers==4.49.0`` in a separate venv, torch
2.13 CPU), e.g. ``/work/scratch/tf449/bin/python benchmarks/qwen_vl_packed_attention_cpu.py``; results and the
command that made them: ``benchmarks/qwen_vl_packed_attention_cpu.txt``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import transformers


def main() -> None:
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mod

    cfg_cls = mod.Qwen2_5_VLVisionConfig if hasattr(mod, "Qwen2_5_VLVisionConfig") else None
    if cfg_cls is None:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as cfg_cls
    # Qwen2.5-VL-3B-Instruct's vision_config (hidden 1280, 16 heads, MLP 3420, out 2048), two blocks
    cfg = cfg_cls(depth=2, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                  fullatt_block_indexes=[1], window_size=112, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)
    cfg._attn_implementation = sys.argv[1] if len(sys.argv) > 1 else "sdpa"
    model = mod.Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg, torch_dtype=torch.bfloat16).eval()
    grid = torch.tensor([[1, 32, 32], [1, 32, 32]])  # two 448 x 448 images: 32 x 32 patches each
    patches = int(grid.prod(-1).sum())
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, dtype=torch.bfloat16)

    calls: list[str] = []
    real = F.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
            *args: object, **kwargs: object) -> torch.Tensor:
        mask = "none" if attn_mask is None else f"{tuple(attn_mask.shape)} {str(attn_mask.dtype).split('.')[-1]}"
        calls.append(f"SDPA q {tuple(q.shape)} ({q.dim()}-D), mask {mask}")
        return real(q, k, v, attn_mask, *args, **kwargs)

    F.scaled_dot_product_attention = spy  # the modeling file calls F.scaled_dot_product_attention / its integration
    torch.nn.functional.scaled_dot_product_attention = spy
    with torch.no_grad():
        model(pixels, grid_thw=grid)  # warm up (lazy buffers)
        calls.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True, with_stack=True) as prof:
            model(pixels, grid_thw=grid)
    # the profiler's memory timeline (torch.profiler._memory_profiler): every allocation and free of the CPU
    # allocator in order, whatever op made it; the peak of the running sum above the start
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    raw = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    totals = [sum(row) for row in raw[1]]
    peak = max(totals) - totals[0]

    s, heads, h, q = patches, 16, 1280, 1280
    math_layer = (2 * h + q) * s * 2 + 12 * q * s + 9 * heads * s * s + 3 * s * s  # tower_forward_bytes, 4.49 sdpa
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, attention {cfg._attn_implementation}")
    print(f"patches S = {patches:,} (two images of 1,024)")
    for c in dict.fromkeys(calls):
        print(f"  {calls.count(c)} x {c}")
    print(f"forward peak above the inputs and weights (CPU allocator, profiler): {peak:,} B")
    print(f"engine's packed math layer at S (9 B/score CUDA-measured + masks + q/k/v copies): {math_layer:,} B; "
          f"at 13 B/score: {math_layer + 4 * heads * s * s:,} B")


if __name__ == "__main__":
    main()
