"""The traced engine's decode cache for sliding-window layers (Gemma 2/3 local layers, Mistral's ``sliding_window``):
each layer's storage as transformers 5.24's ``DynamicSlidingWindowLayer`` keeps it (cache_utils.py :242-249), by
hand and against a real ``generate`` of tiny models on the CPU, and the analytic engine's count of the same cache."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from meta_build import meta_module
from vramplan.analytic.inference import cache_bytes
from vramplan.spec.hf_config import model_from_config

# tiny configs (test inputs, not catalog models): one KV head of 32, window 8 tokens, shorter than the prompts below
_COMMON = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 8, "max_position_embeddings": 256}
GEMMA2 = {"model_type": "gemma2", "num_hidden_layers": 4, **_COMMON}  # layer_types: sliding, full, sliding, full
GEMMA3 = {"model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 2, **_COMMON}
MISTRAL = {"model_type": "mistral", "num_hidden_layers": 3, **_COMMON}  # every layer sliding (no layer_types)


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


@pytest.mark.parametrize("cfg", [GEMMA2, GEMMA3, MISTRAL], ids=["gemma2", "gemma3", "mistral"])
def test_filled_cache_equals_a_real_generate(cfg: dict[str, Any]) -> None:
    """A real bf16 ``generate`` of 2 x 20 prompt tokens and 5 new ones on the CPU leaves 24 tokens in its cache:
    every layer's storage there equals the traced engine's filled cache of 24 tokens after a 20-token prompt,
    and one decode step run on each cache leaves the same storage again."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    batch, prompt, new = 2, 20, 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
        model = model.to(torch.bfloat16).eval()
        ids = torch.randint(1, 128, (batch, prompt))
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                                 return_dict_in_generate=True)
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
