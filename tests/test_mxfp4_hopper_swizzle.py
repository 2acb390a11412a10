"""MXFP4 experts swizzled for triton_kernels on Hopper (serve/vllm.py ``hopper_swizzle_padding_bytes``,
``_swizzle_risk``; spec/load.py ``HOPPER_SWIZZLE_NOTE``).  vLLM's ``_swizzle_mxfp4`` (quantization/utils/mxfp4_utils.py,
commit 01b817d) applies triton_kernels' Hopper layouts, which pad the scales' rows to 256 (hopper_scale.py, triton
14dd7a1) and, in newer triton_kernels, the packed weights to 64 x 256 (hopper_value.py ``_padded_shape``, triton
000df03).  The padding is stated and checked against the KV pool, not added to the weights."""

from __future__ import annotations

from typing import Any

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.serve.vllm import hopper_swizzle_padding_bytes
from vramplan.spec.load import HOPPER_SWIZZLE_NOTE


def _doc(gpu: str = "H100-80GB", model: str = "openai/gpt-oss-120b", tp: int = 1, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp}, "framework": "vllm",
            "parallel": {"tp": tp}, "serve": {"quantization": "mxfp4", "vllm_version": "0.14", **serve}}


def test_padding_of_gpt_oss_120b_on_one_h100() -> None:
    # h 2880, I 2880: w13 packed 1,440 x 5,760 -> 1,472 x 5,888 (+372,736), scales 5,760 x 90 -> 5,888 x 90 (+11,520);
    # w2 1,440 x 2,880 -> 1,472 x 3,072 (+374,784), scales 2,880 x 90 -> 3,072 x 90 (+17,280): 776,320 per expert,
    # x 128 experts x 36 layers = 3,577,282,560 B
    assert hopper_swizzle_padding_bytes(resolve(_doc())) == 3_577_282_560


def test_padding_under_tensor_parallelism() -> None:
    # tp 2: I 1,440 -> 1,472 (Triton's multiple of 64).  w13 (K 2,880, N 2,944): 1,472 x 3,072 - 1,440 x 2,944 =
    # 282,624, scales (3,072 - 2,944) x 90 = 11,520; w2 (K 1,472, N 2,880): 768 x 3,072 - 736 x 2,880 = 239,616,
    # scales (3,072 - 2,880) x 46 = 8,832: 542,592 per expert x 128 x 36 = 2,500,263,936 B
    assert hopper_swizzle_padding_bytes(resolve(_doc(gpu="H100-80GB", tp=2))) == 2_500_263_936


def test_no_padding_off_hopper() -> None:
    # the A100 runs Marlin (its padding is counted in the weights); Blackwell's layouts differ
    assert hopper_swizzle_padding_bytes(resolve(_doc(gpu="A100-80GB"))) == 0
    report = estimate(_doc(gpu="A100-80GB", max_model_len=8192))
    assert HOPPER_SWIZZLE_NOTE not in report.assumptions


def test_padding_that_exhausts_the_kv_pool_is_a_start_risk() -> None:
    # one H100, 8,192 tokens: a 3.11 GB pool by the unpadded layout, less than the 3.58 GB of padding
    report = estimate(_doc(max_model_len=8192))
    assert report.fits and report.verdict == "MAY NOT FIT"
    assert "swizzles the MXFP4 experts" in report.serve.start_risk
    assert HOPPER_SWIZZLE_NOTE in report.assumptions
    # gpt-oss-20b (24 layers x 32 experts) leaves room: no risk, the note only
    small = estimate(_doc(model="openai/gpt-oss-20b", max_model_len=8192))
    assert small.serve.start_risk == "" and HOPPER_SWIZZLE_NOTE in small.assumptions
