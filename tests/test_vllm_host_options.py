"""Host-side vLLM options: ``serve.swap_space_gib`` (V0's pinned CPU KV cache) and ``serve.max_cpu_loras`` (the host
LRU of adapters), serve/vllm.py ``_swap_space_notes``, ``_host_swap_bytes`` and ``_host_lora_bytes``."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.serve.vllm import decide
from vramplan.units import GiB

LLAMA = "meta-llama/Llama-3.1-8B"


def _decide(version: str, **serve: Any) -> Any:
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 16384, "vllm_version": version, **serve}}
    return decide(resolve(doc), version=version)


def test_v0_swap_space_is_pinned_host_memory_by_hand() -> None:
    # Llama-3.1-8B, bf16, block 16: a V0 block of all 32 layers is 16 x (2 x 8 KV heads x 128 x 2 B x 32 layers)
    # = 16 x 131,072 = 2,097,152 B; vLLM's default 4 GiB holds 4,294,967,296 // 2,097,152 = 2,048 blocks
    d = _decide("0.6.5")
    assert d.page_bytes * d.layers_per_group == 2_097_152
    assert d.host_swap_bytes == 2048 * 2_097_152 == 4 * GiB
    # 1.5 GiB: 1,610,612,736 // 2,097,152 = 768 blocks exactly; 1.001 GiB rounds down to 512 blocks
    assert _decide("0.6.5", swap_space_gib=1.5).host_swap_bytes == 768 * 2_097_152
    assert _decide("0.6.5", swap_space_gib=1.001).host_swap_bytes == 512 * 2_097_152
    assert d.to_dict()["host_swap_bytes"] == 4 * GiB
    # the GPU side does not move
    assert _decide("0.6.5", swap_space_gib=16).kv_cache_bytes == d.kv_cache_bytes


def test_v1_allocates_no_swap_and_later_releases_refuse_it() -> None:
    d = _decide("0.15", swap_space_gib=8)
    assert d.host_swap_bytes == 0 and "host_swap_bytes" not in d.to_dict()
    assert any("allocates no swap space" in a for a in d.assumptions)
    with pytest.raises(ScenarioError) as e:
        _decide("0.19", swap_space_gib=8)
    assert e.value.problems[0].where == "serve.swap_space_gib" and "0.18.0" in e.value.problems[0].message


def test_max_cpu_loras_bounds_the_host_adapter_cache_by_hand() -> None:
    # one adapter of rank 16 on every linear: 83,886,080 B (docs/serving.md, lora_slot_bytes); 8 adapters in host
    # RAM: 671,088,640 B; the GPU slots are max_loras 2: 167,772,160 B, as without max_cpu_loras
    d = _decide("0.19", max_loras=2, max_cpu_loras=8)
    assert d.host_lora_cache_bytes == 8 * 83_886_080 == 671_088_640
    assert d.lora_bytes == 2 * 83_886_080 == _decide("0.19", max_loras=2).lora_bytes


@pytest.mark.parametrize(("serve", "says"), [
    ({"max_cpu_loras": 4}, "max_loras 0"),
    ({"max_loras": 4, "max_cpu_loras": 2}, "must be >= max_loras (4)"),
])
def test_bad_max_cpu_loras_is_refused(serve: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError) as e:
        _decide("0.19", **serve)
    p = e.value.problems[0]
    assert p.where == "serve.max_cpu_loras" and says in p.message


def test_sleep_mode_keeps_what_the_allocator_does_not_tag_by_hand() -> None:
    # level 1: CuMemAllocator unmaps the "weights" (copied to the host) and "kv_cache" allocations; everything else
    # nvidia-smi shows stays: device_used - weights - kv_cache
    d = _decide("0.19", sleep_level=1)
    plain = _decide("0.19")
    assert d.kv_cache_bytes == plain.kv_cache_bytes  # start-up is unchanged
    assert d.asleep_device_bytes == plain.device_used_bytes - plain.weights_bytes - plain.kv_cache_bytes
    assert d.asleep_host_bytes == plain.weights_bytes
    # level 2: both discarded; the model's buffers (its rotary cos/sin cache, the report's rotary_cache_bytes:
    # 33,554,432 B for Llama-3.1-8B under 0.19) are copied to the host
    d2 = _decide("0.19", sleep_level=2)
    assert d2.asleep_device_bytes == d.asleep_device_bytes
    assert d2.asleep_host_bytes == plain.rotary_cache_bytes == 33_554_432
    keys = d2.to_dict()
    assert keys["sleep_level"] == 2 and keys["asleep_host_bytes"] == plain.rotary_cache_bytes
    assert "asleep_device_bytes" not in plain.to_dict()


def test_sleep_mode_before_the_read_releases_is_refused() -> None:
    with pytest.raises(ScenarioError) as e:
        _decide("0.8.5", sleep_level=1)
    assert e.value.problems[0].where == "serve.sleep_level" and "0.9.0" in e.value.problems[0].message
