"""Every catalog GPU through the paths that read its compute capability: an estimate or a ScenarioError, never
another exception.  AMD GPUs spell theirs as an architecture ("gfx942", "gfx950"), which CUDA's "major.minor"
parsing once met with a ValueError: vLLM's MXFP4 expert layout (now refused on them: the ROCm backends' layout is
not read) and Liger's fused linear cross-entropy (now the mm-then-cast path, the larger, off CUDA)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.gpus import gpu_names
from vramplan.engine import estimate
from vramplan.errors import ScenarioError, VramplanError

DOCS: list[dict[str, Any]] = [
    {"model": "openai/gpt-oss-20b", "task": "serve", "serve": {"max_model_len": 4096}},
    {"model": "openai/gpt-oss-20b", "task": "serve", "serve": {"engine": "sglang", "max_model_len": 4096}},
    {"model": "meta-llama/Llama-3.1-8B", "task": "train", "train": {"loss": "liger-fused-linear-ce", "seq_len": 1024}},
    {"model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": "torchtitan",
     "train": {"precision": "fp8-torchao", "seq_len": 1024}},
    {"model": "meta-llama/Llama-3.1-8B", "task": "inference", "inference": {"prompt_len": 512, "new_tokens": 64}},
    {"model": "deepseek-ai/DeepSeek-V2-Lite", "task": "serve", "serve": {"max_model_len": 4096}},
]


@pytest.mark.parametrize("gpu", gpu_names())
def test_every_gpu_answers_or_refuses(gpu: str) -> None:
    for doc in DOCS:
        try:
            estimate({**doc, "hardware": {"gpu": gpu}})
        except VramplanError:
            pass


def test_mxfp4_serving_on_an_amd_gpu_is_refused_with_the_reason() -> None:
    with pytest.raises(ScenarioError, match="ROCm MXFP4 backends is not modelled"):
        estimate({"model": "openai/gpt-oss-120b", "task": "serve", "hardware": {"gpu": "MI300X"}})


def test_liger_on_an_amd_gpu_takes_the_larger_path() -> None:
    """Llama 3.1 8B bf16-mixed (fp32 head gradient, bf16 logits) at 1,024 tokens: on an H100 Liger's weight update is
    ``torch.addmm(..., out_dtype=fp32)``; off CUDA the ``torch.mm(...).float()`` path, which holds V H c + V H 4 =
    128,256 x 4,096 x (2 + 4) = 3,151,822,848 B beside one chunk's logits rows, so its forward extra is larger."""
    from vramplan.analytic.terms.context import StepContext
    from vramplan.analytic.terms.loss import kernel_loss_tensors
    from vramplan.catalog.resolve import resolve

    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "train": {"loss": "liger-fused-linear-ce",
                                                                         "seq_len": 1024}}
    extra = {g: kernel_loss_tensors(StepContext(resolve({**doc, "hardware": {"gpu": g}}), 0, "sdpa", False)).forward_extra
             for g in ("MI300X", "H100-SXM")}
    assert extra["MI300X"] - extra["H100-SXM"] >= 3_151_822_848 - 1024 * 4096 * 2


def test_the_report_says_which_liger_path_it_counts_off_cuda() -> None:
    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "train": {"loss": "liger-fused-linear-ce",
                                                                         "seq_len": 1024}}
    amd = estimate({**doc, "hardware": {"gpu": "MI300X"}})
    nv = estimate({**doc, "hardware": {"gpu": "H100-SXM"}})
    assert any("torch.mm(...).float()" in a and "gfx942" in a for a in amd.assumptions)
    assert not any("torch.mm(...).float()" in a for a in nv.assumptions)
