"""From a traced step's events to the Report (the same keys as the analytic engine's).

``peak_allocated_bytes`` is what ``torch.cuda.max_memory_allocated()`` counts: each live
storage rounded up to 512 bytes (the caching allocator's minimum block), at the moment the sum
is largest.  ``breakdown`` is the content of memory at that moment by category and
``breakdown_detail`` splits each category by module (layer indices folded to ``*``) or by op.
``peak_reserved_bytes`` comes from replaying the same events through the caching-allocator
model (``vramplan.alloc.replay``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from vramplan.alloc import AllocEvent, replay
from vramplan.analytic.overhead import cuda_context_bytes, nccl_bytes
from vramplan.report import BREAKDOWN_KEYS, Host, PerGpu, Report, ServeBlock, managed_in_capacity
from vramplan.report.band import with_band
from vramplan.spec.defaults import expandable_segments
from vramplan.spec.load import Resolved
from vramplan.trace.tracker import TrackEvent
from vramplan.units import round_up

__all__ = ["Peak", "peak_of", "to_report"]

ROUND_BYTES = 512
_DIGITS = re.compile(r"\.\d+(?=\.|$)")


def rounded(nbytes: int) -> int:
    """Bytes ``max_memory_allocated`` counts for one block (0 for an empty storage)."""
    return round_up(nbytes, ROUND_BYTES) if nbytes > 0 else 0


_PERSISTENT = {"gradients": "parameter gradients", "optimizer_states": "optimizer states",
               "master_weights": "fp32 master weights", "weights": "parameters"}
_PREFIXES = ("base_model.model.", "model.", "transformer.", "gpt_neox.")
MAX_DETAIL = 8


def fold(module: str) -> str:
    """``base_model.model.model.layers.3.mlp.down_proj`` -> ``layers.*.mlp``."""
    m = module
    for _ in range(3):
        for pre in _PREFIXES:
            m = m.removeprefix(pre)
    m = _DIGITS.sub(".*", "." + m)[1:] if m else m
    parts = m.split(".")
    if "*" in parts:
        return ".".join(parts[: parts.index("*") + 2])
    return ".".join(parts[:2])


def label(ev: TrackEvent) -> str:
    """A short name for where a block came from: its module (layers folded) or its kind."""
    if ev.category in _PERSISTENT and not ev.op.startswith(("cuBLAS", "quantization", "DDP", "all-gathered")):
        return _PERSISTENT[ev.category]
    if ev.op in ("logits", "loss"):
        return "logits and loss"
    if ev.module.startswith("backward:"):
        return "backward (outside modules)"
    if ev.module:
        return fold(ev.module)
    if ev.category in ("temporaries", "activations"):
        return "loss and outside modules"
    return ev.op.removeprefix("aten.")


def _top_detail(detail: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for cat, parts in detail.items():
        ranked = sorted(parts.items(), key=lambda kv: -kv[1])
        keep = dict(ranked[:MAX_DETAIL])
        rest = sum(v for _, v in ranked[MAX_DETAIL:])
        if rest:
            keep["other parts"] = keep.get("other parts", 0) + rest
        out[cat] = keep
    return out


@dataclass
class Peak:
    allocated_bytes: int  # rounded, as max_memory_allocated
    raw_bytes: int  # storage bytes, unrounded
    seq: int
    phase: str
    breakdown: dict[str, int]
    detail: dict[str, dict[str, int]]
    phases: dict[str, int] = field(default_factory=dict)
    alive: list[TrackEvent] = field(default_factory=list)  # blocks alive at the peak (allocation events)


def _phase_at(marks: list[tuple[int, str]]) -> list[tuple[int, str]]:
    # building the decode step's cache belongs to the decode phase
    return sorted((seq, "decode" if ph == "decode-setup" else ph) for seq, ph in marks)


def peak_of(events: list[TrackEvent], marks: list[tuple[int, str]]) -> Peak:
    """Walk the events once: the rounded peak, its moment, phase maxima and what is alive then."""
    bounds = _phase_at(marks)
    phase = "setup"
    bi = 0
    live = raw = 0
    best = -1
    best_seq = 0
    best_phase = "setup"
    raw_peak = 0
    phases: dict[str, int] = {}
    alive: dict[int, TrackEvent] = {}
    for ev in events:
        while bi < len(bounds) and bounds[bi][0] <= ev.seq:
            phase = bounds[bi][1]
            bi += 1
        if ev.nbytes > 0:
            alive[ev.storage_id] = ev
            live += rounded(ev.nbytes)
            raw += ev.nbytes
        else:
            first = alive.pop(ev.storage_id, None)
            if first is None:
                continue
            live -= rounded(first.nbytes)
            raw -= first.nbytes
        raw_peak = max(raw_peak, raw)
        if phase != "end":
            phases[phase] = max(phases.get(phase, 0), live)
        if live > best:
            best, best_seq, best_phase = live, ev.seq, phase
    # second pass: the content at the peak
    at: dict[int, TrackEvent] = {}
    for ev in events:
        if ev.seq > best_seq:
            break
        if ev.nbytes > 0:
            at[ev.storage_id] = ev
        else:
            at.pop(ev.storage_id, None)
    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0)
    detail: dict[str, dict[str, int]] = {}
    for ev in at.values():
        cat = ev.category if ev.category in breakdown else "other"
        size = rounded(ev.nbytes)
        breakdown[cat] += size
        if size:
            d = detail.setdefault(cat, {})
            lab = label(ev)
            d[lab] = d.get(lab, 0) + size
    phases.pop("setup", None)
    return Peak(max(best, 0), raw_peak, best_seq, best_phase, breakdown, _top_detail(detail), phases,
                list(at.values()))


def reserved_bytes(events: Iterable[TrackEvent], expandable: bool = False) -> tuple[int, int]:
    """(peak allocated, peak reserved) from the caching-allocator model."""
    res = replay((AllocEvent(ev.storage_id, ev.nbytes) for ev in events if ev.nbytes != 0),
                 expandable_segments=expandable)
    return res.peak_allocated_bytes, res.peak_reserved_bytes


def to_report(r: Resolved, events: list[TrackEvent], marks: list[tuple[int, str]], assumptions: list[str],
              managed_bytes: int = 0, communicators: int = 0, host: Host | None = None) -> Report:
    pk = peak_of(events, marks)
    _, reserved = reserved_bytes(events, expandable_segments(r.scenario))
    reserved = max(reserved, pk.allocated_bytes)
    outside = {"cuda_context": cuda_context_bytes(r.gpu), "workspaces": 0,
               "communication": nccl_bytes(communicators), "managed": managed_bytes}
    capacity = r.gpu.total_memory_bytes
    outside, paged_out = managed_in_capacity(outside, reserved, capacity)
    host = host or Host()
    if paged_out:
        host = host.model_copy(update={"managed_paged_out_bytes": paged_out})
    used = reserved + sum(outside.values())
    breakdown = pk.breakdown
    per_gpu = PerGpu(
        capacity_bytes=capacity, peak_allocated_bytes=sum(breakdown.values()), peak_reserved_bytes=reserved,
        device_used_bytes=used, headroom_bytes=capacity - used, peak_phase=pk.phase, breakdown=breakdown,
        breakdown_detail=pk.detail, outside_allocator=outside, phases=pk.phases,
    )
    report = Report(
        engine="trace", fits=used <= capacity, per_gpu=per_gpu, host=host, serve=ServeBlock(),
        assumptions=[*r.assumptions, *assumptions], scenario=r.scenario.model_dump(mode="json"),
        model=r.model.summary(),
        gpu=r.gpu.report_block(),
    )
    report.check()
    return with_band(report)
