"""Hand-computed oracles from the seed articles (docs/reference-figures.md), each with its arithmetic."""

from __future__ import annotations

from vramplan.analytic.activations import ActContext, layer_saved_per_token
from vramplan.analytic.kv_cache import kv_bytes_per_token, kv_cache_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.optimizer import optimizer_cost
from vramplan.analytic.train import train_step
from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.catalog.models import load_model
from vramplan.catalog.resolve import resolve
from vramplan.units import GB, GiB

P7 = 6_738_415_616  # Llama-2-7b parameters


def test_sixteen_bytes_per_parameter_for_7b() -> None:
    # bf16-mixed AdamW, HF convention: fp32 weights 4 + fp32 grads 4 + two fp32 moments 8 = 16 B/param.
    # The seeds' round figure: 7e9 * 16 = 112 GB.
    assert 7 * 10**9 * 16 == 112 * GB
    r = resolve({"model": "llama-2-7b", "hardware": {"gpu": "A100-80GB"},
                 "train": {"optimizer": "adamw-fused", "micro_batch_size": 1, "seq_len": 16}})
    step = next(m for m in train_step(r).moments if m.phase == "optimizer")
    states = sum(sum(step.parts.get(k, {}).values()) for k in ("weights", "gradients", "optimizer_states"))
    assert states == 16 * P7  # 107,814,649,856 B


def test_foreach_adamw_adds_a_state_sized_temporary() -> None:
    # torch's foreach AdamW: exp_avg_sq_sqrt over the decay group, fp32 -> 4 B per decayed parameter.
    oc = optimizer_cost("adamw", trainable=1000, decay_group=900, param_bytes=4)
    assert (oc.state_bytes, oc.step_temporary_bytes) == (8000, 3600)
    assert optimizer_cost("adamw-fused", 1000, 900, 4).step_temporary_bytes == 0


def _model_states(zero: int, n: int = 8) -> int:
    r = resolve({"model": "llama-2-7b", "hardware": {"gpu": "A100-80GB", "num_gpus": n}, "framework": "deepspeed",
                 "train": {"micro_batch_size": 1, "seq_len": 16}, "parallel": {"zero_stage": zero}})
    step = next(m for m in train_step(r).moments if m.phase == "optimizer")
    # the paper's model states only: DeepSpeed's reduce bucket and ZeRO-3's persistent (small, gathered)
    # parameters are what it calls residual states, temporary buffers (sec. 3.2; analytic/terms/deepspeed.py)
    buffers = {K.DS_REDUCE_BUCKETS.label, K.DS_PERSISTENT.label}
    return sum(v for k in ("weights", "gradients", "optimizer_states", "master_weights")
               for label, v in step.parts.get(k, {}).items() if label not in buffers)


def test_zero_paper_formulas_7b_on_8_gpus() -> None:
    # ZeRO paper (arXiv 1910.02054) Fig. 1 with K = 12, Nd = 8:
    #   stage 1: 2P + 2P + 12P/8 = 5.5 P  (7e9 -> 38.5 GB)
    #   stage 2: 2P + 14P/8      = 3.75 P (7e9 -> 26.25 GB; the 40.25 GB in one seed uses 4P for weights: wrong)
    #   stage 3: 16P/8           = 2 P    (7e9 -> 14 GB)
    # P7 is divisible by 8, so the splits are exact.
    assert _model_states(1) == 2 * P7 + 2 * P7 + 12 * P7 // 8
    assert _model_states(2) == 2 * P7 + 14 * P7 // 8
    assert _model_states(3) == 16 * P7 // 8
    assert round(3.75 * 7e9 / GB, 2) == 26.25


def test_kv_cache_llama2_7b_seed_figure() -> None:
    # 2 (K,V) * 32 layers * 32 heads * 128 dims * 2 B = 524,288 B per token;
    # * 4096 tokens * 32 sequences = 68,719,476,736 B = 68.7 GB = 64 GiB.
    m = load_model("llama-2-7b")
    assert kv_bytes_per_token(m, 2) == 524_288
    total = kv_cache_bytes(m, batch=32, tokens=4096, elem_bytes=2)
    assert total == 68_719_476_736 and total == 64 * GiB


def test_kv_cache_llama3_8b_gqa_is_a_quarter() -> None:
    # 8 KV heads instead of 32: 2 * 32 * 8 * 128 * 2 = 131,072 B/token -> 17,179,869,184 B
    m = load_model("meta-llama/Meta-Llama-3-8B")
    assert kv_cache_bytes(m, 32, 4096, 2) * 4 == 68_719_476_736


def test_mla_bytes_per_token_deepseek_v3() -> None:
    # (kv_lora_rank 512 + rope 64) * 2 B = 1,152 B per layer and token; 61 layers -> 70,272 B
    m = load_model("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token(m, 2) == 61 * 1152 == 70_272


def test_int4_weights_7b() -> None:
    # 4-bit payload: 7e9 / 2 = 3.5 GB; NF4 absmax per 64 adds 7e9/64*4 = 0.4375 GB -> 3.9375 GB;
    # double quantization: 7e9/64 = 109,375,000 one-byte absmax + 427,247 fp32 constants
    #   (ceil(109,375,000 / 256) = 427,247) -> 3.5e9 + 109,375,000 + 1,708,988 = 3,611,083,988 B.
    n = 7 * 10**9
    assert n // 2 == 3_500_000_000
    assert quantized_linear_bytes(n, 1, "nf4") == 3_500_000_000 + 437_500_000
    assert quantized_linear_bytes(n, 1, "nf4-dq") == 3_611_083_988
    # GPTQ g128 (AutoGPTQ's layout, facts/quantization.py) on one 4096 x 4096 projection: 4-bit payload 8,388,608
    # + 32 groups x 4096 columns x (2 B scale + 0.5 B zero) = 262,144 + 65,536 + int32 g_idx per input 16,384
    # + fp16 bias per output 8,192 = 8,740,864 B (g_idx and bias are per matrix: a 7e9 "one-row" matrix would
    # not be a GPTQ layer)
    assert quantized_linear_bytes(4096 * 4096, 4096, "gptq-4bit") == 8_388_608 + 262_144 + 65_536 + 16_384 + 8_192


def test_activation_worked_example_llama2_7b() -> None:
    # See analytic/activations.py: 227,464 B per token per layer (bf16-mixed, flash, full FT)
    # = 32,772 + 24,576 + 24,576 + 8,192 + 128 + 32,772 + 16,384 + 88,064 (each norm: 4h + 4h + 4 B of rsqrt)
    m = load_model("llama-2-7b")
    ctx = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                     gqa_repeat=False, seq_len=2048)
    assert layer_saved_per_token(m, m.layers[0], ctx) == 227_464


def test_checkpointing_keeps_the_residual_only() -> None:
    # full checkpointing: each layer keeps its input, fp32 residual under autocast: 4 * 4096 = 16,384 B/token
    from vramplan.analytic.activations import checkpoint_saved_per_token

    m = load_model("llama-2-7b")
    ctx = ActContext(2, 4, 2, True, "flash", False, 2048)
    assert checkpoint_saved_per_token(m, ctx) == 16_384


def test_seventy_b_on_8_a100_naive_does_not_fit_but_zero3_offload_does(examples) -> None:  # type: ignore[no-untyped-def]
    from vramplan import estimate

    assert not estimate(examples / "llama3-70b-naive-8xa100.yaml").fits
    assert estimate(examples / "llama3-70b-zero3-offload-8xa100.yaml").fits


def test_mqa_kv_cache_octocoder() -> None:
    # gpt_bigcode with multi_query: one K and one V head of 6144 / 48 = 128 dims shared by 48 query heads:
    # 2 * 40 layers * 1 * 128 * 2 B = 20,480 B per token, 1/48 of the 983,040 B multi-head attention would need.
    m = load_model("bigcode/octocoder")
    assert kv_bytes_per_token(m, 2) == 20_480
    assert kv_bytes_per_token(m, 2) * 48 == 2 * 40 * 6144 * 2


def test_qlora_mixtral_expert_loop_saved_per_token() -> None:
    # QLoRA on Mixtral-8x7B (fp16-mixed, attention-only adapters): the experts are per-expert bitsandbytes
    # linears whose outputs keep the fp32 hidden states' dtype (ew = 4), run one expert at a time.
    # Per routed token: gate out, SiLU out, up out: 3 * 4 * 14,336 = 172,032; down out and the product
    # saved by index_add_: 2 * 4 * 4,096 = 32,768; int64 position and index plus the fp32 routing weight: 20
    # -> 204,820; top-2 -> 409,640.  Router: fp16 logits and fp32 probabilities, (2 + 4) * 8 = 48.
    from vramplan.analytic.activations import mlp_saved

    m = load_model("mistralai/Mixtral-8x7B-v0.1")
    ctx = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                     gqa_repeat=False, seq_len=4096, frozen_base=True,
                     lora_targets=frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), lora_rank=16,
                     elementwise_bytes=4, expert_loop=True)
    assert mlp_saved(m, m.layers[0], ctx) == 409_640 + 48
    # the grouped GEMMs of transformers 5 over fp16 experts: (2 * 2 * 14,336 + 2 * 14,336 + 2 * 4,096) * 2 + 48
    from dataclasses import replace

    assert mlp_saved(m, m.layers[0], replace(ctx, expert_loop=False)) == 188_416 + 48
