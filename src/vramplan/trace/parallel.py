"""Multi-GPU figures of one rank: DDP buckets and ZeRO-1/2 derived from a single-GPU trace.

Parameter sharding (ZeRO-3, FSDP full_shard / shard_grad_op / hybrid_shard) is traced through
FSDP2's ``fully_shard`` on a fake process group (trace/fsdp.py): those events are rank 0's
already (``StepTrace.per_rank``) and pass through unchanged.  Everything else is derived here from
the events of the step traced once for the whole model:

* DDP (``gradient_as_bucket_view=False``): flat all-reduce buckets holding a second copy of
  every gradient, allocated when the model is wrapped and kept for the whole run.
* ZeRO-1/2: each persistent storage is divided by its shard count (optimizer states and fp32
  masters from ZeRO-1, gradients from ZeRO-2), as the ZeRO paper (arXiv 1910.02054, section 5)
  partitions them.
* Fallback for sharded scenarios trace/fsdp.py does not take (QLoRA's packed 4-bit base
  weights) or cannot run: parameters divided by the shard count as well, FSDP's trainable half
  parameters replaced by their fp32 shards (a frozen PEFT base keeps its shard in the stored
  dtype), and the running layer's parameters plus the prefetched next layer's (and FSDP's root
  unit) gathered in the compute dtype from the first layer's forward to the end of the backward.
  The report says which path was taken.

Tensor parallelism is traced (trace/tensor.py: transformers' tp_plan on DTensor under a fake
process group): the events are those of one tensor-parallel rank, and the data-parallel terms
above are derived from them as from a single-GPU trace; the tensor-parallel group adds an NCCL
communicator.  Pipeline, context and expert parallelism are not traced (the analytic engine
covers them); ``apply_parallel`` refuses them.
"""

from __future__ import annotations

import re
from dataclasses import replace

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.terms.context import shards as _shards
from vramplan.errors import Problem, ScenarioError
from vramplan.report import Host
from vramplan.spec.load import Resolved
from vramplan.trace.fsdp import world_shape
from vramplan.trace.step import StepTrace
from vramplan.trace.tracker import TrackEvent
from vramplan.units import MiB, ceil_div

__all__ = ["apply_parallel", "ddp_bucket_sizes"]

DDP_BUCKET_BYTES = 25 * MiB  # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
_LAYER = re.compile(r"\.(\d+)\.")


def ddp_bucket_sizes(grad_sizes: list[int]) -> list[int]:
    """DDP's buckets: parameters in reverse order, a bucket closes once it reaches its cap."""
    buckets: list[int] = []
    cur = 0
    cap = DDP_FIRST_BUCKET_BYTES
    for n in reversed(grad_sizes):
        cur += n
        if cur >= cap:
            buckets.append(cur)
            cur = 0
            cap = DDP_BUCKET_BYTES
    if cur:
        buckets.append(cur)
    return buckets


Marks = list[tuple[int, str]]


def apply_parallel(r: Resolved, st: StepTrace) -> tuple[list[TrackEvent], Marks, int, Host, list[str]]:
    """(events of one rank, phase marks, NCCL communicators, host bytes, notes)."""
    s = r.scenario
    par = s.parallel
    if max(par.pp, par.cp, par.ep) > 1 or (par.tp > 1 and st.tensor_parallel != par.tp):
        raise ScenarioError([Problem("parallel", "pipeline, context and expert parallelism are not traced "
                                     "(tensor parallelism is, through trace/tensor.py)",
                                     "use --engine analytic for pp/cp/ep > 1")])
    if par.offload != "none":
        raise ScenarioError([Problem("parallel.offload", "offloading is not traced",
                                     "use --engine analytic for ZeRO-Offload")])
    dp = s.data_parallel_degree
    tp_comm = 1 if st.tensor_parallel > 1 else 0  # the tensor-parallel group's NCCL communicator
    events = st.events
    notes: list[str] = []
    marks = list(st.marks)
    if st.per_rank:
        # traced through fully_shard (trace/fsdp.py): the events are rank 0's already; HSDP also
        # all-reduces across replica groups (a second communicator)
        hybrid = s.parallel.fsdp == "hybrid_shard" and len(world_shape(r)) == 2
        return events, marks, 2 if hybrid else 1, Host(), notes
    if s.task != "train" or dp == 1:
        if s.task == "train" and deepspeed_zero(s):
            # the analytic engine counts them on one rank too (analytic/terms/deepspeed.py ``zero3``)
            notes.append(f"not modelled: DeepSpeed ZeRO-{s.parallel.zero_stage} on one data-parallel rank is traced "
                         "as a plain single-GPU step (its reduce bucket, flat gradient partition and step copies are "
                         "the analytic engine's alone)")
        return events, marks, tp_comm, Host(), notes
    shard_os, shard_g, shard_p = _shards(s, dp)
    if shard_os == shard_g == shard_p == 1:
        buckets = ddp_bucket_sizes(_grad_sizes(events))
        notes.append(f"DDP all-reduce buckets ({len(buckets)} of up to 25 MiB) hold a copy of every gradient")
        k = len(buckets)
        return (_prepend(events, [(b, "gradients", "DDP buckets") for b in buckets]),
                [(seq + k, ph) for seq, ph in marks], 1 + tp_comm, Host(), notes)
    fsdp = s.parallel.fsdp != "none" or s.effective_framework == "torchtitan"
    opt_start = next((seq for seq, ph in marks if ph == "optimizer"), len(events))
    out: list[TrackEvent] = []
    for ev in events:
        cat, num, den = ev.category, 1, 1
        if cat == "weights" and fsdp and shard_p > 1 and ev.op != "quantization state" and ev.op not in st.frozen:
            # FSDP keeps no sharded half copy of a trainable parameter: its sharded original is the fp32
            # copy, the half one exists only when gathered.  A frozen parameter (PEFT's base) has no fp32
            # copy: its shard is kept in the stored dtype (divided below)
            continue
        if cat == "weights" and ev.op != "input ids and labels":
            den = shard_p
        elif cat == "gradients":
            # FSDP reduce-scatters in fp32 (reduce_dtype): the kept shard of a half gradient is twice its bytes
            num, den = (2 if fsdp else 1), shard_g
        elif cat in ("optimizer_states", "master_weights"):
            den = shard_os
        elif cat == "temporaries" and ev.seq >= opt_start:
            den = shard_os  # the optimizer step works on this rank's shard
        if fsdp and cat == "master_weights":
            cat = "weights"  # FSDP's fp32 parameters are the sharded originals
        if num != 1 or den != 1 or cat != ev.category:
            sign = 1 if ev.nbytes > 0 else -1
            out.append(replace(ev, nbytes=sign * ceil_div(abs(ev.nbytes) * num, den), category=cat))
        else:
            out.append(ev)
    notes.append(f"{'FSDP' if fsdp else 'ZeRO'} sharding derived from the single-GPU trace (not traced through "
                 f"fully_shard): optimizer states and fp32 parameters / {shard_os}, gradients / {shard_g}, "
                 f"half parameters / {shard_p}")
    if shard_p > 1:
        # the traced parameters are in the compute dtype already (half under mixed precision)
        gathered = 2 * _largest_layer_bytes(events)
        if fsdp:
            # FSDP's root unit (embeddings, final norm, LM head) stays gathered from forward to backward
            gathered += _outside_layers_bytes(events)
        out, marks = _with_gathered(out, marks, gathered)
        notes.append("ZeRO-3/FSDP: the running layer's parameters and the prefetched next layer's are gathered "
                     "in the compute dtype")
    return out, marks, 1 + tp_comm, Host(), notes


def _grad_sizes(events: list[TrackEvent]) -> list[int]:
    return [ev.nbytes for ev in events if ev.nbytes > 0 and ev.category == "gradients"]


def _largest_layer_bytes(events: list[TrackEvent]) -> int:
    """Bytes of the largest decoder layer's parameters (as traced: in the compute dtype)."""
    per_layer: dict[str, int] = {}
    for ev in events:
        if ev.nbytes > 0 and ev.category == "weights":
            m = _LAYER.search(ev.op)
            if m:
                per_layer[m.group(1)] = per_layer.get(m.group(1), 0) + ev.nbytes
    if not per_layer:
        return 0
    return max(per_layer.values())


def _outside_layers_bytes(events: list[TrackEvent]) -> int:
    """Bytes of the parameters outside the decoder layers (embeddings, final norm, LM head)."""
    return sum(ev.nbytes for ev in events if ev.nbytes > 0 and ev.category == "weights"
               and ev.op not in ("input ids and labels", "quantization state") and not _LAYER.search(ev.op))


def _prepend(events: list[TrackEvent], blocks: list[tuple[int, str, str]]) -> list[TrackEvent]:
    next_id = max((ev.storage_id for ev in events), default=-1) + 1
    head = [TrackEvent(0, next_id + i, n, cat, op) for i, (n, cat, op) in enumerate(blocks)]
    return _resequence(head + events)


def _with_gathered(events: list[TrackEvent], marks: Marks, nbytes: int) -> tuple[list[TrackEvent], Marks]:
    start = next((seq for seq, ph in marks if ph == "forward"), 0)
    end = next((seq for seq, ph in marks if ph == "optimizer"), len(events))
    sid = max((ev.storage_id for ev in events), default=-1) + 1
    out = list(events[:start])
    out.append(TrackEvent(0, sid, nbytes, "weights", "all-gathered (ZeRO-3/FSDP)"))
    out.extend(events[start:end])
    out.append(TrackEvent(0, sid, -nbytes, "weights", "free"))
    out.extend(events[end:])
    shifted = [(seq + (1 if seq > start else 0) + (1 if seq >= end else 0), ph) for seq, ph in marks]
    return _resequence(out), shifted


def _resequence(events: list[TrackEvent]) -> list[TrackEvent]:
    return [replace(ev, seq=i) for i, ev in enumerate(events)]
