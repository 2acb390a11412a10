"""SGLang's speculative decoding and DP attention at start-up (serve/sglang_options.py): each release's pool rule
and reserve by hand, DeepSeek's weight placement under DP attention, and the combinations refused with a reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.catalog.models import load_model
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.serve.sglang import decide_sglang
from vramplan.serve.sglang_options import (
    DP_RULES,
    SPEC_RULES,
    dp_rule_for,
    headroom_tokens,
    model_draft,
    spec_rule_for,
)

FREE = 84_467_326_648  # H100-SXM free at start: 85,017,755,648 - CUDA context 550,429,000 (tests/test_serve_sglang.py)
W = 16_127_631_360  # Llama-3.1-8B bf16 + its fp32 rotary cache
CELL = 131_072  # 8 KV heads x 128 x 32 layers x 2 x 2 B
EAGLE = {"method": "eagle", "model": "lmsys/sglang-EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3}


def doc(model: str = "meta-llama/Llama-3.1-8B", gpu: str = "H100-SXM", tp: int = 1, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp}, "parallel": {"tp": tp},
            "serve": {"engine": "sglang", **serve}}


def test_rule_of_each_release() -> None:
    pools = {r: spec_rule_for(tuple(int(x) for x in r.split(".")) + (0,) * (3 - len(r.split("."))), "eagle").pool
             for r in ("0.4.3", "0.4.4", "0.4.5", "0.4.8", "0.5.3", "0.5.6", "0.5.7", "0.5.13", "0.5.14", "0.5.23")}
    assert pools == {"0.4.3": "draft_headroom", "0.4.4": "draft_headroom", "0.4.5": "shared_headroom",
                     "0.4.8": "shared_headroom", "0.5.3": "shared_headroom", "0.5.6": "shared_headroom",
                     "0.5.7": "shared", "0.5.13": "shared", "0.5.14": "cell_scaled", "0.5.23": "cell_scaled"}
    # every rule says where it was read
    assert all(r.sources and "wheel" in r.sources[0] for r in SPEC_RULES)
    assert all(d.sources and "wheel" in d.sources[0] for d in DP_RULES)
    assert dp_rule_for((0, 4, 3)).dp_is_tp and not dp_rule_for((0, 4, 5)).dp_is_tp
    assert dp_rule_for((0, 5, 7)).embed == "replicated" and dp_rule_for((0, 5, 8)).embed == "attn_tp"


@given(steps=st.integers(1, 16), reqs=st.integers(1, 4096))
def test_headroom_formulas(steps: int, reqs: int) -> None:
    shared, draft, plain = (next(r for r in SPEC_RULES if r.release == v) for v in ("0.4.5", "0.4.3", "0.5.7"))
    # topk 1, steps + 1 draft tokens: reqs x (steps + steps + 1) + 100
    assert headroom_tokens(shared, reqs, steps, 1, steps + 1) == reqs * (2 * steps + 1) + 100
    assert headroom_tokens(draft, reqs, steps, 1, steps + 1) == reqs * steps + 100
    assert headroom_tokens(plain, reqs, steps, 1, steps + 1) == 0


def test_eagle_048_shared_pool_with_headroom() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.4.8", speculative=EAGLE)))
    # 0.4.8 reserve: (9.5 + 1/2) GiB + 2 GiB for speculative decoding = 12,288 MiB of 81,079.25 MiB:
    # round((81,079.25 - 12,288) / 81,079.25, 3) = round(0.84845, 3) = 0.848
    assert d.mem_fraction_static == 0.848 and d.reserved_heuristic_bytes == 12_288 * 2**20
    # profiled: 84,467,326,648 x 0.848 - 16,127,631,360 = 55,500,661,637.5 B // 131,072 = 423,436 tokens;
    # max_running_requests defaults to 48, headroom 48 x (3 x 1 + 4) + 100 = 436: 423,872 tokens
    assert int((FREE * 0.848 - W) // CELL) == 423_436
    assert d.speculative_headroom_tokens == 436 and d.max_total_num_tokens == 423_872
    assert d.max_num_reqs == 48 and d.max_running_requests == 48 and d.speculative_algorithm == "EAGLE"
    # request table 48 rows (0.4.7 on: size=max_num_reqs) x (131,072 + 4) x 4 B = 25,166,592 B (0.4.8 has no
    # draft-token columns yet)
    assert d.req_to_token_bytes == 25_166_592
    # the head's config is not in the catalog: its weights and pool are stated, not counted; the headroom's
    # 436 x 131,072 B is taken from the reserve
    assert d.draft_weights_bytes == 0 and d.outside_fraction_bytes == 436 * CELL
    assert any("not counted" in a for a in d.assumptions)
    assert d.to_dict()["speculative_headroom_tokens"] == 436


def test_eagle_057_shared_pool_without_headroom() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.5.7", speculative=EAGLE)))
    # 0.5.7: 512 + 8,192 x 1.5 + 256 x 2 + 1/8 x 1,024 = 13,440 MiB (above the 10 GiB floor), + 2,048 after it
    # = 15,488: round((81,079.25 - 15,488) / 81,079.25, 3) = 0.809
    assert d.mem_fraction_static == 0.809
    # (84,467,326,648 x 0.809 - 16,127,631,360) // 131,072 = 398,303 tokens, no headroom
    assert d.max_total_num_tokens == int((FREE * 0.809 - W) // CELL) == 398_303
    assert d.speculative_headroom_tokens == 0 and d.draft_kv_tokens == 398_303


def test_eagle_reserve_4_gib_from_0510() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.5.10", speculative=EAGLE)))
    # 13,440 MiB (piecewise graphs off with speculative decoding) + 4,096: round((81,079.25 - 17,536) / 81,079.25, 3)
    assert d.reserved_heuristic_bytes == 17_536 * 2**20 and d.mem_fraction_static == 0.784


def test_standalone_draft_0514_cell_scaled_and_loaded_first() -> None:
    spec = {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}
    d = decide_sglang(resolve(doc(sglang_version="0.5.14", speculative=spec)))
    # 0.5.14 drops the speculative reserve: 13,440 MiB -> round((81,079.25 - 13,440) / 81,079.25, 3) = 0.834
    assert d.mem_fraction_static == 0.834
    # the draft (1,235,814,400 parameters x 2 B = 2,471,628,800 B) is loaded before the pool is sized; the cell
    # grows to int(131,072 x (1 + 16 / 32)) = 196,608 B: (84,467,326,648 x 0.834 - 16,127,631,360 - 2,471,628,800)
    # // 196,608 = 263,704 tokens
    assert d.max_total_num_tokens == int((FREE * 0.834 - W - 2_471_628_800) // 196_608) == 263_704
    assert d.draft_weights_bytes == 2_471_628_800 and d.outside_fraction_bytes == 0
    # the draft's own pool: 263,704 tokens x (8 KV heads x 64 x 16 layers x 2 x 2 B = 32,768 B)
    assert d.draft_kv_bytes == 263_704 * 32_768
    assert d.device_used_bytes - d.req_to_token_bytes == (d.cuda_context_bytes + W + 263_704 * CELL
                                                          + 2_471_628_800 + 263_704 * 32_768)


def test_standalone_draft_053_from_the_reserve() -> None:
    spec = {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}
    d = decide_sglang(resolve(doc(sglang_version="0.5.3", speculative=spec)))
    # 13,440 + 6,144 MiB for STANDALONE: round((81,079.25 - 19,584) / 81,079.25, 3) = 0.758
    assert d.mem_fraction_static == 0.758
    profiled = int((FREE * 0.758 - W) // CELL)
    assert d.max_total_num_tokens == profiled + 436 and d.draft_kv_tokens == profiled + 436
    # from the reserve: the headroom's target KV, the draft's pool and its weights
    assert d.outside_fraction_bytes == 436 * CELL + (profiled + 436) * 32_768 + 2_471_628_800
    assert d.starts and d.outside_fraction_bytes + d.req_to_token_bytes < d.reserve_bytes


def test_draft_outgrowing_the_reserve_is_a_start_failure() -> None:
    # a given fraction of 0.95 leaves 4.2 GB outside it; a 1B draft's 2.47 GB and its pool do not fit
    spec = {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}
    d = decide_sglang(resolve(doc(sglang_version="0.5.3", speculative=spec, mem_fraction_static=0.95)))
    assert not d.starts and d.problem.startswith("CUDA out of memory loading the draft worker")
    assert "mem_fraction_static" in d.fix


def test_ngram_only_changes_the_request_default() -> None:
    n = decide_sglang(resolve(doc(sglang_version="0.5.3", speculative={"method": "ngram", "num_speculative_tokens": 3})))
    plain = decide_sglang(resolve(doc(sglang_version="0.5.3")))
    # NGRAM adds no reserve and no pool; it defaults max_running_requests to 48
    assert n.mem_fraction_static == plain.mem_fraction_static and n.max_total_num_tokens == plain.max_total_num_tokens
    assert n.max_running_requests == 48 and n.draft_kv_bytes == 0 and n.speculative_algorithm == "NGRAM"


def test_mtp_deepseek_v3_nextn_layer() -> None:
    d = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V3", "H200", 8, sglang_version="0.4.8",
                                  quantization="fp8-block", speculative={"method": "mtp", "num_speculative_tokens": 3})))
    plain = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V3", "H200", 8, sglang_version="0.4.8",
                                      quantization="fp8-block")))
    assert d.speculative_algorithm == "NEXTN" and d.speculative_headroom_tokens == 436
    # one NEXTN layer's MLA pool: (512 + 64) x 1 layer x 2 B = 1,152 B per token
    assert d.draft_kv_bytes == d.draft_kv_tokens * 1_152 and d.draft_kv_tokens == d.max_total_num_tokens
    # the MTP layer is one MoE decoder layer (~1/58 of the routed weights) plus eh_proj: more than 1 GB per rank
    assert 1e9 < d.draft_weights_bytes < plain.weights_bytes / 40
    # 2 GiB more reserved than without it
    assert d.reserved_heuristic_bytes is not None and plain.reserved_heuristic_bytes is not None
    assert d.reserved_heuristic_bytes - plain.reserved_heuristic_bytes == 2 * 2**30


def test_dp_attention_deepseek_v2_lite_weights_reserve_and_chunk() -> None:
    for release, reserve_mib, extra_weights in (("0.4.8", 10_752 + 4_096, 549_453_824),
                                                ("0.5.8", 13_568 + 1_536, 549_453_824),
                                                ("0.4.1", None, 549_453_824 + 209_715_200)):
        d = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V2-Lite", tp=2, sglang_version=release, dp_attention=2)))
        plain = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V2-Lite", tp=2, sglang_version=release)))
        # attention whole on each rank: q_proj 2,048 x 3,072 + kv_b_proj 512 x 4,096 + o_proj 2,048 x 2,048 =
        # 12,582,912 per layer x 27 = 339,738,624, half of it more per rank = 169,869,312; the embedding
        # 102,400 x 2,048 = 209,715,200, half more = 104,857,600 (replicated to 0.5.7, over the attention group of
        # one rank from 0.5.8): 274,726,912 x 2 B = 549,453,824 B; 0.4.1 also replicates the LM head (+209,715,200)
        assert d.weights_bytes - plain.weights_bytes == extra_weights, release
        # chunked prefill 8,192 // dp 2 (0.4.1: // 2)
        assert d.chunked_prefill_size == 4096 and d.dp_attention == 2
        # the MLA cell is the same latent at any attention tp
        assert d.cell_size_bytes == plain.cell_size_bytes
        if reserve_mib is not None:
            # 0.4.8: (9.5 + 2/2) GiB + 4 GiB; 0.5.8: 512 + 12,288 + 512 + 256 + 256 x 2 x 3 (graph_bs x dp x 3)
            assert d.reserved_heuristic_bytes == reserve_mib * 2**20, release
        assert not any(a.startswith("DP attention (--enable-dp-attention) off") for a in d.assumptions)
        assert d.to_dict()["dp_attention"] == 2


def test_dp_attention_large_graph_bs_reserve() -> None:
    d = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V3", "H200", 8, sglang_version="0.5.3",
                                  quantization="fp8-block", dp_attention=8)))
    # 512 + 8,192 x 1.5 + 512 x 2 + 8/8 x 1,024 + 512 x 8 x 3 + 512 x 8 x 1.5 (graph_bs 512 > 300) = 33,280 MiB
    assert d.reserved_heuristic_bytes == 33_280 * 2**20 and d.chunked_prefill_size == 1024


@pytest.mark.parametrize(("serve", "model", "tp", "where", "words"), [
    ({"sglang_version": "0.4.1", "speculative": EAGLE}, "meta-llama/Llama-3.1-8B", 1, "serve.speculative",
     "before 0.4.3"),
    ({"sglang_version": "0.4.3", "speculative": {**EAGLE, "method": "eagle3"}}, "meta-llama/Llama-3.1-8B", 1,
     "serve.speculative.method", "EAGLE3"),
    ({"sglang_version": "0.4.8", "speculative": {**EAGLE, "method": "draft"}}, "meta-llama/Llama-3.1-8B", 1,
     "serve.speculative.method", "STANDALONE"),
    ({"sglang_version": "0.4.8", "speculative": {"method": "mtp"}}, "meta-llama/Llama-3.1-8B", 1,
     "serve.speculative.method", "no MTP layers"),
    ({"sglang_version": "0.4.8", "speculative": {"method": "eagle"}}, "meta-llama/Llama-3.1-8B", 1,
     "serve.speculative.model", "needs a model"),
    ({"sglang_version": "0.5.14", "speculative": EAGLE}, "meta-llama/Llama-3.1-8B", 1, "serve.speculative.model",
     "sglang-EAGLE"),
    ({"sglang_version": "0.4.8", "dp_attention": 2}, "meta-llama/Llama-3.1-8B", 2, "serve.dp_attention",
     "DeepSeek-V2/V3"),
    ({"sglang_version": "0.4.3", "dp_attention": 2}, "deepseek-ai/DeepSeek-V2-Lite", 4, "serve.dp_attention",
     "dp_size = tp_size"),
    ({"sglang_version": "0.4.8", "dp_attention": 3}, "deepseek-ai/DeepSeek-V2-Lite", 2, "serve.dp_attention",
     "tp_size % dp_size"),
    ({"sglang_version": "0.5.3", "dp_attention": 2, "speculative": {"method": "ngram"}},
     "deepseek-ai/DeepSeek-V2-Lite", 2, "serve.dp_attention", "ngram speculative decoding does not support dp"),
    ({"sglang_version": "0.5.3", "dp_attention": 2, "speculative": EAGLE}, "deepseek-ai/DeepSeek-V2-Lite", 2,
     "serve.dp_attention", "EAGLE head under DP attention is not modelled"),
    ({"sglang_version": "0.4.0", "dp_attention": 2}, "deepseek-ai/DeepSeek-V2-Lite", 2, "serve.dp_attention",
     "0.4.0"),
])
def test_unmodelled_combinations_are_refused(serve: dict[str, Any], model: str, tp: int, where: str,
                                             words: str) -> None:
    with pytest.raises(ScenarioError, match=where) as e:
        decide_sglang(resolve(doc(model, tp=tp, **serve)))
    assert words in str(e.value)


def test_engine_options() -> None:
    # serve.dp_attention is SGLang's; serve.speculative belongs to vLLM and SGLang, not llama.cpp
    with pytest.raises(ScenarioError, match="serve.dp_attention"):
        resolve({**doc(), "serve": {"engine": "vllm", "dp_attention": 2}})
    with pytest.raises(ScenarioError, match="serve.speculative"):
        resolve({**doc(), "serve": {"engine": "llamacpp", "speculative": {"method": "ngram"}}})


def test_report_rows_and_cli() -> None:
    from typer.testing import CliRunner

    from vramplan import estimate
    from vramplan.cli.main import app

    spec = {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}
    rep = estimate(doc(sglang_version="0.5.14", speculative=spec))
    detail = rep.per_gpu.breakdown_detail
    assert detail["weights"]["speculative proposer"] == 2_471_628_800
    assert detail["kv_cache"]["speculative draft KV pool"] == 263_704 * 32_768
    res = CliRunner().invoke(app, ["serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                                   "--sglang-version", "0.5.14", "--speculative-method", "draft", "--speculative-model",
                                   "meta-llama/Llama-3.2-1B", "--num-speculative-tokens", "3", "--json"],
                             env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.stdout
    assert '"speculative_algorithm": "STANDALONE"' in res.stdout and '"draft_kv_tokens": 263704' in res.stdout
    res = CliRunner().invoke(app, ["serve", "--model", "deepseek-ai/DeepSeek-V2-Lite", "--gpu", "H100", "--engine",
                                   "sglang", "--tp", "2", "--sglang-version", "0.4.8",
                                   "--dp-attention", "2", "--json"],
                             env={"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.stdout
    assert '"dp_attention": 2' in res.stdout


def test_eagle_043_draft_pool_headroom_and_no_chunked_prefill() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.4.3", speculative=EAGLE)))
    # 0.4.3 has the tp table (0.88) and no 48-request default: the target keeps its profiled
    # (84,467,326,648 x 0.88 - 16,127,631,360) // 131,072 = 444,058 tokens; max_num_reqs
    # min(max(int(444,058 / 131,072 x 512), 2048), 4096) = 2048; the draft pool adds 2048 x 3 + 100 = 6,244
    assert d.max_total_num_tokens == 444_058 and d.speculative_headroom_tokens == 6_244
    assert d.draft_kv_tokens == 444_058 + 6_244 and d.max_num_reqs == 2048
    assert d.chunked_prefill_size == -1 and any("radix cache are off" in a for a in d.assumptions)
    # the headroom is in the draft's pool, not the target's: nothing of the target's is outside the fraction
    assert d.outside_fraction_bytes == 0  # the head's config is not readable: its pool is stated, not counted


def test_dp_attention_groups_of_two_ranks() -> None:
    d = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V2-Lite", tp=4, sglang_version="0.5.8", dp_attention=2)))
    plain = decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V2-Lite", tp=4, sglang_version="0.5.8")))
    # attention split over groups of tp / dp = 2 ranks instead of 4: the 339,738,624 split attention parameters
    # held /2 = 169,869,312 instead of /4 = 84,934,656 (+84,934,656); the embedding over the attention group:
    # 209,715,200 / 2 instead of / 4 (+52,428,800): 137,363,456 x 2 B = 274,726,912 B more per rank
    assert d.weights_bytes - plain.weights_bytes == 274_726_912
    assert d.chunked_prefill_size == 8192 // 2
    assert any("dp 2 of tp 4" in a and "groups of 2 rank(s)" in a for a in d.assumptions)


def test_eagle3_head_keeps_its_own_lm_head() -> None:
    # speculative/eagle_worker.py: an EAGLE head takes the target's embedding and LM head (set_embed_and_head), an
    # EAGLE-3 head the embedding only (set_embed: "most cases EAGLE3 models don't share lm_head").  TinyLlama as the
    # head, tp 1, bf16: 1,100,048,384 parameters x 2 B = 2,200,096,768 B loaded; embedding and untied head
    # 32,000 x 2,048 x 2 B = 131,072,000 B each
    head = load_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    eagle, eagle3 = model_draft(head, 1, 2, 2, "eagle"), model_draft(head, 1, 2, 2, "eagle3")
    assert eagle.load_bytes == eagle3.load_bytes == 2_200_096_768
    assert eagle.resident_bytes == 2_200_096_768 - 2 * 131_072_000 == 1_937_952_768
    assert eagle3.resident_bytes == 2_200_096_768 - 131_072_000 == 2_069_024_768
    assert model_draft(head, 1, 2, 2, "draft").resident_bytes == 2_200_096_768


def test_mtp_with_dp_attention_deepseek_v3() -> None:
    def run(release: str, dp: int) -> Any:
        return decide_sglang(resolve(doc("deepseek-ai/DeepSeek-V3", "H200", 8, sglang_version=release, dp_attention=dp,
                                         quantization="fp8-block",
                                         speculative={"method": "mtp", "num_speculative_tokens": 3})))

    plain, dp8, old, dp4 = run("0.4.8", 1), run("0.4.8", 8), run("0.4.5", 8), run("0.5.10", 4)
    assert dp8.starts and dp8.speculative_algorithm == "NEXTN" and dp8.dp_attention == 8
    # the NEXTN layer's attention whole on every rank at dp = tp = 8: q_b_proj 1,536 x 24,576 + kv_b_proj 512 x 32,768
    # + o_proj 16,384 x 7,168 = 171,966,464 fp8 bytes, of which a rank held 1/8 (21,495,808): 150,470,656 B more;
    # their 128 x 128 block scales (4 B each): (12 x 192 - 12 x 24) + (4 x 256 - 4 x 32) + (128 x 56 - 16 x 56) =
    # 2,016 + 896 + 6,272 = 9,184 blocks = 36,736 B more
    assert dp8.draft_weights_bytes - plain.draft_weights_bytes == 150_470_656 + 36_736
    # groups of two ranks at dp 4 (0.5.10): 171,966,464 x (1/2 - 1/8) = 64,487,424 B and (1,152 - 288) + (512 - 128)
    # + (3,584 - 896) = 3,936 blocks = 15,744 B
    assert dp4.draft_weights_bytes - run("0.5.10", 1).draft_weights_bytes == 64_487_424 + 15_744
    # the MLA cell: (512 + 64) x 61 layers x 2 B = 70,272 B per token at any attention tp; 0.4.8's shared pool adds
    # 48 x (3 + 4) + 100 = 436 tokens
    assert dp8.cell_size_bytes == 70_272 and dp8.speculative_headroom_tokens == 436

    def copies(d: Any) -> int:
        # what the draft holds while loaded beyond its resident weights: its own embedding and head copies
        return d.outside_fraction_bytes - d.speculative_headroom_tokens * d.cell_size_bytes - d.draft_kv_bytes \
            - d.draft_weights_bytes

    # 0.4.8: the embedding copy replicated (129,280 x 7,168 x 2 B = 1,853,358,080), the head over tp 8
    # (16,160 x 7,168 x 2 = 231,669,760): 2,085,027,840 B
    assert copies(dp8) == 2_085_027_840
    # 0.4.5-0.4.7: the head a ReplicatedLinear under DP attention too: 2 x 1,853,358,080 = 3,706,716,160 B
    assert copies(old) == 3_706_716_160
    # 0.5.10, dp 4: the embedding over the attention group of 2 (64,640 x 7,168 x 2 = 926,679,040) + the head
    # 231,669,760 = 1,158,348,800 B
    assert copies(dp4) == 1_158_348_800
    # 48 running requests divided among the DP ranks: 0.4.5 min(48 // 8, 49 rows) = 6; 0.5.10 min(48 // 4, 2048) = 12
    assert (old.max_running_requests, old.req_to_token_rows) == (6, 49)
    assert (dp4.max_running_requests, dp4.req_to_token_rows) == (12, 12)
    # both reserves in the default fraction at 0.4.8: 2 GiB (speculative) + 4 GiB (DP attention) over plain's 2
    assert dp8.reserved_heuristic_bytes is not None and plain.reserved_heuristic_bytes is not None
    assert dp8.reserved_heuristic_bytes - plain.reserved_heuristic_bytes == 4 * 2**30


def test_dp_attention_qwen3_moe() -> None:
    def run(release: str, dp: int = 1, tp: int = 4) -> Any:
        return decide_sglang(resolve(doc("Qwen/Qwen3-30B-A3B", tp=tp, sglang_version=release, dp_attention=dp)))

    for release, embed_extra in (("0.5.8", 466_747_392), ("0.5.10", 155_582_464)):
        d, plain = run(release, 2), run(release)
        # attention per layer: q 2,048 x 4,096 + k, v 2,048 x 512 each + o 4,096 x 2,048 = 18,874,368 x 48 layers =
        # 905,969,664, held 1/2 over the attention group of tp 4 / dp 2 instead of 1/4: 226,492,416 x 2 B more =
        # 452,984,832 B; the embedding 151,936 x 2,048 = 311,164,928: replicated to 0.5.8 (3/4 more: 233,373,696 x 2 B
        # = 466,747,392), over the attention group of 2 from 0.5.9 (1/4 more: 77,791,232 x 2 B = 155,582,464)
        assert d.weights_bytes - plain.weights_bytes == 452_984_832 + embed_extra, release
        # the KV cell at attention tp 2: 4 KV heads // 2 x 128 x 48 layers x 2 x 2 B = 49,152 B (24,576 at tp 4)
        assert (d.cell_size_bytes, plain.cell_size_bytes) == (49_152, 24_576)
        # chunked prefill 8,192 // 2; the reserve adds graph_bs 512 x dp 2 x 3 MiB + 512 x 2 x 1.5 (graph_bs > 300)
        # = 4,608 MiB, less 0.5.10's piecewise graphs (58 sizes x 8 = 464 MiB), off under DP attention
        assert d.chunked_prefill_size == 4096 and d.starts
        assert d.reserved_heuristic_bytes is not None and plain.reserved_heuristic_bytes is not None
        extra_mib = 4608 - (464 if release == "0.5.10" else 0)
        assert d.reserved_heuristic_bytes - plain.reserved_heuristic_bytes == extra_mib * 2**20, release
    # 0.4.6 splits no Qwen-MoE attention over the attention group
    with pytest.raises(ScenarioError, match="before 0.4.7, the first release read"):
        run("0.4.6", 2)
    # attention groups of 8 ranks over 4 KV heads (tp 16, dp 2) would replicate heads inside a group: refused
    with pytest.raises(ScenarioError, match="replicate KV heads"):
        decide_sglang(resolve({**doc("Qwen/Qwen3-30B-A3B", tp=16, sglang_version="0.5.10", dp_attention=2),
                               "hardware": {"gpu": "H100-SXM", "num_gpus": 16, "gpus_per_node": 8}}))


def test_dp_family_and_nextn_rows() -> None:
    from vramplan.serve.sglang_options import NEXTN_DP_RULES, QWEN_MOE_DP_RULES, dp_family, nextn_dp_rule_for

    # every row names the wheel and the file and line it was read at
    assert all("wheel" in r.sources[0] and ".py:" in r.sources[0] for r in (*QWEN_MOE_DP_RULES, *NEXTN_DP_RULES))
    qwen = ["Qwen3MoeForCausalLM"]
    assert dp_family(qwen) is not None and dp_family(["LlamaForCausalLM"]) is None
    assert dp_rule_for((0, 5, 8), qwen).embed == "replicated" and dp_rule_for((0, 5, 9), qwen).embed == "attn_tp"
    assert dp_rule_for((0, 5, 8)).embed == "attn_tp"  # DeepSeek's table: 0.5.8 already splits it
    head = {v: getattr(nextn_dp_rule_for(v), "head", None) for v in ((0, 4, 3), (0, 4, 7), (0, 4, 8), (0, 5, 23))}
    assert head == {(0, 4, 3): None, (0, 4, 7): "replicated", (0, 4, 8): "tp", (0, 5, 23): "tp"}
