"""vLLM 0.8.0-0.10.1's fall back to the V0 engine (``facts/vllm_releases.py`` ``V0_FALLBACK_RULES``,
``serve/vllm.py`` ``engine_choice``) and ``serve.vllm_engine``.

The boundaries were read from ``vllm/engine/arg_utils.py`` ``EngineArgs._is_v1_supported_oracle`` in the wheels:
0.8.0 (CC line 1475, kv_cache_dtype 1481, cpu_offload_gb 1493, dtype 1500, bitsandbytes 1508, LoRA 1586, PP 1590),
0.8.5 (CC 1354, kv 1371, dtype 1384), 0.9.1 (CC 1305, kv 1324, dtype 1343), 0.10.0 (CC 1350, kv 1359), 0.10.1 (CC 1403, kv 1412); 0.10.2 has no CC check."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_releases import V0_FALLBACK_RULES, V0_FALLBACK_UNTIL, v0_fallback_rule
from vramplan.serve.vllm import decide, engine_choice

MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # max_position_embeddings 32,768, 28 layers


def _r(gpu: str, version: str, pp: int = 1, **serve: Any) -> Any:
    doc: dict[str, Any] = {"model": MODEL, "task": "serve", "hardware": {"gpu": gpu}, "framework": "vllm",
                           "serve": {"vllm_version": version, "dtype": "fp16", **serve}}
    if pp > 1:
        doc["parallel"] = {"pp": pp}
        doc["hardware"]["num_gpus"] = pp
    return resolve(doc)


# (release, GPU (compute capability), serve settings, pp, engine, the oracle's line cited or None)
BOUNDARY = [
    ("0.7.3", "T4", {}, 1, "v0", None),  # V0 by default (VLLM_USE_V1 default '0'): no fallback said
    ("0.8.0", "T4", {}, 1, "v0", "0.8.0:1475"),  # 7.5 < 8.0
    ("0.8.0", "V100-16GB", {}, 1, "v0", "0.8.0:1475"),  # 7.0 < 8.0
    ("0.8.0", "A10G", {}, 1, "v1", None),  # 8.6
    ("0.8.0", "A100-40GB", {}, 1, "v1", None),  # 8.0 is not < 8.0
    ("0.8.0", "H100-SXM", {"kv_cache_dtype": "fp8"}, 1, "v0", "0.8.0:1481"),  # any non-auto KV dtype
    ("0.8.0", "A10G", {"cpu_offload_gb": 1}, 1, "v0", "0.8.0:1493"),
    ("0.8.0", "A10G", {"dtype": "fp32"}, 1, "v0", "0.8.0:1500"),  # V1_SUPPORTED_DTYPES bf16, fp16
    ("0.8.0", "A10G", {"quantization": "nf4"}, 1, "v0", "0.8.0:1508"),  # V1_UNSUPPORTED_QUANT bitsandbytes
    ("0.8.0", "A10G", {"max_loras": 1}, 1, "v0", "0.8.0:1586"),
    ("0.8.0", "A10G", {}, 2, "v0", "0.8.0:1590"),
    ("0.8.2", "T4", {}, 1, "v0", "0.8.0:1475"),  # not read: 0.8.0's oracle
    ("0.8.5", "T4", {}, 1, "v0", "0.8.5:1354"),
    ("0.8.5", "A10G", {"kv_cache_dtype": "fp8"}, 1, "v0", "0.8.5:1371"),  # FA3 fp8 needs 9.x
    ("0.8.5", "H100-SXM", {"kv_cache_dtype": "fp8"}, 1, "v1", None),
    ("0.8.5", "A10G", {"cpu_offload_gb": 1}, 1, "v1", None),  # no longer a cause
    ("0.8.5", "A10G", {"max_loras": 1}, 1, "v1", None),
    ("0.8.5", "A10G", {"quantization": "nf4"}, 1, "v1", None),  # V1_UNSUPPORTED_QUANT gguf only
    ("0.8.5", "A10G", {"dtype": "fp32"}, 1, "v0", "0.8.5:1384"),
    ("0.9.1", "A10G", {"dtype": "fp32"}, 1, "v0", "0.9.1:1343"),
    ("0.10.0", "A10G", {"dtype": "fp32"}, 1, "v1", None),  # the dtype check is gone
    ("0.9.1", "V100-32GB", {}, 1, "v0", "0.9.1:1305"),
    ("0.9.1", "L4", {"kv_cache_dtype": "fp8"}, 1, "v0", "0.9.1:1324"),  # 8.9
    ("0.9.1", "B200", {"kv_cache_dtype": "fp8"}, 1, "v0", "0.9.1:1324"),  # 10.0: not 9.x before 0.10.0
    ("0.10.0", "T4", {}, 1, "v0", "0.10.0:1350"),
    ("0.10.0", "B200", {"kv_cache_dtype": "fp8"}, 1, "v1", None),  # cuda.py is_kv_cache_dtype_supported: 10.0
    ("0.10.0", "L4", {"kv_cache_dtype": "fp8"}, 1, "v0", "0.10.0:1359"),
    ("0.10.1", "T4", {}, 1, "v0", "0.10.1:1403"),
    ("0.10.1", "H100-SXM", {"kv_cache_dtype": "fp8"}, 1, "v1", None),
    ("0.10.2", "T4", {}, 1, "v1", None),  # the oracle no longer checks the compute capability
    ("0.11.0", "V100-16GB", {}, 1, "v1", None),
]


@pytest.mark.parametrize(("version", "gpu", "serve", "pp", "engine", "line"), BOUNDARY)
def test_fallback_boundary_per_release(version: str, gpu: str, serve: dict[str, Any], pp: int, engine: str,
                                       line: str | None) -> None:
    got, why = engine_choice(_r(gpu, version, pp, **serve), version)
    assert got == engine
    if line is None:
        assert why == ""
    else:
        assert why.startswith(f"vLLM {version} falls back to the V0 engine ")
        assert f"vllm/engine/arg_utils.py {line})" in why or f"vllm/engine/arg_utils.py {line}" in why
    assert ("not read: the oracle of 0.8.0 is assumed" in why) is (version == "0.8.2")


def test_rules_cover_0_8_0_to_0_10_1() -> None:
    assert [row.first for row in V0_FALLBACK_RULES] == sorted(row.first for row in V0_FALLBACK_RULES)
    assert V0_FALLBACK_RULES[0].first == (0, 8, 0) and V0_FALLBACK_UNTIL == (0, 10, 2)
    assert v0_fallback_rule((0, 7, 3)) is None and v0_fallback_rule((0, 10, 2)) is None
    assert v0_fallback_rule((0, 9, 2)) is V0_FALLBACK_RULES[2]  # 0.9.1's
    for row in V0_FALLBACK_RULES:
        assert row.read_at[0] == row.first and row.source and dict(row.lines)["cc"] > 1000


def test_t4_at_0_8_gets_v0_profile_and_graph_terms() -> None:
    # The V0 engine of 0.8.x runs 0.7.3's rules (worker.py determine_num_available_blocks the same text), so the
    # decision equals the one pinned to 0.7.3 in every figure; by hand, V0 0.7.3 on Qwen2.5-1.5B: no chunked prefill
    # at max_model_len 32,768 (on above 32K), max_num_batched_tokens max(32,768, 2,048) = 32,768, max_num_seqs 256,
    # graphs at [1, 2, 4] + 8i up to 256: 3 + 32 = 35 sizes.  The V1 rules on an A10G (8.6) at 0.8.0 instead give
    # 2,048 tokens (v1-h100-name: not an H100) and 1,024 sequences, graphs of V1 up to 512.
    for version in ("0.8.0", "0.8.5", "0.9.1", "0.10.1"):
        for gpu in ("T4", "V100-16GB"):
            fell = asdict(decide(_r(gpu, version), version))
            pinned = asdict(decide(_r(gpu, "0.7.3"), "0.7.3"))
            assert [k for k in fell if fell[k] != pinned[k]] == ["version", "assumptions"]
            assert fell["assumptions"][1:] == pinned["assumptions"]
            assert fell["max_num_batched_tokens"] == 32_768 and fell["max_num_seqs"] == 256
            assert fell["cudagraph_capture_sizes"] == (1, 2, 4, *range(8, 257, 8))
            assert len(fell["cudagraph_capture_sizes"]) == 35
    v1 = decide(_r("A10G", "0.8.0"), "0.8.0")
    assert (v1.max_num_batched_tokens, v1.max_num_seqs) == (2048, 1024)
    assert "V1 engine" in v1.assumptions[0]


def test_assumption_text_names_release_capability_and_line() -> None:
    d = decide(_r("T4", "0.8.0"), "0.8.0")
    assert d.version == "0.8.0"
    assert d.assumptions[0].startswith(
        "vLLM 0.8.0 falls back to the V0 engine on this GPU (compute capability 7.5 < 8.0, "
        "vllm/engine/arg_utils.py 0.8.0:1475); its V0 engine follows the rules of vLLM 0.7.3")
    d = decide(_r("V100-16GB", "0.10.1"), "0.10.1")
    assert d.assumptions[0].startswith("vLLM 0.10.1 falls back to the V0 engine on this GPU (compute capability "
                                       "7.0 < 8.0, vllm/engine/arg_utils.py 0.10.1:1403)")


def test_settings_cause_fallback_on_a_capable_gpu() -> None:
    # fp8 KV cache on an L4 (8.9) at 0.9.1: V0, the same figures as 0.7.3's V0 with that cache
    fell = decide(_r("L4", "0.9.1", kv_cache_dtype="fp8"), "0.9.1")
    pinned = decide(_r("L4", "0.7.3", kv_cache_dtype="fp8"), "0.7.3")
    assert fell.num_gpu_blocks == pinned.num_gpu_blocks and fell.max_num_seqs == 256
    assert "with kv_cache_dtype fp8 (V1 holds an fp8 KV cache only at compute capability 9.x, this GPU's is 8.9: " \
           "vllm/engine/arg_utils.py 0.9.1:1324)" in fell.assumptions[0]


def test_vllm_engine_forces_or_refuses() -> None:
    # v0 (VLLM_USE_V1=0) on a V1-capable GPU: the V0 rules, said so
    d = decide(_r("A10G", "0.10.2", vllm_engine="v0"), "0.10.2")
    assert d.assumptions[0].startswith("serve.vllm_engine v0: vLLM 0.10.2 runs its V0 engine (VLLM_USE_V1=0)")
    assert d.max_num_seqs == 256 and d.max_num_batched_tokens == 32_768
    # v1 where 0.8.0 only warns (LoRA): V1
    assert engine_choice(_r("A10G", "0.8.0", max_loras=1, vllm_engine="v1"), "0.8.0") == ("v1", "")
    assert engine_choice(_r("A10G", "0.8.0", max_loras=1), "0.8.0")[0] == "v0"
    # v0 on a release whose default is V0: nothing to say
    assert engine_choice(_r("T4", "0.7.3", vllm_engine="v0"), "0.7.3") == ("v0", "")
    refused = [
        (_r("T4", "0.8.5", vllm_engine="v1"), "0.8.5", "raises NotImplementedError"),  # _raise_or_fallback
        (_r("A10G", "0.9.1", dtype="fp32", vllm_engine="v1"), "0.9.1", "with dtype fp32"),
        (_r("A10G", "0.7.3", vllm_engine="v1"), "0.7.3", "its V1 engine"),
        (_r("A10G", "0.11.0", vllm_engine="v0"), "0.11.0", "has no V0 engine"),
    ]
    for r, version, what in refused:
        with pytest.raises(ScenarioError) as exc:
            decide(r, version)
        assert exc.value.problems[0].where == "serve.vllm_engine" and what in exc.value.problems[0].message


def test_fallback_onto_a_v0_refusal_says_why() -> None:
    # pp 2 at 0.8.0 falls back to V0 (line 1590), whose pipeline start-up is not modelled: refused, naming the cause
    with pytest.raises(ScenarioError) as exc:
        decide(_r("A10G", "0.8.0", pp=2), "0.8.0")
    assert exc.value.problems[0].message.startswith("vLLM 0.8.0 falls back to the V0 engine with pipeline "
                                                    "parallelism (pp 2")


def test_colocated_rollout_takes_the_budget_rule_of_the_engine_that_runs() -> None:
    # TRL GRPO with a colocated vLLM 0.8.5 on a T4 (an fp16 checkpoint: vLLM before 0.9.0 refuses a bf16 one under the
    # dtype auto TRL leaves it, spec/checks.py _half_serving_note): the release's V1 engine charges gpu_memory_utilization with the
    # whole device's usage (peak plus non-torch, refused beside a trainer), but on compute capability 7.5 vLLM runs
    # its V0 engine, whose rule (0.7.3's profiled increase) is modelled: estimated, and the fallback is stated
    from vramplan import estimate

    doc: dict[str, Any] = {
        "model": "facebook/opt-125m", "task": "train", "hardware": {"gpu": "T4"},
        "train": {"objective": "grpo", "precision": "fp16-mixed", "peft": {"method": "lora"}, "micro_batch_size": 8},
        "rl": {"rollout": {"engine": "vllm", "colocate": True, "vllm_version": "0.8.5",
                           "gpu_memory_utilization": 0.3}},
        "software": {"trl": "0.19.0"}}
    rep = estimate(doc)
    assert any("falls back to the V0 engine" in a and "0.7.3" in a for a in rep.assumptions)
    # on an A100 the same release runs V1 and stays refused
    doc["hardware"] = {"gpu": "A100-80GB"}
    doc["train"]["precision"] = "bf16-mixed"
    with pytest.raises(ScenarioError, match="peak plus non torch"):
        estimate(doc)
