"""vLLM's MXFP4 backend on Hopper by release (serve/vllm.py ``mxfp4_layout_bytes``, ``_triton_kernels_installed``):
0.10.1-0.11.x run Marlin on a plain install (0.11.0 quantization/mxfp4.py ``get_mxfp4_backend`` lines 94-102:
capability < 9, no ``triton_kernels`` module or torch < 2.8.0 -> MARLIN; the package is not a dependency of the
wheels), and 0.11.0 ``Mxfp4MoEMethod.create_weights`` lines 189-200 pads Marlin's experts (intermediate to 128,
hidden to 256); from 0.12.0 vLLM vendors triton_kernels and Hopper runs Triton (intermediate to 64)."""

from __future__ import annotations

from vramplan.analytic.layout import rank_params
from vramplan.catalog.resolve import resolve
from vramplan.serve.vllm import mxfp4_layout_bytes


def _layout(version: str, gpu: str = "H100-80GB", model: str = "openai/gpt-oss-20b") -> int:
    r = resolve({"model": model, "task": "serve", "hardware": {"gpu": gpu}, "framework": "vllm",
                 "serve": {"quantization": "mxfp4", "vllm_version": version}})
    return mxfp4_layout_bytes(r, rank_params(r.model, 1, 1, 1, 0, None))


def test_hopper_runs_marlin_before_0_12() -> None:
    # gpt-oss-20b (h 2880, I 2880, 32 experts x 24 layers, bf16).  Marlin: I -> 2,944, h -> 3,072; per expert
    # w13 2 x 2,944 x (1,536 + 96) = 9,609,216, w2 3,072 x (1,472 + 92) = 4,804,608, bf16 biases 2 x (5,888 + 3,072)
    # = 17,920: 14,431,744 B against the row's 2 x 2,880 x 1,530 + 2,880 x 1,530 + 4 x 8,640 = 13,253,760 B;
    # 1,177,984 B x 768 experts = 904,691,712 B
    assert _layout("0.11") == _layout("0.10.2") == _layout("0.11", gpu="A100-80GB") == 904_691_712
    # from 0.12.0 Triton: 2,880 is a multiple of 64 and the biases fp32, as the row counts them: nothing more
    assert _layout("0.12") == _layout("0.14") == 0
