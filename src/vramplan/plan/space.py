"""The jobs a user asks to plan, and the search space of setups for them.

What is searched for training (each knob only where the framework that would run it supports it):

==================  =====================================================================
precision           bf16-mixed (fp16-mixed on GPUs without bf16), fp32; bf16-true only with
                    ``allow_pure_bf16`` (pure half-precision updates change training numerics)
optimizer           the rows of ``facts/optimizers.py`` whose ``planner`` names the job (or only
                    ``TrainJob.optimizer``, ``plan --optimizer``, where the user names one): today AdamW
                    (fused), 8-bit AdamW, paged AdamW, paged 8-bit AdamW (bitsandbytes, Hugging Face
                    Trainer; no paged 32-bit AdamW under PEFT); DeepSpeed, FSDP and torchtitan use
                    their own AdamW
checkpointing       none, full.  Selective recomputation (arXiv 2205.05198) drops only the s x s
                    attention tensors, which flash/SDPA never save: with them it *is* "none"
attention           sdpa (PyTorch dispatches the flash kernel; flash-attention-2 is the same in
                    memory and time here), eager
sharding            plain data parallel (DDP); DeepSpeed ZeRO-1/2/3; FSDP full_shard and
                    shard_grad_op; torchtitan FSDP with tensor and pipeline parallelism
offload             DeepSpeed: optimizer (ZeRO-Offload), optimizer+params at stage 3
                    (ZeRO-Infinity to CPU); FSDP full_shard: CPU offload (parameters, gradients,
                    optimizer step); shard_grad_op keeps unsharded parameters, so it is not offloaded
tp, pp              torchtitan only; tp divides the attention heads and stays inside a node
pp schedule         with pp > 1: 1F1B, and interleaved 1F1B with 2 model chunks per rank (and 4 where
                    the layers allow 4 x pp chunks) wherever torch's ScheduleInterleaved1F1B takes the
                    micro-batch count (a multiple of its max(1, m // pp) rounds): it trades more
                    activations in flight for a bubble of (pp - 1) / v slots.  GPipe holds every
                    micro-batch's activations with 1F1B's bubble, so it never beats 1F1B and is not
                    searched.  The zero-bubble schedules (ZB1P interleaved, ZB-V, DualPipeV) at 2 chunks per
                    rank, timed by walking torch's action order (steptime/pipeline.py)
micro-batch         every divisor of the per-rank batch up to ``max_micro_batch``, with
                    gradient accumulation making up the global batch exactly
PEFT                LoRA (bf16 base) and QLoRA (NF4 + double quantization) with DDP, and on more than one
                    GPU with the sharding and offload rungs above (DeepSpeed ZeRO-1/2/3 with optimizer
                    offload, parameters too at stage 3; FSDP full_shard, shard_grad_op, full_shard with
                    CPU offload), as PEFT documents them for DeepSpeed and FSDP
==================  =====================================================================

For serving (vLLM): tensor-parallel degree (the rest of the GPUs are replicas), the weights'
dtype, and with ``allow_quantization`` fp8 or AWQ 4-bit weights and an fp8 KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.optimizers import optimizer_facts, planner_optimizers
from vramplan.facts.pipeline_schedules import interleaved_rounds, pipeline_schedule
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.load import split_backward_unmodelled_params
from vramplan.spec.model import ModelSpec

__all__ = [
    "PeftPolicy", "ServeJob", "TrainJob", "divisors", "parallel_shapes", "precisions_for", "serve_candidates",
    "train_candidates",
]

# The largest global batch in sequences a plan takes: with a micro-batch of one on one data-parallel rank it
# is all gradient accumulation, so it is train.grad_accum_steps' bound in the scenario schema (spec/scenario.py,
# Train: le=1_000_000; tests/test_hostile_input.py checks the two agree)
MAX_GLOBAL_BATCH = 1_000_000

PeftPolicy = Literal["none", "allow", "only", "lora", "qlora"]


@dataclass(frozen=True)
class TrainJob:
    """A training job: sequences of ``seq_len`` tokens, ``global_batch`` sequences per optimizer step.

    Give the global batch in sequences or in tokens (``global_batch_tokens`` must then be a
    multiple of ``seq_len``).  ``peft``: "none" = full fine-tuning only; "allow" = full
    fine-tuning, LoRA or QLoRA; "only" = LoRA or QLoRA; "lora"/"qlora" = that method only.
    """

    seq_len: int
    global_batch: int | None = None
    global_batch_tokens: int | None = None
    peft: PeftPolicy = "none"
    lora_rank: int = 16
    lora_alpha: float = 32
    allow_pure_bf16: bool = False
    max_micro_batch: int = 64
    optimizer: str | None = None  # a ``train.optimizer`` row: only it is searched (None: the rows' ``planner``)
    # ``software.torchtitan``: the release torchtitan setups are estimated and exported for (None: the scenario's
    # default; the export writes the newest job-config layout read, facts/torchtitan_releases.py)
    torchtitan: str | None = None

    def sequences(self) -> int:
        """Global batch in sequences (validated)."""
        if self.seq_len < 1:
            raise ScenarioError([Problem("seq_len", f"must be at least 1, got {self.seq_len}", "")])
        self._check_schema()
        if self.global_batch is not None and self.global_batch_tokens is not None:
            raise ScenarioError([Problem("global batch", "give the global batch in sequences or in tokens, not both",
                                         "drop --global-batch-tokens or --global-batch")])
        if self.global_batch_tokens is not None:
            if self.global_batch_tokens % self.seq_len:
                lo = self.global_batch_tokens // self.seq_len * self.seq_len
                raise ScenarioError([Problem(
                    "global_batch_tokens", f"{self.global_batch_tokens:,} tokens is not a whole number of "
                    f"{self.seq_len}-token sequences", f"use {lo:,} or {lo + self.seq_len:,} tokens")])
            n = self.global_batch_tokens // self.seq_len
        else:
            n = self.global_batch if self.global_batch is not None else 0
        if n < 1:
            raise ScenarioError([Problem("global batch", "no global batch given (or it is below one sequence)",
                                         "give --global-batch SEQUENCES or --global-batch-tokens TOKENS")])
        if n > MAX_GLOBAL_BATCH:
            # every candidate's grad_accum_steps (n / (dp x micro-batch), up to n) must meet the schema's bound
            raise ScenarioError([Problem("global batch", f"{n:,} sequences per optimizer step; a plan takes at most "
                                         f"{MAX_GLOBAL_BATCH:,} (train.grad_accum_steps' bound)",
                                         "give a smaller --global-batch or --global-batch-tokens")])
        return n

    def _check_schema(self) -> None:
        """The job's scenario fields meet the scenario schema's bounds (a candidate is a scenario: a value past
        them raised pydantic's error from inside the search, not the package's)."""
        from vramplan.spec.load import parse_scenario

        parse_scenario({"model": "checked by the plan", "train": {
            "seq_len": self.seq_len, "peft": {"rank": self.lora_rank, "alpha": self.lora_alpha}}})

    def full_ft_allowed(self) -> bool:
        return self.peft in ("none", "allow")

    def peft_methods(self) -> tuple[str, ...]:
        return {"none": (), "allow": ("lora", "qlora"), "only": ("lora", "qlora"), "lora": ("lora",),
                "qlora": ("qlora",)}[self.peft]


@dataclass(frozen=True)
class ServeJob:
    """Serving with vLLM: ``concurrency`` sequences of up to ``max_model_len`` tokens running at once."""

    max_model_len: int
    concurrency: int = 1
    allow_quantization: bool = False
    max_num_batched_tokens: int = 8192


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of ``n`` in increasing order, optionally only those <= ``limit``.

    >>> divisors(12), divisors(12, 4)
    ([1, 2, 3, 4, 6, 12], [1, 2, 3, 4])
    """
    out = [d for d in range(1, n + 1) if n % d == 0]
    return [d for d in out if limit is None or d <= limit]


def tp_ok(m: ModelSpec, tp: int) -> bool:
    """The split rules the estimator enforces: tp divides the heads; KV heads split or replicate evenly."""
    if m.num_attention_heads % tp:
        return False
    return m.mla is not None or m.num_kv_heads % tp == 0 or tp % m.num_kv_heads == 0


def parallel_shapes(m: ModelSpec, n: int, gpus_per_node: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs for ``n`` GPUs: tp inside a node and valid for the heads, pp <= layers."""
    out: list[tuple[int, int]] = []
    for tp in divisors(n, gpus_per_node):
        if not tp_ok(m, tp):
            continue
        for pp in divisors(n // tp):
            if pp <= m.num_layers:
                out.append((tp, pp))
    return out


def precisions_for(gpu: GpuSpec, allow_pure_bf16: bool) -> list[str]:
    """Mixed precision in the GPU's best half dtype, fp32, and pure bf16 when allowed."""
    flops = gpu.dense_flops_per_s
    out: list[str] = []
    if flops.get("bf16"):
        out.append("bf16-mixed")
    elif flops.get("fp16"):
        out.append("fp16-mixed")
    if flops.get("fp32"):
        out.append("fp32")
    if allow_pure_bf16 and flops.get("bf16"):
        out.append("bf16-true")
    return out


def _micro_batches(per_rank: int, limit: int) -> list[int]:
    return divisors(per_rank, limit)


def train_candidates(m: ModelSpec, gpu: GpuSpec, n: int, job: TrainJob, gpus_per_node: int = 8) -> Iterator[TrainSetup]:
    """Every setup searched for ``n`` GPUs.  Setups the global batch cannot be split for are not produced."""
    batch = job.sequences()
    precs = precisions_for(gpu, job.allow_pure_bf16)
    half_mixed = [p for p in precs if p.endswith("-mixed")]
    seq = job.seq_len
    attn = ("sdpa", "eager") if not m.encoder_only else ("sdpa",)
    full_opts, peft_opts = planner_optimizers("full"), planner_optimizers("peft")
    ds_opt, fsdp_opt, titan_opt = "adamw", "adamw-fused", "adamw-fused"
    if job.optimizer is not None:
        full_opts, peft_opts, ds_opt, fsdp_opt, titan_opt = _forced(job.optimizer)
    # a hybrid Mamba2 model's training is estimated for full fine-tuning in half or fp32 precision on one GPU's
    # whole sequences (spec/checks.py ``_hybrid_train_problems``): the other setups are not searched
    hybrid = m.mamba is not None
    if hybrid:
        precs = [p for p in precs if not p.startswith("fp8")]
    # a parallel hybrid (MambaSpec.parallel_attention) trains without autocast only: a mixed precision is searched
    # under DeepSpeed alone, whose half module runs no autocast (spec/checks.py ``_parallel_hybrid_problems``)
    no_autocast = m.mamba is not None and m.mamba.parallel_attention
    for tp, pp in parallel_shapes(m, n, gpus_per_node):
        if hybrid and (tp, pp) != (1, 1):
            continue
        dp = n // (tp * pp)
        if batch % dp:
            continue
        per_rank = batch // dp
        mbs_list = _micro_batches(per_rank, job.max_micro_batch)

        def make(mbs_list: list[int] = mbs_list, per_rank: int = per_rank, tp: int = tp, pp: int = pp,
                 **kw: Any) -> Iterator[TrainSetup]:
            for mbs in mbs_list:
                if not _schedule_takes(kw.get("pp_schedule", "1f1b"), pp, per_rank // mbs):
                    continue
                yield TrainSetup(micro_batch_size=mbs, grad_accum_steps=per_rank // mbs, seq_len=seq, num_gpus=n,
                                 tp=tp, pp=pp, gpus_per_node=gpus_per_node, lora_rank=job.lora_rank,
                                 lora_alpha=job.lora_alpha, **kw)

        ckpts = ("none", "full")
        if tp == 1 and pp == 1:
            if job.full_ft_allowed():
                for prec in precs:
                    autocast = no_autocast and prec.endswith("-mixed")
                    for a in attn:
                        for ck in ckpts:
                            for opt in () if autocast else full_opts:
                                yield from make(framework="hf-trainer", precision=prec, optimizer=opt,
                                                checkpointing=ck, attention=a)
                            for z in (1, 2, 3) if ds_opt else ():
                                offloads = ("none", "optimizer") + (("optimizer+params",) if z == 3 else ())
                                for off in offloads:
                                    yield from make(framework="deepspeed", precision=prec, optimizer=ds_opt,
                                                    checkpointing=ck, attention=a, zero_stage=z, offload=off)
                            # bf16-true under accelerate's FSDP is upcast to fp32 parameters (spec/load.py
                            # fsdp_upcast_for): bf16-mixed's setup, already searched
                            for fs, off in (("full_shard", "none"), ("shard_grad_op", "none"),
                                            ("full_shard", "optimizer+params")) if (fsdp_opt and not autocast
                                                                                    and prec != "bf16-true") else ():
                                yield from make(framework="accelerate", precision=prec, optimizer=fsdp_opt,
                                                checkpointing=ck, attention=a, fsdp=fs, offload=off)
            for method in () if hybrid else job.peft_methods():
                for prec in half_mixed:
                    for a in attn:
                        for ck in ckpts:
                            for opt in peft_opts:
                                quant = "nf4-dq" if method == "qlora" else "none"
                                yield from make(framework="hf-trainer", precision=prec, optimizer=opt,
                                                checkpointing=ck, attention=a, peft=method, quantization=quant)
                            if n > 1 and peft_opts:
                                yield from _peft_sharded(make, method, prec, a, ck, ds_opt, fsdp_opt)
        elif job.full_ft_allowed() and titan_opt:
            for prec in precs:
                if prec == "bf16-true":
                    continue  # torchtitan trains with fp32 sharded parameters (mixed_precision_param bfloat16)
                for ck in ckpts:
                    for sched in _pp_schedules(m, pp, split=tp == 1 and ck == "none"):
                        yield from make(framework="torchtitan", precision=prec, optimizer=titan_opt, checkpointing=ck,
                                        attention="sdpa", fsdp="full_shard" if dp > 1 else "none", **sched)


def _pp_schedules(m: ModelSpec, pp: int, split: bool = True) -> list[dict[str, Any]]:
    """The pipeline schedules searched at ``pp`` stages, as setup keywords (none for the default 1F1B, so its
    setups and documents are those of a plan that searched no schedule): interleaved 1F1B with v = 2 chunks
    per rank where pp x 2 chunks fit in the layers, and v = 4 where the layers split evenly into pp x 4; with
    ``split`` (no tensor parallelism, no checkpointing: what the estimator models for them, spec/load.py
    ``_split_backward_problems``) and a model whose held gradients are modelled, the split-backward schedules."""
    if pp == 1 or m.vision is not None:  # a vision tower's activations are modelled under 1F1B only (spec/load.py)
        return [{}]
    out: list[dict[str, Any]] = [{}]
    for v in (2, 4):
        if pp * v <= m.num_layers and (v == 2 or m.num_layers % (pp * v) == 0):
            out.append({"pp_schedule": "interleaved-1f1b", "pp_virtual_stages": v})
    if split and pp * 2 <= m.num_layers and not split_backward_unmodelled_params(m):
        # the split-backward schedules at 2 chunks per rank (ZB-V and DualPipeV take exactly 2): their W passes fill
        # most of the bubble (steptime/pipeline.py), their saved activations are walked in torch's order
        # (facts/pipeline_schedules.py)
        out.extend({"pp_schedule": name, "pp_virtual_stages": 2}
                   for name in ("interleaved-zero-bubble", "zbv-zero-bubble", "dualpipev"))
    return out


def _schedule_takes(schedule: str, pp: int, micro_batches: int) -> bool:
    """Whether torch's schedule class accepts ``micro_batches`` per step: ScheduleInterleaved1F1B and
    ScheduleInterleavedZeroBubble raise unless they are a multiple of their rounds (``interleaved_rounds``),
    ScheduleDualPipeV unless they are at least its 2 pp stages (spec/load.py checks the same for a scenario)."""
    row = pipeline_schedule(schedule)
    if row.name == "dualpipev":
        return micro_batches >= 2 * pp
    if row.style != "loop" or row.in_flight not in ("interleaved", "split"):
        return True
    return micro_batches % interleaved_rounds(pp, micro_batches)[0] == 0


# The sharding and offload rungs for adapter training, as for full fine-tuning: PEFT documents LoRA and QLoRA
# under DeepSpeed ZeRO-3 (with ZeRO-Infinity CPU offload) and under FSDP (with CPU offload, the FSDP-QLoRA
# recipe), peft docs/source/accelerate/deepspeed.md and fsdp.md (v0.13); a 4-bit base is then stored in the
# float dtype (bnb_4bit_quant_storage) so that it shards, which the estimator models (analytic/precision.py).
_PEFT_ZERO: tuple[tuple[int, str], ...] = ((1, "none"), (2, "none"), (3, "none"), (1, "optimizer"), (2, "optimizer"),
                                           (3, "optimizer"), (3, "optimizer+params"))
_PEFT_FSDP: tuple[tuple[str, str], ...] = (("full_shard", "none"), ("shard_grad_op", "none"),
                                           ("full_shard", "optimizer+params"))


def _peft_sharded(make: Any, method: str, prec: str, attention: str, ck: str, ds_opt: str = "adamw",
                  fsdp_opt: str = "adamw-fused") -> Iterator[TrainSetup]:
    """LoRA/QLoRA setups sharded over more than one GPU: DeepSpeed ZeRO-1/2/3 (optimizer offload, and
    parameters too at stage 3) and FSDP full_shard / shard_grad_op (CPU offload with full_shard only);
    an empty optimizer name leaves that framework out (``_forced``)."""
    quant = "nf4-dq" if method == "qlora" else "none"
    for fs, off in _PEFT_FSDP if fsdp_opt else ():
        yield from make(framework="accelerate", precision=prec, optimizer=fsdp_opt, checkpointing=ck,
                        attention=attention, fsdp=fs, offload=off, peft=method, quantization=quant)
    for z, off in _PEFT_ZERO if ds_opt else ():
        yield from make(framework="deepspeed", precision=prec, optimizer=ds_opt, checkpointing=ck,
                        attention=attention, zero_stage=z, offload=off, peft=method, quantization=quant)


def _forced(name: str) -> tuple[tuple[str, ...], tuple[str, ...], str, str, str]:
    """The search's optimizers when the user names one (``TrainJob.optimizer``): the Trainer's rows
    (full, PEFT: not for a row whose layout covers the hidden matrices, which adapters do not have),
    DeepSpeed (only AdamW, which its engine runs as FusedAdam; its config names no other row here),
    FSDP through Accelerate (a row the Trainer names) and torchtitan (a row with a torchtitan name);
    "" leaves that framework out."""
    f = optimizer_facts(name)
    hidden = f.subset is not None and f.subset.params == "hidden_matrices"
    return ((name,), () if hidden else (name,), name if name == "adamw" else "",
            name if f.hf_trainer_optim else "", name if f.torchtitan else "")


def batch_split_problems(m: ModelSpec, counts: Sequence[int], job: TrainJob, gpus_per_node: int) -> list[str]:
    """GPU counts for which no (tp, pp) shape divides the global batch (said in the plan)."""
    batch = job.sequences()
    out = []
    for n in counts:
        if not any(batch % (n // (tp * pp)) == 0 for tp, pp in parallel_shapes(m, n, gpus_per_node)):
            out.append(f"{n} GPUs: the global batch of {batch} sequences cannot be split evenly over any "
                       "data-parallel degree these GPUs allow")
    return out


def serve_candidates(m: ModelSpec, gpu: GpuSpec, n: int, job: ServeJob, margin: float,
                     gpus_per_node: int = 8) -> Iterator[ServeSetup]:
    """vLLM deployments on ``n`` GPUs: each tensor-parallel degree, replicas on the rest."""
    flops = gpu.dense_flops_per_s
    dtype = "bf16" if flops.get("bf16") else "fp16"
    quants = ["none"]
    kvs = ["auto"]
    if job.allow_quantization:
        if flops.get("fp8"):
            quants.append("fp8")
            kvs.append("fp8")
        quants.append("awq-4bit")
    for tp in divisors(n, gpus_per_node):
        if not tp_ok(m, tp):
            continue
        replicas = n // tp
        per_replica = -(-job.concurrency // replicas)
        for q in quants:
            for kv in kvs:
                # vLLM's AWQ kernels run in float16 ("half" is the recommended dtype for AWQ in EngineArgs)
                yield ServeSetup(num_gpus=n, tp=tp, max_model_len=job.max_model_len, max_num_seqs=per_replica,
                                 dtype="fp16" if q == "awq-4bit" else dtype, quantization=q, kv_cache_dtype=kv,
                                 gpu_memory_utilization=round(1.0 - margin, 4),
                                 max_num_batched_tokens=job.max_num_batched_tokens, gpus_per_node=gpus_per_node)
