"""Decode throughput of a vLLM deployment: one token per running sequence per engine step.

Decoding is memory-bound: every step reads all of the GPU's weights and the KV cache of every
running sequence, and does only 2 FLOPs per weight per sequence (Pope et al., "Efficiently
Scaling Transformer Inference", arXiv 2211.05102, sec. 2).  So a step takes the larger of the
HBM time and the matmul time, plus tensor parallelism's two all-reduces per layer of the
batch's hidden states (Megatron, arXiv 1909.08053), which at decode sizes are latency-bound.

Worked example: Llama-3-8B bf16 on one H100 (3.35 TB/s), 64 sequences at 4096 of 8192 tokens:
weights 16.06e9 B + KV 64 * 4096 * 131,072 B = 34.4e9 B -> 50.4e9 / 3.35e12 = 15.0 ms per step,
64 / 0.0150 = 4,260 tokens/s per replica.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vramplan.plan.setup import ServeSetup
from vramplan.plan.steptime import collectives as col
from vramplan.plan.steptime.assumptions import PerfAssumptions
from vramplan.plan.steptime.facts import ModelFacts
from vramplan.plan.steptime.memory_bound import hbm_seconds
from vramplan.plan.steptime.train import peak_flops_per_s
from vramplan.spec.gpu import GpuSpec

__all__ = ["DecodeTime", "decode_step_time"]


@dataclass(frozen=True, slots=True)
class DecodeTime:
    weights_read_s: float
    kv_read_s: float
    compute_s: float
    tp_comm_s: float
    total_s: float  # one engine step (one token for each running sequence)
    tokens_per_s: float  # the whole deployment (all replicas)
    communication_s: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def decode_step_time(s: ServeSetup, f: ModelFacts, gpu: GpuSpec, a: PerfAssumptions, weights_bytes_per_gpu: int,
                     kv_bytes_per_token_per_gpu: int, sequences_per_replica: int) -> DecodeTime:
    """One decode step with ``sequences_per_replica`` running sequences on each replica."""
    hbm = float(gpu.hbm_bytes_per_s)
    context = s.max_model_len * a.decode_context_fraction
    w_s = hbm_seconds(weights_bytes_per_gpu, hbm)
    kv_s = hbm_seconds(sequences_per_replica * context * kv_bytes_per_token_per_gpu, hbm)
    dtype = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}.get(s.dtype, "bf16")
    rate = peak_flops_per_s(gpu, dtype) * a.mfu
    flops = 2.0 * f.matmul_params * sequences_per_replica / s.tp
    flops += 2.0 * f.attn_width * context * sequences_per_replica * f.num_layers / s.tp
    c_s = flops / rate if rate else 0.0
    tp_s = 0.0
    if s.tp > 1:
        msg = sequences_per_replica * f.hidden_size * 2
        tp_s = 2 * f.num_layers * col.all_reduce_seconds(msg, s.tp, col.link_bytes_per_s(gpu, False, a), a)
    total = max(w_s + kv_s, c_s) + tp_s
    tokens = s.replicas * sequences_per_replica / total if total > 0 else 0.0
    return DecodeTime(w_s, kv_s, c_s, tp_s, total, tokens, tp_s)
