"""A colocated vLLM rollout engine over a pre-quantized policy checkpoint (serve/rollout.py ``rollout_memory``).

The trainer holds an fp8 or MXFP4 checkpoint dequantized (transformers cannot train it as stored), but vLLM reads
the checkpoint's ``quantization_config`` and keeps the weights as stored, as it does for ``task: serve``.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.serve.rollout import rollout_memory


def _grpo(model: str) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H200"},
            "train": {"objective": "grpo", "micro_batch_size": 8, "peft": {"method": "lora", "rank": 16}},
            "rl": {"rollout": {"engine": "vllm", "colocate": True, "max_completion_len": 256}}}


@pytest.mark.parametrize("model", ["openai/gpt-oss-20b", "Qwen/Qwen3-30B-A3B-FP8"])
def test_the_engine_holds_the_checkpoint_as_stored(model: str) -> None:
    r = resolve(_grpo(model))
    assert r.scenario.train.quantization == "none"  # the trainer: loaded dequantized
    ro = rollout_memory(r, 0, 0)
    served = estimate({"model": model, "task": "serve", "hardware": {"gpu": "H200"}}).per_gpu.breakdown["weights"]
    assert ro.weights == served
    # bf16 would hold 2 B per parameter: gpt-oss-20b's 20.9 G and Qwen3-30B-A3B's 30.5 G parameters are more than
    # 41 GB in bf16, at most 31.2 GB as stored (MXFP4 experts at 4.25 bits; fp8 e4m3 with a fp32 scale per 128 x 128)
    assert ro.weights < 0.75 * 2 * r.model.num_parameters
    assert any("estimated as stored" in a for a in ro.assumptions)


def test_gpt_oss_20b_engine_weights_by_hand() -> None:
    # 24 layers x 32 experts x (2880 x 5760 + 2880 x 2880) = 19,110,297,600 expert weights at 4 bits + one E8M0 scale
    # per 32 (17/32 B each): 10,152,345,600 B; the other 1,804,459,584 parameters in bf16: 3,608,919,168 B; vLLM's
    # Triton MXFP4 layout would keep the experts' biases, 24 x 32 x (5760 + 2880) = 6,635,520, in fp32 (2 B more
    # each: 13,271,040), but the rollout's vLLM (0.11, a plain install without triton_kernels) runs Marlin on an H200,
    # 1,177,984 B per expert more than Triton's layout (serve/vllm.py mxfp4_layout_bytes: I 2,880 -> 2,944, h 2,880
    # -> 3,072, bf16 biases; 14,431,744 - 13,253,760), x 768 experts = 904,691,712 B; the rotary cache is 131,072
    # positions x 64 x 2 B = 16,777,216: 14,696,004,736 B.  bf16 for everything (the engine before) is
    # 2 x 20,914,757,184 + 16,777,216.
    r = resolve(_grpo("openai/gpt-oss-20b"))
    ro = rollout_memory(r, 0, 0)
    assert r.model.num_parameters == 20_914_757_184
    assert 10_152_345_600 + 3_608_919_168 + 13_271_040 + 904_691_712 + 16_777_216 == 14_696_004_736
    assert ro.weights == 14_696_004_736
