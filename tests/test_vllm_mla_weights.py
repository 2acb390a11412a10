"""vLLM's MLA backend: what it keeps on the GPU after loading the weights, by release (facts/vllm_mla.py,
serve/vllm.py ``mla_after_load_bytes``); hand-computed oracles."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.serve.vllm import mla_after_load_bytes

LAYERS = 27   # DeepSeek-V2-Lite: H 2,048, 16 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, no q_lora_rank


def _doc(version: str, tp: int = 1, quantization: str = "none") -> dict[str, Any]:
    return {"model": "deepseek-ai/DeepSeek-V2-Lite", "task": "serve", "hardware": {"gpu": "H100-SXM", "num_gpus": tp},
            "parallel": {"tp": tp},
            "serve": {"engine": "vllm", "vllm_version": version, "max_model_len": 4096, "dtype": "fp16",
                      "quantization": quantization}, "offline": True}


def test_absorbed_matrices_at_0_7() -> None:
    # per layer, fp16 (s 2), Rin = H = 2,048, N 16: W_QR 2 x 2,048 x 16 x 64 = 4,194,304; W_Q_UK 2 x 2,048 x 16 x 512 =
    # 33,554,432; W_UV_O 2 x 16 x 512 x 2,048 = 33,554,432; 71,303,168 x 27 = 1,925,185,536
    for version in ("0.7.1", "0.7.2", "0.7.3"):
        assert mla_after_load_bytes(resolve(_doc(version)), LAYERS) == 1_925_185_536


@pytest.mark.parametrize("version", ["0.6.6", "0.7.0", "0.8.0", "0.10.2"])
def test_nothing_kept_outside_0_7_for_unquantized_weights(version: str) -> None:
    assert mla_after_load_bytes(resolve(_doc(version)), LAYERS) == 0


def test_heads_split_over_tensor_parallel() -> None:
    # tp 2: N = 8 heads per rank, half of every term: 962,592,768
    assert mla_after_load_bytes(resolve(_doc("0.7.2", tp=2)), LAYERS) == 1_925_185_536 // 2


def test_quantized_kv_b_copy_by_release() -> None:
    # kv_b_proj dequantized and kept: L x N x (P + V) = 512 x 16 x 256 = 2,097,152 elements per layer; fp32 at 0.7.2
    # (8,388,608 B), fp16 from 0.7.3 (4,194,304 B); fp8 weights keep W_Q_UK and W_UV_O in one byte each
    # (2,048 x 16 x 512 + 16 x 512 x 2,048 = 33,554,432) beside W_QR in fp16 (4,194,304)
    copy32, copy16 = 27 * 2_097_152 * 4, 27 * 2_097_152 * 2
    assert mla_after_load_bytes(resolve(_doc("0.7.2", quantization="fp8")), LAYERS) == 27 * (4_194_304 + 33_554_432) + copy32
    assert mla_after_load_bytes(resolve(_doc("0.7.3", quantization="fp8")), LAYERS) == 27 * (4_194_304 + 33_554_432) + copy16
    assert mla_after_load_bytes(resolve(_doc("0.8.0", quantization="fp8")), LAYERS) == copy16


def test_counted_in_the_reported_weights() -> None:
    with_mla = estimate(resolve(_doc("0.7.2")))
    without = estimate(resolve(_doc("0.6.6")))
    assert with_mla.serve.weights_bytes - without.serve.weights_bytes == 1_925_185_536
    assert any("MLA backend keeps" in a for a in with_mla.assumptions)
