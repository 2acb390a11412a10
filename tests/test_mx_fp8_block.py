"""MXFP4 (gpt-oss) and block-wise fp8 (DeepSeek-V3) checkpoints estimated as stored, from their configs.

The bytes below are computed by hand from the catalog configs; the gpt-oss-20b checkpoint's own
``model.safetensors.index.json`` gives ``metadata.total_size`` 13,761,264,768 B (huggingface.co/openai/gpt-oss-20b,
as quoted in public copies of the index), which the hand count reproduces to the byte.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.layout import rank_params
from vramplan.analytic.weights import weights_bytes
from vramplan.catalog.models import list_models
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.export.vllm import vllm_engine_args
from vramplan.facts.quantization import quant_format
from vramplan.plan.setup import ServeSetup
from vramplan.serve.vllm import hopper_swizzle_bytes, mxfp4_layout_bytes, serve_weights_bytes

# gpt-oss-20b: 24 layers x 32 experts x (gate 2880 -> 2880, up 2880 -> 2880, down 2880 -> 2880)
OSS20_EXPERT = 24 * 32 * 3 * 2880 * 2880  # 19,110,297,600 weights stored as MXFP4
OSS20_TOTAL = 20_914_757_184  # catalog published_parameters
OSS20_CHECKPOINT = (OSS20_EXPERT // 2  # 9,555,148,800 B: two e2m1 values per byte (*_blocks)
                    + OSS20_EXPERT // 32  # 597,196,800 B: one uint8 E8M0 scale per 32 (*_scales)
                    + 2 * (OSS20_TOTAL - OSS20_EXPERT))  # 1,804,459,584 others in bf16: 3,608,919,168 B
OSS20_BIASES = 24 * 32 * (2 * 2880 + 2880)  # 6,635,520 expert biases, held in fp32 (2 B more each than bf16)


def _rank_weights(r: Any, tp: int = 1) -> int:
    s = r.scenario
    section = getattr(s, s.task)
    rp = rank_params(r.model, tp, 1, 1, 0, None)
    return weights_bytes(rp, 2, section.quantization)


def test_rows_by_hand() -> None:
    mx, fb = quant_format("mxfp4"), quant_format("fp8-block")
    # gpt-oss down_proj 2880 -> 2880: 8,294,400 weights / 2 = 4,147,200 B + 2,880 rows x 90 blocks = 259,200 scales
    assert mx.matrix_bytes(2880, 2880) == 4_147_200 + 259_200
    # 4.25 bits per weight where 32 divides the input features
    assert mx.matrix_bytes(2880, 2880) * 8 == 2880 * 2880 * 4.25
    # DeepSeek-V3 kv_a_proj_with_mqa 7168 -> 576: 4,128,768 B + ceil(576/128) x 56 = 280 fp32 tiles
    assert fb.matrix_bytes(7168, 576) == 4_128_768 + 4 * 280
    assert fb.matrix_bytes(7168, 2048) * 8 == 7168 * 2048 * (8 + 32 / 16384)


def test_gpt_oss_20b_inference_weights_as_stored() -> None:
    assert OSS20_CHECKPOINT == 13_761_264_768  # the checkpoint index's metadata.total_size
    r = resolve({"model": "openai/gpt-oss-20b", "task": "inference", "hardware": {"gpu": "H100-SXM"}})
    assert r.scenario.inference.quantization == "mxfp4"
    held = OSS20_CHECKPOINT + 2 * OSS20_BIASES  # 13,774,535,808 B: Mxfp4GptOssExperts' fp32 biases
    assert _rank_weights(r) == held == 13_774_535_808
    rep = estimate({"model": "openai/gpt-oss-20b", "task": "inference", "hardware": {"gpu": "H100-SXM"},
                    "inference": {"batch_size": 1, "prompt_len": 128, "new_tokens": 16}})
    assert rep.per_gpu.breakdown["weights"] == held
    assert any("Mxfp4HfQuantizer.validate_environment dequantizes to bf16" in a for a in rep.assumptions)
    # naming the row in the scenario gives the same estimate as reading it off the checkpoint
    named = estimate({"model": "openai/gpt-oss-20b", "task": "inference", "hardware": {"gpu": "H100-SXM"},
                      "inference": {"batch_size": 1, "prompt_len": 128, "new_tokens": 16, "quantization": "mxfp4"}})
    assert named.per_gpu.peak_allocated_bytes == rep.per_gpu.peak_allocated_bytes


def test_gpt_oss_20b_serves_on_one_h100() -> None:
    doc = {"model": "openai/gpt-oss-20b", "task": "serve", "hardware": {"gpu": "H100-SXM"}}
    params, _rotary = serve_weights_bytes(resolve(doc))
    # the default vLLM (0.11) has no triton_kernels on a plain install: Marlin, 1,177,984 B per expert more than the
    # Triton layout (fp32 biases) x 768 experts = 904,691,712 B (serve/vllm.py mxfp4_layout_bytes)
    assert params == OSS20_CHECKPOINT + 2 * OSS20_BIASES + 904_691_712
    rep = estimate(doc)
    assert rep.fits and rep.serve is not None and rep.serve.num_gpu_blocks > 0
    assert any("Marlin MoE backend" in a for a in rep.assumptions)
    # from 0.12 (vendored triton_kernels): Triton, w13_bias / w2_bias in fp32, plus the swizzled scale copy
    doc14 = {**doc, "serve": {"vllm_version": "0.14"}}
    r14 = resolve(doc14)
    assert serve_weights_bytes(r14)[0] == OSS20_CHECKPOINT + 2 * OSS20_BIASES + hopper_swizzle_bytes(r14)
    assert any("Triton MoE backend" in a for a in estimate(doc14).assumptions)
    assert not any(a.startswith("not modelled: vLLM pads") for a in rep.assumptions)  # 2880 = 45 x 64
    setup = ServeSetup(num_gpus=1, tp=1, max_model_len=131_072, max_num_seqs=16, quantization="mxfp4")
    assert vllm_engine_args(setup, "openai/gpt-oss-20b")["quantization"] == "mxfp4"
    assert not any(a.startswith("not modelled") and "MXFP4" in a for a in rep.assumptions)


def test_vllm_pads_the_expert_slices_at_tp_2() -> None:
    # tp 2: each expert's slice of 2880 is 1440, which vLLM's Triton backend rounds up to 1472 (23 x 64).
    # Per expert, vLLM allocates w13 [2 x 1472, 1440] + scales [2 x 1472, 90] = 4,504,320 B, w2 [2880, 736] +
    # scales [2880, 46] = 2,252,160 B and fp32 biases w13 [2 x 1472] + w2 [2880] = 23,296 B: 6,779,776 B; the
    # row counts 2 x 1440 x 1530 + 2880 x (720 + 45) = 6,609,600 B and half of the 8,640 biases (split by tp)
    # in fp32, 17,280 B: 6,626,880 B.  152,896 B more per expert x 32 x 24 layers = 117,424,128 B
    # (vLLM 0.14: the Triton backend; the swizzled scale copy is serve/vllm.py hopper_swizzle_bytes')
    doc = {"model": "openai/gpt-oss-20b", "task": "serve", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
           "parallel": {"tp": 2}, "serve": {"vllm_version": "0.14"}}
    r = resolve(doc)
    params, _ = serve_weights_bytes(r)
    rp = rank_params(r.model, 2, 1, 1, 0, None)
    assert mxfp4_layout_bytes(r, rp) == 152_896 * 32 * 24 == 117_424_128
    assert params == _rank_weights(r, tp=2) + 117_424_128 + hopper_swizzle_bytes(r)
    one = resolve({"model": "openai/gpt-oss-20b", "task": "serve", "hardware": {"gpu": "H100-SXM"},
                   "serve": {"vllm_version": "0.14"}})
    assert mxfp4_layout_bytes(one, rank_params(one.model, 1, 1, 1, 0, None)) == 0  # 2880 = 45 x 64


def test_gpt_oss_20b_on_an_a100_takes_marlin_and_matches_the_log() -> None:
    # A100 (8.0): Marlin pads hidden 2880 -> 3072 and the intermediate 2880 -> 2944; biases in bf16.
    # Per expert 2 x 2944 x (1536 + 96) + 3072 x (1472 + 92) + 2 x (5888 + 3072) = 14,431,744 B against the
    # row's 13,253,760 B: 1,177,984 B x 768 experts = 904,691,712 B more than on an H100
    doc = {"model": "openai/gpt-oss-20b", "task": "serve", "hardware": {"gpu": "A100-80GB"},
           "serve": {"max_model_len": 131072, "gpu_memory_utilization": 0.65}}
    r = resolve(doc)
    params, rotary = serve_weights_bytes(r)
    assert params == 13_774_535_808 + 904_691_712
    assert any("Marlin MoE backend" in a for a in r.assumptions)
    # benchmarks/data/vllm_startup_logs.yaml myoceane-v0190-gpt-oss-20b-a100 (vLLM 0.19.0): "Model loading took
    # 13.72 GiB"; ours with the 16 MiB rotary cache is 14,696,004,736 B = 13.687 GiB, 0.24% under
    assert params + rotary == 14_696_004_736
    assert abs((params + rotary) / 2**30 - 13.72) / 13.72 < 0.005


def test_gpt_oss_120b_weights() -> None:
    # 36 layers x 128 experts x 3 x 2880^2 = 114,661,785,600 expert weights -> 57,330,892,800 + 3,583,180,800 B;
    # 116,829,156,672 - 114,661,785,600 = 2,167,371,072 others in bf16 = 4,334,742,144 B; total 65,248,815,744 B
    # (the published safetensors are "about 65 GB"); the 39,813,120 expert biases held in fp32 add 79,626,240 B
    r = resolve({"model": "openai/gpt-oss-120b", "task": "serve", "hardware": {"gpu": "H100-SXM"}})
    assert _rank_weights(r) == 65_248_815_744 + 79_626_240


def test_deepseek_v3_weights_as_stored() -> None:
    # per layer (61): q_a 7168->1536, q_b 1536->24576, kv_a 7168->576, kv_b 512->32768, o 16384->7168:
    #   187,105,280 weights, tiles 12x56 + 192x12 + 5x56 + 256x4 + 56x128 = 11,448
    # dense MLP (3 layers): 3 x 7168 x 18432 = 396,361,728 weights, 3 x 144 x 56 = 24,192 tiles
    # MoE (58 layers): 257 experts (256 routed + 1 shared) x 3 x 7168 x 2048 = 11,318,329,344 weights,
    #   257 x 3 x 16 x 56 = 690,816 tiles
    fp8 = 61 * 187_105_280 + 3 * 396_361_728 + 58 * 11_318_329_344  # 669,065,609,216 B
    tiles = 61 * 11_448 + 3 * 24_192 + 58 * 690_816  # 40,838,232 fp32 weight_scale_inv
    # bf16: embeddings + lm_head 2 x 129280 x 7168, 58 gates 256 x 7168 and their 256 score biases, norms
    # (61 x (2 x 7168 + 1536 + 512) + 7168): 1,960,809,984 = 671,026,419,200 - 669,065,609,216
    bf16 = 2 * 129_280 * 7168 + 58 * (256 * 7168 + 256) + 61 * (2 * 7168 + 1536 + 512) + 7168
    assert bf16 == 671_026_419_200 - fp8
    r = resolve({"model": "deepseek-ai/DeepSeek-V3", "task": "inference", "hardware": {"gpu": "H200"}})
    assert r.scenario.inference.quantization == "fp8-block"
    assert _rank_weights(r) == fp8 + 4 * tiles + 2 * bf16 == 673_150_582_112
    # tp 8 (vLLM): column-parallel outputs and row-parallel inputs split by 8, still whole tiles; q_a and kv_a
    # replicated; per rank the fp8 weights are (61 x (11,010,048 + 4,128,768) + 61 x (37,748,736 + 16,777,216 +
    # 117,440,512) / 8 + (3 x 396,361,728 + 58 x 11,318,329,344) / 8)
    rs = resolve({"model": "deepseek-ai/DeepSeek-V3", "task": "serve", "hardware": {"gpu": "H200", "num_gpus": 8},
                  "parallel": {"tp": 8}})
    rp = rank_params(rs.model, 8, 1, 1, 0, None)
    q = [s for s in rp.linear_shapes if s[0] in ("linear", "expert")]
    assert sum(each * n for _, _, _, each, n in q) == (
        61 * (11_010_048 + 4_128_768) + (61 * (37_748_736 + 16_777_216 + 117_440_512)
                                         + 3 * 396_361_728 + 58 * 11_318_329_344) // 8)


@pytest.mark.parametrize("task", ["inference", "serve"])
def test_a_block_fp8_layout_without_a_row_is_still_refused(task: str) -> None:
    cfg = dict(list_models("deepseek-ai/DeepSeek-V3")[0].config)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}
    with pytest.raises(ScenarioError, match=r"not modelled \(only e4m3 with 128 x 128 blocks has a row\)"):
        resolve({"model": cfg, "task": task, "hardware": {"gpu": "H200", "num_gpus": 8}, "parallel": {"tp": 8}})


def test_block_fp8_slices_that_are_not_whole_tiles_are_refused() -> None:
    # tp 32: each routed expert's 2048-wide intermediate becomes 64, half a 128 tile; vLLM raises
    with pytest.raises(ScenarioError, match="multiple of 128"):
        resolve({"model": "deepseek-ai/DeepSeek-V3", "task": "serve", "hardware": {"gpu": "H200", "num_gpus": 32},
                 "parallel": {"tp": 32}})


def test_mxfp4_on_a_dense_model_is_refused() -> None:
    with pytest.raises(ScenarioError, match="mxfp4 stores only routed MoE experts"):
        resolve({"model": "meta-llama/Llama-3.2-1B", "task": "serve", "hardware": {"gpu": "H100-SXM"},
                 "serve": {"quantization": "mxfp4"}})


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8-block"])
def test_the_traced_engine_refuses_them(fmt: str) -> None:
    pytest.importorskip("torch")
    from vramplan.trace import estimate as traced

    with pytest.raises(ScenarioError, match=f"{fmt} weights are not traced"):
        traced({"model": "Qwen/Qwen1.5-MoE-A2.7B-Chat", "task": "inference", "hardware": {"gpu": "H100-SXM"},
                "inference": {"batch_size": 1, "prompt_len": 16, "new_tokens": 2, "quantization": fmt}})
