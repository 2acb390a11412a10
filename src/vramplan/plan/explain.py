"""The answer explains itself: the decision tree, rung by rung, and what would fit instead.

The rungs follow the seed article's memory decision tree (reduce precision -> checkpoint
activations -> shrink optimizer states (8-bit or ZeRO-1/2) -> ZeRO-3 -> offload), each tried on
its own with the smallest micro-batch (1 sequence, accumulation making up the global batch), so
that a rung fails only because of what the next rung removes.  Each rung is one full estimate:
how much memory it needs, by how much it misses the usable memory, and which parts are largest.

When nothing fits, three searches over the estimator say what would, with the setups of the
last rungs (ZeRO-3, with and without offload; QLoRA when PEFT is allowed): the fewest GPUs of
this type (keeping the global batch), the smallest larger GPU in the catalog, and the longest
sequence that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vramplan.catalog.gpus import list_gpus
from vramplan.monotone import largest_true
from vramplan.plan.context import PlanContext, has_speed_figures
from vramplan.plan.fit import band_fits
from vramplan.plan.result import PlanResult, Rung, Suggestion
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.plan.space import ServeJob, TrainJob, divisors, precisions_for, tp_ok
from vramplan.report import Report
from vramplan.units import GiB

__all__ = ["explain_result", "train_ladder"]


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f} GiB"


def _largest(rep: Report, k: int = 2) -> list[tuple[str, int]]:
    parts = dict(rep.per_gpu.breakdown)
    managed = rep.per_gpu.outside_allocator.get("managed", 0)
    if managed:
        parts["optimizer_states (paged)"] = managed
    return sorted(((p, b) for p, b in parts.items() if b), key=lambda x: -x[1])[:k]


def _rung(ctx: PlanContext, step: int, title: str, s: TrainSetup | ServeSetup, next_hint: str,
          need_concurrency: int = 0) -> Rung:
    rep = ctx.estimate(s)
    used = rep.per_gpu.device_used_bytes
    usable = ctx.usable
    largest = _largest(rep)
    parts = ", ".join(f"{p} {_gib(b)}" for p, b in largest)
    if isinstance(s, ServeSetup):
        conc = rep.serve.max_concurrency
        fits = band_fits(rep, need_concurrency)
        over = 0 if fits else max(0, used - rep.per_gpu.capacity_bytes)
        why = (f"KV cache holds {conc} sequences of {s.max_model_len} tokens per replica, "
               f"{need_concurrency} needed" + ("" if fits else f"; {next_hint}"))
    else:
        fits = used <= usable and band_fits(rep)
        over = max(0, used - usable)
        high = rep.per_gpu.device_used_bytes_high or used
        if fits:
            why = f"fits: {_gib(used)} of {_gib(usable)} usable ({_gib(usable - used)} to spare)"
        elif used <= usable:  # the point fits, its band does not (report/band.py)
            over = high - rep.per_gpu.capacity_bytes
            why = (f"may not fit: {_gib(used)} of {_gib(usable)} usable, but the band's high bound {_gib(high)} "
                   f"exceeds the {_gib(rep.per_gpu.capacity_bytes)} capacity")
            if next_hint:
                why += f" -> {next_hint}"
        else:
            why = f"needs {_gib(used)}, {_gib(usable)} usable: over by {_gib(over)}; largest: {parts}"
            if next_hint:
                why += f" -> {next_hint}"
    return Rung(step=step, title=title, label=s.label(), fits=fits, device_used_bytes=used, usable_bytes=usable,
                over_bytes=over, largest_parts=largest, host_offloaded_bytes_per_gpu=rep.host.offloaded_bytes, why=why)


def _train_rungs(ctx: PlanContext, job: TrainJob, n: int, gpus_per_node: int) -> list[tuple[str, TrainSetup, str]]:
    batch = job.sequences()
    if batch % n:
        return []
    precs = precisions_for(ctx.gpu, False)
    half = next((p for p in precs if p.endswith("-mixed")), "fp32")

    def mk(**kw: Any) -> TrainSetup:
        return TrainSetup(num_gpus=n, micro_batch_size=1, grad_accum_steps=batch // n, seq_len=job.seq_len,
                          gpus_per_node=gpus_per_node, lora_rank=job.lora_rank, lora_alpha=job.lora_alpha, **kw)

    naive = ("naive: fp32, AdamW, plain data parallelism" if n > 1 else "naive: fp32, AdamW, one GPU",
             mk(framework="hf-trainer", precision="fp32"), "reduce precision")
    if not job.full_ft_allowed():
        # full fine-tuning is not asked for: show its cost once, then the allowed PEFT rungs
        return [(naive[0] + " (full fine-tuning, for scale)", naive[1], "train adapters (PEFT)"),
                *_peft_rungs(mk, job, half)]
    out: list[tuple[str, TrainSetup, str]] = [
        naive,
        (f"reduce precision: {half}", mk(framework="hf-trainer", precision=half), "checkpoint activations"),
        ("gradient checkpointing", mk(framework="hf-trainer", precision=half, checkpointing="full"),
         "shrink the optimizer states"),
        ("8-bit AdamW states", mk(framework="hf-trainer", precision=half, checkpointing="full", optimizer="adamw-8bit"),
         "shard the states over the GPUs" if n > 1 else "offload the optimizer to the CPU"),
    ]
    if n > 1:
        out.append(("ZeRO-2: shard optimizer states and gradients",
                    mk(framework="deepspeed", precision=half, checkpointing="full", optimizer="adamw", zero_stage=2),
                    "shard the parameters too"))
        out.append(("ZeRO-3: shard parameters, gradients and optimizer states",
                    mk(framework="deepspeed", precision=half, checkpointing="full", optimizer="adamw", zero_stage=3),
                    "offload to the CPU"))
    z = 3 if n > 1 else 2
    out.append(("CPU offload of the optimizer (ZeRO-Offload)",
                mk(framework="deepspeed", precision=half, checkpointing="full", optimizer="adamw", zero_stage=z,
                   offload="optimizer"), "offload the parameters too"))
    out.append(("CPU offload of parameters too (ZeRO-Infinity)",
                mk(framework="deepspeed", precision=half, checkpointing="full", optimizer="adamw", zero_stage=3,
                   offload="optimizer+params"), "train adapters instead (PEFT)" if job.peft_methods() else ""))
    out.extend(_peft_rungs(mk, job, half))
    return out


def _peft_rungs(mk: Callable[..., TrainSetup], job: TrainJob, half: str) -> list[tuple[str, TrainSetup, str]]:
    out: list[tuple[str, TrainSetup, str]] = []
    if "lora" in job.peft_methods():
        out.append(("LoRA adapters on a frozen base",
                    mk(framework="hf-trainer", precision=half, checkpointing="full", peft="lora"),
                    "quantize the base" if "qlora" in job.peft_methods() else ""))
    if "qlora" in job.peft_methods():
        out.append(("QLoRA: 4-bit base + LoRA, paged 8-bit AdamW",
                    mk(framework="hf-trainer", precision=half, checkpointing="full", peft="qlora",
                       quantization="nf4-dq", optimizer="paged-adamw-8bit"), ""))
    return out


def train_ladder(ctx: PlanContext, job: TrainJob, n: int, gpus_per_node: int = 8) -> list[Rung]:
    """The decision tree's rungs on ``n`` GPUs, up to the first that fits."""
    rungs: list[Rung] = []
    for i, (title, s, hint) in enumerate(_train_rungs(ctx, job, n, gpus_per_node), start=1):
        r = _rung(ctx, i, title, s, hint)
        if rungs and not r.fits and r.device_used_bytes >= rungs[-1].device_used_bytes:
            # e.g. autocast mixed precision keeps the fp32 weights and adds half copies: no saving
            more = r.device_used_bytes - rungs[-1].device_used_bytes
            r = r.model_copy(update={"why": r.why + f" (this rung alone saves nothing here: +{_gib(more)} "
                                                   "over the previous one)"})
        rungs.append(r)
        if r.fits:
            break
    return rungs


def _frugal(ctx: PlanContext, job: TrainJob, n: int, gpus_per_node: int, seq_len: int | None = None,
            batch: int | None = None) -> list[TrainSetup]:
    """The last rungs' setups: the least memory the search space offers on ``n`` GPUs."""
    b = batch if batch is not None else job.sequences()
    precs = precisions_for(ctx.gpu, False)
    half = next((p for p in precs if p.endswith("-mixed")), "fp32")
    out: list[TrainSetup] = []
    if job.full_ft_allowed():
        # tensor parallelism inside a node splits the activations too (torchtitan, FSDP over the rest)
        for tp in divisors(n, gpus_per_node)[1:]:
            if tp_ok(ctx.model, tp) and b % (n // tp) == 0:
                out.append(TrainSetup(framework="torchtitan", num_gpus=n, tp=tp, micro_batch_size=1,
                                      grad_accum_steps=b // (n // tp), seq_len=seq_len or job.seq_len,
                                      gpus_per_node=gpus_per_node, precision=half, checkpointing="full",
                                      fsdp="full_shard" if n // tp > 1 else "none"))
    if b % n:
        return out
    base: dict[str, Any] = {
        "num_gpus": n, "micro_batch_size": 1, "grad_accum_steps": b // n, "seq_len": seq_len or job.seq_len,
        "gpus_per_node": gpus_per_node, "precision": half, "checkpointing": "full", "lora_rank": job.lora_rank,
        "lora_alpha": job.lora_alpha}
    if job.full_ft_allowed():
        z = 3 if n > 1 else 2
        out.append(TrainSetup(framework="deepspeed", optimizer="adamw", zero_stage=z, **base))
        out.append(TrainSetup(framework="deepspeed", optimizer="adamw", zero_stage=z, offload="optimizer",
                              **base))
        out.append(TrainSetup(framework="deepspeed", optimizer="adamw", zero_stage=3, offload="optimizer+params",
                              **base))
        # FSDP's CPU offload, which the search also tries: without ZeRO-3's reduce bucket and per-parameter gradient
        # copies it can need less than DeepSpeed's last rung (on one GPU a 70B model's 1B-element head makes
        # 6 GB of them)
        out.append(TrainSetup(framework="accelerate", optimizer="adamw-fused", fsdp="full_shard",
                              offload="optimizer+params", **base))
    if "lora" in job.peft_methods():
        out.append(TrainSetup(framework="hf-trainer", peft="lora", optimizer="paged-adamw-8bit", **base))
    if "qlora" in job.peft_methods():
        out.append(TrainSetup(framework="hf-trainer", peft="qlora", quantization="nf4-dq",
                              optimizer="paged-adamw-8bit", **base))
    if n > 1:
        # the adapter's last rung on several GPUs: ZeRO-3 with the optimizer and the parameters on the CPU
        for method in job.peft_methods():
            out.append(TrainSetup(framework="deepspeed", optimizer="adamw", zero_stage=3, offload="optimizer+params",
                                  peft=method, quantization="nf4-dq" if method == "qlora" else "none", **base))
    return out


def _first_fit(ctx: PlanContext, setups: Sequence[TrainSetup]) -> tuple[TrainSetup, Report] | None:
    for s in setups:
        if ctx.lower_bound(s) > ctx.usable:
            continue
        rep = ctx.estimate(s)
        # the search's own rule (plan/fit.py): within the margin and the band's verdict FITS; the point
        # estimate alone suggested setups the planner then refused
        if rep.per_gpu.device_used_bytes <= ctx.usable and band_fits(rep):
            return s, rep
    return None



def _train_suggestions(ctx: PlanContext, job: TrainJob, n: int, gpus_per_node: int) -> list[Suggestion]:
    out: list[Suggestion] = []
    batch = job.sequences()
    # more GPUs of this type, keeping the global batch (each data-parallel rank gets whole sequences;
    # tensor parallelism inside a node multiplies the count)
    tps = [t for t in divisors(gpus_per_node) if tp_ok(ctx.model, t)]
    counts = sorted({t * d for t in tps for d in divisors(batch) if t * d > n})

    def fits_at(k: int) -> bool:
        return _first_fit(ctx, _frugal(ctx, job, k, gpus_per_node)) is not None

    k = next((c for c in counts if fits_at(c)), None)  # counts are few: scan, so the fewest is exact
    if k is not None:
        hit = _first_fit(ctx, _frugal(ctx, job, k, gpus_per_node))
        assert hit is not None
        out.append(Suggestion(kind="more_gpus", value=k, label=hit[0].label(), scenario=ctx.document(hit[0]),
                              text=f"{k} x {ctx.gpu.name} fit: {hit[0].label()} uses "
                                   f"{_gib(hit[1].per_gpu.device_used_bytes)} of {_gib(ctx.usable)} per GPU"))
    else:
        out.append(Suggestion(kind="more_gpus", value=None,
                              text=f"no count up to {max(counts, default=n)} GPUs fits the last rungs (ZeRO-3, "
                                   f"offload, tensor parallelism up to {max(tps)}) with a global batch of {batch}"))
    # a larger GPU from the catalog, same count
    bigger = sorted((g for g in list_gpus() if g.total_memory_bytes > ctx.gpu.total_memory_bytes
                     and has_speed_figures(g) and g.vendor == ctx.gpu.vendor), key=lambda g: g.total_memory_bytes)
    for g in bigger:
        c2 = ctx.with_gpu(g)
        hit = _first_fit(c2, _frugal(c2, job, n, gpus_per_node))
        if hit is not None:
            out.append(Suggestion(kind="larger_gpu", value=g.name, label=hit[0].label(), scenario=c2.document(hit[0]),
                                  text=f"{n} x {g.name} ({_gib(g.total_memory_bytes)}) fit: {hit[0].label()} uses "
                                       f"{_gib(hit[1].per_gpu.device_used_bytes)} of {_gib(c2.usable)} per GPU"))
            break
    # the longest sequence that fits on these GPUs
    if batch % n == 0:
        def seq_fits(sl: int) -> bool:
            return _first_fit(ctx, _frugal(ctx, job, n, gpus_per_node, seq_len=sl)) is not None

        best = largest_true(1, job.seq_len - 1, seq_fits)
        if best is not None:
            hit = _first_fit(ctx, _frugal(ctx, job, n, gpus_per_node, seq_len=best))
            assert hit is not None
            out.append(Suggestion(kind="shorter_sequence", value=best, label=hit[0].label(),
                                  scenario=ctx.document(hit[0]),
                                  text=f"sequences of up to {best:,} tokens fit on {n} x {ctx.gpu.name} "
                                       f"({hit[0].label()})"))
    if not job.peft_methods():
        alt = TrainJob(seq_len=job.seq_len, global_batch=batch, peft="only", lora_rank=job.lora_rank,
                       lora_alpha=job.lora_alpha)
        hit = _first_fit(ctx, _frugal(ctx, alt, n, gpus_per_node))
        if hit is not None:
            out.append(Suggestion(kind="peft", value=hit[0].peft, label=hit[0].label(), scenario=ctx.document(hit[0]),
                                  text=f"with PEFT allowed (--peft allow), {hit[0].label()} fits: "
                                       f"{_gib(hit[1].per_gpu.device_used_bytes)} per GPU"))
    return out


def _serve_base(ctx: PlanContext, job: ServeJob, tp: int, replicas: int, quant: str = "none",
                kv: str = "auto", max_len: int | None = None) -> ServeSetup:
    dtype = "bf16" if ctx.gpu.dense_flops_per_s.get("bf16") else "fp16"
    return ServeSetup(num_gpus=tp * replicas, tp=tp, max_model_len=max_len or job.max_model_len,
                      max_num_seqs=-(-job.concurrency // replicas), dtype=dtype, quantization=quant,
                      kv_cache_dtype=kv, gpu_memory_utilization=round(1 - ctx.margin, 4),
                      max_num_batched_tokens=job.max_num_batched_tokens)


def _serve_ok(ctx: PlanContext, s: ServeSetup) -> tuple[bool, Report]:
    rep = ctx.estimate(s)
    return band_fits(rep, s.max_num_seqs), rep


def _serve_ladder(ctx: PlanContext, job: ServeJob, n: int, gpus_per_node: int) -> list[Rung]:
    rungs: list[Rung] = []
    tps = [t for t in divisors(n, gpus_per_node) if tp_ok(ctx.model, t)]
    for i, tp in enumerate(tps, start=1):
        s = _serve_base(ctx, job, tp, n // tp)
        title = f"tensor parallel {tp}" + (f", {n // tp} replicas" if n // tp > 1 else "")
        r = _rung(ctx, i, title, s, "more GPUs per replica", s.max_num_seqs)
        rungs.append(r)
    return rungs


def _serve_suggestions(ctx: PlanContext, job: ServeJob, n: int, gpus_per_node: int) -> list[Suggestion]:
    out: list[Suggestion] = []
    best: tuple[int, int, int] | None = None  # (gpus, tp, replicas)
    for tp in [t for t in divisors(gpus_per_node) if tp_ok(ctx.model, t)]:
        one = _serve_base(ctx, job, tp, 1)
        ok, rep = _serve_ok(ctx, one)
        cap = rep.serve.max_concurrency
        if cap < 1:
            continue
        replicas = -(-job.concurrency // cap)
        while True:
            s = _serve_base(ctx, job, tp, replicas)
            ok, rep = _serve_ok(ctx, s)
            if ok or replicas > job.concurrency:
                break
            replicas += 1
        if ok and (best is None or tp * replicas < best[0]):
            best = (tp * replicas, tp, replicas)
    if best is not None:
        bs = _serve_base(ctx, job, best[1], best[2])
        out.append(Suggestion(kind="more_gpus", value=best[0], label=bs.label(), scenario=ctx.document(bs),
                              text=f"{best[0]} x {ctx.gpu.name} serve {job.concurrency} sequences of "
                                   f"{job.max_model_len} tokens: TP {best[1]} x {best[2]} replicas"))
    tp1 = max([t for t in divisors(n, gpus_per_node) if tp_ok(ctx.model, t)], default=1)
    s = _serve_base(ctx, job, tp1, n // tp1)
    ok, rep = _serve_ok(ctx, s)
    if rep.serve.num_gpu_blocks > 0:
        tokens = rep.serve.num_gpu_blocks * s.block_size // max(1, s.max_num_seqs)
        length = tokens // s.block_size * s.block_size
        if 0 < length < job.max_model_len:
            short = _serve_base(ctx, job, tp1, n // tp1, max_len=length)
            out.append(Suggestion(kind="shorter_sequence", value=length, label=short.label(),
                                  scenario=ctx.document(short),
                                  text=f"with TP {tp1} on {n} GPUs, max_model_len up to {length:,} holds "
                                       f"{s.max_num_seqs} sequences per replica"))
    for g in sorted((g for g in list_gpus() if g.total_memory_bytes > ctx.gpu.total_memory_bytes
                     and has_speed_figures(g) and g.vendor == ctx.gpu.vendor), key=lambda g: g.total_memory_bytes):
        c2 = ctx.with_gpu(g)
        big = _serve_base(c2, job, tp1, n // tp1)
        ok2, rep2 = _serve_ok(c2, big)
        if ok2:
            out.append(Suggestion(kind="larger_gpu", value=g.name, label=big.label(), scenario=c2.document(big),
                                  text=f"{n} x {g.name}: KV cache holds {rep2.serve.max_concurrency} sequences "
                                       f"per replica"))
            break
    if not job.allow_quantization:
        for q, kv in (("none", "fp8"), ("fp8", "fp8"), ("awq-4bit", "auto")):
            if q == "fp8" and not ctx.gpu.dense_flops_per_s.get("fp8"):
                continue
            if kv == "fp8" and not ctx.gpu.dense_flops_per_s.get("fp8"):
                continue
            qs = _serve_base(ctx, job, tp1, n // tp1, quant=q, kv=kv)
            ok3, rep3 = _serve_ok(ctx, qs)
            if ok3:
                out.append(Suggestion(kind="quantization", value=f"{q}/{kv}", label=qs.label(), scenario=ctx.document(qs),
                                      text=f"with --allow-quantization: {qs.label()} holds "
                                           f"{rep3.serve.max_concurrency} sequences per replica"))
                break
    return out


def explain_result(ctx: PlanContext, job: TrainJob | ServeJob, counts: Sequence[int], result: PlanResult,
                   gpus_per_node: int) -> PlanResult:
    """Add the ladder, the explanation sentences and (when nothing fits) the suggestions."""
    n = result.chosen.setup["num_gpus"] if result.chosen else max(counts)
    if isinstance(job, TrainJob):
        ladder = train_ladder(ctx, job, n, gpus_per_node)
        suggestions = [] if result.chosen else _train_suggestions(ctx, job, n, gpus_per_node)
    else:
        ladder = _serve_ladder(ctx, job, n, gpus_per_node)
        suggestions = [] if result.chosen else _serve_suggestions(ctx, job, n, gpus_per_node)
    lines: list[str] = []
    c = result.chosen
    if c is not None:
        pg = c.report.per_gpu
        speed = (f"{c.step_time_s:,.2f} s per step, {c.tokens_per_s:,.0f} tokens/s" if c.kind == "train"
                 else f"{c.tokens_per_s:,.0f} generated tokens/s")
        if c.kind == "train":
            mem = (f"{_gib(pg.device_used_bytes)} of {_gib(c.usable_bytes)} usable per GPU "
                   f"({_gib(c.headroom_bytes)} headroom inside the {result.margin:.0%} margin)")
        else:
            mem = (f"{_gib(pg.device_used_bytes)} of {_gib(pg.capacity_bytes)} per GPU with vLLM given "
                   f"gpu_memory_utilization {1 - result.margin:.2f}; the KV cache holds "
                   f"{c.max_concurrency} sequences of {c.setup['max_model_len']} tokens per replica")
        lines.append(f"Chosen: {c.label} on {c.setup['num_gpus']} x {result.gpu}: {mem}, {speed}.")
        if c.host_offloaded_bytes_per_gpu:
            node = c.host_offloaded_bytes_per_gpu * min(int(c.setup["num_gpus"]), gpus_per_node)
            lines.append(f"It keeps {_gib(c.host_offloaded_bytes_per_gpu)} per GPU in host memory "
                         f"({_gib(node)} per node): check the nodes' RAM (--host-memory-gib checks it).")
        failing = [r for r in ladder if not r.fits]
        if failing and c.kind == "train":
            lines.append("Cheaper rungs of the decision tree do not fit: " + "; ".join(
                f"{r.title} is over by {_gib(r.over_bytes)}" for r in failing) + ".")
    else:
        lines.append(f"Nothing in the search space fits {', '.join(map(str, counts))} x {result.gpu} with a "
                     f"{result.margin:.0%} margin.")
    return result.model_copy(update={"ladder": ladder, "suggestions": suggestions, "explanation": lines})
