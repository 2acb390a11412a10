"""vLLM serving of models with mixers under tensor parallelism: each rank's state page (MambaStateShapeCalculator's
``tp_world_size``, the extra groups of ``extra_groups_for_head_shards``), the attention block raised for it beside one
rank's KV heads (replicated below tp), the mixers' weights per rank (facts/vllm_releases.py MIXER_TP_SHARDED), the
profile run's mixer widths per rank, and what stays refused.  Every expected value is computed by hand in its
comment."""

from __future__ import annotations

from typing import Any

import pytest

from test_families_jamba import JAMBA_V01
from test_families_lfm2 import LFM2_1_2B
from test_families_qwen3_next import QWEN3_NEXT_80B
from test_families_state_space import CODESTRAL, MAMBA_2_8B
from test_serve_hybrid import BAMBA_9B
from test_serve_linear_mixers import ZAMBA2_DEFAULTS
from vramplan.analytic.layout import rank_params
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_releases import MAMBA_HYBRID_RULES, MIXER_TP_SHARDED, SHARED_BLOCK_TP_SHARDED_LISTS
from vramplan.serve.mamba_pages import (
    extra_groups_for_head_shards,
    hybrid_layout,
    mamba_state_page_bytes,
    mixer_name,
    mixer_profile_width,
    mixer_tp_problem,
    mixer_weights_tp_delta,
)
from vramplan.serve.vllm import decide, serve_weights_bytes
from vramplan.spec.hf_config import model_from_config

KV_10_GIB = 10 * 1024**3  # kv_cache_memory_bytes: the KV budget as given, so the blocks follow from it alone
RULE_0_11 = MAMBA_HYBRID_RULES[0]


def _doc(model: Any, tp: int, version: str = "0.11", max_len: int = 8192, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": "H100", "num_gpus": tp}, "parallel": {"tp": tp},
            "serve": {"vllm_version": version, "gpu_memory_utilization": 0.9, "max_model_len": max_len, **serve}}


def _decide(model: Any, tp: int, version: str = "0.11", max_len: int = 8192) -> Any:
    return decide(resolve(_doc(model, tp, version, max_len, kv_cache_memory_bytes=KV_10_GIB)), version=version)


def test_the_shared_block_row_names_zamba2s_adapter_lists() -> None:
    # the row's lists are the adapters transformers' Zamba2 builds (with use_shared_attention_adapter), held whole
    m = model_from_config({**ZAMBA2_DEFAULTS, "use_shared_attention_adapter": True})
    lists = {part for p in m.params if p.tp == "replicated" for part in p.name.split(".") if part.endswith("_list")}
    assert lists == SHARED_BLOCK_TP_SHARDED_LISTS


@pytest.mark.parametrize(("kind", "config", "prefix"), [
    ("mamba2", BAMBA_9B, "layers.mamba."),
    ("mamba1", JAMBA_V01, "layers.mamba."),
    ("gated_deltanet", QWEN3_NEXT_80B, "layers.linear_attn."),
    ("short_conv", LFM2_1_2B, "layers.conv."),
])
def test_facts_rows_name_tensors_the_mixers_hold_whole(kind: str, config: dict[str, Any], prefix: str) -> None:
    # one test per row: every module the row names is a mixer tensor of a family of that kind, kept whole on every
    # rank by the dense split (transformers' modules), which vLLM shards
    m = model_from_config(config)
    assert m.mamba is not None and m.mamba.kind == kind
    whole = {p.module for p in m.params if p.name.startswith(prefix) and p.tp == "replicated"}
    assert MIXER_TP_SHARDED[kind] <= whole
    # what stays whole in vLLM too: Jamba's dt/B/C norms, Qwen3-Next's RMSNormGated(head_v_dim)
    assert whole - MIXER_TP_SHARDED[kind] == {"mamba1": {"dt_layernorm", "b_layernorm", "c_layernorm"},
                                              "gated_deltanet": {"norm"}}.get(kind, set())


def test_extra_groups_for_head_shards() -> None:
    # mamba_utils.py:154-164 at 0.11.0: 0 where tp divides the groups, else tp - n_groups (one group)
    assert [extra_groups_for_head_shards(1, t) for t in (1, 2, 4, 8)] == [0, 1, 3, 7]
    assert [extra_groups_for_head_shards(8, t) for t in (1, 2, 4, 8)] == [0, 0, 0, 0]


def test_bamba_9b_at_tp_2_by_hand() -> None:
    ms = model_from_config(BAMBA_9B).mamba
    assert ms is not None
    # one group, tp 2: one extra group, conv_dim 8,192 + 2 x 2 x 128 = 8,704, 4,352 per rank: conv 3 x 4,352 x 2 B =
    # 26,112; SSM 128 / 2 = 64 heads x 64 x 128 x 2 B = 1,048,576 -> 1,074,688 B
    assert mamba_state_page_bytes(ms, 2, tp=2) == 1_074_688
    # attention per token per rank: 8 / 2 = 4 KV heads x 128 x 2 (K, V) x 2 B = 2,048; block 16 x cdiv(1,074,688,
    # 32,768) = 16 x 33 = 528, page 528 x 2,048 = 1,081,344
    lay = hybrid_layout(ms, 3, 2048, 2, 16, RULE_0_11, tp=2)
    assert (lay.block_size, lay.page, lay.group_size, lay.attention_groups, lay.mamba_groups) == (528, 1_081_344, 3, 1,
                                                                                                   10)
    d = _decide(BAMBA_9B, 2)
    assert (d.block_size, d.page_bytes, d.to_dict()["mamba_state_page_bytes"]) == (528, 1_081_344, 1_074_688)
    # 10,737,418,240 // 1,081,344 = 9,929 pages; // 3 = 3,309 blocks; tokens 3,309 // 11 groups x 528 = 300 x 528
    assert (d.num_gpu_blocks, d.kv_cache_tokens) == (3309, 158_400)
    # needed: (3 x cdiv(8,192, 528) + 29) x 1,081,344 = (48 + 29) x 1,081,344 = 83,263,488 B
    assert d.needed_kv_bytes == 83_263_488
    # profile run per token and rank: in_proj (4,096 + 4,352 + 64), the x|B|C copy 4,352, the gated norm 4,096
    assert mixer_profile_width(ms, 4096, 2) == 2 * 4096 + 2 * 4352 + 64 == 16_960


def test_bamba_9b_weights_at_tp_2_by_hand() -> None:
    m = model_from_config(BAMBA_9B)
    layers = tuple(range(32))
    # per mixer: in_proj 4,096 x (8,192 + 8,704 + 128) / 2 = 34,865,152 against 4,096 x 16,768 / 2 = 34,340,864
    # (+524,288); conv1d weight 8,704 x 4 / 2 = 17,408 against 33,792 (-16,384), bias 4,352 against 8,448 (-4,096);
    # A_log, D, dt_bias 64 against 128 each (-192); norm 4,096 against 8,192 (-4,096): +499,520; 29 mixers
    assert mixer_weights_tp_delta(m, 2, layers) == 29 * 499_520 == 14_486_080
    assert mixer_weights_tp_delta(m, 1, layers) == 0
    # the serve weights move by that many bf16 elements beyond the dense split
    r = resolve(_doc(BAMBA_9B, 2))
    dense = rank_params(m, 2, 1, 1, 0, None).total
    assert serve_weights_bytes(r)[0] == (dense + 14_486_080) * 2


def test_bamba_9b_at_tp_4_with_three_extra_groups() -> None:
    ms = model_from_config(BAMBA_9B).mamba
    assert ms is not None
    # tp 4: 3 extra groups, conv_dim 8,192 + 2 x 4 x 128 = 9,216, 2,304 per rank: 3 x 2,304 x 2 = 13,824; SSM 32 heads x
    # 64 x 128 x 2 = 524,288 -> 538,112 B; attention 8 / 4 = 2 KV heads x 128 x 2 x 2 = 1,024 B per token; block 16 x
    # cdiv(538,112, 16,384) = 16 x 33 = 528, page 528 x 1,024 = 540,672
    assert mamba_state_page_bytes(ms, 2, tp=4) == 538_112
    d = _decide(BAMBA_9B, 4)
    assert (d.block_size, d.page_bytes) == (528, 540_672)
    # 10,737,418,240 // 540,672 = 19,859; // 3 = 6,619 blocks; 6,619 // 11 x 528 = 601 x 528 = 317,328 tokens
    assert (d.num_gpu_blocks, d.kv_cache_tokens) == (6619, 317_328)


def test_qwen3_next_80b_at_tp_4_with_a_replicated_kv_head() -> None:
    m = model_from_config(QWEN3_NEXT_80B)
    ms = m.mamba
    assert ms is not None
    # conv_dim 8,192 / 4 = 2,048: 3 x 2,048 x 2 B = 12,288; 32 / 4 = 8 value heads x 128 x 128 x 2 B = 262,144
    assert mamba_state_page_bytes(ms, 2, tp=4) == 274_432
    d = _decide(QWEN3_NEXT_80B, 4)
    # 2 KV heads over 4 ranks: one (replicated) per rank, 2 x 1 x 256 x 2 B = 1,024 per token; block 16 x
    # cdiv(274,432, 16,384) = 16 x 17 = 272, page 272 x 1,024 = 278,528; groups of 12: 1 attention + 3 mixer
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups)) == (272, 278_528, 12, 4)
    # 10,737,418,240 // 278,528 = 38,550; // 12 = 3,212 blocks; 3,212 // 4 x 272 = 803 x 272 = 218,416 tokens
    assert (d.num_gpu_blocks, d.kv_cache_tokens) == (3212, 218_416)
    # needed: (12 x cdiv(8,192, 272) + 36) x 278,528 = (12 x 31 + 36) x 278,528 = 408 x 278,528 = 113,639,424 B
    assert d.needed_kv_bytes == 113_639_424
    # weights: conv1d 32,768 -> 8,192 (-24,576), dt_bias and A_log 32 -> 8 (-24 each): -24,624 per layer, 36 layers
    assert mixer_weights_tp_delta(m, 4, tuple(range(48))) == -36 * 24_624


def test_qwen3_next_80b_at_tp_4_on_h100_whole_budget() -> None:
    # the default budget (gpu_memory_utilization 0.9 of an H100): the pool is the available bytes in pages of 278,528
    # B, 12 layers each, 4 groups of 272 tokens
    d = decide(resolve(_doc(QWEN3_NEXT_80B, 4)), version="0.11")
    assert (d.block_size, d.page_bytes) == (272, 278_528)
    blocks = d.available_kv_bytes // 278_528 // 12
    assert d.num_gpu_blocks == blocks and d.kv_cache_tokens == blocks // 4 * 272
    assert 550_000 < d.kv_cache_tokens < 650_000  # ~37 GiB of weights per rank leave ~28 GiB of the 72 GiB budget


def test_nemotron_h_56b_at_tp_2() -> None:
    # the catalog's config: 54 Mamba2 mixers of 256 heads of 64, 8 groups of state 256, d_conv 4, intermediate 16,384;
    # 10 attention layers of 8 KV heads of 128; tp 2: no extra group, conv_dim (16,384 + 2 x 8 x 256) / 2 = 10,240:
    # 3 x 10,240 x 2 = 61,440; SSM 128 x 64 x 256 x 2 = 4,194,304 -> 4,255,744 B; attention 4 KV heads x 128 x 2 x 2 =
    # 2,048 B per token; block 16 x cdiv(4,255,744, 32,768) = 16 x 130 = 2,080, page 4,259,840
    d = decide(resolve(_doc("nvidia/Nemotron-H-56B-Base-8K", 2, kv_cache_memory_bytes=KV_10_GIB)), version="0.11")
    assert (d.block_size, d.page_bytes, d.to_dict()["mamba_state_page_bytes"]) == (2080, 4_259_840, 4_255_744)
    # groups of 10: 1 attention + cdiv(54, 10) = 6 mixer; 10,737,418,240 // 4,259,840 = 2,520; // 10 = 252 blocks;
    # 252 // 7 x 2,080 = 36 x 2,080 = 74,880 tokens
    assert (d.layers_per_group, len(d.groups), d.num_gpu_blocks, d.kv_cache_tokens) == (10, 7, 252, 74_880)


def test_jamba_and_lfm2_at_tp_2() -> None:
    jamba = model_from_config(JAMBA_V01).mamba
    assert jamba is not None
    # Mamba-1, intermediate 8,192 / 2 = 4,096 channels: conv 3 x 4,096 x 2 = 24,576; SSM 4,096 x 16 x 2 = 131,072
    assert mamba_state_page_bytes(jamba, 2, tp=2) == 155_648
    d = _decide(JAMBA_V01, 2)
    # 8 / 2 = 4 KV heads x 128 x 2 x 2 = 2,048 B per token: block 16 x cdiv(155,648, 32,768) = 80, page 163,840
    assert (d.block_size, d.page_bytes) == (80, 163_840)
    # profile run: in_proj 2 x 4,096, the x copy 4,096, out_proj's result and the layer's output 4,096 each
    assert mixer_profile_width(jamba, 4096, 2) == 3 * 4096 + 2 * 4096
    # weights per mixer: conv1d 32,768 + 8,192 halved (-20,480), x_proj 8,192 x 288 halved (-1,179,648), dt_proj
    # 256 x 8,192 + 8,192 halved (-1,052,672), A_log 8,192 x 16 halved (-65,536), D (-4,096): -2,322,432
    m = model_from_config(JAMBA_V01)
    assert mixer_weights_tp_delta(m, 2, tuple(range(m.num_layers))) == -len(jamba.layers) * 2_322_432
    lfm2 = model_from_config(LFM2_1_2B).mamba
    assert lfm2 is not None
    # 2 x 2,048 / 2 x 2 B = 4,096; attention 8 / 2 = 4 KV heads x 64 x 2 x 2 = 1,024 per token: block 16, page 16,384
    assert mamba_state_page_bytes(lfm2, 2, tp=2) == 4096
    assert (_decide(LFM2_1_2B, 2).block_size, _decide(LFM2_1_2B, 2).page_bytes) == (16, 16_384)
    # profile run: 5 x 1,024 + 2 x 2,048 = 9,216 per token and rank
    assert mixer_profile_width(lfm2, 2048, 2) == 9216


def test_zamba2_at_tp_2_by_hand() -> None:
    m = model_from_config(ZAMBA2_DEFAULTS)
    ms = m.mamba
    assert ms is not None
    # one group, tp 2: one extra group, conv_dim 5,120 + 2 x 2 x 64 = 5,376, 2,688 per rank: 3 x 2,688 x 2 = 16,128; SSM
    # 8 / 2 = 4 heads x 640 x 64 x 2 = 327,680 -> 343,808 B
    assert mamba_state_page_bytes(ms, 2, tp=2) == 343_808
    d = _decide(ZAMBA2_DEFAULTS, 2, max_len=4096)
    # 32 / 2 = 16 KV heads x 160 x 2 x 2 = 10,240 B per token: block 16 x cdiv(343,808, 163,840) = 48, page 491,520;
    # 10,737,418,240 // 491,520 = 21,845; // 9 = 2,427 blocks; 2,427 // 7 groups x 48 = 346 x 48 = 16,608 tokens
    assert (d.block_size, d.page_bytes, d.num_gpu_blocks, d.kv_cache_tokens) == (48, 491_520, 2427, 16_608)
    # weights per mixer: in_proj 2,560 x (5,120 + 5,376 + 8) / 2 = 13,445,120 against 2,560 x 10,376 / 2 = 13,281,280
    # (+163,840); conv1d 5,376 x 4 / 2 = 10,752 against 20,992 (-10,240), its bias 2,688 against 5,248 (-2,560);
    # A_log, D, dt_bias 4 against 8 (-12); norm 2,560 against 5,120 (-2,560): +148,468 x 54 mixers = +8,017,272;
    # the gate_up adapters (9 of each, Zamba2LoRA: A and B column-parallel) 2,560 x 128 and 128 x 20,480 halved:
    # -9 x (163,840 + 1,310,720) = -13,271,040; the per-layer linear stays whole (ReplicatedLinear)
    assert mixer_weights_tp_delta(m, 2, tuple(range(54))) == 8_017_272 - 13_271_040


def test_state_space_models_at_tp_2() -> None:
    # Mamba-Codestral-7B: 8 groups, tp 2: (8,192 + 2 x 8 x 128) / 2 = 5,120 channels: 3 x 5,120 x 2 = 30,720; 64 x 64 x
    # 128 x 2 = 1,048,576 -> 1,079,296 B, one group of 64 layers, the page unpadded
    d = _decide(CODESTRAL, 2)
    assert (d.page_bytes, d.layers_per_group) == (1_079_296, 64)
    # 10,737,418,240 // 1,079,296 // 64 = 9,948 // 64 = 155 blocks of 8,192 tokens
    assert (d.num_gpu_blocks, d.kv_cache_tokens) == (155, 155 * 8192)


def test_the_report_says_what_each_rank_keeps() -> None:
    text = " ".join(estimate(_doc(BAMBA_9B, 2)).assumptions)
    assert "tensor parallel 2: each rank keeps its share of every mixer's state" in text
    assert "its 1 B/C group(s) become 2" in text and "max(1, KV heads / tp)" in text
    assert "tensor parallel" not in " ".join(estimate(_doc(BAMBA_9B, 1)).assumptions)
    assert "replicated" not in text  # 8 KV heads over 2 ranks split evenly
    # Qwen3-Next at tp 4: 2 KV heads of 256 over 4 ranks, each holds one whole; the dense split counts K and V at 1/4:
    # 12 layers x 2 x (256 x 2,048 - 2 x 256 x 2,048 / 4) x 2 B = 12 x 2 x 262,144 x 2 = 12,582,912 B left out
    q = " ".join(estimate(_doc(QWEN3_NEXT_80B, 4)).assumptions)
    assert "one of the 2 KV heads whole, replicated by vLLM's QKVParallelLinear" in q
    assert "12,582,912 B per rank more than the dense split's 1/4, counted in the weights" in q


@pytest.mark.parametrize(("model", "tp", "text", "fix"), [
    # Zamba2LoRA.A is a ColumnParallelLinear of the adapter's rank: 100 over 8 ranks does not split, over 4 it does
    ({**ZAMBA2_DEFAULTS, "adapter_rank": 100}, 8, "its adapters' rank 100 does not split over tp 8",
     "use parallel.tp 4"),
    # MambaMixer2 asserts one group or a multiple of tp
    ({**BAMBA_9B, "mamba_n_groups": 3}, 2, "its 3 groups are neither 1 nor a multiple of tp 2", "use parallel.tp 1"),
    (CODESTRAL, 16, "its 8 groups are neither 1 nor a multiple of tp 16", "use parallel.tp 8"),
    # divide(intermediate_size, tp): 5,120 channels over 3 ranks
    (MAMBA_2_8B, 3, "its 5120 channels (intermediate size)", "use parallel.tp 2"),
])
def test_what_does_not_split_is_refused(model: Any, tp: int, text: str, fix: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate(_doc(model, tp, max_len=4096))
    assert err.value.problems[0].where == "parallel.tp"
    assert text in str(err.value) and fix in err.value.problems[0].hint


def test_mixer_tp_problem_for_gated_deltanet_key_heads() -> None:
    ms = model_from_config(QWEN3_NEXT_80B).mamba
    assert ms is not None
    # 16 key heads and 32 value heads: tp 8 and 16 split both; tp 32 splits the value heads only
    assert mixer_tp_problem(ms, 8) == mixer_tp_problem(ms, 16) == ""
    assert "16 key heads" in mixer_tp_problem(ms, 32)


def test_the_planner_names_the_mixers() -> None:
    from vramplan.plan import ServeJob, plan

    assert mixer_name("gated_deltanet") == "Gated DeltaNet linear-attention"
    with pytest.raises(ScenarioError) as err:
        plan(QWEN3_NEXT_80B, "H100", 4, ServeJob(max_model_len=8192))
    msg = str(err.value)
    assert "36 Gated DeltaNet linear-attention mixer layers (a hybrid model)" in msg
    assert "decode step time of its mixers is not modelled" in msg and "tensor parallelism included" in msg
    with pytest.raises(ScenarioError, match="64 Mamba2 mixer layers \\(a state-space model\\)"):
        plan(CODESTRAL, "H100", 1, ServeJob(max_model_len=8192))
