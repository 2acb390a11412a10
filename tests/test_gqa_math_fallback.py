"""Grouped-query attention on SDPA's math kernel where flash cannot run (analytic/attention.py).

transformers >= 4.54 hands SDPA the K/V heads with ``enable_gqa=True``; flash cannot run in fp32, on a GPU
before sm80 or with head_dim > 256; torch <= 2.13's memory-efficient kernel refuses grouped K/V; so the
math kernel runs and saves the s x s softmax.  Checked against a real H200 step
(benchmarks/gpu/h200-2026-11-26/results.jsonl, made by benchmarks/gpu/measure_h200.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramplan.analytic import activations as act
from vramplan.analytic.attention import gqa_math_fallback, resolve_attention
from vramplan.analytic.terms.context import step_policy
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate

GPU_RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h200-2026-11-26" / "results.jsonl"


def _train(model: str = "Qwen/Qwen3-0.6B", gpu: str = "H200", precision: str = "fp32", seq: int = 1024,
           software: dict[str, str] | None = None, **hw: Any) -> dict[str, Any]:
    return {"model": model, "task": "train", "hardware": {"gpu": gpu, "num_gpus": 1, **hw},
            "train": {"micro_batch_size": 4, "seq_len": seq, "precision": precision, "optimizer": "adamw"},
            "software": software or {}}


def _kernel(doc: dict[str, Any]) -> str:
    r = resolve(doc)
    return resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)[0]


@pytest.mark.parametrize(("doc", "kernel"), [
    # Qwen3-0.6B: 16 query heads, 8 K/V heads, head_dim 128
    (_train(), "math"),                                            # fp32: no flash; GQA: no memory-efficient
    (_train(precision="bf16-mixed"), "flash"),                     # half on sm90: flash takes GQA
    (_train(software={"torch": "2.14"}), "efficient"),             # 2.14's memory-efficient kernel takes GQA
    (_train(software={"torch": "2.13.0"}), "math"),
    (_train(software={"torch": "2.4"}), "efficient"),              # no enable_gqa before torch 2.5
    (_train(software={"transformers": "4.53"}), "efficient"),      # repeat_kv before transformers 4.54
    (_train(model="meta-llama/Meta-Llama-3-8B", gpu="T4", precision="fp16-mixed"), "math"),  # sm75: no flash
    (_train(model="meta-llama/Llama-2-7b-hf", gpu="T4", precision="fp16-mixed"), "efficient"),  # MHA: no GQA
    # bf16 before sm80: neither flash nor the memory-efficient kernel takes it, whatever the heads
    (_train(model="meta-llama/Llama-2-7b-hf", gpu="T4", precision="bf16-true"), "math"),
    (_train(model="meta-llama/Llama-2-7b-hf", gpu="A100-80GB", precision="bf16-true"), "flash"),
    (_train(model="meta-llama/Meta-Llama-3-8B", gpu="A100-80GB", precision="fp16-mixed"), "flash"),
    # Mistral 7B v0.1 slides over 4096 tokens: at 4096 transformers builds a mask and repeats K/V itself
    (_train(model="mistralai/Mistral-7B-v0.1", precision="fp32", seq=4096), "efficient"),
    (_train(model="mistralai/Mistral-7B-v0.1", precision="fp32", seq=2048), "math"),
])
def test_kernel_rule(doc: dict[str, Any], kernel: str) -> None:
    assert _kernel(doc) == kernel


def test_amd_and_mha_are_untouched() -> None:
    r = resolve(_train(gpu="MI300X"))
    assert not gqa_math_fallback(r.scenario, r.model, step_policy(r.scenario).compute_bytes, r.gpu)
    r = resolve(_train(model="meta-llama/Llama-2-7b-hf"))
    assert not gqa_math_fallback(r.scenario, r.model, step_policy(r.scenario).compute_bytes, r.gpu)


def test_math_saves_the_softmax_and_three_query_wide_copies() -> None:
    # Qwen3-0.6B fp32 at s = 1024, per layer and token: q width 16 x 128 = 2048, K/V width 8 x 128 = 1024.
    # math saves the scaled q, the scaled repeated k and the repeated v (3 x 4 x 2048 = 24,576) and the
    # softmax (4 x 16 heads x 1024 keys = 65,536); the memory-efficient kernel saved q (4 x 2048 = 8,192), k and
    # v (2 x 4 x 1024 = 8,192), its output (8,192, a view that is o_proj's input) and the logsumexp
    # (4 x 16 = 64).  o_proj's input: the output's contiguous copy under math (8,192).
    # math = 24,576 + 65,536 + 8,192 = 98,304; efficient = 8,192 + 8,192 + 8,192 + 64 = 24,640;
    # difference 73,664 B per layer and token (the H200 step measured 73,636 more than the efficient estimate)
    r = resolve(_train())
    m = r.model
    def ctx(kernel: str) -> act.ActContext:
        return act.ActContext(compute_bytes=4, residual_bytes=4, linear_input_bytes=4, autocast=False,
                              attention=kernel, gqa_repeat=False, seq_len=1024)

    math = act.attention_saved(m, m.layers[0], ctx("math"))
    eff = act.attention_saved(m, m.layers[0], ctx("efficient"))
    assert math - eff == 73_664
    # the whole step's saved activations at the backward's peak move by about 28 layers x 4096 tokens x that
    whole = (estimate(_train()).per_gpu.breakdown["activations"]
             - estimate(_train(software={"torch": "2.14"})).per_gpu.breakdown["activations"])
    assert abs(whole - 28 * 4096 * 73_664) < 4096 * 73_664 // 100


def test_report_states_the_fallback_and_the_release() -> None:
    rep = estimate(_train())
    text = " ".join(rep.assumptions)
    assert "enable_gqa" in text and "torch <= 2.13 assumed" in text
    rep = estimate(_train(software={"torch": "2.11"}))
    assert "(torch 2.11;" in " ".join(rep.assumptions)
    assert "enable_gqa" not in " ".join(estimate(_train(precision="bf16-mixed")).assumptions)


def _gpu_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in GPU_RUN.read_text().splitlines()]


def test_h200_fp32_gqa_step_is_predicted_from_the_math_kernel() -> None:
    """The measured step: max_memory_allocated 37,300,128,256 B; efficient-kernel estimate was 22.6% under."""
    row = next(r for r in _gpu_rows() if r["id"] == "qwen3-06b-full-fp32")
    measured = row["result"]["peak_allocated_bytes"]
    assert measured == 37_300_128_256
    # the releases that ran (env.json): transformers 5.17, torch 2.11
    scenario = {**row["result"]["scenario"], "software": {"transformers": "5.17", "torch": "2.11"}}
    # the harness built the model with config.use_cache = False for training (measure/build.py then)
    scenario["train"] = {**scenario["train"], "use_cache": False}
    predicted = estimate(scenario).per_gpu.peak_allocated_bytes
    assert abs(predicted - measured) / measured < 0.001


def test_t4_prefill_runs_math_and_keeps_fp32_scores() -> None:
    # Llama 3 8B fp16 generate on a T4 (sm75: no flash), b 1, prompt 2048: the running layer at math's softmax
    # (analytic/inference.py prefill_layer_bytes), h = q = 4096, t = 2048 tokens, c = 2, 32 heads:
    #   (2h + q) t c      = 12,288 x 2048 x 2   =    50,331,648  layer input, normed input, rotated queries
    #   12 q t            = 12 x 4096 x 2048    =   100,663,296  fp32 scaled q, scaled repeated k, repeated v
    #   9 b heads p^2     = 9 x 32 x 2048^2     = 1,207,959,552  fp32 scores and softmax output, and one byte
    #                                                            per score the softmax holds (measured on an H200)
    #   5 p^2             = 5 x 2048^2          =    20,971,520  is_causal's bool mask and its float copy
    #   total                                     1,379,926,016
    # The traced engine (torch's own math decomposition on the meta device, which does not see the byte per
    # score held below the dispatcher) keeps 1,241,513,984 in the layer, 134,217,728 = 32 x 2048^2 less.
    doc = {"model": "meta-llama/Meta-Llama-3-8B", "task": "inference", "hardware": {"gpu": "T4"},
           "inference": {"dtype": "fp16", "batch_size": 1, "prompt_len": 2048, "new_tokens": 64}}
    rep = estimate(doc)
    assert rep.per_gpu.breakdown_detail["activations"]["running layer"] == 1_379_926_016
    assert any("enable_gqa" in a for a in rep.assumptions)
    # the same prompt on an A100 runs flash: no s x s term
    a100 = estimate({**doc, "hardware": {"gpu": "A100-80GB"}})
    assert a100.per_gpu.breakdown_detail["activations"]["running layer"] < 300_000_000


@pytest.mark.parametrize(("model", "release", "kernel"), [
    # Gemma2PreTrainedModel sets _supports_sdpa = False from transformers 5.21.0 ("sdpa does not support
    # softcapping"; True in the 5.17.0-5.20.0 wheels): the default sdpa falls back to eager
    ("google/gemma-2-2b", "5.20", "flash"),
    ("google/gemma-2-2b", "5.21", "eager"),
    ("google/gemma-2-2b", None, "eager"),          # the current release
    ("google/gemma-3-1b-pt", None, "flash"),       # Gemma 3 keeps SDPA
])
def test_gemma2_sdpa_by_transformers_release(model: str, release: str | None, kernel: str) -> None:
    doc = _train(model=model, precision="bf16-mixed", software={"transformers": release} if release else None)
    assert _kernel(doc) == kernel


def test_bf16_prompt_on_a_t4_runs_math_even_with_one_kv_head_per_head() -> None:
    # Llama-2-7B (32 heads, 32 K/V heads) generate on a T4 (sm75), b 1, prompt 2048: in bf16 neither flash (sm80)
    # nor the memory-efficient kernel (fp16/fp32 only before sm80) runs, so SDPA's math kernel does; the running
    # layer is the same sum as the grouped-query case above (h = q = 4096, 32 heads): 1,379,926,016 B
    doc = {"model": "meta-llama/Llama-2-7b-hf", "task": "inference", "hardware": {"gpu": "T4"},
           "inference": {"dtype": "bf16", "batch_size": 1, "prompt_len": 2048, "new_tokens": 16}}
    rep = estimate(doc)
    assert rep.per_gpu.breakdown_detail["activations"]["running layer"] == 1_379_926_016
    assert any(a.startswith("bf16 on a GPU before sm80") for a in rep.assumptions)
    # fp16 on the same GPU: the memory-efficient kernel, no s x s term
    fp16 = estimate({**doc, "inference": {**doc["inference"], "dtype": "fp16"}})
    assert fp16.per_gpu.breakdown_detail["activations"]["running layer"] < 300_000_000
    assert not any("sm80" in a for a in fp16.assumptions)
