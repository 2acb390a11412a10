"""MXFP4 experts swizzled for triton_kernels on Hopper, by vLLM release (serve/vllm.py ``hopper_swizzle_bytes``;
facts/vllm_releases.py ``MXFP4_HOPPER_SWIZZLE_FROM``; spec/load.py ``HOPPER_SWIZZLE_NOTE``).  From 0.12.0 vLLM vendors
triton_kernels, so a plain install on an H100 takes the Triton backend, and ``process_weights_after_loading`` keeps the
loaded scales beside the swizzled copy that HopperMXScaleLayout pads to 256 rows; the vendored HopperMXValueLayout pads
the packed weights to 16 x 32 only.  Before 0.12.0 a plain install runs Marlin (0.10.x: torch 2.7.1; 0.11.x: no
triton_kernels), whose padding serve/vllm.py ``mxfp4_layout_bytes`` counts (tests/test_mxfp4_marlin_releases.py)."""

from __future__ import annotations

from typing import Any

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.facts.vllm_releases import MXFP4_HOPPER_SWIZZLE_FROM
from vramplan.serve.vllm import decide, hopper_swizzle_bytes
from vramplan.spec.load import HOPPER_SWIZZLE_NOTE


def _doc(gpu: str = "H100-80GB", model: str = "openai/gpt-oss-120b", tp: int = 1, version: str = "0.14",
         **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp}, "framework": "vllm",
            "parallel": {"tp": tp}, "serve": {"quantization": "mxfp4", "vllm_version": version, **serve}}


def test_the_release_is_pinned_at_0_12_0() -> None:
    assert MXFP4_HOPPER_SWIZZLE_FROM == (0, 12, 0)


def test_scale_copy_of_gpt_oss_120b_on_one_h100() -> None:
    # h 2880, I 2880: w13 scales 5,760 x 90 -> 5,888 x 90 = 529,920; w2 2,880 x 90 -> 3,072 x 90 = 276,480; the packed
    # weights 5,760 x 1,440 and 2,880 x 1,440 are multiples of 16 x 32: no padding.  806,400 B per expert x 128
    # experts x 36 layers = 3,715,891,200 B
    assert hopper_swizzle_bytes(resolve(_doc())) == 3_715_891_200


def test_the_weights_match_the_printed_load() -> None:
    # vLLM 0.14.1 printed "Model loading took 64.38 GiB" (vllm-project/vllm#33155); a plain 0.11 install runs Marlin
    # (no triton_kernels): no scale copy, but Marlin's padding, 1,177,984 B per expert (serve/vllm.py
    # mxfp4_layout_bytes) x 128 x 36 = 5,428,150,272 B: 0.11 holds 5,428,150,272 - 3,715,891,200 = 1,712,259,072 B more
    r14 = decide(resolve(_doc(version="0.14")), "0.14")
    r11 = decide(resolve(_doc(version="0.11")), "0.11")
    assert r11.weights_bytes - r14.weights_bytes == 1_712_259_072
    assert abs(r14.weights_bytes / 2**30 - 64.38) < 0.1


def test_scale_copy_under_tensor_parallelism() -> None:
    # tp 2: I 1,440 -> 1,472 (Triton's multiple of 64).  w13 (K 2,880, N 2,944): scales 3,072 x 90 = 276,480, packed
    # 2,944 x 1,440 no padding; w2 (K 1,472, N 2,880): scales 3,072 x 46 = 141,312, packed 2,880 x 736 (23 x 32) no
    # padding: 417,792 per expert x 128 x 36 = 1,925,185,536 B
    assert hopper_swizzle_bytes(resolve(_doc(tp=2))) == 1_925_185_536


def test_none_before_0_12_or_off_hopper() -> None:
    assert hopper_swizzle_bytes(resolve(_doc(version="0.11"))) == 0
    assert hopper_swizzle_bytes(resolve(_doc(version="0.10.2"))) == 0
    # the A100 runs Marlin (its padding is counted in the weights); Blackwell takes FlashInfer's backend
    assert hopper_swizzle_bytes(resolve(_doc(gpu="A100-80GB"))) == 0
    report = estimate(_doc(gpu="A100-80GB", max_model_len=8192))
    assert HOPPER_SWIZZLE_NOTE not in report.assumptions


def test_the_copy_shrinks_the_kv_pool() -> None:
    # one H100, 8,192 tokens: the copy comes out of the KV budget, no separate start risk
    a = decide(resolve(_doc(version="0.14", max_model_len=8192)), "0.14")
    assert "swizzle" not in a.start_risk
    assert HOPPER_SWIZZLE_NOTE in estimate(_doc(max_model_len=8192)).assumptions
    # 0.12 and 0.14 share the copy (from MXFP4_HOPPER_SWIZZLE_FROM); the pool is what the weights leave
    c = decide(resolve(_doc(version="0.12", max_model_len=8192)), "0.12")
    assert a.weights_bytes == c.weights_bytes
    assert a.available_kv_bytes < a.total_memory_bytes - a.weights_bytes
