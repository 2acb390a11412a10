"""The step-time model, term by term, against arithmetic done by hand in the comments."""

from __future__ import annotations

import math

import pytest

from vramplan.analytic.precision import PrecisionPolicy
from vramplan.catalog import load_model, resolve_gpu
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.plan.steptime import (
    DEFAULT_ASSUMPTIONS,
    PerfAssumptions,
    decode_step_time,
    model_facts,
    train_step_time,
)
from vramplan.plan.steptime import collectives as col
from vramplan.plan.steptime import flops as fl
from vramplan.plan.steptime import memory_bound as mb
from vramplan.plan.steptime.offload import CPU_ADAM_BYTES_PER_PARAM, cpu_optimizer_seconds, host_link_seconds
from vramplan.plan.steptime.pipeline import pipeline_bubble_seconds, pipeline_slots, stage_boundary_bytes

NO_LAT = PerfAssumptions(collective_latency_s=0.0)
# HF autocast bf16-mixed: fp32 params (4), fp32 grads (4), no master, bf16 compute (2)
HF_MIXED = PrecisionPolicy(param_bytes=4, frozen_param_bytes=2, grad_bytes=4, master_bytes=0, compute_bytes=2,
                           residual_bytes=4, autocast=True, weight_cast_bytes=2, linear_input_bytes=2, half="bf16")
DS_MIXED = PrecisionPolicy(param_bytes=2, frozen_param_bytes=2, grad_bytes=2, master_bytes=4, compute_bytes=2,
                           residual_bytes=2, autocast=False, weight_cast_bytes=0, linear_input_bytes=2, half="bf16")
LLAMA2_7B = model_facts(load_model("meta-llama/Llama-2-7b-hf"))
A100 = resolve_gpu("A100-80GB")


def test_flop_terms() -> None:
    assert fl.matmul_forward_flops(4096 * 4096, 1) == 2 * 16_777_216
    assert fl.matmul_backward_flops(1e9, 10, True) == 4e10  # input + weight gradients
    assert fl.matmul_backward_flops(1e9, 10, False) == 2e10  # frozen: input gradient only
    assert fl.keys_per_query(4096, None, True) == 2048.5  # (s + 1) / 2
    assert fl.keys_per_query(4096, None, False) == 4096  # eager computes the whole square
    assert fl.keys_per_query(8, 4, True) == (4 * 5 / 2 + 4 * 4) / 8  # window 4: 1,2,3,4,4,4,4,4
    assert fl.keys_per_query(8, 100, True) == 4.5  # a window longer than the sequence is no window
    assert fl.attention_forward_flops(8192, 2048.5, 4096) == 2 * 8192 * 2048.5 * 4096
    assert fl.attention_backward_factor("eager") == 2.0 and fl.attention_backward_factor("flash") == 2.5


def test_model_facts_llama2_7b() -> None:
    # per layer: q,k,v,o 4 * 4096^2 = 67,108,864; gate, up, down 3 * 4096 * 11008 = 135,266,304
    assert LLAMA2_7B.layer_matmul_params[0] == 202_375_168
    assert LLAMA2_7B.head_matmul_params == 32000 * 4096
    assert LLAMA2_7B.attn_width == 32 * (128 + 128)
    assert LLAMA2_7B.matmul_params == 32 * 202_375_168 + 131_072_000  # 6,607,077,376


def test_moe_counts_active_experts_only() -> None:
    f = model_facts(load_model("mistralai/Mixtral-8x7B-v0.1"))
    # one layer: attention 4096*(4096 + 1024 + 1024 + 4096) = 41,943,040, router 4096*8 = 32,768,
    # 2 of 8 experts, each 3 * 4096 * 14336 = 176,160,768
    assert f.layer_matmul_params[0] == pytest.approx(41_943_040 + 32_768 + 2 * 176_160_768)


def test_collectives() -> None:
    # 13.5 GB of gradients over 8 A100s: 2 * 7/8 * 13.5e9 / 300e9 = 78.75 ms
    bw = col.link_bytes_per_s(A100, False, NO_LAT)
    assert bw == 300e9  # NVLink3 600 GB/s bidirectional -> 300 per direction
    assert col.all_reduce_seconds(13.5e9, 8, bw, NO_LAT) == pytest.approx(0.07875)
    assert col.all_gather_seconds(13.5e9, 8, bw, NO_LAT) == pytest.approx(0.039375)
    assert col.reduce_scatter_seconds(13.5e9, 8, bw, NO_LAT) == pytest.approx(0.039375)
    assert col.all_reduce_seconds(1e9, 1, bw, NO_LAT) == 0.0  # no peers, no traffic
    assert col.link_bytes_per_s(A100, True, NO_LAT) == 25e9  # across nodes: the network assumption
    assert col.all_reduce_seconds(1.0, 2, bw, DEFAULT_ASSUMPTIONS) == pytest.approx(10e-6 + 1 / 300e9)


def test_memory_bound_terms() -> None:
    assert mb.optimizer_bytes_per_param("adamw-fused", 4, 4, 0) == 28  # read p g m v, write p m v (fp32)
    assert mb.optimizer_bytes_per_param("adamw", 2, 2, 4) == 36  # + bf16 grad upcast 2+4, + bf16 param write 2
    assert mb.optimizer_bytes_per_param("adamw-fused", 2, 2, 0) == 14  # pure bf16: 7 x 2
    assert mb.optimizer_bytes_per_param("adamw-8bit", 4, 4, 0) == 16 + 16 / 256
    assert mb.clip_bytes_per_param(4) == 12
    # eager attention, 32 heads, one 4096-token sequence, bf16: 32 * 4096^2 elements x 48 B
    assert mb.eager_attention_bytes(32, 4096, 1, 2) == 32 * 4096**2 * 48
    assert mb.hbm_seconds(2.039e12, 2.039e12) == 1.0


def test_offload_and_pipeline_terms() -> None:
    assert CPU_ADAM_BYTES_PER_PARAM == 30
    # 8.8e9 parameters per GPU, 200 GB/s shared by 8 GPUs: 8.8e9 * 30 / 25e9 = 10.56 s
    assert cpu_optimizer_seconds(8.8e9, 8, 200e9) == pytest.approx(10.56)
    assert host_link_seconds(32e9, 32e9) == 1.0
    assert pipeline_slots(8, 4) == 11 and pipeline_bubble_seconds(1.0, 4) == 3.0
    assert stage_boundary_bytes(4096, 8192, 2, 4, True) == 4096 * 8192 * 2 / 4


def _setup(**kw: object) -> TrainSetup:
    base: dict[str, object] = {"framework": "hf-trainer", "num_gpus": 1, "micro_batch_size": 1, "grad_accum_steps": 1,
                                   "seq_len": 4096}
    base.update(kw)
    return TrainSetup(**base)  # type: ignore[arg-type]


def test_single_gpu_step_by_hand() -> None:
    """Llama-2-7B, one A100, bf16-mixed, fused AdamW, no checkpointing, one 4096-token sequence."""
    s = _setup()
    params = load_model("meta-llama/Llama-2-7b-hf").num_parameters  # 6,738,415,616
    t = train_step_time(s, LLAMA2_7B, A100, DEFAULT_ASSUMPTIONS, HF_MIXED, params)
    rate = 312e12 * 0.40
    matmul = 6 * 6_607_077_376 * 4096
    attention = 32 * 2 * 8192 * 2048.5 * 4096 * (1 + 2.5)
    assert t.compute_s == pytest.approx((matmul + attention) / rate)
    # optimizer: 28 B AdamW + 12 B clipping per fp32 parameter, at 2.039 TB/s
    assert t.optimizer_step_s == pytest.approx(params * 40 / 2.039e12)
    assert t.total_s == pytest.approx(t.compute_s + t.optimizer_step_s)
    assert t.tokens_per_s == pytest.approx(4096 / t.total_s)
    assert t.communication_s == 0.0


def test_checkpointing_recomputes_the_layers_forward() -> None:
    t = train_step_time(_setup(checkpointing="full"), LLAMA2_7B, A100, DEFAULT_ASSUMPTIONS, HF_MIXED, 1)
    forward_layers = 2 * 32 * 202_375_168 * 4096 + 32 * 2 * 8192 * 2048.5 * 4096  # the head is not recomputed
    assert t.recompute_s == pytest.approx(forward_layers / (312e12 * 0.4))


def test_frozen_base_skips_weight_gradients() -> None:
    full = train_step_time(_setup(), LLAMA2_7B, A100, DEFAULT_ASSUMPTIONS, HF_MIXED, 1)
    lora = train_step_time(_setup(peft="lora"), LLAMA2_7B, A100, DEFAULT_ASSUMPTIONS, HF_MIXED, 1, lora_params=0)
    saved = 2 * 6_607_077_376 * 4096 / (312e12 * 0.4)
    assert full.compute_s - lora.compute_s == pytest.approx(saved)


def test_data_parallel_exposure_and_zero3_volumes() -> None:
    # DDP on 8 GPUs: one fp32 all-reduce of 6.74e9 gradients per step, hidden behind the micro-step's compute
    params = 6_738_415_616
    s = _setup(num_gpus=8, micro_batch_size=1, grad_accum_steps=1, seq_len=128)
    t = train_step_time(s, LLAMA2_7B, A100, NO_LAT, HF_MIXED, params)
    ar = 2 * 7 / 8 * params * 4 / 300e9
    assert t.dp_comm_exposed_s == pytest.approx(max(0.0, ar - t.compute_s))
    # ZeRO-3: per micro-step two bf16 all-gathers of the parameters and a reduce-scatter of bf16 gradients
    z3 = _setup(framework="deepspeed", zero_stage=3, num_gpus=8, micro_batch_size=1, grad_accum_steps=4, seq_len=128,
                optimizer="adamw")
    t3 = train_step_time(z3, LLAMA2_7B, A100, NO_LAT, DS_MIXED, params)
    per_micro = 3 * 7 / 8 * params * 2 / 300e9
    assert t3.dp_comm_exposed_s == pytest.approx(4 * max(0.0, per_micro - t3.compute_s / 4))
    # the optimizer step covers 1/8 of the parameters at 36 + 6 (clip of bf16 grads) bytes each
    assert t3.optimizer_step_s == pytest.approx(params / 8 * 42 / 2.039e12)


def test_offload_cpu_step_and_pipeline_bubble() -> None:
    params = 6_738_415_616
    s = _setup(framework="deepspeed", zero_stage=3, offload="optimizer", num_gpus=8, optimizer="adamw")
    t = train_step_time(s, LLAMA2_7B, A100, NO_LAT, DS_MIXED, params)
    assert t.optimizer_step_s == 0.0
    assert t.cpu_optimizer_step_s == pytest.approx(params / 8 * 30 / (200e9 / 8))
    pp = _setup(framework="torchtitan", pp=4, num_gpus=4, micro_batch_size=1, grad_accum_steps=8, seq_len=1024)
    tp = train_step_time(pp, LLAMA2_7B, A100, NO_LAT, HF_MIXED, params)
    slot = (tp.total_s - tp.optimizer_step_s) / 11  # 8 micro-batches + 3 bubble slots
    assert tp.pp_bubble_s == pytest.approx(3 * slot)
    assert math.isclose(sum(v for k, v in tp.as_dict().items() if k not in ("total_s", "tokens_per_s",
                                                                             "communication_s")), tp.total_s)


def test_v_schedule_step_time() -> None:
    # Llama-2-7B (32 equal layers), pp 4, 2 chunks per rank: interleaved 1F1B's slowest rank is rank 3 (layers
    # 12-15 and 28-31, and the head); ZB-V's and DualPipeV's rank 0 (layers 0-3 and 28-31, and the head): the same
    # 8 layers + head, so the same compute.  Interleaved 1F1B's bubble is (pp - 1) / v = 1.5 slots of 8 + 1.5 = 9.5;
    # the split schedules' is the walk of torch's order (plan/steptime/pipeline.py): per layer and micro-batch the
    # forward, input-gradient and weight-gradient passes are each 2 x 202M weights x 1,024 tokens = 4.1e11 FLOPs,
    # plus attention's 8.6e9 forward (in F) and its backward (in I), so the three are within ~5% of equal and the
    # walk gives just over (pp - 1) / (3 v) = 0.5 slot (F a little longer than W: the ramp is F's)
    params = 6_738_415_616
    base = {"framework": "torchtitan", "pp": 4, "num_gpus": 4, "micro_batch_size": 1, "grad_accum_steps": 8,
            "seq_len": 1024, "pp_virtual_stages": 2}
    inter = train_step_time(_setup(pp_schedule="interleaved-1f1b", **base), LLAMA2_7B, A100, NO_LAT, HF_MIXED, params)
    for name in ("zbv-zero-bubble", "dualpipev"):
        setup = _setup(pp_schedule=name, **base)
        assert setup.parallel.pp_schedule == name and setup.parallel.pp_virtual_stages == 2
        t = train_step_time(setup, LLAMA2_7B, A100, NO_LAT, HF_MIXED, params)
        assert t.compute_s == pytest.approx(inter.compute_s)
        # total - optimizer = (8 + b) slots, of which the bubble is b slots
        b = 8 * t.pp_bubble_s / (t.total_s - t.optimizer_step_s - t.pp_bubble_s)
        assert 0.5 <= b <= 0.55, (name, b)
        assert t.total_s < inter.total_s
    slot = (inter.total_s - inter.optimizer_step_s) / 9.5
    assert inter.pp_bubble_s == pytest.approx(1.5 * slot)


def test_decode_worked_example() -> None:
    """Llama-3-8B bf16 on one H100, 64 sequences at half of 8192 tokens (module docstring)."""
    m = load_model("meta-llama/Meta-Llama-3-8B")
    h100 = resolve_gpu("H100-SXM")
    s = ServeSetup(num_gpus=1, tp=1, max_model_len=8192, max_num_seqs=64)
    kv_token = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head_dim x bf16 = 131,072 B
    d = decode_step_time(s, model_facts(m), h100, NO_LAT, 16_060_522_496, kv_token, 64)
    assert d.weights_read_s == pytest.approx(16_060_522_496 / 3.35e12)
    assert d.kv_read_s == pytest.approx(64 * 4096 * kv_token / 3.35e12)
    assert d.total_s == pytest.approx(max(d.weights_read_s + d.kv_read_s, d.compute_s))
    assert d.tokens_per_s == pytest.approx(64 / d.total_s)


@pytest.mark.parametrize("module", [
    "vramplan.plan.steptime.flops", "vramplan.plan.steptime.collectives", "vramplan.plan.steptime.memory_bound",
    "vramplan.plan.steptime.offload", "vramplan.plan.steptime.pipeline", "vramplan.plan.fit", "vramplan.plan.space",
])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
