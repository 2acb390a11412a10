"""transformers before 4.54 repeats grouped K/V to every query head before SDPA (analytic/attention.py
``sdpa_repeats_kv``; repeat_kv in 4.36-4.53, enable_gqa from 4.54, read off the 4.53.0 and 4.54.0 wheels)."""

from __future__ import annotations

from typing import Any

from vramplan.analytic.inference import GenerateCall, repeated_kv_bytes
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate


def _train(version: str, checkpointing: str = "none", model: str = "meta-llama/Meta-Llama-3-8B") -> dict[str, Any]:
    return {"model": model, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
            "software": {"transformers": version},
            "train": {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-true",
                      "gradient_checkpointing": checkpointing, "attention": "sdpa",
                      "peft": {"method": "lora", "rank": 16}}}


def test_repeated_kv_saved_by_the_kernel() -> None:
    # Llama-3-8B: 32 heads and 8 K/V heads of 128 (q width 4,096, K/V width 1,024), 32 layers, 2,048 tokens, bf16,
    # no checkpointing: the kernel keeps K and V at the query width, 2 x (4,096 - 1,024) x 2 B = 12,288 B more per
    # token and layer: 32 x 2,048 x 12,288 = 805,306,368 B at the peak
    old = estimate(_train("4.53.3"))
    new = estimate(_train("4.54.0"))
    assert old.per_gpu.peak_allocated_bytes - new.per_gpu.peak_allocated_bytes == 32 * 2048 * 12_288
    assert any("repeats the grouped K/V" in a for a in old.assumptions)
    assert not any("repeats the grouped K/V" in a for a in new.assumptions)


def test_mha_and_flash_attention_2_repeat_nothing() -> None:
    # Llama-2-7B has as many K/V heads as query heads: nothing to repeat
    old = estimate(_train("4.53.3", model="meta-llama/Llama-2-7b-hf")).per_gpu.peak_allocated_bytes
    new = estimate(_train("4.54.0", model="meta-llama/Llama-2-7b-hf")).per_gpu.peak_allocated_bytes
    assert old == new
    # the flash-attention package takes grouped K/V itself
    flash = [_train(v) for v in ("4.53.3", "4.54.0")]
    for d in flash:
        d["train"]["attention"] = "flash"
    assert estimate(flash[0]).per_gpu.peak_allocated_bytes == estimate(flash[1]).per_gpu.peak_allocated_bytes


def test_decode_step_repeats_one_layers_cache() -> None:
    # a decode step at 4,096 cached tokens, batch 2, bf16: K and V repeated to 4,096 wide, 2 x 2 x 4,096 x 4,096 x 2
    doc: dict[str, Any] = {"model": "meta-llama/Meta-Llama-3-8B", "task": "inference",
                           "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
                           "inference": {"batch_size": 2, "prompt_len": 128, "new_tokens": 8, "dtype": "bf16"},
                           "software": {"transformers": "4.45.2"}}
    assert repeated_kv_bytes(GenerateCall.of(resolve(doc)), 4096) == 2 * 2 * 4096 * 4096 * 2
    doc["software"] = {"transformers": "4.54.0"}
    assert repeated_kv_bytes(GenerateCall.of(resolve(doc)), 4096) == 0
