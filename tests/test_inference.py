"""Hugging Face generate: prefill vs decode terms, each with its arithmetic, and the solvers."""

from __future__ import annotations

from typing import Any

from vramplan.analytic.engine import estimate
from vramplan.analytic.inference import (
    SAMPLING_BYTES_PER_ENTRY,
    cache_bytes,
    inference_step,
    logits_bytes,
    max_batch_size,
    max_prompt_len,
)
from vramplan.spec.load import resolve


def _doc(model: str = "meta-llama/Meta-Llama-3-8B", gpu: str = "A100-80GB", **inf: Any) -> dict[str, Any]:
    base = {"batch_size": 8, "prompt_len": 1024, "new_tokens": 512, "dtype": "bf16"}
    base.update(inf)
    return {"model": model, "task": "inference", "hardware": {"gpu": gpu}, "inference": base}


def _part(moment: Any, part: str, sub: str) -> int:
    return int(moment.parts.get(part, {}).get(sub, 0))


def test_decode_peak_terms_llama3_8b() -> None:
    r = resolve(_doc())
    ir = inference_step(r)
    dec = next(m for m in ir.moments if m.phase == "decode")
    # cache: 8 sequences * (1024 + 512) tokens * 131,072 B = 1,610,612,736 B
    assert _part(dec, "kv_cache", "all tokens") == 8 * 1536 * 131_072 == 1_610_612_736
    # torch.cat growth: one layer's keys at full length coexist with the old ones: 8 * 1536 * 4096 / 2 * ... =
    # 8 sequences * 1536 tokens * (8 heads * 128 * 2 B) = 25,165,824 B
    assert _part(dec, "temporaries", "cache growth (torch.cat of one layer)") == 8 * 1536 * 8 * 128 * 2
    # last-token logits only (logits_to_keep=1): 8 * 128,256 * (2 B + 4 B fp32 copy + 26 B sampling)
    assert _part(dec, "temporaries", "last-token logits and sampling") == 8 * 128_256 * (2 + 4 + 26)
    assert logits_bytes(r.model, 8, 2, 1) == 8 * 128_256 * (6 + SAMPLING_BYTES_PER_ENTRY)


def test_prefill_mlp_transient_llama3_8b() -> None:
    # running layer at prefill: the layer input, the residual after attention, the normed input and the
    # gated MLP's three I-sized tensors: (3h + 3I) * tokens * 2 B = (12,288 + 43,008) * 8192 * 2 = 905,969,664 B
    ir = inference_step(resolve(_doc()))
    pre = next(m for m in ir.moments if m.phase == "prefill")
    assert _part(pre, "activations", "running layer") == (3 * 4096 + 3 * 14336) * 8 * 1024 * 2 == 905_969_664
    # inputs_embeds, bound in LlamaModel.forward for the whole layer loop: 8 * 1024 * 4096 * 2 = 67,108,864 B
    assert _part(pre, "activations", "inputs_embeds (kept by the decoder's forward)") == 67_108_864
    # RoPE cos and sin, batch 1 (position_ids from cache_position): 2 * 1024 * 128 * 2 = 524,288 B
    assert _part(pre, "activations", "RoPE cos/sin") == 524_288
    assert _part(pre, "kv_cache", "prompt") == 8 * 1024 * 131_072


def test_eager_attention_materialises_the_scores() -> None:
    sdpa = inference_step(resolve(_doc(batch_size=1, prompt_len=8192, new_tokens=1, attention="sdpa")))
    eager = inference_step(resolve(_doc(batch_size=1, prompt_len=8192, new_tokens=1, attention="eager")))
    pre_s = next(m for m in sdpa.moments if m.phase == "prefill").total
    pre_e = next(m for m in eager.moments if m.phase == "prefill").total
    # scores 32 heads * 8192^2 * (2 + 4 + 4) B (masked bf16 scores, ATen's fp32 copy, fp32 softmax) = 21.5 GB
    # replace the MLP's (3h + 3I) * 8192 * 2 B as the running layer's peak
    assert pre_e - pre_s >= 32 * 8192 * 8192 * 10 - (3 * 4096 + 3 * 14336) * 8192 * 2
    assert eager.peak.phase == "prefill"


def test_sliding_window_prefill_holds_the_whole_prompt() -> None:
    # Mistral-7B (window 4096): DynamicSlidingWindowLayer keeps a view of the concatenated prompt until the
    # first decode step, so prefill holds 8192 tokens and decode only the window
    m = resolve(_doc(model="mistralai/Mistral-7B-v0.1")).model
    assert cache_bytes(m, 1, 8192, 2, 1, "auto", prefill=True) == 8192 * 131_072
    assert cache_bytes(m, 1, 8192, 2, 1, "auto", prefill=False) == 4096 * 131_072


def test_solvers_find_the_edge() -> None:
    r = resolve(_doc(gpu="L4", prompt_len=2048, new_tokens=256))
    b = max_batch_size(r)
    assert b > 0
    assert estimate(_doc(gpu="L4", prompt_len=2048, new_tokens=256, batch_size=b)).fits
    assert not estimate(_doc(gpu="L4", prompt_len=2048, new_tokens=256, batch_size=b + 1)).fits
    r = resolve(_doc(gpu="L4", batch_size=4, new_tokens=256))
    p = max_prompt_len(r)
    assert 0 < p < 8192 - 256
    assert estimate(_doc(gpu="L4", batch_size=4, new_tokens=256, prompt_len=p)).fits
    assert not estimate(_doc(gpu="L4", batch_size=4, new_tokens=256, prompt_len=p + 1)).fits


def test_solvers_report_zero_when_nothing_fits() -> None:
    r = resolve(_doc(model="meta-llama/Llama-3.1-70B", gpu="L4"))
    assert max_batch_size(r) == 0 and max_prompt_len(r) == 0


def test_decode_peak_grows_with_new_tokens() -> None:
    # both peaks in decode: 3072 more tokens for 8 sequences at 131,072 B, plus the larger torch.cat copy
    small = inference_step(resolve(_doc(new_tokens=1024))).peak
    large = inference_step(resolve(_doc(new_tokens=4096))).peak
    assert small.phase == large.phase == "decode"
    assert large.total - small.total == 8 * 3072 * 131_072 + 8 * 3072 * 8 * 128 * 2


def _legacy_doc(transformers: str | None, **inf: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"batch_size": 16, "prompt_len": 256, "new_tokens": 512, "dtype": "fp16",
                            "attention": "eager"}
    base.update(inf)
    doc = _doc(model="meta-llama/Llama-2-7b-hf", **base)
    if transformers is not None:
        doc["software"] = {"transformers": transformers}
    return doc


def test_legacy_tuple_cache_keeps_the_previous_step_alive() -> None:
    # transformers 4.34: generate holds the previous step's tuple past_key_values until the forward returns.
    # Llama-2-7B fp16 KV per token: 32 layers x 2 x 4096 x 2 B = 524,288 B.  Cache at the last decode step:
    # 16 x (256 + 512) x 524,288 = 6,442,450,944 B (the engine's p + n convention); the previous one, read by the
    # last of the 511 decode forwards: 16 x (256 + 512 - 2) x 524,288 = 6,425,673,728 B
    dec = next(m for m in inference_step(resolve(_legacy_doc("4.34.1"))).moments if m.phase == "decode")
    assert _part(dec, "kv_cache", "all tokens") == 16 * 768 * 524_288 == 6_442_450_944
    assert _part(dec, "kv_cache", "previous step's cache (tuple past_key_values kept by generate)") \
        == 16 * 766 * 524_288 == 6_425_673_728
    assert _part(dec, "temporaries", "cache growth (torch.cat of one layer)") == 0
    # weights 13,476,831,232 + both caches 12,868,124,672 + logits 16 x 32,000 x (2 + 4 + 26) = 16,384,000
    # -> 26,361,339,904 B; optimum-benchmark read 26,441 MB (validation entry optimum-bench-llama2-7b-fp16-gen-bs16-...)
    assert dec.total == 13_476_831_232 + 6_442_450_944 + 6_425_673_728 + 16_384_000 + _part(dec, "other", "cuBLAS workspace")


def test_legacy_prefill_upcasts_the_logits_of_every_position() -> None:
    # 4.34's LlamaForCausalLM: lm_head on all 16 x 256 positions (fp16), then .float(): 16 x 256 x 32,000 x (2 + 4)
    # = 786,432,000 B, against the running eager layer's few hundred MB
    pre = next(m for m in inference_step(resolve(_legacy_doc("4.34.1"))).moments if m.phase == "prefill")
    assert _part(pre, "temporaries", "logits of every prompt position and their fp32 copy") == 786_432_000
    assert _part(pre, "activations", "final hidden states") == 16 * 256 * 4096 * 2


def test_legacy_cache_only_before_4_36_and_only_with_decode_steps() -> None:
    # 4.36 (the Cache classes) and an unset version keep the DynamicCache model: one layer's growth, no previous cache
    for version in (None, "4.36.0", "4.46.0"):
        dec = next(m for m in inference_step(resolve(_legacy_doc(version))).moments if m.phase == "decode")
        assert _part(dec, "kv_cache", "previous step's cache (tuple past_key_values kept by generate)") == 0
        # one layer's keys at full length: 16 x 768 x 4096 x 2 B = 100,663,296 B
        assert _part(dec, "temporaries", "cache growth (torch.cat of one layer)") == 16 * 768 * 4096 * 2
    # one new token comes from the prefill alone: no decode forward, so no previous cache even on 4.34
    one = next(m for m in inference_step(resolve(_legacy_doc("4.34.1", new_tokens=1))).moments if m.phase == "decode")
    assert _part(one, "kv_cache", "previous step's cache (tuple past_key_values kept by generate)") == 0
    # the whole estimate: 4.34 needs more than the DynamicCache model by about the previous cache
    old = estimate(resolve(_legacy_doc("4.34.1"))).per_gpu.peak_allocated_bytes
    new = estimate(resolve(_legacy_doc(None))).per_gpu.peak_allocated_bytes
    assert old - new == 6_425_673_728 - 16 * 768 * 4096 * 2
