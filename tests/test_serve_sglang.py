"""SGLang's start-up decision (serve/sglang.py): a hand-computed oracle, the defaults of each modelled
release, its start-up errors, the engine's options refused for the other engine, the CLI and the web API."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.serve.sglang import (
    NOT_ENOUGH_MEMORY,
    SGLANG_BEHAVIOURS,
    behaviour_for,
    cell_size_bytes,
    decide_sglang,
    default_settings,
    vlm_fraction_factor,
)
from vramplan.units import MiB

ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()
H100_TOTAL = 85_017_755_648  # catalog totalGlobalMem of the H100-SXM (catalog/data/gpus.json)


def doc(model: str = "meta-llama/Llama-3.1-8B", gpu: str = "H100-SXM", tp: int = 1, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp}, "parallel": {"tp": tp},
            "serve": {"engine": "sglang", **serve}}


def behaviour(release: str) -> Any:
    return next(b for b in SGLANG_BEHAVIOURS if b.release == release)


def test_oracle_llama31_8b_h100_release_041() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.4.1")))
    # free at start = total 85,017,755,648 - CUDA context 550,429,000 (catalog, Hopper) = 84,467,326,648 B
    assert d.free_at_start_bytes == 84_467_326_648
    # weights: 8,030,261,248 parameters x 2 B = 16,060,522,496 B + the fp32 rotary cache
    # 131,072 positions x 128 x 4 B = 67,108,864 B  ->  16,127,631,360 B
    assert d.weights_bytes == 16_127_631_360
    # 0.4.x default at tp 1: 0.88. pool = 0.88 x 84,467,326,648 - 16,127,631,360 = 58,203,616,090 B;
    # cell 8 KV heads x 128 x 32 layers x 2 x 2 B = 131,072 B -> 58,203,616,090 // 131,072 = 444,058 tokens
    # (the published log of this setup printed 444,500: 0.1 % apart)
    assert d.mem_fraction_static == 0.88 and d.cell_size_bytes == 131_072
    assert d.max_total_num_tokens == 444_058 and d.kv_cache_bytes == 444_058 * 131_072
    # max_num_reqs = min(max(int(444,058 / 131,072 x 512), 2048), 4096) = min(max(1734, 2048), 4096) = 2048;
    # running = min(444,058 // 2, 2048 + 1) = 2049, as the logs print
    assert d.max_num_reqs == 2048 and d.max_running_requests == 2049
    # request table: (2048 + 1) x (131,072 + 4) x 4 B = 1,074,298,896 B
    assert d.req_to_token_bytes == 1_074_298_896
    # concurrency at the full context: 444,058 / 131,072 = 3.39; one request may hold 131,071 input tokens
    assert round(d.max_concurrency, 2) == 3.39 and d.max_req_input_len == 131_071
    assert d.starts and d.chunked_prefill_size == 8192 and d.cuda_graph_max_bs == 160


def test_report_serve_block_carries_the_engine_and_its_numbers() -> None:
    rep = estimate(doc(sglang_version="0.4.1"))
    assert rep.serve.engine == "sglang" and rep.serve.starts and rep.fits
    assert rep.serve.kv_cache_tokens == 444_058 and rep.serve.kv_cache_bytes == 444_058 * 131_072
    assert rep.serve.num_gpu_blocks == 444_058  # pages of one token
    assert rep.serve.max_concurrency == 3 and rep.serve.weights_bytes == 16_127_631_360
    assert rep.per_gpu.breakdown_detail["kv_cache"]["request-to-token table"] == 1_074_298_896


def test_vllm_stays_the_default_engine() -> None:
    rep = estimate({"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100-SXM"}})
    assert rep.serve.engine == "vllm" and rep.serve.starts
    assert rep.serve.kv_cache_tokens * 131_072 == rep.serve.kv_cache_bytes


@pytest.mark.parametrize(("tp", "fraction"), [(1, 0.88), (2, 0.87), (4, 0.85), (8, 0.81), (16, 0.79)])
def test_release_040_fraction_is_the_tp_table(tp: int, fraction: float) -> None:
    assert default_settings(behaviour("0.4.0"), H100_TOTAL, tp).mem_fraction_static == fraction


def test_release_048_reserves_by_gpu_memory() -> None:
    # H100: 85,017,755,648 B = 81,079.25 MiB, below 90 GiB: reserved (9.5 + 1/2) x 1024 = 10,240 MiB;
    # round((81,079.25 - 10,240) / 81,079.25, 3) = round(0.87370, 3) = 0.874 (docs.sglang.ai printed 0.874)
    s = default_settings(behaviour("0.4.8"), H100_TOTAL, 1)
    assert s.mem_fraction_static == 0.874 and s.reserved_mib == 10_240
    # tp 8: (9.5 + 8/2) x 1024 = 13,824 MiB -> round(67,255.25 / 81,079.25, 3) = round(0.829502, 3) = 0.83
    assert default_settings(behaviour("0.4.8"), H100_TOTAL, 8).mem_fraction_static == 0.83


def test_release_047_keeps_the_tp_table_up_to_80_gib_and_adjusts_larger_gpus() -> None:
    # the 0.4.7 wheel's server_args.py still has the tp table (the reserve heuristic came with 0.4.8)
    assert behaviour_for("0.4.7")[0].fraction_rule == "tp_table_large_gpu"
    assert default_settings(behaviour("0.4.7"), H100_TOTAL, 1).mem_fraction_static == 0.88
    assert default_settings(behaviour("0.4.7"), H100_TOTAL, 4).mem_fraction_static == 0.85
    # an H200 at 143,771 MiB: above 81,920 MiB 0.88, then above 96 GiB
    # min(0.88 + 49,152 x 0.12 / 143,771, (143,771 - 18,432) / 143,771) = min(0.921025, 0.871796) = 0.871796
    h200 = default_settings(behaviour("0.4.7"), 143_771 * 1024 * 1024, 1)
    assert abs(h200.mem_fraction_static - 125_339 / 143_771) < 1e-12
    # above 180,000 MiB (B200): 0.79 and a 16,384-token chunked prefill
    b200 = default_settings(behaviour("0.4.7"), 183_000 * 1024 * 1024, 8)
    assert (b200.mem_fraction_static, b200.chunked_prefill_size) == (0.79, 16384)
    # 0.4.0's table knows no large GPU
    assert default_settings(behaviour("0.4.0"), 143_771 * 1024 * 1024, 1).mem_fraction_static == 0.88


def test_release_053_reserves_by_settings() -> None:
    # H100, tp 1: chunked prefill 8192, CUDA graphs up to 256; reserved 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024
    # = 13,440 MiB (above the 10 GiB floor): round((81,079.25 - 13,440) / 81,079.25, 3) = round(0.83424, 3) = 0.834
    s = default_settings(behaviour("0.5.3"), H100_TOTAL, 1)
    assert (s.chunked_prefill_size, s.cuda_graph_max_bs, s.reserved_mib, s.mem_fraction_static) == (8192, 256, 13_440,
                                                                                                     0.834)
    # an L4 (23,570,219,008 B = 22,478.3 MiB, below 35 GiB): chunk 2048, graphs up to 16 at tp 1 in 0.5.3-0.5.4;
    # reserved 512 + 2048 x 1.5 + 16 x 2 + 128 = 3,744 MiB -> round(18,734.3 / 22,478.3, 3) = round(0.83344) = 0.833
    s = default_settings(behaviour("0.5.3"), 23_570_219_008, 1)
    assert (s.chunked_prefill_size, s.cuda_graph_max_bs, s.reserved_mib, s.mem_fraction_static) == (2048, 16, 3_744,
                                                                                                     0.833)
    # 0.5.5 on: graphs up to 24: reserved 3,760 MiB -> round(18,718.3 / 22,478.3, 3) = round(0.83273) = 0.833
    s = default_settings(behaviour("0.5.5"), 23_570_219_008, 1)
    assert (s.cuda_graph_max_bs, s.reserved_mib, s.mem_fraction_static) == (24, 3_760, 0.833)


def test_release_0510_reserves_the_piecewise_cuda_graphs() -> None:
    # 0.5.10: piecewise graphs for 58 token counts up to the 8192-token chunk (piecewise_graph_tokens docstring),
    # 8 MiB each: H100 tp 1 reserved 13,440 + 464 = 13,904 MiB -> round(67,175.25 / 81,079.25, 3) = 0.829
    s = default_settings(behaviour("0.5.10"), H100_TOTAL, 1, piecewise="mha")
    assert (s.reserved_mib, s.mem_fraction_static) == (13_904, 0.829)
    # MLA: a flat 1.5 GiB: 13,440 + 1,536 = 14,976 MiB -> round(66,103.25 / 81,079.25, 3) = round(0.81529) = 0.815
    assert default_settings(behaviour("0.5.10"), H100_TOTAL, 1, piecewise="mla").mem_fraction_static == 0.815
    # off (a multimodal model), or before 0.5.10: the 0.5.5 reserve
    assert default_settings(behaviour("0.5.10"), H100_TOTAL, 1).reserved_mib == 13_440
    assert default_settings(behaviour("0.5.5"), H100_TOTAL, 1, piecewise="mha").reserved_mib == 13_440
    # an L4 (no 10 GiB floor): 3,760 + 42 sizes up to 2048 x 8 = 4,096 MiB -> round(18,382.3 / 22,478.3, 3) = 0.818
    s = default_settings(behaviour("0.5.10"), 23_570_219_008, 1, piecewise="mha")
    assert (s.reserved_mib, s.mem_fraction_static) == (4_096, 0.818)


def test_given_settings_win_over_the_defaults() -> None:
    s = default_settings(behaviour("0.5.3"), H100_TOTAL, 1, fraction=0.7, chunked_prefill_size=4096,
                         cuda_graph_max_bs=64)
    assert (s.mem_fraction_static, s.fraction_given, s.chunked_prefill_size, s.cuda_graph_max_bs) == (0.7, True, 4096, 64)
    d = decide_sglang(resolve(doc(mem_fraction_static=0.7, max_running_requests=64)))
    assert d.mem_fraction_static == 0.7 and d.max_running_requests == 64 and d.max_num_reqs == 64


def test_release_strings_map_to_the_nearest_earlier_behaviour() -> None:
    assert behaviour_for("0.4.7")[0].release == "0.4.7"
    b, said = behaviour_for("0.4.9.post2")
    assert b.release == "0.4.8" and "nearest earlier" in said and "not read" not in said
    assert behaviour_for("v0.5.10")[0].release == "0.5.10"
    assert behaviour_for("0.5.4")[0].release == "0.5.3"
    assert behaviour_for("0.4.3.post4")[0].release == "0.4.0"
    assert behaviour_for("0.5.11")[0].release == "0.5.10"
    assert behaviour_for("0.4.10")[0].release == "0.4.10" and behaviour_for("0.5.2")[0].release == "0.4.10"
    b, said = behaviour_for("0.5.23")
    assert b.release == "0.5.22" and "nearest earlier" in said and "not read" not in said
    b, said = behaviour_for("0.5.24")
    assert b.release == "0.5.22" and "releases after 0.5.23 were not read" in said
    for bad, text in (("0.3.6", "outside the modelled range"), ("0.6.0", "outside the modelled range"),
                      ("latest", "is not an SGLang release")):
        with pytest.raises(ScenarioError) as exc:
            behaviour_for(bad)
        p = exc.value.problems[0]
        # the hint states the modelled range
        assert p.where == "serve.sglang_version" and text in p.message and "SGLang 0.4.0 to 0.5.x" in p.hint


def test_cell_sizes_mla_tp_and_fp8() -> None:
    r = resolve(doc("deepseek-ai/DeepSeek-V2-Lite"))
    # MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 27 layers x 2 B = 31,104 B, the same on every rank
    assert cell_size_bytes(r.model, 1, 2) == 31_104 == cell_size_bytes(r.model, 4, 2)
    q = resolve(doc("Qwen/Qwen2.5-32B", tp=4)).model
    # 8 KV heads: 8 // 4 = 2 per rank x 128 x 64 layers x 2 x 2 B = 65,536 B; at tp 16, 8 // 16 = 0 -> 1 (replicated)
    assert cell_size_bytes(q, 4, 2) == 65_536 and cell_size_bytes(q, 16, 2) == 32_768
    fp8 = decide_sglang(resolve(doc(kv_cache_dtype="fp8", sglang_version="0.4.1")))
    # fp8: 1 B per element, cell 65,536 B; the same pool bytes: 58,203,616,090 // 65,536 = 888,116 tokens
    assert fp8.cell_size_bytes == 65_536 and fp8.max_total_num_tokens == 888_116


def test_page_size_rounds_the_pool_down() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.4.1", page_size=64)))
    # 444,058 // 64 = 6,938 pages x 64 = 444,032 tokens
    assert d.max_total_num_tokens == 444_032 and d.num_pages == 6_938


def test_not_enough_memory_quotes_sglang_and_says_what_to_raise() -> None:
    # L4: 23,570,219,008 - context; 0.5 x free < 16.1 GB of weights -> no tokens
    d = decide_sglang(resolve(doc(gpu="L4", mem_fraction_static=0.5)))
    assert not d.starts and d.problem == NOT_ENOUGH_MEMORY
    assert d.problem == "Not enough memory. Please try to increase --mem-fraction-static."
    # the fraction that leaves one token: (16,127,631,360 + 131,072) / free, rounded up to the next hundredth
    free = d.free_at_start_bytes
    needed = (16_127_631_360 + 131_072) / free
    assert d.fix == f"serve.mem_fraction_static >= {int(needed * 100 + 1) / 100:.2f}"
    rep = estimate(doc(gpu="L4", mem_fraction_static=0.5))
    assert not rep.fits and not rep.serve.starts and rep.serve.start_problem == NOT_ENOUGH_MEMORY
    assert rep.serve.start_fix.startswith("serve.mem_fraction_static >= ")


def test_weights_larger_than_the_gpu_fail_at_load() -> None:
    d = decide_sglang(resolve(doc("meta-llama/Llama-3.1-70B")))
    assert not d.starts and "CUDA out of memory while loading the weights" in d.problem
    assert "raise parallel.tp" in d.fix


@pytest.mark.parametrize(("serve", "where", "instead"), [
    ({"gpu_memory_utilization": 0.8}, "serve.gpu_memory_utilization", "serve.mem_fraction_static"),
    ({"block_size": 32}, "serve.block_size", "serve.page_size"),
    ({"max_num_seqs": 64}, "serve.max_num_seqs", "serve.max_running_requests"),
    ({"vllm_version": "0.19"}, "serve.vllm_version", "serve.sglang_version"),
])
def test_vllm_options_refused_with_sglang(serve: dict[str, Any], where: str, instead: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(doc(**serve))
    p = exc.value.problems[0]
    assert p.where == where and "not of engine sglang" in p.message and instead in p.hint


@pytest.mark.parametrize(("serve", "where", "instead"), [
    ({"mem_fraction_static": 0.8}, "serve.mem_fraction_static", "serve.gpu_memory_utilization"),
    ({"page_size": 64}, "serve.page_size", "serve.block_size"),
    ({"chunked_prefill_size": 4096}, "serve.chunked_prefill_size", "serve.max_num_batched_tokens"),
])
def test_sglang_options_refused_with_vllm(serve: dict[str, Any], where: str, instead: str) -> None:
    d = doc(**serve)
    d["serve"]["engine"] = "vllm"
    with pytest.raises(ScenarioError) as exc:
        resolve(d)
    p = exc.value.problems[0]
    assert p.where == where and "not of engine vllm" in p.message and instead in p.hint


def test_a_dumped_scenario_checks_again() -> None:
    # model_dump writes every field, the other engine's defaults included: they do not count as set
    r = resolve(doc(sglang_version="0.4.1"))
    again = resolve(r.scenario.model_dump(mode="json"))
    assert decide_sglang(again).max_total_num_tokens == 444_058


def test_refused_setups() -> None:
    for serve, extra, where in (({}, {"parallel": {"tp": 1, "pp": 2}, "hardware": {"gpu": "H100-SXM", "num_gpus": 2}},
                                 "parallel.pp"),
                                ({"kv_cache_dtype": "int8"}, {}, "serve.kv_cache_dtype"),
                                ({"max_model_len": 200_000}, {}, "serve.max_model_len")):
        with pytest.raises(ScenarioError) as exc:
            estimate({**doc(**serve), **extra})
        assert exc.value.problems[0].where == where
    # an SGLang option given to llama.cpp is refused, not ignored
    d = doc(mem_fraction_static=0.8)
    d["serve"]["engine"] = "llamacpp"
    with pytest.raises(ScenarioError) as exc:
        estimate(d)
    assert exc.value.problems[0].where == "serve.mem_fraction_static"
    assert "not of engine llamacpp" in exc.value.problems[0].message


@settings(max_examples=25, deadline=None)
@given(low=st.floats(0.3, 0.95), high=st.floats(0.3, 0.95))
def test_pool_grows_with_the_fraction_and_stays_inside_it(low: float, high: float) -> None:
    low, high = sorted((round(low, 3), round(high, 3)))
    a = decide_sglang(resolve(doc(mem_fraction_static=low)))
    b = decide_sglang(resolve(doc(mem_fraction_static=high)))
    assert a.max_total_num_tokens <= b.max_total_num_tokens
    for d in (a, b):
        # the pool never exceeds what the fraction leaves after the weights
        assert d.kv_cache_bytes <= max(0, d.static_budget_bytes - d.weights_bytes) + d.cell_size_bytes
        assert d.reserve_bytes + d.static_budget_bytes == d.free_at_start_bytes


def cli(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_cli_serve_engine_sglang_json() -> None:
    code, out, _ = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                       "--sglang-version", "0.4.1", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["engine"] == "sglang" and data["fits"] and "vllm" not in data
    s = data["sglang"]
    assert s["max_total_num_tokens"] == 444_058 and s["mem_fraction_static"] == 0.88 and s["starts"]
    assert s["sglang_behaviour_modelled"].startswith("SGLang 0.4.1: behaviour of 0.4.0")
    # the vLLM document keeps its key and gains the engine beside it
    code, out, _ = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--json")
    assert code == 0 and json.loads(out)["engine"] == "vllm" and "vllm" in json.loads(out)


def test_cli_serve_engine_sglang_text_and_failure() -> None:
    code, out, _ = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang")
    out = " ".join(out.split())
    assert code == 0 and "SGLang start-up memory per GPU" in out and "STARTS" in out
    code, out, _ = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--engine", "sglang",
                       "--mem-fraction-static", "0.5")
    out = " ".join(out.split())
    assert code == 1 and "WILL NOT START" in out and "Please try to increase --mem-fraction-static" in out
    assert "change: serve.mem_fraction_static >=" in out


def test_cli_bad_combinations_exit_2() -> None:
    code, _, err = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                       "--gpu-memory-utilization", "0.8")
    err = " ".join(err.split())
    assert code == 2 and "serve.gpu_memory_utilization" in err and "SGLang uses serve.mem_fraction_static" in err
    code, _, err = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--mem-fraction-static", "0.8")
    err = " ".join(err.split())
    assert code == 2 and "vLLM uses serve.gpu_memory_utilization" in err
    code, _, err = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                       "--subtract-cudagraphs")
    assert code == 2 and "--subtract-cudagraphs" in err and "Traceback" not in err
    code, _, err = cli("serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "sglang",
                       "--sglang-version", "0.2.0")
    assert code == 2 and "serve.sglang_version" in err


def test_estimate_takes_the_serving_engine_as_serve_engine() -> None:
    code, out, _ = cli("estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--task", "serve",
                       "--serve-engine", "sglang", "--sglang-version", "0.4.1", "--json")
    assert code == 0
    serve = json.loads(out)["serve"]
    assert serve["engine"] == "sglang" and serve["kv_cache_tokens"] == 444_058


def test_mib_unit_used_for_gpu_memory() -> None:
    # SGLang's gpu_mem is in MiB: the H100's 85,017,755,648 B is 81,079.25 MiB
    assert H100_TOTAL / MiB == 81_079.25


def test_piecewise_graphs_are_off_for_a_multimodal_model() -> None:
    # server_args.py _handle_piecewise_cuda_graph (0.5.10): "9. Multimodal / VLM models" disables them, so the
    # catalog's Gemma 3 4B (Gemma3ForConditionalGeneration) keeps the 0.5.5 reserve; Llama-3.1-8B gets the graphs
    gemma = decide_sglang(resolve(doc("google/gemma-3-4b-pt", sglang_version="0.5.10")))
    llama = decide_sglang(resolve(doc(sglang_version="0.5.10")))
    llama_055 = decide_sglang(resolve(doc(sglang_version="0.5.5")))
    assert gemma.reserved_heuristic_bytes == decide_sglang(resolve(doc("google/gemma-3-4b-pt",
                                                                       sglang_version="0.5.5"))).reserved_heuristic_bytes
    assert llama.reserved_heuristic_bytes is not None and llama_055.reserved_heuristic_bytes is not None
    assert llama.reserved_heuristic_bytes - llama_055.reserved_heuristic_bytes == 58 * 8 * 1024 * 1024


def test_dp_attention_off_is_stated_for_moe_and_mla_at_tp_above_one() -> None:
    # SGLang offers --enable-dp-attention for MoE/MLA models; without serve.dp_attention the answer is the pool
    # without it and says so (never silently): DeepSeek-V2-Lite (MLA + MoE) and Qwen3-30B-A3B (MoE) at tp 2
    for model in ("deepseek-ai/DeepSeek-V2-Lite", "Qwen/Qwen3-30B-A3B"):
        d = decide_sglang(resolve(doc(model=model, tp=2, sglang_version="0.4.2")))
        assert any(a.startswith("DP attention (--enable-dp-attention) off") for a in d.assumptions)
    # not for a dense GQA model, nor at tp 1 (nothing for DP attention to split)
    dense = decide_sglang(resolve(doc(tp=2, sglang_version="0.4.2")))
    single = decide_sglang(resolve(doc(model="Qwen/Qwen3-30B-A3B", sglang_version="0.4.2")))
    assert not any("DP attention" in a for a in dense.assumptions + single.assumptions)


def test_enable_dp_attention_key_is_refused_not_ignored() -> None:
    # a user who writes SGLang's option gets an error naming it, not an answer that ignores it
    with pytest.raises(ScenarioError, match="serve.enable_dp_attention"):
        resolve(doc(model="deepseek-ai/DeepSeek-V2-Lite", tp=2, enable_dp_attention=True))


def test_release_0520_small_gpu_defaults() -> None:
    # 0.5.20 on, below 35 GiB: chunk 4096 and graphs up to 48 at tp 1 (were 2048 and 24). L4, 22,478.3125 MiB:
    # 50 piecewise sizes up to 4096 (8 + 14 + 8 + 8 + 12) x 8 = 400 MiB; reserved 512 + 4096 x 1.5 + 48 x 2 + 128
    # + 400 = 7,280 MiB -> round(15,198.3125 / 22,478.3125, 3) = round(0.67613, 3) = 0.676
    s = default_settings(behaviour("0.5.20"), 23_570_219_008, 1, piecewise="mha")
    assert (s.chunked_prefill_size, s.cuda_graph_max_bs, s.reserved_mib, s.mem_fraction_static) == (4096, 48, 7_280,
                                                                                                     0.676)
    assert _bucket(behaviour("0.5.20"), 23_570_219_008, 4) == (4096, 160)
    assert _bucket(behaviour("0.5.18"), 23_570_219_008, 4) == (2048, 80)


def _bucket(beh: object, total: int, tp: int) -> tuple[int, int]:
    s = default_settings(beh, total, tp)  # type: ignore[arg-type]
    return s.chunked_prefill_size, s.cuda_graph_max_bs


def test_disabled_cuda_graphs_leave_the_reserve_from_0514_and_0515() -> None:
    # H100 tp 1, piecewise on: 0.5.10 keeps both reserves with --disable-cuda-graph (13,904 MiB, 0.829); 0.5.14
    # drops the prefill graphs' 464 MiB (13,440 -> round(67,639.25 / 81,079.25, 3) = 0.834); 0.5.15 also the decode
    # graphs' 256 x 2 = 512 MiB: 512 + 12,288 + 128 = 12,928 -> round(68,151.25 / 81,079.25, 3) = round(0.84055) = 0.841
    got = [default_settings(behaviour(rel), H100_TOTAL, 1, piecewise="mha", graphs=False)
           for rel in ("0.5.10", "0.5.14", "0.5.15")]
    assert [(s.reserved_mib, s.mem_fraction_static) for s in got] == [(13_904, 0.829), (13_440, 0.834), (12_928, 0.841)]
    on = decide_sglang(resolve(doc(sglang_version="0.5.15")))
    off = decide_sglang(resolve(doc(sglang_version="0.5.15", cuda_graphs=False)))
    assert off.mem_fraction_static == 0.841 and off.max_total_num_tokens > on.max_total_num_tokens


def test_release_0522_caps_the_graph_batch_at_max_running_requests() -> None:
    # H100 tp 1, max_running_requests 64: graphs up to 64 (not 256): 512 + 12,288 + 128 + 128 + 464 = 13,520 MiB ->
    # round(67,559.25 / 81,079.25, 3) = round(0.83325) = 0.833; 0.5.20 keeps 256 (13,904 MiB, 0.829)
    s = default_settings(behaviour("0.5.22"), H100_TOTAL, 1, piecewise="mha", max_running_requests=64)
    assert (s.cuda_graph_max_bs, s.reserved_mib, s.mem_fraction_static) == (64, 13_520, 0.833)
    s = default_settings(behaviour("0.5.20"), H100_TOTAL, 1, piecewise="mha", max_running_requests=64)
    assert (s.cuda_graph_max_bs, s.mem_fraction_static) == (256, 0.829)


def test_releases_0513_to_0516_clamp_the_prefill_graphs_at_the_context_length() -> None:
    # context length 2048: 42 sizes (8 + 14 + 8 + 8 + 4) x 8 = 336 MiB: 13,440 + 336 = 13,776 ->
    # round(67,303.25 / 81,079.25, 3) = round(0.83009) = 0.830; 0.5.17 drops the clamp (58 sizes, 13,904, 0.829)
    s = default_settings(behaviour("0.5.13"), H100_TOTAL, 1, piecewise="mha", context_length=2048)
    assert (s.reserved_mib, s.mem_fraction_static) == (13_776, 0.83)
    assert default_settings(behaviour("0.5.17"), H100_TOTAL, 1, piecewise="mha",
                            context_length=2048).reserved_mib == 13_904


def test_vlm_fraction_factor() -> None:
    # Qwen2.5-VL: vision hidden 1280 and no num_hidden_layers (its depth is 'depth'): 24 layers read;
    # ratio 24 x 1280^2 / (24 x 1024^2) = 1.5625 -> 0.95 x (1 - 0.1 x 0.5625) = 0.8965625
    factor, layers, hidden, note = vlm_fraction_factor({"hidden_size": 1280, "depth": 32}, "qwen2_5_vl")
    assert (layers, hidden) == (24, 1280) and abs(factor - 0.8965625) < 1e-12 and "getattr default 24" in note
    # ViT-L/14 (CLIP, llava): ratio 1 -> 0.95; SigLIP-So400m (27 x 1152): ratio 27 x 1152^2 / (24 x 1024^2)
    # = 1.423828125 -> 0.95 x (1 - 0.0423828125) = 0.909736328125
    assert vlm_fraction_factor({"num_hidden_layers": 24, "hidden_size": 1024})[0] == 0.95
    assert abs(vlm_fraction_factor({"num_hidden_layers": 27, "hidden_size": 1152})[0] - 0.909736328125) < 1e-12
    # CLIPVisionConfig's defaults when config.json omits them: 12 x 768^2 -> ratio 0.28125 -> clamp 1.05 x 0.95
    assert abs(vlm_fraction_factor({"model_type": "clip_vision_model"})[0] - 0.9975) < 1e-12
    # a very large tower is clamped at 0.8: Qwen2-VL's vision hidden_size 3584 (its LM width): ratio 12.25
    assert abs(vlm_fraction_factor({"hidden_size": 3584}, "qwen2_vl")[0] - 0.76) < 1e-12


def test_multimodal_model_scales_the_default_fraction_from_0410() -> None:
    vl = "qwen/qwen2.5-vl-7b-instruct"
    # 0.5.10, H100 tp 1: piecewise graphs are off for a multimodal model: 13,440 MiB -> 0.834, x 0.8965625
    d = decide_sglang(resolve(doc(vl, sglang_version="0.5.10")))
    assert abs(d.mem_fraction_static - 0.834 * 0.8965625) < 1e-12
    assert any("adjust_mem_fraction_for_vlm" in a for a in d.assumptions)
    # 0.4.10 adjusts the reserved-by-GPU fraction: (9.5 + 0.5) GiB -> round(70,839.25 / 81,079.25, 3) = 0.874
    assert abs(decide_sglang(resolve(doc(vl, sglang_version="0.4.10"))).mem_fraction_static
               - 0.874 * 0.8965625) < 1e-12
    # 0.4.9 does not; a given fraction is never adjusted
    assert decide_sglang(resolve(doc(vl, sglang_version="0.4.9"))).mem_fraction_static == 0.874
    assert decide_sglang(resolve(doc(vl, sglang_version="0.5.10", mem_fraction_static=0.8))).mem_fraction_static == 0.8
    # the report speaks of SGLang's tower, not of vLLM's encoder cache and profiling run
    notes = estimate(doc(vl, sglang_version="0.5.10")).assumptions
    assert any("SGLang runs the vision tower" in a for a in notes)
    assert not any("encoder cache" in a for a in notes)


def test_release_0518_keeps_100_mib_for_multimodal_allocations() -> None:
    vl = "qwen/qwen2.5-vl-7b-instruct"
    d17 = decide_sglang(resolve(doc(vl, sglang_version="0.5.17")))
    d18 = decide_sglang(resolve(doc(vl, sglang_version="0.5.18")))
    # same fraction; the pool is 100 MiB smaller: 104,857,600 B / cell, give or take the floor of each
    assert d17.mem_fraction_static == d18.mem_fraction_static
    assert abs((d17.max_total_num_tokens - d18.max_total_num_tokens) - 100 * 2**20 / d18.cell_size_bytes) <= 1
    assert any("SGLANG_VLM_CACHE_SIZE_MB" in a for a in d18.assumptions)


def test_release_0514_names_the_weights_in_its_error() -> None:
    # L4, fraction 0.5: the weights exceed half the free memory; 0.5.14 raises its own message with the fraction
    # that leaves something: ceil((1 - (free - weights) / free) x 1000) / 1000
    d = decide_sglang(resolve(doc(gpu="L4", mem_fraction_static=0.5, sglang_version="0.5.14")))
    assert not d.starts and d.problem.startswith("Loaded weights leave no GPU memory for the KV cache under "
                                                 "--mem-fraction-static=0.5. Raise --mem-fraction-static above ")
    minimum = 1 - (d.free_at_start_bytes - d.weights_bytes) / d.free_at_start_bytes
    assert d.problem.endswith(f"{math.ceil(minimum * 1000) / 1000:.3f}")
    assert decide_sglang(resolve(doc(gpu="L4", mem_fraction_static=0.5, sglang_version="0.5.13"))).problem \
        == NOT_ENOUGH_MEMORY
    # a server that does not start caps no request: no "caps input at 0 tokens" note
    assert not any("caps input" in a for a in d.assumptions)
