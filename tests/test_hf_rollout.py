"""GRPO's and RLOO's rollout by Hugging Face generate inside the trainer (rl.rollout.engine: hf-generate).

The oracle is Qwen2.5-0.5B (hidden 896, MLP 4,864, 24 layers, 2 KV heads of 64, vocabulary 151,936, tied embeddings;
357,826,560 decoder linear parameters) on an A100-80GB, GRPO at TRL's defaults: bf16 autocast over fp32 parameters,
8 completions per device, 512 prompt + 256 completion tokens, one gradient-accumulation step (8 prompts per generate
call), no reference model.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramplan.analytic.grpo import policy_scenario
from vramplan.analytic.lifecycle.hf_rollout import generation_batch, hf_generate_parts
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.load import Resolved

A100 = "A100-80GB"
BASE: dict[str, Any] = {"model": "qwen2.5-0.5b", "hardware": {"gpu": A100},
                        "train": {"objective": "grpo", "micro_batch_size": 8},
                        "rl": {"rollout": {"engine": "hf-generate"}}}
RESIDENT = 5_945_432_576  # fp32 parameters, AdamW's states, cuBLAS workspaces (tests/test_grpo.py)


def _with(**train: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(BASE))
    doc["train"].update(train)
    return doc


def _parts(doc: dict[str, Any]) -> tuple[int, int, int]:
    r = resolve(doc)
    pr = Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    c = train_step(pr).context
    assert c is not None
    return hf_generate_parts(c, pr)


def test_generate_parts_by_hand() -> None:
    # one generate call of 8 prompts of 512 tokens, 256 new, under bf16 autocast over fp32 weights
    # (analytic/inference.py in bf16, then the fp32 tensors autocast leaves):
    #   prefill: the prompt's cache in bf16 24 layers x 8 x 512 x 2 (K, V) x 2 heads x 64 x 2 B = 50,331,648, its keys
    #   fp32 (RoPE's fp32 cos/sin promote them): 25,165,824 x 2 + 25,165,824 = 75,497,472; kept embeddings
    #   8 x 512 x 896 x 2 = 7,340,032, RoPE cos/sin 131,072, the running layer 141,557,760: 149,028,864, plus the fp32
    #   residual stream's extra 3 x 8 x 512 x 896 x (4 - 2) = 22,020,096 and cos/sin's 131,072 -> 171,180,032
    #   (the last decode step: cache 75,399,168 x 1.5 = 113,098,752, one layer's key growth 1,570,816 x 2 =
    #   3,141,632, the logits 38,895,616 and their fp32 conversion 4,861,952: 159,997,952, smaller than the
    #   prefill's 246,677,504)
    #   autocast's copies: the decoder's linears 357,826,560 x 2 = 715,653,120 and the tied head 151,936 x 896 x 2 =
    #   272,269,312 -> 987,922,432
    assert _parts(BASE) == (75_497_472, 171_180_032, 987_922_432)


def test_decode_bound_call_by_hand() -> None:
    # 8 prompts of 16 tokens, 1,024 new: the last decode step (1,039 tokens cached) is the call's highest moment:
    #   cache 24 x 8 x 1,039 x 512 = 102,137,856 in bf16, keys fp32: x 1.5 = 153,206,784
    #   one layer's key growth 8 x 1,039 x 512 / 2 = 2,127,872, fp32: 4,255,744; the last-token logits and sampling
    #   8 x 151,936 x (2 + 4 + 26) = 38,895,616; accelerate's fp32 conversion 4 x 8 x 151,936 = 4,861,952
    #   -> other 48,013,312
    doc = {**BASE, "rl": {"rollout": {"engine": "hf-generate", "max_prompt_len": 16, "max_completion_len": 1024}}}
    assert _parts(doc) == (153_206_784, 48_013_312, 987_922_432)


def test_half_parameters_keep_half_keys_and_no_copies() -> None:
    # bf16-true: the residual is bf16, the keys too (50,331,648), nothing cached by autocast (no autocast)
    kv, other, casts = _parts(_with(precision="bf16-true"))
    assert (kv, other, casts) == (50_331_648, 149_028_864, 0)


def test_rollout_phase_by_hand() -> None:
    # the resident 5,945,432,576 + 75,497,472 + 171,180,032 + 987,922,432 = 7,180,032,512; no engine in any phase
    rep = estimate(BASE)
    assert rep.per_gpu.lifecycle["rollout"]["allocated_bytes"] == 7_180_032_512
    assert "rollout engine (vLLM) weights" not in rep.per_gpu.breakdown_detail.get("weights", {})
    assert any(a.startswith("GRPO rollout: Hugging Face generate inside the trainer") for a in rep.assumptions)


def test_training_step_and_scoring_hold_no_engine() -> None:
    # the same as vLLM in server mode: nothing of a rollout engine beside the step or the scoring
    server = estimate({**BASE, "rl": {"rollout": {"colocate": False}}}).per_gpu.lifecycle
    hf = estimate(BASE).per_gpu.lifecycle
    assert hf["training step"] == server["training step"] and hf["scoring"] == server["scoring"]


def test_generation_batch_counts_the_accumulation_steps() -> None:
    r = resolve(_with(grad_accum_steps=4))
    pr = Resolved(policy_scenario(r.scenario), r.model, r.gpu, r.assumptions)
    c = train_step(pr).context
    assert c is not None and generation_batch(c) == 32
    # four times the prompts: the prompt's cache four times as large
    assert hf_generate_parts(c, pr)[0] == 4 * 75_497_472


def test_peft_caches_no_copies_of_a_half_base() -> None:
    # bf16-mixed LoRA: the frozen base is loaded in bf16 (no cast at all; the adapters' own copies, rank-sized, are not
    # counted), and its residual stream stays bf16: the keys bf16 (50,331,648) and no fp32 residual extra (149,028,864)
    assert _parts(_with(peft={"method": "lora"})) == (50_331_648, 149_028_864, 0)


def test_rloo_by_hf_generate() -> None:
    doc = {**_with(objective="rloo"), "rl": {"rollout": {"engine": "hf-generate"}}}
    rep = estimate(doc)
    assert any(a.startswith("RLOO rollout: Hugging Face generate") for a in rep.assumptions)
    # RLOO's defaults: 512 new tokens and a reference copy 494,032,768 x 4 = 1,976,131,072 in the rollout phase too.
    # The prefill stays the call's highest moment: the last decode step's cache 24 x 8 x 1,023 x 512 x 1.5 =
    # 150,847,488, one layer's key growth 8 x 1,023 x 256 x 2 = 4,190,208 and the logits 38,895,616 make 193,933,312
    # < 246,677,504; so 7,180,032,512 + 1,976,131,072 = 9,156,163,584
    assert rep.per_gpu.lifecycle["rollout"]["allocated_bytes"] == 9_156_163_584


@pytest.mark.parametrize(("change", "where"), [
    ({"rl": {"rollout": {"engine": "hf-generate", "gpu_memory_utilization": 0.5}}}, "rl.rollout"),
    ({"rl": {"rollout": {"engine": "hf-generate", "sleep_mode": 1}}}, "rl.rollout"),
    ({"train": {"objective": "grpo", "micro_batch_size": 8, "precision": "fp32"}}, "train.precision"),
    ({"train": {"objective": "grpo", "micro_batch_size": 8, "quantization": "nf4", "peft": {"method": "qlora"}}},
     "train.quantization"),
])
def test_refusals(change: dict[str, Any], where: str) -> None:

    with pytest.raises(ScenarioError) as exc:
        estimate({**BASE, **change})
    assert any(p.where == where for p in exc.value.problems), exc.value


def test_mla_cache_is_refused() -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate({**BASE, "model": "deepseek-ai/DeepSeek-V2-Lite"})
    assert any(p.where == "rl.rollout.engine" and "MLA" in p.message for p in exc.value.problems), exc.value


def test_transformers_caches_fp32_keys_under_autocast_over_fp32_weights() -> None:
    # a real CPU run: a 2-layer Qwen2 in fp32 under bf16 autocast (as accelerate's forward wrapper runs generate's
    # forwards): RoPE's cos/sin in the residual's fp32 promote the keys; the values stay bf16
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=torch.randint(0, 100, (2, 7)), use_cache=True)
    layer = out.past_key_values.layers[0]
    assert (layer.keys.dtype, layer.values.dtype) == (torch.float32, torch.bfloat16)
