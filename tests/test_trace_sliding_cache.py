"""The traced engine's decode cache for sliding-window layers (Gemma 2/3 local layers, Mistral's ``sliding_window``):
each layer's storage as transformers 5.24's ``DynamicSlidingWindowLayer`` keeps it (cache_utils.py :242-249), by
hand and against a real ``generate`` of tiny models on the CPU, and the analytic engine's count of the same cache."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import bf16_generate, meta_module
from vramplan.analytic.inference import cache_bytes
from vramplan.spec.hf_config import model_from_config

# tiny configs (test inputs, not catalog models): one KV head of 32, window 8 tokens, shorter than the prompts below
_COMMON = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 8, "max_position_embeddings": 256}
GEMMA2 = {"model_type": "gemma2", "num_hidden_layers": 4, **_COMMON}  # layer_types: sliding, full, sliding, full
GEMMA3 = {"model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 2, **_COMMON}
MISTRAL = {"model_type": "mistral", "num_hidden_layers": 3, **_COMMON}  # every layer sliding (no layer_types)
COHERE2 = {"model_type": "cohere2", "num_hidden_layers": 4, "sliding_window_pattern": 2, **_COMMON}
# Qwen2's window from layer max_window_layers on: full, full, sliding, sliding
QWEN2 = {"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": True, "max_window_layers": 2, **_COMMON}


def _storage_bytes(layer: Any) -> int:
    return int(layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes())


def _filled(cfg: dict[str, Any], batch: int, tokens: int, prompt: int | None, device: str = "meta",
            model: Any = None) -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    from vramplan.trace.step import _filled_cache
    from vramplan.trace.tracker import Tracker

    model = model if model is not None else meta_module(dict(cfg), "AutoModelForCausalLM").to(torch.bfloat16)
    with Tracker() as tr:
        cache = _filled_cache(model, tr, batch, tokens, device, prompt=prompt)
    return cache, tr


def test_sliding_layer_keeps_its_window_after_decode_steps_by_hand() -> None:
    # batch 3, prompt 100, 31 new tokens: the last decode step starts from 100 + 31 - 1 = 130 cached tokens.
    # Sliding layer (window 8): the previous step's torch.cat of the 7-token view and the new token, 8 tokens:
    # 3 x 1 head x 8 x 32 x 2 B = 1,536 B for K, 3,072 B with V; the view shows the last 7 tokens.
    # Full layer: 3 x 1 x 130 x 32 x 2 B = 24,960 B for K, 49,920 B with V.
    cache, tr = _filled(GEMMA2, 3, 130, 100)
    sliding, full = cache.layers[0], cache.layers[1]
    assert sliding.is_sliding and not full.is_sliding
    assert _storage_bytes(sliding) == 3_072
    assert tuple(sliding.keys.shape) == (3, 1, 7, 32)
    assert _storage_bytes(full) == 49_920
    assert cache.get_seq_length() == 130  # layer 0 (sliding) counts every token, as its cumulative_length does
    # the kv_cache events: 2 x 3,072 + 2 x 49,920 = 106,000 B; no copy is made while filling (update's torch.cat
    # would hold a layer's K/V twice), so the fill's peak is the filled cache
    kv = sum(e.nbytes for e in tr.events if e.category == "kv_cache")
    assert kv == 106_000
    assert tr.peak_bytes == tr.live_bytes == 106_000


def test_sliding_layer_keeps_the_prompt_before_any_decode_step_by_hand() -> None:
    # no decode step yet (the cache as the prefill of 130 tokens leaves it): the sliding layer's 7-token view keeps
    # the prompt's whole storage, 3 x 1 x 130 x 32 x 2 B = 24,960 B for K, 49,920 B with V, as a full layer's
    cache, _ = _filled(GEMMA2, 3, 130, 130)
    assert _storage_bytes(cache.layers[0]) == 49_920
    assert tuple(cache.layers[0].keys.shape) == (3, 1, 7, 32)


def test_sequence_shorter_than_the_window_is_held_whole() -> None:
    # 2 + 3 = 5 tokens < window 8: 3 x 1 x 5 x 32 x 2 B = 960 B for K, 1,920 B with V, all of them visible
    cache, _ = _filled(MISTRAL, 3, 5, 2)
    assert all(_storage_bytes(layer) == 1_920 and layer.keys.shape[2] == 5 for layer in cache.layers)


@pytest.mark.parametrize("cfg", [GEMMA2, GEMMA3, MISTRAL, COHERE2, QWEN2],
                         ids=["gemma2", "gemma3", "mistral", "cohere2", "qwen2"])
def test_filled_cache_equals_a_real_generate(cfg: dict[str, Any]) -> None:
    """A real bf16 ``generate`` of 2 x 20 prompt tokens and 5 new ones on the CPU leaves 24 tokens in its cache:
    every layer's storage there equals the traced engine's filled cache of 24 tokens after a 20-token prompt,
    and one decode step run on each cache leaves the same storage again."""
    torch = pytest.importorskip("torch")
    batch, prompt, new = 2, 20, 5
    model, out = bf16_generate(cfg, batch, prompt, new)
    real = out.past_key_values
    traced, _ = _filled(cfg, batch, prompt + new - 1, prompt, device="cpu", model=model)
    assert any(layer.is_sliding for layer in real.layers)
    assert [_storage_bytes(layer) for layer in traced.layers] == [_storage_bytes(layer) for layer in real.layers]
    assert [tuple(layer.keys.shape) for layer in traced.layers] == [tuple(layer.keys.shape) for layer in real.layers]
    assert traced.get_seq_length() == real.get_seq_length() == prompt + new - 1
    # the analytic engine's decode cache of the same 24 tokens: min(24, 8) tokens in a sliding layer, 24 in a full
    # one, 2 sequences x 1 head x 32 x 2 B x 2 (K and V) = 256 B a token
    m = model_from_config(dict(cfg))
    assert cache_bytes(m, batch, prompt + new - 1, 2, 1, "auto", prefill=False) == sum(
        _storage_bytes(layer) for layer in real.layers)
    with torch.no_grad():
        nxt = out.sequences[:, -1:]
        pos = torch.full((batch, 1), prompt + new - 1)
        for cache in (real, traced):
            model(input_ids=nxt, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
    assert [_storage_bytes(layer) for layer in traced.layers] == [_storage_bytes(layer) for layer in real.layers]


def _call(cfg: dict[str, Any], batch: int, prompt: int, new: int) -> Any:
    from vramplan.analytic.inference import GenerateCall
    from vramplan.catalog.resolve import resolve

    return GenerateCall.of(resolve({"model": dict(cfg), "task": "inference", "hardware": {"gpu": "H100"},
                                    "inference": {"batch_size": batch, "prompt_len": prompt, "new_tokens": new,
                                                  "dtype": "bf16"}}))


def test_analytic_cache_growth_of_sliding_layers_by_hand() -> None:
    from vramplan.analytic.inference import cache_growth_bytes

    # a layer caches 1 KV head x 32 x 2 B x 2 (K and V) = 128 B a token and sequence.  Mistral (every layer
    # sliding, window 8), 2 sequences, the step to 24 tokens: the old K and V of min(23, 8) = 8 tokens, held while
    # the new ones are made: 2 x 8 x 128 = 2,048 B (no full-attention layer: its half would be 0)
    assert cache_growth_bytes(_call(MISTRAL, 2, 20, 5), 24) == 2_048
    # Gemma 2 (sliding and full): a full layer's keys, 2 x 24 x 128 / 2 = 3,072 B, exceed the sliding layer's 2,048
    assert cache_growth_bytes(_call(GEMMA2, 2, 20, 5), 24) == 3_072
    # 6 tokens, under the window: full 2 x 6 x 64 = 768 B; sliding 2 x min(5, 8) x 128 = 1,280 B, the larger
    assert cache_growth_bytes(_call(GEMMA2, 2, 3, 4), 6) == 1_280


@pytest.mark.parametrize(("cfg", "layer"), [(MISTRAL, 0), (GEMMA2, 0), (GEMMA2, 1)],
                         ids=["mistral-sliding", "gemma2-sliding", "gemma2-full"])
def test_analytic_cache_growth_equals_a_real_update(cfg: dict[str, Any], layer: int) -> None:
    """The bytes one layer's ``update`` holds beyond its cache at a decode step, measured on the cache a real bf16
    ``generate`` of 2 x 20 + 5 tokens leaves (24 tokens), are what ``cache_growth_bytes`` counts for that kind of
    layer (the step to 25 tokens; a full layer's count rounds its one-token values up to the keys' half)."""
    torch = pytest.importorskip("torch")
    from vramplan.analytic.inference import cache_growth_bytes
    from vramplan.trace.tracker import Tracker

    _, out = bf16_generate(cfg, 2, 20, 5)
    cache_layer = out.past_key_values.layers[layer]
    key, value = (torch.zeros((2, 1, 1, 32), dtype=torch.bfloat16) for _ in range(2))
    with Tracker() as tr:
        tr.track([cache_layer.keys, cache_layer.values], "kv_cache")
        held = tr.live_bytes
        cache_layer.update(key, value)
    extra = tr.peak_bytes - held
    if cache_layer.is_sliding:
        # the old 8-token K and V (2,048 B) beside the new ones: exactly the sliding count, Mistral's whole growth
        assert extra == 2 * 8 * 128 == 2_048  # 2 sequences x 8 tokens x 128 B (K and V)
        if cfg is MISTRAL:
            assert cache_growth_bytes(_call(cfg, 2, 20, 6), 25) == extra
    else:
        # at the values' cat: the new 25-token keys (2 x 25 x 32 x 2 B = 3,200 B; the old ones are freed) and the new
        # values beside the old, one token more (2 x 32 x 2 B = 128 B); counted as the keys' half, 2 x 25 x 64 = 3,200 B
        assert extra == 3_200 + 128
        assert cache_growth_bytes(_call(cfg, 2, 20, 6), 25) == 3_200
