"""framework: autoawq, AutoAWQ's fused-module inference (analytic/autoawq.py), against hand-computed oracles.

Shapes: Llama-2-7B h 4096, 32 layers, 32 heads, 32 KV heads, d 128, I 11008, V 32000, max_position_embeddings 4096;
Mistral-7B-v0.1 the same but 8 KV heads, I 14336, max_position_embeddings 32768.

AWQ 4-bit weights (facts/quantization.py awq-4bit, group 128): per linear weight 1/2 B (qweight) + 2/128 B (fp16
scales) + 0.5/128 B (packed zeros) = 66.5/128 B.  Llama-2-7B linears 32 x (4 x 4096^2 + 3 x 4096 x 11008) =
6,476,005,376 -> 3,364,487,168 B, plus embeddings, head and norms 262,410,240 x 2 B: W = 3,889,307,648 B.
Mistral-7B linears 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) = 6,979,321,856 -> 3,625,975,808 B,
W = 4,150,796,288 B.  cuBLAS workspace on an A100: 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

W_LLAMA = 3_889_307_648
W_MISTRAL = 4_150_796_288
CUBLAS = 8_519_680


def _doc(model: str, release: str | None, **inference: Any) -> dict[str, Any]:
    awq = inference.pop("autoawq", {})
    doc: dict[str, Any] = {"model": model, "task": "inference", "framework": "autoawq",
                           "hardware": {"gpu": "a100-80gb"},
                           "inference": {"quantization": "awq-4bit", **inference, "autoawq": awq}}
    if release is not None:
        doc["software"] = {"autoawq": release}
    return doc


def _phase(doc: dict[str, Any], phase: str) -> int:
    return estimate(doc).per_gpu.phases[phase]


def test_llama2_7b_016_peak_is_the_fusing() -> None:
    # 0.1.6, batch 1, prompt 512 + 512 new, window 1024 (max_new_tokens=1024)
    # window cache: 32 layers x (K + V) x 1 x 32 heads x 1024 x 128 x 2 B = 536,870,912
    # RoPE tables: 32 x 2 x 1024 x 64 x 8 B (complex64) = 33,554,432
    resident = W_LLAMA + 536_870_912 + 33_554_432  # 4,459,732,992
    # load: every layer's fused q/k/v (4096 x 12288 x 66.5/128 = 26,148,864 B) beside the originals: 836,763,648;
    # the last layer's K made in fp32: 2 x one K (8,388,608 B in fp16) less its not-yet-built RoPE table
    # (1,048,576) = 15,728,640, more than its fuse_qkv (25,165,824 qweight - 16,777,216 - 1,048,576)
    load = resident + 836_763_648 + 15_728_640
    # prefill attention at the softmax, t = 512 tokens: bound (2h + q+2k + q+k + k + 2q) = 40,960 x 512 x 2 =
    # 41,943,040; scores 32 x 512^2 x 10 B = 83,886,080; the [1,1,512,512] fp16 mask 524,288; ids 512 x 8 = 4,096
    prefill = resident + 41_943_040 + 83_886_080 + 524_288 + 4_096 + CUBLAS
    doc = _doc("llama-2-7b", "0.1.6", prompt_len=512, new_tokens=512, autoawq={"max_seq_len": 1024})
    rep = estimate(doc)
    assert rep.per_gpu.phases["load"] == load == 5_312_225_280
    assert rep.per_gpu.phases["prefill"] == prefill == 4_594_610_176
    assert rep.per_gpu.peak_allocated_bytes == load and rep.per_gpu.peak_phase == "load"
    # the first decode step: the prompt's fp32 logits kept by the caller (512 x 32000 x 4 = 65,536,000), the
    # step's head (32000 x (2 + 4) = 192,000); the forward loop keeps the caller's 512 ids
    assert rep.per_gpu.phases["decode (first step)"] == resident + 65_536_000 + 192_000 + 4_096 + CUBLAS
    # with the peak reset after loading, the prefill is the peak
    doc["inference"]["autoawq"]["load_in_peak"] = False
    assert estimate(doc).per_gpu.peak_allocated_bytes == prefill


def test_mistral_gqa_023_batch2_dequantizes_and_rolls() -> None:
    # 0.2.3 default window 2048 (from_quantized max_seq_len=2048), batch 2, prompt 1024, 1100 new tokens
    # cache: 32 x 2 x 2 x 8 KV heads x 2048 x 128 x 2 B = 536,870,912; RoPE: 32 x 8 x 2048 x 128 = 67,108,864
    resident = W_MISTRAL + 536_870_912 + 67_108_864
    # attention, t = 2048: bound (8192 + 6144 + 5120 + 1024 + 8192 = 28,672) x 2048 x 2 = 117,440,512; scores
    # 2 x 32 x 1024^2 x 10 = 671,088,640 (K and V repeated to 32 heads are in the bound's 2q)
    attention = 117_440_512 + 671_088_640
    # MLP (transformers' LlamaMLP, b x p = 2048 >= 1024 so WQLinear_GEMM dequantizes 4096 x 14336 x 2 B =
    # 117,440,512): bound 24,576 x 2048 x 2 = 100,663,296 plus at up_proj 2 x 14336 x 2048 x 2 + 117,440,512
    # = 234,881,024: 335,544,320, below the attention
    mask, ids = 1024 * 1024 * 2, 2 * 1024 * 8
    assert _phase(_doc("mistral-7b", "0.2.3", batch_size=2, prompt_len=1024, new_tokens=1100), "prefill") == (
        resident + attention + mask + ids + CUBLAS)
    # decode: p + n - 1 = 2123 > 2048, so step 1025 rolls the window: one layer's K, 2 x 8 x 2048 x 128 x 2 =
    # 8,388,608, beside the previous step's fp32 logits (2 x 32000 x 4 = 256,000), before its forward
    roll = resident + 8_388_608 + 256_000 + ids + CUBLAS
    last = resident + 256_000 + 2 * 32000 * 6 + ids + CUBLAS  # the last step's head, 384,000
    assert _phase(_doc("mistral-7b", "0.2.3", batch_size=2, prompt_len=1024, new_tokens=1100), "decode") == max(roll, last)


def test_window_defaults_follow_the_release() -> None:
    # 0.1.6: max_new_tokens=None takes Mistral's max_position_embeddings, 32,768 positions:
    # cache 32 x 2 x 8 x 32768 x 128 x 2 = 4,294,967,296; RoPE 32 x 8 x 32768 x 128 = 1,073,741,824
    old = estimate(_doc("mistral-7b", "0.1.6", prompt_len=16, new_tokens=2)).per_gpu.breakdown_detail
    assert old["kv_cache"]["fused window cache (AutoAWQ)"] == 4_294_967_296
    assert old["weights"]["fused RoPE tables (AutoAWQ)"] == 1_073_741_824
    # 0.2.3 (and no release named): max_seq_len=2048, 268,435,456 and 67,108,864
    for release in ("0.2.3", None):
        new = estimate(_doc("mistral-7b", release, prompt_len=16, new_tokens=2)).per_gpu.breakdown_detail
        assert new["kv_cache"]["fused window cache (AutoAWQ)"] == 268_435_456
        assert new["weights"]["fused RoPE tables (AutoAWQ)"] == 67_108_864


def test_warmup_only_when_asked() -> None:
    # prompt 8 + 8 new, window 16, no load phase: the warm-up's two 4096 x 4096 fp32 tensors (134,217,728 B) are the
    # peak; cache 32 x 2 x 32 x 16 x 128 x 2 = 8,388,608, RoPE 32 x 8 x 16 x 128 = 524,288, ids 8 x 8 = 64
    awq = {"max_seq_len": 16, "load_in_peak": False, "warmup_matmul": True}
    rep = estimate(_doc("llama-2-7b", "0.2.0", prompt_len=8, new_tokens=8, autoawq=awq))
    assert rep.per_gpu.peak_phase == "warm-up"
    assert rep.per_gpu.peak_allocated_bytes == W_LLAMA + 8_388_608 + 524_288 + 64 + 134_217_728 + CUBLAS
    awq["warmup_matmul"] = False
    assert "warm-up" not in estimate(_doc("llama-2-7b", "0.2.0", prompt_len=8, new_tokens=8, autoawq=awq)).per_gpu.phases


def test_generate_loop_adds_sampling_and_grown_ids() -> None:
    # model.generate: the warpers' 26 B per vocabulary entry on the last row (32000 x 26 = 832,000) and
    # generate's input_ids grown to p + n - 1 = 15 tokens (15 x 8 = 120) at the last step, vs the forward loop's 8 x 8
    base = {"max_seq_len": 16, "load_in_peak": False}
    fwd = _phase(_doc("llama-2-7b", "0.2.0", prompt_len=8, new_tokens=8, autoawq=base), "decode")
    gen = _phase(_doc("llama-2-7b", "0.2.0", prompt_len=8, new_tokens=8, autoawq={**base, "loop": "generate"}), "decode")
    assert gen - fwd == 832_000 + 120 - 64


@pytest.mark.parametrize(("change", "where"), [
    ({"inference": {"prompt_len": 3000}}, "inference.prompt_len"),        # beyond the 2048 window
    ({"inference": {"quantization": "none"}}, "inference.quantization"),
    ({"software": {"autoawq": "0.2.4"}}, "software.autoawq"),             # not read
    ({"task": "train"}, "framework"),
    ({"inference": {"autoawq": {"fuse_layers": False}}}, "inference.autoawq.fuse_layers"),
    ({"inference": {"dtype": "fp32"}}, "inference.dtype"),
    ({"model": "mixtral-8x7b"}, "model"),
    ({"hardware": {"gpu": "a100-80gb", "num_gpus": 2}}, "hardware.num_gpus"),
    ({"inference": {"attention": "eager"}}, "inference.attention"),          # the fused attention is its own
    ({"parallel": {"zero_stage": 3}}, "parallel.zero_stage"),                # no sharding is read by the fused path
])
def test_refusals(change: dict[str, Any], where: str) -> None:
    doc = _doc("mistral-7b", None, prompt_len=512, new_tokens=64)
    for key, value in change.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc.get(key), dict) else value
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert where in [p.where for p in exc.value.problems]


def test_autoawq_keys_without_the_framework_are_refused() -> None:
    doc = {"model": "llama-2-7b", "task": "inference", "hardware": {"gpu": "a100-80gb"},
           "inference": {"quantization": "awq-4bit", "autoawq": {"max_seq_len": 4096}}}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "inference.autoawq.max_seq_len" in [p.where for p in exc.value.problems]


def test_other_frameworks_unchanged_by_the_section() -> None:
    # the section's defaults change nothing for transformers' generate (the same scenario with and without it)
    plain = {"model": "llama-2-7b", "task": "inference", "hardware": {"gpu": "a100-80gb"},
             "inference": {"quantization": "awq-4bit"}}
    with_defaults = {**plain, "inference": {"quantization": "awq-4bit", "autoawq": {"loop": "forward"}}}
    assert estimate(plain).per_gpu == estimate(with_defaults).per_gpu


def test_traced_engine_refuses() -> None:
    from vramplan.trace.engine import trace

    with pytest.raises(ScenarioError) as exc:
        trace(_doc("llama-2-7b", None, prompt_len=64, new_tokens=8))
    assert exc.value.problems[0].where == "framework"


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=64, max_value=4096), st.integers(min_value=1, max_value=512))
def test_peak_grows_with_the_window(window: int, extra: int) -> None:
    # every resident term (cache, RoPE tables) and the roll grow with the window; nothing shrinks
    small = estimate(_doc("mistral-7b", "0.1.8", prompt_len=64, new_tokens=64, autoawq={"max_seq_len": window}))
    big = estimate(_doc("mistral-7b", "0.1.8", prompt_len=64, new_tokens=64,
                        autoawq={"max_seq_len": window + extra}))
    assert big.per_gpu.peak_allocated_bytes > small.per_gpu.peak_allocated_bytes


def test_rotary_caches_on_the_gpu_while_fusing_from_017() -> None:
    # 0.1.7+ dispatch the transformers model (buffers included) before fusing: every old attention's fp16 cos/sin
    # caches [4096, 128] and fp32 inv_freq [64] are on the GPU: 32 x (2 x 4096 x 128 x 2 + 64 x 4) = 67,117,056 B;
    # 0.1.6 fuses before dispatch_model (its load phase is the first test's)
    doc = _doc("llama-2-7b", "0.1.8", prompt_len=512, new_tokens=512, autoawq={"max_seq_len": 1024})
    assert _phase(doc, "load") == 5_312_225_280 + 67_117_056


def test_issue_276_rows_within_two_percent() -> None:
    # AutoAWQ issue 276 (validation/published.yaml, source autoawq-issue-276-benchmark): benchmark.py, Llama-2-7b GEMM on
    # an A100-80GB, 4.55 GiB at 32 + 32 tokens (the fusing peak), 62.33 GiB at batch 8, 4096 + 4096 (the scores)
    awq = {"max_seq_len": 32, "warmup_matmul": True}
    small = estimate(_doc("llama-2-7b", "0.1.8", prompt_len=32, new_tokens=32, autoawq=awq)).per_gpu
    assert small.peak_phase == "load" and abs(small.peak_allocated_bytes / (4.55 * 2**30) - 1) < 0.02
    awq = {"max_seq_len": 4096, "warmup_matmul": True}
    big = estimate(_doc("llama-2-7b", "0.1.8", batch_size=8, prompt_len=4096, new_tokens=4096, autoawq=awq)).per_gpu
    assert big.peak_phase == "prefill" and abs(big.peak_allocated_bytes / (62.33 * 2**30) - 1) < 0.02


def test_transformers_438_llama_causal_mask_buffer() -> None:
    # transformers 4.38.2 LlamaModel registers causal_mask [4096, 4096] bool: 16,777,216 B more while fusing; 4.37 none
    base = {"prompt_len": 512, "new_tokens": 512, "autoawq": {"max_seq_len": 1024}}
    doc = _doc("llama-2-7b", "0.2.3", **base)
    plain = _phase(doc, "load")
    doc["software"]["transformers"] = "4.38.2"
    assert _phase(doc, "load") - plain == 16_777_216
    doc["software"]["transformers"] = "4.37.2"
    assert _phase(doc, "load") == plain


def test_longest_prompt_stops_at_the_window() -> None:
    # plan/solvers.max_prompt_len: at batch 1 Llama-2-7B fits an RTX 4090 up to the 2048 window (0.2.3's default),
    # which a longer prompt cannot be written into; the solver answers the window, not an error
    from vramplan.catalog.resolve import resolve
    from vramplan.plan.solvers import max_prompt_len

    r = resolve(_doc("llama-2-7b", None, prompt_len=512, new_tokens=512) | {"hardware": {"gpu": "rtx-4090"}})
    assert max_prompt_len(r) == 2048


def test_short_prompt_running_layer_is_rope() -> None:
    # 0.2.0 (transformers' LlamaMLP, no dequantization below 1024 tokens), Llama-2-7B, 64 tokens, per token in bytes:
    # softmax 40,960 x 2 + 32 x 64 x 10 = 102,400; o_proj 81,920 + 32 x 64 x 2 + 12,288 x 2 = 110,592;
    # MLP (5h + q) x 2 + 3I x 2 = 49,152 + 66,048 = 115,200; RoPE (2h + q + 2k) x 2 + max(16h, 20h, 20h) =
    # 40,960 + 81,920 = 122,880, the largest: 122,880 x 64 = 7,864,320, plus the 64 x 64 fp16 mask 8,192
    from vramplan.analytic.autoawq import AwqCall, prefill_moments
    from vramplan.catalog.resolve import resolve

    a = AwqCall.of(resolve(_doc("llama-2-7b", "0.2.0", prompt_len=64, new_tokens=8, autoawq={"max_seq_len": 128})))
    assert prefill_moments(a)[0].parts["activations"]["running layer"] == 7_864_320 + 8_192


def test_solvers_take_an_autoawq_scenario() -> None:
    # the solvers re-read their own documents (every field dumped, inference.dtype at its default bf16): the dtype
    # check compares values, so a scenario that never named a dtype is not refused for "bf16" there
    from vramplan.plan.solvers import solve_max_batch

    doc = _doc("mistralai/Mistral-7B-v0.1", "0.2.3", batch_size=1, prompt_len=2048, new_tokens=2048,
               autoawq={"max_seq_len": 2048})
    r = solve_max_batch(doc)
    assert r.value is not None and r.value > 1
    with pytest.raises(ScenarioError, match="inference.dtype"):
        resolve({**doc, "inference": {**doc["inference"], "dtype": "fp32"}})
    # bf16 (the schema's default, which a saved document carries) is stated as not read
    assert any("inference.dtype bf16 is not read" in a for a in estimate(doc).assumptions)
