"""generate()'s allocator cache: the prefill's holes and DynamicCache's torch.cat growth (analytic/generate_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramplan.analytic.generate_replay import applies, cached_excess, generate_stream, weight_tensors
from vramplan.analytic.inference import GenerateCall
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate

GPU_RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h200-2026-11-26" / "results.jsonl"


def _doc(model: str = "meta-llama/Llama-3.2-1B", gpu: str = "H200", **inf: Any) -> dict[str, Any]:
    return {"model": model, "task": "inference", "hardware": {"gpu": gpu},
            "inference": {"batch_size": 2, "prompt_len": 64, "new_tokens": 5, "dtype": "bf16", **inf}}


def _live_after(events: list[int]) -> int:
    sizes: list[int] = []
    live = 0
    for e in events:
        if e > 0:
            sizes.append(e)
            live += e
        else:
            live -= sizes[-e - 1]
    return live


def test_stream_leaves_exactly_the_weights_inputs_cache_and_scores() -> None:
    # Llama 3.2 1B, bf16 (c = 2), b 2, prompt 64, 5 new tokens: 4 decode steps, the cache ends at 68 tokens.
    # Left alive after the stream: the weights (1,235,814,400 parameters x 2 B, tied head), the prompt's
    # embeddings (2 x 64 x 2048 x 2 = 524,288), RoPE cos and sin (2 x 64 x 64 x 2 = 16,384), the cache
    # (16 layers x 2 (K, V) x 2 x 68 x 512 (8 K/V heads x 64) x 2 = 4,456,448) and the last fp32 scores
    # (2 x 128,256 x 4 = 1,026,048)
    g = GenerateCall.of(resolve(_doc()))
    weights = weight_tensors(g)
    assert sum(weights) == 1_235_814_400 * 2
    events = generate_stream(g, weights)
    assert _live_after(events) == 1_235_814_400 * 2 + 524_288 + 16_384 + 4_456_448 + 1_026_048


def test_every_block_is_freed_at_most_once() -> None:
    events = generate_stream(GenerateCall.of(resolve(_doc())), [])
    freed = [-e - 1 for e in events if e < 0]
    assert len(freed) == len(set(freed))
    assert all(0 <= i < sum(e > 0 for e in events) for i in freed)


@pytest.mark.parametrize(("doc", "replayed"), [
    (_doc(), True),
    (_doc(model="Qwen/Qwen3-30B-A3B"), False),            # mixture of experts
    (_doc(quantization="nf4"), False),                    # bitsandbytes weights
    (_doc(attention="eager"), False),
    (_doc(new_tokens=1), False),                          # no decode step
])
def test_what_is_replayed(doc: dict[str, Any], replayed: bool) -> None:
    g = GenerateCall.of(resolve(doc))
    assert applies(g) is replayed
    if not replayed:
        assert cached_excess(g).bytes == 0
    rep = estimate(doc)
    assert any(("replayed through PyTorch's caching-allocator" in a) is replayed for a in rep.assumptions
               if a.startswith("reserved bytes"))


def test_reserved_is_the_peak_plus_the_cached_excess() -> None:
    doc = _doc(batch_size=16, prompt_len=2048, new_tokens=128, model="microsoft/Phi-3.5-mini-instruct")
    rep = estimate(doc)
    g = GenerateCall.of(resolve(doc))
    assert rep.per_gpu.peak_reserved_bytes == rep.per_gpu.peak_allocated_bytes + cached_excess(g).bytes


def _row(name: str) -> dict[str, Any]:
    """A measured row, its scenario given the releases that ran (env.json: transformers 5.17, torch 2.11)."""
    for line in GPU_RUN.read_text().splitlines():
        row = json.loads(line)
        if row["id"] == name:
            result = dict(row["result"])
            result["scenario"] = {**result["scenario"], "software": {"transformers": "5.17", "torch": "2.11"}}
            return result
    raise KeyError(name)


@pytest.mark.parametrize("name", ["phi35-mini-gen-b16", "llama31-8b-gen-b8", "gemma2-9b-gen-s4096",
                                  "qwen25-7b-gen-b32"])
def test_h200_generate_reserved_within_three_percent(name: str) -> None:
    """Measured max_memory_reserved after generate on an H200 (torch 2.11, transformers 5.17); the peak's
    tensors packed into empty segments were 3.5% to 17.6% under on these four calls."""
    row = _row(name)
    predicted = estimate(row["scenario"]).per_gpu.peak_reserved_bytes
    measured = row["peak_reserved_bytes"]
    assert abs(predicted - measured) / measured < 0.03


def test_growth_late_in_the_call_is_stated_and_widens_the_band() -> None:
    # SmolLM2-1.7B, batch 64, prompt 512, 128 new tokens: the replay's excess doubles between step 63 and
    # step 127 (measured on an H200 the call kept 28% more reserved than the estimate): stated, band widened
    grows = estimate(_doc(model="HuggingFaceTB/SmolLM2-1.7B-Instruct", batch_size=64, prompt_len=512,
                          new_tokens=128))
    assert any(a.startswith("not modelled: the allocator's cached excess") for a in grows.assumptions)
    # Llama 3 8B, batch 8, prompt 2048, 256 new tokens: the excess is set by the first steps
    flat = estimate(_doc(model="meta-llama/Meta-Llama-3-8B", batch_size=8, prompt_len=2048, new_tokens=256))
    assert not any(a.startswith("not modelled") for a in flat.assumptions)
    assert (grows.band["classes"]["reserved"]["factor_high"]
            > flat.band["classes"]["reserved"]["factor_high"])
