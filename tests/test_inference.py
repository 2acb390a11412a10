"""Hugging Face generate: prefill vs decode terms, each with its arithmetic, and the solvers."""

from __future__ import annotations

from typing import Any

from vramplan.analytic.engine import estimate
from vramplan.analytic.inference import (
    SAMPLING_BYTES_PER_ENTRY,
    GenerateBehaviour,
    cache_bytes,
    generate_behaviour,
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
    # cache: 512 new tokens take 511 decode steps after the prefill, so the last one ends with
    # 8 sequences * (1024 + 512 - 1) tokens * 131,072 B = 1,609,564,160 B
    assert _part(dec, "kv_cache", "all tokens") == 8 * 1535 * 131_072 == 1_609_564_160
    # torch.cat growth: one layer's keys at full length coexist with the old ones:
    # 8 sequences * 1535 tokens * (8 heads * 128 * 2 B) = 25,149,440 B
    assert _part(dec, "temporaries", "cache growth (torch.cat of one layer)") == 8 * 1535 * 8 * 128 * 2
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


def test_one_new_token_is_the_prefill_alone() -> None:
    # generate makes the first new token with the prefill's forward: no decode step runs
    ir = inference_step(resolve(_doc(new_tokens=1)))
    assert [m.phase for m in ir.moments] == ["prefill"]


def test_generate_behaviour_by_release() -> None:
    # Llama: DynamicCache from 4.42, logits of the last position only from 4.45
    assert generate_behaviour("llama", (4, 41, 2)) == GenerateBehaviour(True, True, True, True)
    assert generate_behaviour("llama", (4, 42)) == GenerateBehaviour(False, False, True, True)
    assert generate_behaviour("llama", (4, 45)) == GenerateBehaviour(False, False, False, False)
    # GPT-2 kept the legacy tuple until 4.52 and never upcast its logits
    assert generate_behaviour("gpt2", (4, 51)) == GenerateBehaviour(True, False, False, False)
    assert not generate_behaviour("gpt2", (4, 52)).legacy_cache
    assert generate_behaviour("gpt2", None) == GenerateBehaviour(False, False, False, False)


def test_legacy_cache_tuple_doubles_the_cache_llama2_13b() -> None:
    # optimum's GPTQ benchmark setting (transformers 4.32): Llama-2-13B fp16, batch 16, 512 + 512 tokens.
    # Cache per token: 40 layers * 2 * 5120 * 2 B = 819,200 B.  The last decode step ends with 1,023 tokens
    # and still holds the previous step's tuple of 1,022: 16 * (1023 + 1022) * 819,200 B = 26,804,224,000 B
    doc = {"model": "meta-llama/Llama-2-13b-hf", "task": "inference", "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 16, "prompt_len": 512, "new_tokens": 512, "dtype": "fp16",
                         "attention": "eager"},
           "software": {"transformers": "4.32"}}
    ir = inference_step(resolve(doc))
    dec = next(m for m in ir.moments if m.phase == "decode")
    assert _part(dec, "kv_cache", "all tokens") == 16 * 1023 * 819_200
    assert _part(dec, "kv_cache", "previous step's cache (legacy tuple)") == 16 * 1022 * 819_200
    assert sum(dec.parts["kv_cache"].values()) == 26_804_224_000
    # the prefill computed the logits of all 16 * 512 positions, fp16 then fp32 (Llama's logits.float()):
    # 16 * 512 * 32,000 * (2 + 4) B = 1,572,864,000 B at the upcast; the fp32 copy (1,048,576,000 B) lives
    # through the first decode step in the previous step's outputs
    pre = next(m for m in ir.moments if m.phase == "prefill")
    first = next(m for m in ir.moments if m.phase == "decode (first step)")
    assert _part(pre, "temporaries", "logits of every prompt position and their fp32 copy") == 1_572_864_000
    assert _part(first, "temporaries", "prompt logits (previous step's outputs)") == 1_048_576_000
    # the current release: one cache, growth of one layer only
    doc["software"] = {}
    now = next(m for m in inference_step(resolve(doc)).moments if m.phase == "decode")
    assert now.parts["kv_cache"] == {"all tokens": 16 * 1023 * 819_200}
