"""The planner: the fastest setups that fit, by branch and bound over the estimator.

For each GPU count, every candidate of the search space (``space.py``) is timed by the step-time
model (cheap), then visited in order of predicted step time:

1. if a faster setup of the same *family* (same everything but the micro-batch split) already
   fits, it is skipped -- it cannot be its family's best;
2. if the lower bound of its memory (``bound.py``: weights + optimizer states + masters + fixed
   overheads, provably <= the estimate) exceeds the usable memory, it is rejected; so is it when
   the steady step's peak moment with the bytes outside the allocator does
   (``engine.train_step_floor_bytes``: also never above the estimate, at about a third of its cost);
3. otherwise the analytic engine estimates it, first with the fast packed reserved bytes, then,
   if that fits, with the allocator replay; it fits when ``device_used <= (1 - margin) x capacity``
   and its verdict is ``FITS`` (the band's high bound within the capacity: ``fit.py``).

The walk of a GPU count stops once ``top`` families fit, or once it has found its count's best and
``top`` setups found over all the counts walked so far rank before the candidate (the answer keeps
the ``top`` fastest over every count and the best of each count): every remaining candidate has a
predicted step time at least as long, so the ranking of the answer is exact with respect to the
step-time model (``exhaustive=True`` estimates everything instead; tests check both agree).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.plan.context import PlanContext, make_context, micro_batch_key
from vramplan.plan.fit import DEFAULT_MARGIN, band_fits
from vramplan.plan.result import GpuCountBest, PlanResult, RankedSetup, SearchStats, Suggestion
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.plan.space import ServeJob, TrainJob, batch_split_problems, serve_candidates, train_candidates
from vramplan.plan.steptime import (
    DEFAULT_ASSUMPTIONS,
    DecodeTime,
    PerfAssumptions,
    StepTime,
    decode_step_time,
)
from vramplan.report import Report
from vramplan.serve.mamba_pages import mixer_name
from vramplan.units import GiB

__all__ = ["DEFAULT_TOP", "parse_gpu_counts", "plan"]

DEFAULT_TOP = 5
MAX_GPUS = 100_000


@dataclass
class _Stats:
    candidates: int = 0
    bound_rejected: int = 0
    estimated: int = 0
    estimated_fit: int = 0
    pruned: int = 0
    host_rejected: int = 0
    # setups the estimator refuses for this model (e.g. FSDP for an encoder-decoder model): skipped, counted, and
    # the first refusal kept so that the plan says why (and raises it when every setup was refused)
    refused: int = 0
    first_refusal: ScenarioError | None = None

    def refuse(self, e: ScenarioError) -> None:
        self.refused += 1
        self.first_refusal = self.first_refusal or e


@dataclass
class _Found:
    setup: TrainSetup | ServeSetup
    time: StepTime | DecodeTime
    report: Report


def parse_gpu_counts(value: int | str | Sequence[int]) -> list[int]:
    """``8``, ``"8"``, ``"1-8"`` (every count in the range), ``"2,4,8"`` or a list -> sorted counts."""
    counts: list[int] = []
    try:
        if isinstance(value, int):
            counts = [value]
        elif isinstance(value, str):
            for part in value.split(","):
                part = part.strip()
                if "-" in part:
                    lo, hi = (int(x) for x in part.split("-", 1))
                    counts.extend(range(lo, hi + 1))
                elif part:
                    counts.append(int(part))
        else:
            counts = [int(x) for x in value]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or max(counts) > MAX_GPUS:
        raise ScenarioError([Problem("--num-gpus", f"{value!r} is not a GPU count, range or list",
                                     "give e.g. 8, 1-8 or 2,4,8 (each between 1 and 100,000)")])
    return sorted(set(counts))


def _host_ok(report: Report, s: TrainSetup, host_limit_bytes: int | None) -> bool:
    if host_limit_bytes is None or not report.host.offloaded_bytes:
        return True
    return report.host.offloaded_bytes * min(s.num_gpus, s.gpus_per_node) <= host_limit_bytes


def _rank_key(t: StepTime, s: TrainSetup) -> tuple[float, int]:
    """The order of the walk and of the answer: shorter predicted step first, then the larger micro-batch."""
    return (t.total_s, -s.micro_batch_size)


def _walk_train(ctx: PlanContext, setups: list[TrainSetup], top: int, st: _Stats, exhaustive: bool,
                host_limit_bytes: int | None, ahead: list[tuple[float, int]] | None = None) -> list[_Found]:
    """The fitting setups of one GPU count, fastest first, at most ``top`` families.

    ``ahead``: the rank keys of the setups found at the counts walked before (grown with this count's): once this
    count has its best and ``top`` of them rank strictly before a candidate, neither it nor any after it can enter
    the answer (the ``top`` fastest over all counts, and each count's best), so the walk stops there."""
    timed = [(ctx.step_time(s), s) for s in setups]
    st.candidates += len(timed)
    timed.sort(key=lambda x: _rank_key(*x))
    # the smallest micro-batch of each split of the same strategy (``micro_batch_key``): its step floor bounds the
    # others' from below, so one floor above the memory rejects the whole split (the walk meets the larger
    # micro-batches first: they are faster)
    smallest: dict[tuple[object, ...], TrainSetup] = {}
    split: dict[int, tuple[object, ...]] = {}  # each setup's key, by the setup's identity (``setups`` holds them)
    fields: dict[int, tuple[Any, tuple[tuple[str, str], ...]]] = {}
    for s in setups:
        k = split[id(s)] = micro_batch_key(s, fields)
        if k not in smallest or s.train.micro_batch_size < smallest[k].train.micro_batch_size:
            smallest[k] = s
    usable = ctx.usable
    found: list[_Found] = []
    families: set[tuple[object, ...]] = set()
    ahead = [] if ahead is None else ahead
    for i, (t, s) in enumerate(timed):
        key = _rank_key(t, s)
        if not exhaustive and (len(found) >= top or (found and sum(k < key for k in ahead) >= top)):
            st.pruned += len(timed) - i
            break
        fam = s.family()
        if fam in families and not exhaustive:
            st.pruned += 1
            continue
        try:
            if ctx.lower_bound(s) > usable:
                st.bound_rejected += 1
                continue
            if not exhaustive and _split_cannot_fit(ctx, smallest[split[id(s)]], s):
                st.bound_rejected += 1
                continue
            floor = ctx.step_floor(s)
            if floor is not None and floor > usable:
                st.bound_rejected += 1
                continue
            rep = ctx.estimate(s, reserved="packed")
        except ScenarioError as e:
            st.refuse(e)
            continue
        st.estimated += 1
        # the band's high bound grows with the reserved bytes, so the packing's never exceeds the replay's
        if rep.per_gpu.device_used_bytes > usable or not band_fits(rep):
            continue
        # confirm with the allocator replay (slower; its reserved bytes are never below the packing's)
        rep = ctx.estimate(s)
        if rep.per_gpu.device_used_bytes > usable or not band_fits(rep):
            continue
        if not _host_ok(rep, s, host_limit_bytes):
            st.host_rejected += 1
            continue
        st.estimated_fit += 1
        if fam in families:
            continue
        try:
            # the fast path above builds the scenario without the estimator's checks; the document a setup is
            # shown with goes through all of them (``_ranked``), so a setup they refuse is not chosen
            ctx.verify(s, rep)
        except ScenarioError as e:
            st.refuse(e)
            continue
        families.add(fam)
        found.append(_Found(s, t, rep))
        ahead.append(key)
    return found


def _split_cannot_fit(ctx: PlanContext, least: TrainSetup, s: TrainSetup) -> bool:
    """Whether the step floor of ``least``, the smallest micro-batch of ``s``'s split, is already above the memory
    (then so is ``s``'s: ``micro_batch_key``).  A smaller micro-batch the estimator refuses screens nothing."""
    if least is s:
        return False
    try:
        low = ctx.step_floor(least)
    except ScenarioError:
        return False
    return low is not None and low > ctx.usable


def _walk_serve(ctx: PlanContext, setups: list[ServeSetup], top: int, st: _Stats, exhaustive: bool = False,
                ahead: list[tuple[float, int]] | None = None) -> list[_Found]:
    """The fitting deployments of one GPU count, most tokens per second first, at most ``top``.

    Branch and bound: a deployment's decode step time grows with the weights it reads (plan/steptime/serve.py), so
    the weights vLLM loads on one rank before anything else (``PlanContext.serve_weights_floor``, never above the
    report's) give each candidate an upper bound of its tokens per second, before any estimate.  The walk goes in
    the order of that bound and stops once this count has its best and ``top`` deployments (of this count, or of
    every count walked so far: ``ahead``, the merged answer's keys) rank strictly before the next bound; a
    deployment that provably leaves no KV cache for its requests (``PlanContext.serve_cannot_fit``) is not
    estimated, except the plan's first (so that what the estimator refuses of every deployment is the answer, not
    "nothing fits").  A deployment the estimator refuses is skipped and counted (``_Stats.refuse``), as in training.
    ``exhaustive``: estimate every deployment (no pruning, no screen)."""
    st.candidates += len(setups)
    ahead = [] if ahead is None else ahead
    bounded = []
    for i, s in enumerate(setups):
        try:
            floor, kv_tok = ctx.serve_weights_floor(s), ctx.kv_bytes_per_token(s)
        except ScenarioError as e:  # a format the checkpoint does not allow at this tp (block-wise fp8 slices)
            st.refuse(e)
            continue
        best = decode_step_time(s, ctx.facts, ctx.gpu, ctx.assumptions, floor, kv_tok, s.max_num_seqs)
        bounded.append(((-best.tokens_per_s, s.tp, i), floor, kv_tok, s))
    bounded.sort(key=lambda b: b[0])
    found: list[tuple[tuple[float, int, int], _Found]] = []
    for j, (bound, floor, kv_tok, s) in enumerate(bounded):
        if not exhaustive and found and min(k for k, _ in found)[:2] < bound[:2]:
            merged = (bound[0], s.num_gpus)
            if (sum(k[:2] < bound[:2] for k, _ in found) >= top
                    or sum(k < merged for k in ahead) >= top):
                st.pruned += len(bounded) - j
                break
        # the first deployment of the plan is always estimated, so that what the estimator refuses of every
        # deployment (a max_model_len beyond the model's positions) is raised as before, not screened into "nothing
        # fits"; the exhaustive walk estimates every deployment
        if not exhaustive and (st.estimated or st.refused) and ctx.serve_cannot_fit(s):
            st.bound_rejected += 1  # no KV cache for max_num_seqs requests is left beside the weights
            continue
        try:
            rep = ctx.estimate(s)
        except ScenarioError as e:
            st.refuse(e)
            continue
        st.estimated += 1
        if not band_fits(rep, s.max_num_seqs):
            continue
        st.estimated_fit += 1
        try:
            # the document a deployment is shown with goes through every check of ``resolve`` (``_ranked``): one it
            # refuses is not chosen
            ctx.verify(s, rep)
        except ScenarioError as e:
            st.refuse(e)
            continue
        t = decode_step_time(s, ctx.facts, ctx.gpu, ctx.assumptions, rep.per_gpu.breakdown.get("weights", 0),
                             kv_tok, s.max_num_seqs)
        found.append(((-t.tokens_per_s, s.tp, bound[2]), _Found(s, t, rep)))
        ahead.append((-t.tokens_per_s, s.num_gpus))
    # the order of the exhaustive walk: tokens per second, then the smaller tp, then the candidates' order
    found.sort(key=lambda f: f[0])
    return [f for _, f in found[:top]]


_FIELD_NAMES = {
    "framework": "framework", "num_gpus": "GPUs", "precision": "precision", "optimizer": "optimizer",
    "checkpointing": "checkpointing", "attention": "attention", "zero_stage": "ZeRO stage", "fsdp": "FSDP",
    "offload": "offload", "tp": "TP", "pp": "PP", "pp_schedule": "PP schedule",
    "pp_virtual_stages": "model chunks per rank", "peft": "PEFT", "quantization": "base weights",
    "micro_batch_size": "micro-batch", "dtype": "dtype", "kv_cache_dtype": "KV cache",
}


def _strategy(s: TrainSetup | ServeSetup) -> str:
    return s.label().split(",")[0]


def _trade(chosen: _Found, other: _Found, kind: str) -> str:
    a, b = chosen.setup.as_dict(), other.setup.as_dict()
    diffs = []
    if _strategy(chosen.setup) != _strategy(other.setup):
        diffs.append(f"{_strategy(other.setup)} instead of {_strategy(chosen.setup)}")
    skip = ("framework", "zero_stage", "fsdp", "tp", "pp", "pp_schedule", "pp_virtual_stages")  # in the strategy
    diffs += [f"{_FIELD_NAMES[k]} {b[k]} (vs {a[k]})" for k in _FIELD_NAMES
              if k in a and a[k] != b[k] and k not in skip]
    if kind == "train":
        dt = other.time.total_s / chosen.time.total_s - 1 if chosen.time.total_s else 0.0
        speed = f"{dt:+.0%} step time"
    else:
        dt = other.time.tokens_per_s / chosen.time.tokens_per_s - 1 if chosen.time.tokens_per_s else 0.0
        speed = f"{dt:+.0%} tokens/s"
    dh = (other.report.per_gpu.device_used_bytes - chosen.report.per_gpu.device_used_bytes) / GiB
    return f"{speed}, {dh:+.1f} GiB per GPU; " + ("; ".join(diffs) if diffs else "same setup")


def _ranked(ctx: PlanContext, f: _Found, rank: int, kind: str, trade: str) -> RankedSetup:
    rep = ctx.verify(f.setup, f.report)  # full validation of the document the user will get
    pg = rep.per_gpu
    # serving: the margin is inside gpu_memory_utilization, so the device's capacity is the limit
    usable = ctx.usable if kind == "train" else pg.capacity_bytes
    return RankedSetup(
        rank=rank, label=f.setup.label(), kind=kind, setup=f.setup.as_dict(), scenario=ctx.document(f.setup),
        step_time_s=f.time.total_s, tokens_per_s=f.time.tokens_per_s, step_time=f.time.as_dict(),
        device_used_bytes=pg.device_used_bytes, usable_bytes=usable, capacity_bytes=pg.capacity_bytes,
        headroom_bytes=usable - pg.device_used_bytes, host_offloaded_bytes_per_gpu=rep.host.offloaded_bytes,
        max_concurrency=rep.serve.max_concurrency, trade=trade, report=rep,
    )


def _margin_text(task: str, margin: float, ctx: PlanContext) -> str:
    if task == "train":
        return (f"safety margin {margin:.0%} of capacity: a setup fits when nvidia-smi's figure stays below "
                f"{ctx.usable / GiB:,.2f} of {ctx.gpu.total_memory_bytes / GiB:,.2f} GiB")
    return (f"safety margin {margin:.0%} of capacity: vLLM is given gpu_memory_utilization {1 - margin:.2f} and its "
            "KV cache must hold the concurrency at max_model_len")


def plan(model: str | dict[str, Any], gpu: str, num_gpus: int | str | Sequence[int], job: TrainJob | ServeJob,
         margin: float = DEFAULT_MARGIN, top: int = DEFAULT_TOP, assumptions: PerfAssumptions = DEFAULT_ASSUMPTIONS,
         gpus_per_node: int = 8, host_memory_gib: float | None = None, explain: bool = True,
         exhaustive: bool = False, preface_notes: Sequence[str] = (), offline: bool = False) -> PlanResult:
    """The fastest setups of ``job`` that fit ``num_gpus`` x ``gpu`` with ``margin`` of capacity to spare.

    ``num_gpus`` may be one count, a range ``"1-8"`` or a list; the answer ranks setups over all
    of them by predicted step time (training) or generated tokens per second (serving).
    ``host_memory_gib``: host RAM per node available for offload (None: not checked, but reported).
    ``preface_notes``: the caller's notes, first in the result's (a scenario file's fields the search replaced).
    ``offline``: resolve a Hub id from the local cache only (the scenario's ``offline``, as HF_HUB_OFFLINE=1 does).
    """
    t0 = time.perf_counter()
    counts = parse_gpu_counts(num_gpus)
    if top < 1:
        raise ScenarioError([Problem("--top", f"{top} is below 1", "show at least one setup")])
    if gpus_per_node < 1:
        raise ScenarioError([Problem("--gpus-per-node", f"{gpus_per_node} is below 1", "")])
    task = "train" if isinstance(job, TrainJob) else "serve"
    job_keys: dict[str, Any] = ({"train": {"seq_len": job.seq_len}} if isinstance(job, TrainJob)
                                else {"serve": {"max_model_len": job.max_model_len}})
    if isinstance(job, TrainJob) and job.torchtitan is not None:
        job_keys["software"] = {"torchtitan": job.torchtitan}
    if offline:
        job_keys["offline"] = True
    ctx = make_context(model, gpu, margin, assumptions, task, job_keys)
    if task == "serve" and ctx.model.mamba is not None:
        # the decode step time (plan/steptime/serve.py) reads every layer's KV cache and attends in every layer;
        # a hybrid model's mixers read a fixed state instead, which is not modelled there
        ms = ctx.model.mamba
        what = "a hybrid" if ctx.model.num_layers > len(ms.layers) or ms.parallel_attention else "a state-space"
        raise ScenarioError([Problem("--model", f"{ctx.model.name} has {len(ms.layers)} {mixer_name(ms.kind)} mixer "
                                     f"layers ({what} model): the decode step time of its mixers is not modelled, so "
                                     "serving setups are not ranked",
                                     "estimate each setup with vramplan serve --tp N: vLLM serving is estimated, "
                                     "tensor parallelism included")])
    st = _Stats()
    per_count: dict[int, list[_Found]] = {}
    notes: list[str] = list(preface_notes)
    host_limit = int(host_memory_gib * GiB) if host_memory_gib is not None else None
    if host_memory_gib is not None and host_memory_gib <= 0:
        raise ScenarioError([Problem("--host-memory-gib", f"{host_memory_gib} is not a memory size",
                                     "give the host RAM per node in GiB, e.g. 1024")])
    if isinstance(job, TrainJob):
        job.sequences()
        if job.max_micro_batch < 1 or job.lora_rank < 1:
            raise ScenarioError([Problem("--max-micro-batch/--lora-rank", "must be at least 1", "")])
        if job.seq_len > ctx.model.max_position_embeddings:
            notes.append(f"seq_len {job.seq_len} exceeds the model's max_position_embeddings "
                         f"({ctx.model.max_position_embeddings}); memory is estimated as asked")
        notes.extend(batch_split_problems(ctx.model, counts, job, gpus_per_node))
        ahead: list[tuple[float, int]] = []  # the rank keys found so far, over every count
        for n in counts:
            setups = list(train_candidates(ctx.model, ctx.gpu, n, job, gpus_per_node))
            per_count[n] = _walk_train(ctx, setups, top, st, exhaustive, host_limit, ahead)
    else:
        if job.max_model_len < 1 or job.concurrency < 1:
            raise ScenarioError([Problem("serve job", "max_model_len and concurrency must be at least 1",
                                         "give --max-model-len and --concurrency")])
        seen: list[tuple[float, int]] = []  # the merged answer's keys found so far, over every count
        # the most GPUs first: they serve the most tokens per second, so their deployments bound the others' walks
        # soonest (the answer does not depend on the order: the merged keys differ between counts)
        walked = {n: _walk_serve(ctx, list(serve_candidates(ctx.model, ctx.gpu, n, job, margin, gpus_per_node)), top,
                                 st, exhaustive, seen) for n in sorted(counts, reverse=True)}
        per_count = {n: walked[n] for n in counts}
    if st.first_refusal is not None:
        if not st.estimated:  # every setup refused: the refusal is the answer
            raise st.first_refusal
        # counted among the setups the walk reached (those it pruned unseen are not estimated, so not counted)
        notes.append(f"{st.refused:,} of the setups the search reached were skipped: the estimator refuses them for "
                     f"{ctx.model.name} ({st.first_refusal.problems[0].where}: "
                     f"{st.first_refusal.problems[0].message.rsplit(', but ', 1)[-1]})")
    merged = [f for fs in per_count.values() for f in fs]
    if task == "train":
        merged.sort(key=lambda f: (f.time.total_s, -getattr(f.setup, "micro_batch_size", 0)))  # _rank_key
    else:
        merged.sort(key=lambda f: (-f.time.tokens_per_s, f.setup.num_gpus))
    merged = merged[:top]
    chosen = _ranked(ctx, merged[0], 1, task, "") if merged else None
    runners = [_ranked(ctx, f, i + 2, task, _trade(merged[0], f, task)) for i, f in enumerate(merged[1:])]
    by_count = []
    for n in counts:
        fs = per_count[n]
        if fs:
            best = min(fs, key=lambda f: f.time.total_s) if task == "train" else fs[0]
            by_count.append(GpuCountBest(num_gpus=n, fits=True, label=best.setup.label(),
                                         step_time_s=best.time.total_s, tokens_per_s=best.time.tokens_per_s))
        else:
            by_count.append(GpuCountBest(num_gpus=n, fits=False))
    elapsed = time.perf_counter() - t0
    stats = SearchStats(candidates=st.candidates, bound_rejected=st.bound_rejected, estimated=st.estimated,
                        estimated_fit=st.estimated_fit, pruned=st.pruned, host_memory_rejected=st.host_rejected,
                        seconds=elapsed, candidates_per_s=st.candidates / elapsed if elapsed > 0 else 0.0,
                        exhaustive=exhaustive)
    job_doc: dict[str, Any] = dict(vars(job))
    if isinstance(job, TrainJob):
        job_doc["global_batch_sequences"] = job.sequences()
    result = PlanResult(
        task=task, model=ctx.model.name, gpu=ctx.gpu.name, num_gpus=counts, job=job_doc, margin=margin,
        capacity_bytes=ctx.gpu.total_memory_bytes, usable_bytes=ctx.usable, fits=chosen is not None, chosen=chosen,
        runners_up=runners, by_gpu_count=by_count, notes=notes, stats=stats,
        assumptions=[*assumptions.describe(task), _margin_text(task, margin, ctx)],
    )
    if explain:
        from vramplan.plan.explain import explain_result

        result = explain_result(ctx, job, counts, result, gpus_per_node)
        if result.suggestions:
            kw = {"margin": margin, "assumptions": assumptions, "gpus_per_node": gpus_per_node,
                  "host_memory_gib": host_memory_gib, "offline": offline}
            result = _verified(result, model, ctx.gpu.name, counts, job, kw)
    return result


def _changed(sug: Suggestion, gpu: str, counts: list[int], job: TrainJob | ServeJob
             ) -> tuple[str, list[int], TrainJob | ServeJob] | None:
    """The plan's inputs with ``sug``'s change applied (None: the suggestion names no change to re-plan)."""
    if sug.value is None:
        return None
    if sug.kind == "more_gpus":
        return gpu, [int(sug.value)], job
    if sug.kind == "larger_gpu":
        return str(sug.value), counts, job
    if sug.kind == "shorter_sequence" and isinstance(job, TrainJob):
        # the batch stays in sequences: the suggestion keeps the number of sequences, not of tokens
        return gpu, counts, replace(job, seq_len=int(sug.value), global_batch=job.sequences(), global_batch_tokens=None)
    if sug.kind == "shorter_sequence" and isinstance(job, ServeJob):
        return gpu, counts, replace(job, max_model_len=int(sug.value))
    if sug.kind == "peft" and isinstance(job, TrainJob):
        return gpu, counts, replace(job, peft="allow")
    if sug.kind == "quantization" and isinstance(job, ServeJob):
        return gpu, counts, replace(job, allow_quantization=True)
    return None


def _verified(result: PlanResult, model: str | dict[str, Any], gpu: str, counts: list[int],
              job: TrainJob | ServeJob, kw: dict[str, Any]) -> PlanResult:
    """Each "would fit" suggestion re-planned with its change: kept only when that plan finds a setup that
    fits (by the same rule, margin and host RAM), otherwise dropped and said in the notes."""
    kept: list[Suggestion] = []
    notes = list(result.notes)
    for sug in result.suggestions:
        change = _changed(sug, gpu, counts, job)
        if change is None or plan(model, change[0], change[1], change[2], top=1, explain=False, **kw).fits:
            kept.append(sug)
        else:
            notes.append(f"not suggested: {sug.text} (re-planned with that change, nothing fits)")
    return result.model_copy(update={"suggestions": kept, "notes": notes})
