"""Predicted time of one optimizer step of a training setup, as a sum of named terms.

One micro-step on the slowest pipeline stage costs

    t_c   = matmul + attention FLOPs (incl. recomputation) / (peak x MFU)
            + memory-bound attention (eager) and dequantization traffic / HBM bandwidth
    t_mu  = t_c + tensor-parallel all-reduces + pipeline sends
            + max(0, max(data-parallel collectives, host copies) issued this micro-step - t_c)

(data-parallel collectives and offload copies run on other engines -- NVLink/network, the
copy engines over PCIe -- and overlap the compute; only what exceeds it is exposed).  A step
runs ``grad_accum + pp - 1`` micro-step slots (the pipeline bubble is ``pp - 1`` of them),
then the once-per-step work: the data-parallel reduction issued with the last micro-step
(overlapped with its compute), the parameter all-gather after a ZeRO-1/2 update, the optimizer
step on the GPU (HBM-bound) or on the CPU (DRAM-bound), and host copies at the boundary.

Collective volumes (ZeRO paper, arXiv 1910.02054, sec. 7): plain data parallelism all-reduces
the gradients once per step (DDP skips synchronisation while accumulating); ZeRO-1
reduce-scatters them at the accumulation boundary and all-gathers the updated half parameters;
ZeRO-2 reduce-scatters at every micro-step; ZeRO-3 and FSDP all-gather the parameters for the
forward and again for the backward and reduce-scatter the gradients at every micro-step
(shard_grad_op keeps the parameters from the forward for the backward: one all-gather).
Recomputation under full checkpointing is assumed not to gather again (the unit is already
unsharded when its backward runs).  Tensor parallelism (Megatron, arXiv 1909.08053, sec. 3)
all-reduces the activations twice per layer in the forward and twice in the backward, twice more
when the forward is recomputed; sequence parallelism replaces each by an all-gather and a
reduce-scatter of the same total volume (arXiv 2205.05198, sec. 4.2.2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from vramplan.analytic.layout import head_stage, stage_layers
from vramplan.analytic.precision import PrecisionPolicy
from vramplan.facts.pipeline_schedules import pipeline_schedule
from vramplan.plan.setup import TrainSetup
from vramplan.plan.steptime import collectives as col
from vramplan.plan.steptime import flops as fl
from vramplan.plan.steptime import memory_bound as mb
from vramplan.plan.steptime.assumptions import PerfAssumptions
from vramplan.plan.steptime.facts import ModelFacts
from vramplan.plan.steptime.offload import cpu_optimizer_seconds, host_link_seconds
from vramplan.plan.steptime.pipeline import (
    pipeline_bubble_seconds,
    pipeline_slots,
    split_bubble_slots,
    stage_boundary_bytes,
)
from vramplan.spec.gpu import GpuSpec
from vramplan.units import ceil_div

__all__ = ["StepTime", "peak_flops_per_s", "train_step_time"]


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per optimizer step, by term; the terms sum to ``total_s``."""

    compute_s: float  # matmuls, attention, memory-bound attention and dequantization (first pass)
    recompute_s: float  # the forward pass again under full checkpointing
    tp_comm_s: float
    pp_p2p_s: float
    pp_bubble_s: float
    dp_comm_exposed_s: float
    offload_exposed_s: float
    optimizer_step_s: float
    cpu_optimizer_step_s: float
    total_s: float
    tokens_per_s: float
    communication_s: float  # every second spent waiting on a link (incl. the bubble's share)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def peak_flops_per_s(gpu: GpuSpec, dtype: str) -> float:
    """Dense peak for the compute dtype from the GPU catalog ('bf16', 'fp16', 'fp32').

    PyTorch does not use TF32 for fp32 matmuls by default (``torch.backends.cuda.matmul.allow_tf32``
    is False since 1.12), so fp32 training runs at the non-tensor fp32 peak.  0 if unknown.
    """
    value = gpu.dense_flops_per_s.get(dtype)
    return float(value) if value else 0.0


@lru_cache(maxsize=4096)
def _stage_sums(f: ModelFacts, pp: int, stage: int, seq_len: int, skips: bool,
                virtual: int = 1, style: str = "loop") -> tuple[int, float, float]:
    """(layers, active matmul parameters, keys per query summed over layers) of one pipeline stage (``style``: the
    chunk layout, analytic/layout.py ``chunk_stages``)."""
    layers = stage_layers(f.num_layers, pp, stage, virtual, style)
    mm = sum(f.layer_matmul_params[i] for i in layers)
    keys = sum(fl.keys_per_query(seq_len, f.windows[i], skips) for i in layers)
    return len(layers), mm, keys


def _gathered_bytes_per_param(s: TrainSetup, pol: PrecisionPolicy) -> int:
    return 2 if pol.compute_bytes <= 2 else 4


# the slowest stage's (first pass, recomputation, forward share, weight-gradient share) seconds and its layer count
_Compute = tuple[float, float, float, float, int]


def _compute(s: TrainSetup, f: ModelFacts, gpu: GpuSpec, a: PerfAssumptions, pol: PrecisionPolicy, lora_params: int,
             v: int, style: str) -> _Compute:
    """Compute per micro-step on the slowest stage: it reads of ``s`` only the fields of ``train_step_time``'s memo
    key (tp, pp, the micro-batch, the sequence, the attention, PEFT, checkpointing, the quantization)."""
    tp, pp = s.tp, s.pp
    tokens = s.micro_batch_size * s.seq_len
    kernel = "eager" if s.attention == "eager" else "flash"
    skips = kernel != "eager" and not f.encoder_only
    rate = peak_flops_per_s(gpu, pol.half) * a.mfu
    frozen = s.peft is not None
    full_ckpt = s.checkpointing == "full"
    hbm = float(gpu.hbm_bytes_per_s)
    t_first = t_re = 0.0
    t_fwd = t_wgrad = 0.0  # the slowest stage's forward and weight-gradient shares (split schedules' walk)
    slowest = -1.0
    stage_layer_count = 0
    for stage in range(pp):
        layers, mm, keys = _stage_sums(f, pp, stage, s.seq_len, skips, v, style)
        head = f.head_matmul_params if stage == head_stage(pp, style) else 0
        attn = fl.attention_forward_flops(f.attn_width, keys, tokens)  # summed over the stage's layers
        lora = lora_params * layers / f.num_layers
        first = (fl.matmul_forward_flops(mm + head, tokens) + fl.matmul_backward_flops(mm + head, tokens, not frozen)
                 + attn * (1 + fl.attention_backward_factor(kernel)) + 6.0 * lora * tokens)
        again = (fl.matmul_forward_flops(mm + lora, tokens) + attn) if full_ckpt else 0.0
        first_s, again_s = first / tp / rate, again / tp / rate
        if kernel == "eager":
            per_layer = mb.eager_attention_bytes(ceil_div(f.num_attention_heads, tp), s.seq_len, s.micro_batch_size,
                                                 pol.compute_bytes)
            first_s += mb.hbm_seconds(per_layer * layers, hbm)
            again_s += mb.hbm_seconds(per_layer / 3 * layers, hbm) if full_ckpt else 0.0
        dequant = mb.dequant_bytes_per_weight_use(s.quantization) if s.quantization != "none" else 0.0
        if dequant:
            q = f.linear_params * layers / f.num_layers / tp
            first_s += mb.hbm_seconds(q * 2 * dequant, hbm)  # forward + input gradient
            again_s += mb.hbm_seconds(q * dequant, hbm) if full_ckpt else 0.0
        if first_s + again_s > slowest:
            slowest, t_first, t_re, stage_layer_count = first_s + again_s, first_s, again_s, layers
            # forward: the matmuls', attention's and the adapters'; weight gradients: 2 FLOPs per trainable weight and
            # token (flops.matmul_backward_flops) and the adapters' 2 of their 6; the rest of the step is the input
            # gradient's (with any recomputation, which runs before it)
            t_fwd = (fl.matmul_forward_flops(mm + head, tokens) + attn + 2.0 * lora * tokens) / tp / rate
            t_wgrad = ((0.0 if frozen else 2.0 * (mm + head) * tokens) + 2.0 * lora * tokens) / tp / rate
    return t_first, t_re, t_fwd, t_wgrad, stage_layer_count


def train_step_time(s: TrainSetup, f: ModelFacts, gpu: GpuSpec, a: PerfAssumptions, pol: PrecisionPolicy,
                    trainable: int, lora_params: int = 0, memo: dict[tuple[object, ...], _Compute] | None = None
                    ) -> StepTime:
    """Step time of ``s``; ``trainable`` = parameters the optimizer updates (adapters under PEFT).

    ``memo``: the slowest stage's compute (``_compute``) by its inputs, for calls with the same ``f``, ``gpu``
    and ``a`` (the planner's, one per search: its candidates share it across frameworks, offloads, optimizers)."""
    tp, pp, dp, g = s.tp, s.pp, s.dp, s.grad_accum_steps
    # model chunks per rank of an interleaved schedule (facts/pipeline_schedules.py; pipeline.py)
    row = pipeline_schedule(s.parallel.pp_schedule)
    v = s.parallel.pp_virtual_stages if pp > 1 and row.multi_stage else 1
    # a V schedule (zbv-zero-bubble, dualpipev) puts rank r's chunks at r and 2 pp - 1 - r, the head on rank 0; the
    # split-backward schedules' bubble is the walk of their actions (pipeline.py split_bubble_slots)
    style = row.style if pp > 1 else "loop"
    tokens = s.micro_batch_size * s.seq_len
    full_ckpt = s.checkpointing == "full"
    hbm = float(gpu.hbm_bytes_per_s)
    key = (tp, pp, v, style, s.micro_batch_size, s.seq_len, s.attention, s.peft is not None, full_ckpt,
           s.quantization, pol.half, pol.compute_bytes, lora_params)
    got = None if memo is None else memo.get(key)
    if got is None:
        got = _compute(s, f, gpu, a, pol, lora_params, v, style)
        if memo is not None:
            memo[key] = got
    t_first, t_re, t_fwd, t_wgrad, stage_layer_count = got
    t_c = t_first + t_re
    # ---- tensor and pipeline parallel, per micro-step ----
    act_bytes = tokens * f.hidden_size * pol.compute_bytes
    intra = col.link_bytes_per_s(gpu, False, a)
    t_tp = 0.0
    if tp > 1:
        per_layer_ops = 4 + (2 if full_ckpt else 0)
        t_tp = stage_layer_count * per_layer_ops * col.all_reduce_seconds(act_bytes, tp, intra, a)
    t_p2p = 0.0
    if pp > 1:
        bw = col.link_bytes_per_s(gpu, s.num_gpus > s.gpus_per_node, a)
        t_p2p = 2 * v * col.p2p_seconds(stage_boundary_bytes(tokens, f.hidden_size, pol.compute_bytes, tp, tp > 1),
                                        bw, a)

    # ---- data parallel collectives ----
    dp_bw = col.link_bytes_per_s(gpu, tp * dp > s.gpus_per_node, a)
    params_rank = f.num_parameters / (tp * pp)  # parameters one GPU of a stage holds before sharding
    trainable_rank = trainable / (tp * pp)
    grad_buf = trainable_rank * pol.grad_bytes
    param_buf = params_rank * _gathered_bytes_per_param(s, pol)
    dp_micro = dp_step = after_step = 0.0
    shard_os = 1
    if dp > 1 or s.framework in ("deepspeed", "accelerate"):
        fw, z = s.framework, s.zero_stage
        if fw == "hf-trainer":
            dp_step = col.all_reduce_seconds(grad_buf, dp, dp_bw, a)
        elif fw == "deepspeed":
            shard_os = dp
            if z == 1:
                dp_step = col.reduce_scatter_seconds(grad_buf, dp, dp_bw, a)
                after_step = col.all_gather_seconds(params_rank * 2, dp, dp_bw, a)
            elif z == 2:
                dp_micro = col.reduce_scatter_seconds(grad_buf, dp, dp_bw, a)
                after_step = col.all_gather_seconds(params_rank * 2, dp, dp_bw, a)
            else:
                dp_micro = 2 * col.all_gather_seconds(param_buf, dp, dp_bw, a) + col.reduce_scatter_seconds(
                    grad_buf, dp, dp_bw, a)
        else:  # FSDP (accelerate) and torchtitan's FSDP over the data-parallel ranks
            shard_os = dp
            gathers = 1 if s.fsdp == "shard_grad_op" else 2
            dp_micro = gathers * col.all_gather_seconds(param_buf, dp, dp_bw, a) + col.reduce_scatter_seconds(
                grad_buf, dp, dp_bw, a)

    # ---- offload over the host link ----
    host_bw = float(gpu.host_link_bytes_per_s or 16e9)
    host_micro = host_step = cpu_opt = 0.0
    if s.offload != "none":
        shard = trainable_rank / dp
        pshard = params_rank / dp
        if s.framework == "deepspeed":
            if s.zero_stage == 1:
                host_step += host_link_seconds(shard * pol.grad_bytes, host_bw)
            else:
                host_micro += host_link_seconds(shard * pol.grad_bytes, host_bw)
            host_step += host_link_seconds(shard * 2, host_bw)
            if s.offload == "optimizer+params":
                host_micro += host_link_seconds(2 * pshard * 2, host_bw)
        else:  # FSDP CPUOffloadPolicy: fp32 parameter shards fetched for forward and backward, fp32 gradients back
            host_micro += host_link_seconds(2 * pshard * 4 + shard * 4, host_bw)
        cpu_opt = cpu_optimizer_seconds(shard, min(s.num_gpus, s.gpus_per_node), a.host_memory_bytes_per_s)

    exposed_micro = max(0.0, max(dp_micro, host_micro) - t_c)
    t_micro = t_c + t_tp + t_p2p + exposed_micro
    if pp > 1 and row.in_flight == "split":
        bubble_slots = split_bubble_slots(row.name, pp, v, g, t_fwd, max(0.0, t_c - t_fwd - t_wgrad), t_wgrad)
        slots, bubble = g + bubble_slots, bubble_slots * t_micro
    else:
        bubble_slots = (pp - 1) / v
        slots, bubble = pipeline_slots(g, pp, v), pipeline_bubble_seconds(t_micro, pp, v)
    dp_step_exposed = max(0.0, dp_step - t_c) + after_step

    # ---- optimizer step on the GPU ----
    opt_s = 0.0
    if s.offload == "none":
        per_param = mb.optimizer_bytes_per_param(s.optimizer, pol.param_bytes if not pol.master_bytes else 2,
                                                 pol.grad_bytes, pol.master_bytes) + mb.clip_bytes_per_param(
            pol.grad_bytes)
        opt_s = mb.hbm_seconds(trainable_rank / shard_os * per_param, hbm)

    dp_exposed = g * (exposed_micro if dp_micro >= host_micro else 0.0) + dp_step_exposed
    host_exposed = g * (exposed_micro if host_micro > dp_micro else 0.0) + host_step
    total = slots * t_micro + dp_step_exposed + opt_s + host_step + cpu_opt
    communication = g * (t_tp + t_p2p + exposed_micro) + bubble_slots * (t_tp + t_p2p + exposed_micro) + \
        dp_step_exposed + host_step
    return StepTime(
        compute_s=g * t_first, recompute_s=g * t_re, tp_comm_s=g * t_tp, pp_p2p_s=g * t_p2p, pp_bubble_s=bubble,
        dp_comm_exposed_s=dp_exposed, offload_exposed_s=host_exposed, optimizer_step_s=opt_s,
        cpu_optimizer_step_s=cpu_opt, total_s=total,
        tokens_per_s=s.global_batch * s.seq_len / total if total > 0 else 0.0, communication_s=communication,
    )
