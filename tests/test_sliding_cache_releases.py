"""What a sliding-window layer's cache holds in each transformers release (analytic/inference.py
``GenerateBehaviour.sliding_cache``): the window from 4.56.0 (``DynamicSlidingWindowLayer``, cache_utils.py 4.56.0:165),
every token before it (4.55.4's ``DynamicCache``), and for checkpoints whose generation_config.json names
``cache_implementation: "hybrid"`` (Gemma 2, Gemma 3) a HybridCache allocated before the prefill for the prompt and
the new tokens, which 4.56.0's generate stops honouring (generation/utils.py 4.56.0:1728-1732)."""

from __future__ import annotations

from typing import Any

from vramplan.analytic.inference import GenerateCall, cache_growth_bytes
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate

# Gemma 2 2B: 26 layers alternating sliding (window 4,096) and full; 4 KV heads x 256; bf16:
# K + V = 2 x 4 x 256 x 2 = 4,096 B per token and layer, 13 layers of each kind
GEMMA2_LAYER_TOKEN = 4096
# Mistral-7B-v0.1: 32 layers, all sliding (window 4,096); 8 KV heads x 128; bf16: 2 x 8 x 128 x 2 = 4,096 B
MISTRAL_LAYER_TOKEN = 4096


def _doc(model: str, release: str | None, prompt: int, new: int, attention: str = "sdpa") -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "inference", "hardware": {"gpu": "H100-SXM"},
                           "inference": {"batch_size": 1, "prompt_len": prompt, "new_tokens": new, "dtype": "bf16",
                                         "attention": attention}}
    if release:
        doc["software"] = {"transformers": release}
    return doc


def test_gemma2_hybrid_cache_before_4_56_by_hand() -> None:
    # 4.50: max_cache_length = max_length - 1 (generation/utils.py 4.50.0:2188): 2,048 prompt + 8,192 new - 1 =
    # 10,239 slots on full layers, the 4,096 window on sliding ones, from the prefill on:
    # 13 x 10,239 x 4,096 + 13 x 4,096 x 4,096 = 545,206,272 + 218,103,808 = 763,310,080 B
    static = 13 * 10_239 * GEMMA2_LAYER_TOKEN + 13 * 4_096 * GEMMA2_LAYER_TOKEN
    assert static == 763_310_080
    g = GenerateCall.of(resolve(_doc("google/gemma-2-2b", "4.50", 2048, 8192)))
    assert g.gen.sliding_cache == "static" and g.static_slots == 10_239
    assert g.cache(2048, prefill=True) == static == g.cache(6000, prefill=False)
    # full layers are written in place; a sliding layer's _sliding_update gathers its window into new k_out and
    # v_out (cache_utils.py 4.50.0:1741-1743): 4,096 x 4,096 = 16,777,216 B per sequence
    assert cache_growth_bytes(g, 6000) == 4096 * GEMMA2_LAYER_TOKEN == 16_777_216
    # 4.45 (before 4.49): max_length slots, 10,240: 13 x 10,240 x 4,096 + 218,103,808 = 763,363,328 B
    g45 = GenerateCall.of(resolve(_doc("google/gemma-2-2b", "4.45", 2048, 8192)))
    assert g45.cache(2048, prefill=True) == 13 * 10_240 * GEMMA2_LAYER_TOKEN + 218_103_808 == 763_363_328
    # 4.56: DynamicCache with DynamicSlidingWindowLayer: the prefill holds the prompt on all 26 layers,
    # 26 x 2,048 x 4,096 = 218,103,808 B
    g56 = GenerateCall.of(resolve(_doc("google/gemma-2-2b", "4.56", 2048, 8192)))
    assert g56.gen.sliding_cache == "window"
    assert g56.cache(2048, prefill=True) == 26 * 2048 * GEMMA2_LAYER_TOKEN == 218_103_808


def test_gemma2_static_cache_prefill_scores_span_every_slot() -> None:
    # eager attention over the HybridCache: the full layers' keys are the 10,239 slots, so the prefill's scores are
    # 2,048 x 10,239 per head, five times the 2,048 x 2,048 of a DynamicCache: the running layer grows
    old = estimate(resolve(_doc("google/gemma-2-2b", "4.50", 2048, 8192, attention="eager")))
    new = estimate(resolve(_doc("google/gemma-2-2b", "4.56", 2048, 8192, attention="eager")))
    # scores alone, 8 heads x 2,048 x (10,239 - 2,048) more keys x 4 B (fp32 softmax) = 536,805,376 B more
    assert old.per_gpu.peak_allocated_bytes - new.per_gpu.peak_allocated_bytes > 536_805_376
    assert any("HybridCache allocated before the prefill" in a for a in old.assumptions)


def test_mistral_sliding_layers_keep_every_token_before_4_56_by_hand() -> None:
    # prompt 8,192 + 64 new: the last decode step's cache holds 8,255 tokens; 4.55: every layer all of them,
    # 32 x 8,255 x 4,096 = 1,081,999,360 B; 4.56: the 4,096-token window, 32 x 4,096 x 4,096 = 536,870,912 B
    g55 = GenerateCall.of(resolve(_doc("mistralai/Mistral-7B-v0.1", "4.55", 8192, 64)))
    g56 = GenerateCall.of(resolve(_doc("mistralai/Mistral-7B-v0.1", "4.56", 8192, 64)))
    assert g55.gen.sliding_cache == "all" and g56.gen.sliding_cache == "window"
    assert g55.cache(8255, prefill=False) == 32 * 8255 * MISTRAL_LAYER_TOKEN == 1_081_999_360
    assert g56.cache(8255, prefill=False) == 32 * 4096 * MISTRAL_LAYER_TOKEN == 536_870_912
    # growth at that step: 4.55's torch.cat of one layer's keys, 8,255 x 4,096 / 2 = 16,906,240 B; 4.56's
    # DynamicSlidingWindowLayer keeps the old keys and values of min(8,254, 4,096) tokens: 4,096 x 4,096 = 16,777,216
    assert cache_growth_bytes(g55, 8255) == 8255 * MISTRAL_LAYER_TOKEN // 2 == 16_906_240
    assert cache_growth_bytes(g56, 8255) == 4096 * MISTRAL_LAYER_TOKEN == 16_777_216
    e55 = estimate(resolve(_doc("mistralai/Mistral-7B-v0.1", "4.55", 8192, 64)))
    e56 = estimate(resolve(_doc("mistralai/Mistral-7B-v0.1", "4.56", 8192, 64)))
    assert any("before 4.56 a sliding-window layer keeps every token" in a for a in e55.assumptions)
    assert not any("before 4.56 a sliding-window layer keeps every token" in a for a in e56.assumptions)


def test_models_without_sliding_layers_are_unchanged() -> None:
    # Llama 3 has no sliding layer: the release's sliding_cache does not change its cache
    a = GenerateCall.of(resolve(_doc("meta-llama/Meta-Llama-3-8B", "4.50", 1024, 64)))
    b = GenerateCall.of(resolve(_doc("meta-llama/Meta-Llama-3-8B", "4.56", 1024, 64)))
    assert a.cache(1087, prefill=False) == b.cache(1087, prefill=False)


def test_cohere2_config_default_hybrid_cache_before_4_53() -> None:
    # Cohere2Config defaulted cache_implementation "hybrid" through 4.52; from 4.53 the checkpoint decides (not read)
    doc = _doc("CohereForAI/c4ai-command-r7b-12-2024", "4.50", 8192, 64)
    assert GenerateCall.of(resolve(doc)).gen.sliding_cache == "static"
    doc["software"] = {"transformers": "4.53"}
    assert GenerateCall.of(resolve(doc)).gen.sliding_cache == "all"


def test_cohere2_4_53_to_4_55_states_the_dynamic_cache_it_assumes() -> None:
    # from 4.53 Cohere2's config class no longer names the HybridCache: the checkpoint's generation_config.json would
    # decide, which is not read, so the report says the DynamicCache is assumed; 4.50 (the config's own default) and
    # 4.56 (generate no longer honours "hybrid") need no such assumption, nor does Mistral (no HybridCache ever)
    def says(model: str, release: str) -> bool:
        rep = estimate(_doc(model, release, 1024, 16))
        return any("would run a HybridCache" in a for a in rep.assumptions)

    cohere = "CohereForAI/c4ai-command-r7b-12-2024"
    assert [says(cohere, v) for v in ("4.50", "4.53", "4.55", "4.56")] == [False, True, True, False]
    assert not says("mistralai/Mistral-7B-v0.1", "4.53")
