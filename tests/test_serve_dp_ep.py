"""Data and expert parallelism at serving start-up: vLLM's --data-parallel-size and --enable-expert-parallel, SGLang's
--dp-size and --ep-size (serve/vllm.py ``moe_split``, ``_check_data_expert_parallel``; serve/sglang.py
``_data_expert_problems``), and the refusals of combinations an engine does not have."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.serve.llamacpp import decide as decide_llamacpp
from vramplan.serve.sglang import decide_sglang
from vramplan.serve.sglang_options import mtp_draft
from vramplan.serve.vllm import (
    FUSED_MOE_CHUNK_TOKENS,
    decide,
    forward_peak_bytes,
    moe_split,
    serve_weights_bytes,
)

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
LLAMA = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"

# Mixtral-8x7B (h 4096, expert intermediate 14336, 8 experts, top-2, 32 layers, 32 heads, 8 KV heads of 128, vocab
# 32,000, untied): one expert w1 + w3 + w2 = 3 x 4096 x 14336 = 176,160,768; all experts of all layers 8 x 32 x
# 176,160,768 = 45,097,156,608; attention q, o 4096 x 4096 each + k, v 4096 x 1024 each = 41,943,040 per layer,
# x 32 = 1,342,177,280; norms 2 x 4096 x 32 + final 4096 = 266,240; router 8 x 4096 x 32 = 1,048,576 (replicated);
# embedding and head 32,000 x 4096 = 131,072,000 each.
EXPERT = 3 * 4096 * 14336
ATTN = 1_342_177_280
NORMS, ROUTER, VOCAB = 266_240, 1_048_576, 131_072_000


def _serve(model: str, tp: int = 1, dp: int = 1, ep: int = 1, engine: str = "vllm", **serve: Any) -> dict[str, Any]:
    extra = {"vllm_version": "0.11.0", "gpu_memory_utilization": 0.9} if engine == "vllm" else {"engine": "sglang"}
    return {"model": model, "task": "serve", "hardware": {"gpu": "H100", "num_gpus": tp * dp},
            "parallel": {"tp": tp, "ep": ep},
            "serve": {"max_model_len": 2048, "dp": dp, **extra, **serve}}


def test_moe_split_per_engine() -> None:
    # vLLM FusedMoEParallelConfig.make: flatten_tp_across_dp gives tp x dp; without EP the experts are split over them,
    # with EP each of the tp x dp ranks holds whole experts.  SGLang: moe_tp_size = tp // ep.
    assert moe_split(resolve(_serve(MIXTRAL, tp=2, dp=2))) == (1, 4)
    assert moe_split(resolve(_serve(MIXTRAL, tp=2, dp=2, ep=4))) == (4, 1)
    assert moe_split(resolve(_serve(MIXTRAL, tp=2, ep=2))) == (2, 1)
    assert moe_split(resolve(_serve(MIXTRAL, tp=4, ep=2, engine="sglang"))) == (2, 2)


def test_vllm_dp_splits_experts_over_tp_x_dp() -> None:
    # tp 2 x dp 2, no EP: experts over 4 GPUs 45,097,156,608 / 4 = 11,274,289,152; attention over tp 2
    # 671,088,640; embedding and head over tp 2: 65,536,000 each; norms and router whole 266,240 + 1,048,576:
    # 12,077,764,608 parameters x 2 B = 24,155,529,216 B.  With dp 1 the experts would be / 2 (46.7 GB per GPU).
    r = resolve(_serve(MIXTRAL, tp=2, dp=2))
    expected = (8 * 32 * EXPERT // 4 + ATTN // 2 + NORMS + ROUTER + VOCAB) * 2
    assert expected == 24_155_529_216
    assert serve_weights_bytes(r)[0] == expected
    # --enable-expert-parallel over the same 4 GPUs: 8 / 4 = 2 whole experts per layer: the same bytes
    assert serve_weights_bytes(resolve(_serve(MIXTRAL, tp=2, dp=2, ep=4)))[0] == expected


def test_vllm_uneven_expert_map_counts_the_largest_rank() -> None:
    # tp 1 x dp 3 with EP: 8 experts over 3 ranks, determine_expert_map: 8 // 3 = 2, remainder 2, so ranks 0-1 hold
    # 3 and rank 2 holds 2; the GPU counted holds 3: 3 x 32 x 176,160,768 = 16,911,433,728; attention whole
    # 1,342,177,280; norms + router 1,314,816; embedding + head 262,144,000: 18,517,069,824 x 2 B = 37,034,139,648 B
    r = resolve(_serve(MIXTRAL, tp=1, dp=3, ep=3))
    assert serve_weights_bytes(r)[0] == (3 * 32 * EXPERT + ATTN + NORMS + ROUTER + 2 * VOCAB) * 2 == 37_034_139_648
    d = decide(r, version="0.11.0")
    note = next(a for a in d.assumptions if a.startswith("expert parallel"))
    assert "3 on ranks 0-1, 2 on the others" in note and "counted with 3, the largest rank's" in note
    assert d.ep == 3 and d.dp == 3


def test_vllm_profile_peak_with_dp_and_ep() -> None:
    m = resolve(_serve(MIXTRAL)).model
    # tp 2 x dp 2 without EP, 8192 tokens, bf16, compiled: the MoE sees 2 x 8192 = 16,384 gathered rows; expert
    # slice 14336 / 4 = 3584: per routed row 2 x (max(7168, 4096) + 3584) + 8 logits = 21,512 elements:
    # 21,512 x 16,384 + gathered hidden 16,384 x 4096 = 419,561,472 elements x 2 B = 839,122,944; plus 4h per
    # local token 4 x 4096 x 8192 x 2 B = 268,435,456: 1,107,558,400 B
    assert forward_peak_bytes(m, 8192, 2, 2, True, moe_tp=4, dp=2) == 1_107_558_400
    # EP over tp 2, dp 1: whole experts, slice 14336: 2 x (28,672 + 14,336) + 8 = 86,024 per token, no gathering:
    # (16,384 + 86,024) x 8192 x 2 B = 1,677,852,672 B (tensor-sliced at tp 2 it would be 2 x (14,336 + 7168) + 8
    # = 43,016: (16,384 + 43,016) x 16,384 = 973,209,600 B)
    assert forward_peak_bytes(m, 8192, 2, 2, True, moe_tp=1) == 1_677_852_672
    assert forward_peak_bytes(m, 8192, 2, 2, True) == 973_209_600
    # dp 8 with EP: 65,536 gathered rows, the fused caches capped at 32,768 (VLLM_FUSED_MOE_CHUNK_SIZE):
    # 86,024 x 32,768 + 65,536 x 4096 = 3,087,269,888 elements x 2 = 6,174,539,776 + 268,435,456 = 6,442,975,232 B
    assert FUSED_MOE_CHUNK_TOKENS == 32768
    assert forward_peak_bytes(m, 8192, 2, 2, True, moe_tp=1, dp=8) == 6_442_975_232


def test_vllm_dense_dp_keeps_the_pool_and_reports_concurrency_across_ranks() -> None:
    one = decide(resolve(_serve(LLAMA)), version="0.11.0")
    two = decide(resolve(_serve(LLAMA, dp=2)), version="0.11.0")
    # each DP rank is its own engine core on its own GPU: the same weights, profile and pool as dp 1
    assert (two.weights_bytes, two.num_gpu_blocks, two.nccl_bytes) == (one.weights_bytes, one.num_gpu_blocks,
                                                                      one.nccl_bytes)
    out = two.to_dict()
    assert out["dp"] == 2 and out["max_concurrency_all_dp_ranks"] == round(2 * two.max_concurrency, 4)
    assert "dp" not in one.to_dict()
    assert any(a.startswith("dense model: the DP ranks share no layer") for a in two.assumptions)


def test_vllm_moe_dp_adds_the_expert_group_communicator() -> None:
    # the EP group (dp x tp ranks) that dispatch/combine run on: one communicator more than tp 2 alone
    one = decide(resolve(_serve(MIXTRAL, tp=2)), version="0.11.0")
    two = decide(resolve(_serve(MIXTRAL, tp=2, dp=2)), version="0.11.0")
    assert two.nccl_bytes == 2 * one.nccl_bytes


@pytest.mark.parametrize(("tp", "dp", "ep", "where", "words"), [
    (2, 2, 2, "parallel.ep", "parallel.tp 2 x serve.dp 2 = 4, not 2"),
    (2, 1, 4, "parallel.ep", "parallel.tp 2 x serve.dp 1 = 2, not 4"),
])
def test_vllm_refuses_an_ep_that_is_not_tp_x_dp(tp: int, dp: int, ep: int, where: str, words: str) -> None:
    with pytest.raises(ScenarioError) as e:
        decide(resolve(_serve(MIXTRAL, tp=tp, dp=dp, ep=ep)), version="0.11.0")
    p = e.value.problems[0]
    assert p.where == where and words in p.message and f"set parallel.ep {tp * dp}" in p.hint


def test_vllm_refuses_too_few_gpus_for_dp() -> None:
    doc = _serve(LLAMA, tp=2, dp=2)
    doc["hardware"]["num_gpus"] = 2  # dp 2 x tp 2 needs 4
    with pytest.raises(ScenarioError) as e:
        decide(resolve(doc), version="0.11.0")
    assert e.value.problems[0].where == "hardware.num_gpus" and "needs 4 GPUs" in e.value.problems[0].message


def test_expert_parallel_on_a_dense_model_is_refused() -> None:
    with pytest.raises(ScenarioError) as e:
        resolve(_serve(LLAMA, tp=2, ep=2))
    assert any(p.where == "parallel.ep" and "dense model" in p.message for p in e.value.problems)


def test_llamacpp_has_no_data_parallel() -> None:
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"}, "serve": {"engine": "llamacpp", "dp": 2}}
    with pytest.raises(ScenarioError) as e:
        resolve(doc)
    assert any(p.where == "serve.dp" and "not of engine llamacpp" in p.message for p in e.value.problems)


def test_sglang_ep_weights_and_dp_replicas() -> None:
    # tp 4, --ep-size 2: 8 / 2 = 4 whole experts per layer, each split over tp / ep = 2: 4 x 32 x 176,160,768 / 2
    # = 11,274,289,152; attention / 4 = 335,544,320; norms + router 1,314,816; embedding + head / 4 65,536,000:
    # 11,676,684,288 x 2 B = 23,353,368,576 B -- the same bytes as ep 1 (8 experts each / 4), as even splits must be
    r = resolve(_serve(MIXTRAL, tp=4, ep=2, engine="sglang"))
    expected = (4 * 32 * EXPERT // 2 + ATTN // 4 + NORMS + ROUTER + 2 * VOCAB // 4) * 2
    assert serve_weights_bytes(r)[0] == expected == 23_353_368_576
    d = decide_sglang(r)
    assert any("expert parallel --ep-size 2: 4 whole experts" in a for a in d.assumptions)
    # --dp-size 2 without DP attention: each replica on its own 4 GPUs, the pool as with dp 1
    base = decide_sglang(resolve(_serve(MIXTRAL, tp=4, engine="sglang")))
    rep = decide_sglang(resolve(_serve(MIXTRAL, tp=4, dp=2, engine="sglang")))
    assert rep.max_total_num_tokens == base.max_total_num_tokens
    assert any(a.startswith("--dp-size 2 without DP attention") for a in rep.assumptions)


@pytest.mark.parametrize(("tp", "ep", "version", "where", "words"), [
    (4, 8, "0.5.3", "parallel.ep", "ep 8 must divide tp 4"),
    (4, 2, "0.4.6", "parallel.ep", "an ep below tp was read at 0.5.3 only"),
    (4, 4, "0.4.0", "parallel.ep", "expert parallelism was not read"),
    (6, 3, "0.5.3", "parallel.ep", "ep=3 does not divide 8 experts"),  # SGLang asserts num_experts % ep == 0
])
def test_sglang_ep_refusals(tp: int, ep: int, version: str, where: str, words: str) -> None:
    doc = _serve(MIXTRAL, tp=tp, ep=ep, engine="sglang", sglang_version=version)
    with pytest.raises(ScenarioError) as e:
        decide_sglang(resolve(doc))
    assert any(p.where == where and words in p.message for p in e.value.problems)


def test_sglang_dp_and_dp_attention_are_one_option() -> None:
    doc = _serve("deepseek-ai/DeepSeek-V2-Lite", tp=2, dp=2, engine="sglang", dp_attention=2)
    with pytest.raises(ScenarioError) as e:
        decide_sglang(resolve(doc))
    assert any(p.where == "serve.dp" and "SGLang has one --dp-size" in p.message for p in e.value.problems)


def test_llamacpp_has_no_expert_parallel() -> None:
    doc = {"model": MIXTRAL, "task": "serve", "hardware": {"gpu": "H100"}, "parallel": {"ep": 2},
           "serve": {"engine": "llamacpp", "gguf": {"quant": "Q4_K_M"}, "max_model_len": 4096}}
    with pytest.raises(ScenarioError) as e:
        decide_llamacpp(resolve(doc))
    assert e.value.problems[0].where == "parallel.ep" and "no expert parallelism" in e.value.problems[0].message


def test_sglang_mtp_draft_splits_its_experts_like_the_target() -> None:
    # SGLang's NEXTN layer (shaped like the target's last) under --ep-size at tp 4: each GPU holds 8 / ep experts,
    # each split over tp / ep ranks: ep 1: 8 x 176,160,768 / 4 = 352,321,536 elements, ep 2: 4 x 176,160,768 / 2 =
    # 352,321,536, ep 4: 2 x 176,160,768 = 352,321,536 -- the same; whole experts at ep 2 (4 x 176,160,768, what
    # rank_params does by default at ep > 1) would be twice that
    m = resolve(_serve(MIXTRAL)).model
    sizes = [mtp_draft(m, 1, 4, ep, 2, "none", 0, 4).resident_bytes for ep in (1, 2, 4)]
    assert sizes[0] == sizes[1] == sizes[2]


def test_vllm_v0_has_no_data_parallel_engine_cores() -> None:
    doc = _serve(LLAMA, dp=2)
    doc["serve"]["vllm_version"] = "0.6.3"  # a V0 release (facts/vllm_releases.py)
    with pytest.raises(ScenarioError) as e:
        decide(resolve(doc), version="0.6.3")
    p = e.value.problems[0]
    assert p.where == "serve.dp" and "V0 engine" in p.message and "use a V1 release" in p.hint
