"""vLLM's QKVParallelLinear replicates the KV heads when tensor parallelism exceeds them: every rank holds one
whole K head and one whole V head (vllm/model_executor/layers/linear.py, ``num_kv_head_replicas``), not the dense
split's ``kv_heads / tp`` of them.  The weights per rank include the replicas."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.catalog import load_model
from vramplan.serve import vllm
from vramplan.serve.vllm import replicated_kv_elements

MODEL = "Qwen/Qwen3-30B-A3B"  # 48 layers, 32 query heads, 4 KV heads of 128, hidden 2048


def _serve(tp: int, **serve: Any) -> Any:
    return estimate({"model": MODEL, "task": "serve", "hardware": {"gpu": "H100", "num_gpus": tp},
                     "parallel": {"tp": tp}, "serve": {"max_model_len": 4096, **serve}})


def test_replicated_elements_by_hand() -> None:
    m = load_model(MODEL)
    every = tuple(layer.index for layer in m.layers)
    # tp 8 over 4 KV heads: one whole head of 128 x 2048 = 262,144 per K and per V, against the split's 4/8 of a
    # head, 131,072: 48 layers x 2 x (262,144 - 131,072) = 12,582,912 elements
    assert replicated_kv_elements(m, 8, every) == 12_582_912
    # tp 4 divides the 4 KV heads: nothing replicated; half the layers (a pipeline stage) half the replicas
    assert replicated_kv_elements(m, 4, every) == 0
    assert replicated_kv_elements(m, 8, every[:24]) == 6_291_456


def test_the_weights_per_rank_carry_the_replicas_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    at8 = _serve(8)
    text = " ".join(at8.assumptions)
    assert "each rank holds max(1, 4 // 8) whole K and V heads" in text and "12,582,912 elements" in text
    assert not any("whole K and V heads" in a for a in _serve(4).assumptions)
    # the same estimate without the replicas: bf16, 12,582,912 x 2 B = 25,165,824 B less weight per rank
    monkeypatch.setattr(vllm, "replicated_kv_elements", lambda *a: 0)
    assert at8.per_gpu.breakdown["weights"] - _serve(8).per_gpu.breakdown["weights"] == 25_165_824


def test_sglang_says_it_does_not_add_them() -> None:
    r = _serve(8, engine="sglang")
    assert any(a.startswith("not modelled: attention tensor parallel 8 over 4 KV heads") for a in r.assumptions)
    assert not any("whole K and V heads (vLLM's" in a for a in r.assumptions)
