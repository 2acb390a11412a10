"""vLLM's start-up decision against public start-up logs, its arithmetic, and its refusals.

Every log case names its entry in benchmarks/data/vllm_startup_logs.yaml, which holds the
citation (URL at a commit) and the lines vLLM printed.  num_gpu_blocks must be within 2% of
the printed value (printed blocks or tokens / block_size; for the llm-d H100 table, which
publishes GiB only, floor(printed KV bytes / page / layers) exactly as vLLM computes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vramplan.catalog.models import _catalog
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.serve.vllm import decide, default_batch_limits, kv_groups, sampler_peak_bytes
from vramplan.units import GiB

LOGS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "vllm_startup_logs.yaml"


def _config(model_id: str, **overrides: Any) -> dict[str, Any]:
    cfg = dict(_catalog()[0][model_id].config)
    cfg.update(overrides)
    return cfg


# Architectures not in the catalog, from their public config.json (same families as catalog rows):
# CodeLlama-7b-hf = Llama-2-7B with vocab 32,016, 16,384 positions, rope_theta 1e6
# (huggingface.co/codellama/CodeLlama-7b-hf/blob/main/config.json).
CODELLAMA_7B = _config("meta-llama/Llama-2-7b-hf", vocab_size=32016, max_position_embeddings=16384, rope_theta=1e6)
# Qwen3-0.6B and Qwen3-32B (huggingface.co/Qwen/Qwen3-0.6B, /Qwen3-32B config.json): Qwen3-8B's layout.
QWEN3_06B = _config("Qwen/Qwen3-8B", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                    num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True, max_window_layers=28)
QWEN3_32B = _config("Qwen/Qwen3-8B", hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                    num_attention_heads=64, num_key_value_heads=8, max_window_layers=64)
# Qwen2.5-7B-Instruct has 32,768 positions (the base model's config says 131,072).
QWEN25_7B_INSTRUCT = _config("Qwen/Qwen2.5-7B", max_position_embeddings=32768)


def _serve(model: Any, gpu: str, util: float, max_len: int, tp: int = 1, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp}, "parallel": {"tp": tp},
            "serve": {"gpu_memory_utilization": util, "max_model_len": max_len, **serve}}


# log id -> (scenario, vLLM behaviour modelled).  The GPU, utilisation, max_model_len, tp, block size,
# quantization and explicit batch limits are those of the log; defaults are vllm serve's.
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "llmd-planner-v0190-codellama-7b-h100": (_serve(CODELLAMA_7B, "H100", 0.95, 8192), "0.19"),
    "llmd-planner-v0190-llama31-8b-16k-h100": (_serve("meta-llama/Llama-3.1-8B", "H100", 0.95, 16384), "0.19"),
    "llmd-planner-v0190-qwen25-7b-w8a8-h100": (
        _serve(QWEN25_7B_INSTRUCT, "H100", 0.95, 8192, quantization="int8"), "0.19"),
    "bench3-v0112-llama3-8b-h200": (_serve("meta-llama/Meta-Llama-3-8B", "H200", 0.9, 1024), "0.11"),
    "llmd-bench-v0110-llama31-8b-h100": (_serve("meta-llama/Llama-3.1-8B", "H100", 0.9, 16000, block_size=128),
                                         "0.11"),
    "llmd-bench-v0110-qwen3-0.6b-h100": (_serve(QWEN3_06B, "H100", 0.9, 16000, block_size=128), "0.11"),
    "llmd-bench-v0110-qwen3-32b-h100": (_serve(QWEN3_32B, "H100", 0.9, 16000, block_size=128), "0.11"),
    "llmd-bench-v0110-qwen3-32b-tp2-h100": (_serve(QWEN3_32B, "H100", 0.9, 16000, tp=2, block_size=128), "0.11"),
    "llmd-bench-v0110-llama33-70b-fp8-tp2-h100": (
        _serve("meta-llama/Llama-3.1-70B", "H100", 0.9, 16000, tp=2, block_size=128, quantization="fp8"), "0.11"),
}


def _logs() -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in yaml.safe_load(LOGS.read_text(encoding="utf-8"))}


def test_at_least_five_cited_logs_are_checked() -> None:
    logs = _logs()
    assert len(CASES) >= 5
    for log_id in CASES:
        assert logs[log_id]["citation"] and logs[log_id]["log_lines"]


@pytest.mark.parametrize("log_id", list(CASES))
def test_num_gpu_blocks_within_two_percent_of_vllm(log_id: str) -> None:
    entry = _logs()[log_id]
    doc, version = CASES[log_id]
    d = decide(resolve(doc), version=version)
    printed = int(entry["num_gpu_blocks"])
    assert d.starts
    assert abs(d.num_gpu_blocks - printed) / printed <= 0.02, (d.num_gpu_blocks, printed)
    # the terms vLLM prints, where it printed them, within 0.1 GiB
    for key, ours in (("model_weights_gib", d.weights_bytes), ("activation_peak_gib", d.activation_peak_bytes),
                      ("kv_cache_gib", d.available_kv_bytes)):
        if entry.get(key) is not None:
            assert abs(ours / GiB - float(entry[key])) <= 0.1, (key, ours / GiB, entry[key])


def test_worked_example_llama31_8b_h100_v019() -> None:
    # requested = 0.95 * 85,017,755,648 B (79.18 GiB); weights = 8,030,261,248 * 2 + 131,072 * 128 * 2 (rotary)
    d = decide(resolve(CASES["llmd-planner-v0190-llama31-8b-16k-h100"][0]), version="0.19")
    assert d.requested_bytes == int(85_017_755_648 * 0.95)
    assert d.weights_bytes == 8_030_261_248 * 2 + 131_072 * 128 * 2
    assert (d.max_num_batched_tokens, d.max_num_seqs) == (8192, 1024)  # vllm serve defaults on an H100
    # sampler: 1024 requests * 128,256 entries * (2 + 12) B + (8192 + 2 * 1024) * 4096 * 2 B (hidden states)
    assert d.sampler_peak_bytes == 1024 * 128_256 * 14 + (8192 + 2048) * 4096 * 2
    # page = 16 tokens * 8 KV heads * 128 * 2 (K, V) * 2 B = 65,536 B; 32 layers per block
    assert d.page_bytes == 65_536 and d.layers_per_group == 32
    assert d.num_gpu_blocks == d.available_kv_bytes // 65_536 // 32
    assert d.kv_cache_tokens == d.num_gpu_blocks * 16
    # one request of 16,384 tokens needs 1,024 blocks
    assert d.blocks_per_request == 1024 and d.max_concurrency == d.num_gpu_blocks / 1024


def test_native_sampler_explains_the_v011_activation_peaks() -> None:
    # vLLM 0.11.0 printed 4.76 GiB (Llama-3.1-8B) and 5.56 GiB (Qwen3-0.6B) of torch peak at 1024 dummy
    # requests: 1024 * V * (2 + 36) B dominates (128,256 -> 4.65 GiB; 151,936 -> 5.51 GiB)
    llama = decide(resolve(CASES["llmd-bench-v0110-llama31-8b-h100"][0]))
    qwen = decide(resolve(CASES["llmd-bench-v0110-qwen3-0.6b-h100"][0]))
    assert abs(llama.activation_peak_bytes / GiB - 4.76) < 0.02
    assert abs(qwen.activation_peak_bytes / GiB - 5.56) < 0.02
    # one request: 128,256 entries * 38 B, plus its last-token row and its random copy (2 * 4096 * 2 B)
    model = resolve(CASES["llmd-bench-v0110-llama31-8b-h100"][0]).model
    assert sampler_peak_bytes(model, 0, 1, 2, "native") == 128_256 * 38 + 2 * 4096 * 2


def test_default_batch_limits_follow_vllm_serve() -> None:
    assert default_batch_limits(int(79.18 * GiB), "H100-SXM") == (8192, 1024)
    assert default_batch_limits(int(79.25 * GiB), "A100-80GB") == (2048, 256)  # A100s keep the small defaults
    assert default_batch_limits(int(21.95 * GiB), "L4") == (2048, 256)


def test_hybrid_groups_gemma3_and_gpt_oss() -> None:
    from vramplan.analytic.kv_cache import kv_spec
    from vramplan.catalog import load_model

    groups, size = kv_groups(kv_spec(load_model("google/gemma-3-27b-pt")))
    # 52 sliding + 10 full layers -> groups of 10: 6 sliding groups (the last padded) and 1 full group
    assert size == 10 and len(groups) == 7
    groups, size = kv_groups(kv_spec(load_model("openai/gpt-oss-20b")))
    assert size == 12 and len(groups) == 2  # 12 sliding + 12 full


def test_sliding_window_request_needs_only_its_window_in_blocks() -> None:
    # Mistral-7B (window 4096, all layers): one request of 32,768 tokens holds
    # ceil(min(4096 - 1 + 2048, 32768) / 16) + 1 = 385 blocks, not 2048
    d = decide(resolve(_serve("mistralai/Mistral-7B-v0.1", "A100-80GB", 0.9, 32768)))
    assert d.blocks_per_request == 385


def test_max_model_len_too_long_fails_like_vllm() -> None:
    # Llama-3.1-8B at its full 131,072 context on an L4 (21.95 GiB): about 3.4 GiB of KV is left, one request
    # needs 16 GiB; vLLM refuses and estimates the largest max_model_len
    d = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "L4", 0.9, 131072)))
    assert not d.starts
    assert "16.00 GiB KV cache is needed" in d.problem and "available KV cache memory" in d.problem
    assert f"estimated maximum model length is {d.max_model_len_that_fits}" in d.problem
    assert d.fix == f"serve.max_model_len <= {d.max_model_len_that_fits}"
    # that length does fit, one more token would not
    ok = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "L4", 0.9, d.max_model_len_that_fits)))
    assert ok.starts
    over = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "L4", 0.9, d.max_model_len_that_fits + 16)))
    assert not over.starts
    report = estimate(_serve("meta-llama/Llama-3.1-8B", "L4", 0.9, 131072))
    assert report.fits is False and report.assumptions[0].startswith("vLLM would not start")


def test_no_room_for_weights_fails_like_vllm() -> None:
    # llm-d-benchmark: Llama-3.3-70B FP8 at tp=1 on an H100 loads 67.72 GiB and vLLM says
    # "No available memory for the cache blocks" (-1.44 GiB)
    d = decide(resolve(_serve("meta-llama/Llama-3.1-70B", "H100", 0.9, 16000, block_size=128,
                              quantization="fp8")))
    assert not d.starts and "No available memory for the cache blocks" in d.problem
    assert abs(d.weights_bytes / GiB - 67.72) < 0.1
    assert abs(d.available_kv_bytes / GiB - (-1.44)) < 0.15


def test_utilisation_above_free_memory_fails() -> None:
    d = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "H100", 1.0, 8192)))
    assert not d.starts and "less than desired GPU memory utilization" in d.problem


def test_max_model_len_beyond_the_model_is_bad_input() -> None:
    with pytest.raises(ScenarioError, match="max_position_embeddings"):
        decide(resolve(_serve("meta-llama/Llama-2-7b-hf", "H100", 0.9, 8192)))


def test_expert_parallel_is_tp_or_nothing() -> None:
    # vLLM's expert group is TP x DP (FusedMoEParallelConfig.make); without data parallelism ep is 1 or tp:
    # tp 2, ep 4 on 2 GPUs is refused with ep 2 as the setting that works; tp 2, ep 2 is estimated
    d = _serve("Qwen/Qwen3-30B-A3B", "H100", 0.9, 8192)
    d["hardware"]["num_gpus"] = 2
    d["parallel"] = {"tp": 2, "ep": 4}
    with pytest.raises(ScenarioError) as exc:
        decide(resolve(d))
    p = exc.value.problems[0]
    assert p.where == "parallel.ep" and "parallel.ep 2" in p.hint
    d["parallel"] = {"tp": 2, "ep": 2}
    assert decide(resolve(d)).num_gpu_blocks > 0


def test_unknown_version_is_bad_input() -> None:
    # every release from 0.6 to 0.33 is modelled (facts/vllm_releases.py); 0.5 is older: refused with the nearest
    with pytest.raises(ScenarioError, match=r"nearest is 0\.6\.0"):
        decide(resolve(_serve("meta-llama/Llama-2-7b-hf", "H100", 0.9, 4096)), version="0.5")


def test_more_utilisation_never_means_fewer_blocks() -> None:
    blocks = [decide(resolve(_serve("Qwen/Qwen2.5-7B", "A100-80GB", u, 8192))).num_gpu_blocks
              for u in (0.5, 0.6, 0.7, 0.8, 0.9)]
    assert blocks == sorted(blocks) and blocks[0] > 0


def test_fp8_kv_doubles_the_blocks() -> None:
    base = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "H100", 0.9, 8192)))
    fp8 = decide(resolve(_serve("meta-llama/Llama-3.1-8B", "H100", 0.9, 8192, kv_cache_dtype="fp8")))
    assert fp8.num_gpu_blocks in (2 * base.num_gpu_blocks, 2 * base.num_gpu_blocks + 1)


def test_report_breakdown_adds_up_and_serve_block_is_filled() -> None:
    r = estimate(CASES["llmd-bench-v0110-llama31-8b-h100"][0])
    assert r.fits and r.serve.num_gpu_blocks == 3288
    assert r.per_gpu.breakdown["kv_cache"] == r.serve.kv_cache_bytes == 3288 * 128 * 131_072
    assert r.serve.max_concurrency == int(3288 / 125)  # ceil(16000 / 128) = 125 blocks per request
