"""The serve report's moment holds every byte vLLM's decision counts on the device: the LoRA slots, the speculative
proposer's weights and buffers, and the parameters less what ``cpu_offload_gb`` keeps on the host.  Before, the
moment had the target's parameters only, so a LoRA or draft-model server's peak and device-used figures were short
of ``VllmDecision.device_used_bytes`` by those terms (while its KV pool already paid for them)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.serve.vllm import decide

BASE: dict[str, Any] = {"model": "llama-3.1-8b", "task": "serve", "hardware": {"gpu": "H100-SXM"}}
CASES: dict[str, dict[str, Any]] = {
    "plain": {"vllm_version": "0.19", "max_model_len": 8192},
    "lora": {"vllm_version": "0.19", "max_model_len": 8192, "max_loras": 4, "max_lora_rank": 64},
    "lora-outside-budget-0.7": {"vllm_version": "0.7.3", "max_model_len": 8192, "max_loras": 2, "max_lora_rank": 16},
    "draft": {"vllm_version": "0.29.0", "max_model_len": 8192,
              "speculative": {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 3}},
    "cpu-offload": {"vllm_version": "0.19", "max_model_len": 8192, "cpu_offload_gb": 4},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_report_device_used_is_the_decisions(name: str) -> None:
    doc = {**BASE, "serve": CASES[name]}
    d = decide(resolve(doc), CASES[name]["vllm_version"])
    rep = estimate(doc)
    assert rep.per_gpu.device_used_bytes == d.device_used_bytes
    bd = rep.per_gpu.breakdown
    # the weights part: parameters - offloaded + rotary + LoRA slots + proposer = the decision's weights, plus the
    # slots the release leaves outside the budget
    assert bd["weights"] == d.weights_bytes + (d.lora_bytes if d.lora_outside_budget else 0)
    if name == "lora":
        assert bd["weights"] > d.parameters_bytes + d.rotary_cache_bytes  # the slots are in it
