"""Hugging Face generate: prefill vs decode terms, each with its arithmetic, and the solvers."""

from __future__ import annotations

from typing import Any

from vramplan.analytic.inference import (
    SAMPLING_BYTES_PER_ENTRY,
    GenerateBehaviour,
    GenerateCall,
    cache_bytes,
    call_terms,
    decode_moment,
    generate_behaviour,
    inference_step,
    logits_bytes,
)
from vramplan.catalog import load_model
from vramplan.catalog.models import list_models
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.plan.solvers import max_batch_size, max_prompt_len


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
    llama, gpt2 = load_model("meta-llama/Llama-2-7b-hf").traits, load_model("gpt2").traits
    # (before 4.56 a sliding layer's DynamicCache kept every token, "all": no sliding layer here, so no effect)
    assert generate_behaviour(llama, (4, 41, 2)) == GenerateBehaviour(True, True, True, True, "all")
    assert generate_behaviour(llama, (4, 42)) == GenerateBehaviour(False, False, True, True, "all")
    assert generate_behaviour(llama, (4, 45)) == GenerateBehaviour(False, False, False, False, "all")
    assert generate_behaviour(llama, (4, 56)) == GenerateBehaviour(False, False, False, False, "window")
    # GPT-2 kept the legacy tuple until 4.52 and never upcast its logits
    assert generate_behaviour(gpt2, (4, 51)) == GenerateBehaviour(True, False, False, False, "all")
    assert not generate_behaviour(gpt2, (4, 52)).legacy_cache
    assert generate_behaviour(gpt2, None) == GenerateBehaviour(False, False, False, False)


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


def test_the_shared_terms_are_computed_once_and_placed_by_the_moments() -> None:
    # the setting above (transformers 4.32, Llama-2-13B fp16, batch 16, 512 + 512 tokens), term by term
    doc = {"model": "meta-llama/Llama-2-13b-hf", "task": "inference", "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 16, "prompt_len": 512, "new_tokens": 512, "dtype": "fp16"},
           "software": {"transformers": "4.32"}}
    g = GenerateCall.of(resolve(doc))
    t = call_terms(g)
    # every prompt position's logits: 16 * 512 * 32,000 = 262,144,000 entries, (2 + 4) B at the fp32 upcast,
    # then the fp32 copy alone (4 B) in the outputs generate keeps
    assert (t.prompt_logits_peak, t.prompt_logits_kept) == (262_144_000 * 6, 262_144_000 * 4)
    # the cache after the prompt (512 tokens) and at the last decode step (1,023), 819,200 B per token
    assert (t.kv_prompt, t.kv_final) == (16 * 512 * 819_200, 16 * 1023 * 819_200)
    # 4.32's per-layer rotary buffers (analytic/hf_buffers.py): 40 layers x (2 x 4,096 x 128 x 2 + 64 x 4)
    assert t.hf_rope == 40 * (2 * 4096 * 128 * 2 + 64 * 4) == 83_896_320
    # the last decode step: weights and buffers, the cache, the previous step's tuple (1,022 tokens), logits, cuBLAS
    mo = decode_moment(g, t, "decode", 1023, 0)
    assert mo.total == (t.weights + t.hf_rope + 16 * 1023 * 819_200 + 16 * 1022 * 819_200 + t.logits
                        + t.cublas)
    assert mo.parts == next(m for m in inference_step(resolve(doc)).moments if m.phase == "decode").parts


def test_a_family_without_sdpa_runs_eager_attention() -> None:
    # gpt-oss's transformers class sets _supports_sdpa = False: the default sdpa falls back to eager (its config
    # without the MXFP4 quantization_config, which inference refuses: test_checkpoint_quant.py)
    cfg = {k: v for k, v in list_models("openai/gpt-oss-20b")[0].config.items() if k != "quantization_config"}
    assert GenerateCall.of(resolve(_doc(model=cfg, attention="sdpa"))).attention == "eager"
    assert GenerateCall.of(resolve(_doc(attention="sdpa"))).attention == "sdpa"


# ---- Lit-GPT (framework: lightning) --------------------------------------------------------------------


def _lit(model: str = "meta-llama/Llama-2-7b-hf", quantization: str = "nf4", **inf: Any) -> dict[str, Any]:
    doc = _doc(model=model, gpu="A100-40GB", batch_size=1, prompt_len=8, new_tokens=50,
               quantization=quantization, **inf)
    doc["framework"] = "lightning"
    return doc


def test_litgpt_quantizes_its_lm_head_and_dequantizes_it_from_fp16() -> None:
    lit = inference_step(resolve(_lit()))
    hf = inference_step(resolve(_doc(model="meta-llama/Llama-2-7b-hf", gpu="A100-40GB", batch_size=1,
                                     prompt_len=8, new_tokens=50, quantization="nf4")))
    pre_l = next(m for m in lit.moments if m.phase == "prefill")
    pre_h = next(m for m in hf.moments if m.phase == "prefill")
    # the head (32,000 x 4,096 = 131,072,000 weights) is nf4 under Lightning: 131,072,000 / 2 = 65,536,000 B
    # payload + 131,072,000 / 64 x 4 = 8,192,000 B absmax = 73,728,000 B instead of 262,144,000 B in bf16
    assert _part(pre_l, "weights", "parameters") - _part(pre_h, "weights", "parameters") == 73_728_000 - 262_144_000
    # the prompt's forward dequantizes the head, the largest 4-bit linear: fp16 (quantized from
    # .to(torch.half)) and its bf16 copy for the compute dtype, 131,072,000 x (2 + 2) = 524,288,000 B;
    # transformers dequantizes its largest MLP weight once, 11,008 x 4,096 x 2 = 90,177,536 B
    assert _part(pre_l, "temporaries", "dequantized weight") == 524_288_000
    assert _part(pre_h, "temporaries", "dequantized weight") == 90_177_536
    # KV cache preallocated for 8 + 50 positions: 32 layers x 2 x 32 heads x 58 x 128 x 2 B = 30,408,704 B,
    # the same in prefill and decode, and no torch.cat growth
    dec_l = next(m for m in lit.moments if m.phase == "decode")
    assert _part(pre_l, "kv_cache", "prompt") == _part(dec_l, "kv_cache", "all tokens") == 30_408_704
    assert _part(dec_l, "temporaries", "cache growth (torch.cat of one layer)") == 0


def test_litgpt_caches_grouped_kv_heads_expanded() -> None:
    # Llama-2-70B: 8 KV groups, but Lit-GPT's KVCache holds all 64 heads: 80 x 2 x 64 x 58 x 128 x 2 B
    ir = inference_step(resolve(_lit(model="meta-llama/Llama-2-70b-hf", quantization="nf4-dq")))
    assert ir.prompt_cache_bytes == ir.final_cache_bytes == 152_043_520


def test_litgpt_holds_a_head_of_its_own_for_tied_checkpoints() -> None:
    # Falcon-40B ties its head to the 65,024 x 8,192 embedding in transformers; Lit-GPT adds an nn.Linear
    # of 532,676,608 weights, nf4 under Lightning: 266,338,304 + 8,323,072 x 4 = 299,630,592 B
    lit = inference_step(resolve(_lit(model="tiiuae/falcon-40b")))
    hf = inference_step(resolve(_doc(model="tiiuae/falcon-40b", gpu="A100-40GB", batch_size=1, prompt_len=8,
                                     new_tokens=50, quantization="nf4")))
    w_l = _part(lit.peak, "weights", "parameters")
    w_h = _part(hf.peak, "weights", "parameters")
    assert w_l - w_h == 299_630_592
    # unquantized, the extra head is bf16: 532,676,608 x 2 = 1,065,353,216 B
    lit16 = inference_step(resolve(_lit(model="tiiuae/falcon-40b", quantization="none")))
    hf16 = inference_step(resolve(_doc(model="tiiuae/falcon-40b", gpu="A100-40GB", batch_size=1, prompt_len=8,
                                       new_tokens=50)))
    assert _part(lit16.peak, "weights", "parameters") - _part(hf16.peak, "weights", "parameters") == 1_065_353_216


def test_bnb_dequant_bytes_by_quantization_dtype() -> None:
    from vramplan.analytic.inference import bnb_compute_dtype, bnb_dequant_bytes

    n = 1_000_000
    # Lightning quantizes from fp16: a bf16 compute dtype adds a copy (2 + 2), fp32 (2 + 4), fp16 none (2)
    assert bnb_dequant_bytes(n, "nf4", "fp16", "bf16") == 4 * n
    assert bnb_dequant_bytes(n, "nf4-dq", "fp16", "fp32") == 6 * n
    assert bnb_dequant_bytes(n, "fp4", "fp16", "fp16") == 2 * n
    # transformers quantizes from the load dtype, usually the compute dtype: one tensor
    assert bnb_dequant_bytes(n, "nf4", "bf16", "bf16") == 2 * n
    assert bnb_dequant_bytes(n, "int8", "fp16", "fp32") == 2 * n  # 8-bit: one copy whatever the compute dtype
    # set_compute_type: a bf16/fp32 model computes in its own dtype, an fp16 one in the configured dtype
    assert bnb_compute_dtype("fp16", "fp32") == "fp32"
    assert bnb_compute_dtype("bf16", "fp32") == "bf16"
    assert bnb_compute_dtype("fp32", "fp16") == "fp32"
    assert bnb_compute_dtype("fp16", None) == "fp16"


def test_fp16_model_under_fp32_compute_dtype_dequantizes_twice() -> None:
    # bigcode/octocoder, fp4, fp16 weights, transformers' default bnb_4bit_compute_dtype fp32: the largest
    # 4-bit linear (c_fc, 6,144 x 24,576 = 150,994,944 weights) is dequantized to fp16 and copied to fp32:
    # 150,994,944 x (2 + 4) = 905,969,664 B; with an fp16 compute dtype 150,994,944 x 2 = 301,989,888 B
    doc = _doc(model="bigcode/octocoder", gpu="A100-40GB", batch_size=1, prompt_len=20, new_tokens=60,
               dtype="fp16", quantization="fp4", attention="eager")
    pre16 = next(m for m in inference_step(resolve(doc)).moments if m.phase == "prefill")
    doc["inference"]["bnb_compute_dtype"] = "fp32"
    pre32 = next(m for m in inference_step(resolve(doc)).moments if m.phase == "prefill")
    assert _part(pre16, "temporaries", "dequantized weight") == 301_989_888
    assert _part(pre32, "temporaries", "dequantized weight") == 905_969_664
