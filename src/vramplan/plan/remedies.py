"""What to change when a job does not fit: the cheapest changes that make it fit, each one re-estimated.

``remedies`` tries single changes to the scenario, cheapest first, estimates each with the same engine
(``vramplan.engine.estimate``, the allocator replay included) and keeps those that fit with the planner's
margin (``plan.fit.fits_with_margin``, 10% of capacity by default).  "Cheapest" is an order of kinds, not
a fitted cost: first changes that keep the hardware and the result of the step (a smaller micro-batch with
more accumulation keeps the global batch; sharding with ZeRO-3; recomputing activations; an 8-bit
optimizer), then changes to the job (LoRA adapters instead of full fine-tuning, a shorter context, fewer beams,
quantized weights), then more GPUs, then a larger GPU.  Nothing is suggested that was not estimated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vramplan.catalog.gpus import list_gpus
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError, VramplanError
from vramplan.plan.fit import DEFAULT_MARGIN, fits_with_margin
from vramplan.report import Report, flatten
from vramplan.spec.defaults import checkpointing
from vramplan.spec.load import Resolved

__all__ = ["MAX_REMEDIES", "Remedy", "remedies", "remedies_and_defaults"]

MAX_REMEDIES = 4
_MAX_GPUS = 64  # the most GPUs a "more GPUs" remedy proposes


@dataclass(frozen=True)
class Remedy:
    """One verified change: the scenario keys it sets, in words, and the estimate after it."""

    kind: str
    change: dict[str, Any]
    text: str
    device_used_bytes: int
    capacity_bytes: int

    def to_json_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "change": dict(self.change), "text": self.text,
                "device_used_bytes": self.device_used_bytes, "capacity_bytes": self.capacity_bytes}


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        doc = doc.setdefault(k, {})
    doc[keys[-1]] = value


def _try(base: dict[str, Any], change: dict[str, Any], margin: float) -> Report | None:
    import copy

    doc = copy.deepcopy(base)
    for path, value in change.items():
        _set(doc, path, value)
    try:
        rep = estimate(doc)
    except ScenarioError:  # the change is not a valid setup (a degree that does not divide, say)
        return None
    return rep if fits_with_margin(rep, margin) else None


Candidate = tuple[str, dict[str, Any], str]


def _train_candidates(r: Resolved) -> Iterator[Candidate]:
    s, t = r.scenario, r.scenario.train
    if t.micro_batch_size > 1:
        mb = t.micro_batch_size // 2
        while mb >= 1:
            ga = math.ceil(t.micro_batch_size * t.grad_accum_steps / mb)
            yield ("micro_batch", {"train.micro_batch_size": mb, "train.grad_accum_steps": ga},
                   (f"micro_batch_size {t.micro_batch_size} -> {mb} with grad_accum_steps {t.grad_accum_steps} -> "
                    f"{ga} (the same global batch)"))
            mb //= 2
    if s.hardware.num_gpus > 1 and s.parallel.zero_stage < 3 and s.parallel.fsdp == "none":
        yield ("zero3", {"parallel.zero_stage": 3}, (f"parallel.zero_stage {s.parallel.zero_stage} -> 3 (shard "
               f"weights, gradients and optimizer states over the {s.hardware.num_gpus} GPUs)"))
    if checkpointing(s) != "full":
        yield ("checkpointing", {"train.gradient_checkpointing": "full"},
               f"train.gradient_checkpointing {checkpointing(s)} -> full (recompute activations, ~1/3 more compute)")
    if t.optimizer in ("adamw", "adamw-fused", "paged-adamw"):
        yield ("optimizer", {"train.optimizer": "adamw-8bit"},
               f"train.optimizer {t.optimizer} -> adamw-8bit (bitsandbytes 8-bit states)")
    if t.peft is None and t.quantization == "none":
        yield ("peft", {"train.peft": {"method": "lora", "rank": 16}},
               "LoRA adapters (rank 16) instead of full fine-tuning (changes what is trained)")


def _inference_candidates(r: Resolved) -> Iterator[Candidate]:
    inf = r.scenario.inference
    if inf.batch_size > 1:
        b = inf.batch_size // 2
        while b >= 1:
            yield ("batch", {"inference.batch_size": b}, f"inference.batch_size {inf.batch_size} -> {b}")
            b //= 2
    if inf.num_beams > 1:
        # every tensor of the call runs over batch x num_beams rows (analytic/inference.py): fewer beams shrink them all
        k = inf.num_beams // 2
        while k >= 1:
            yield ("beams", {"inference.num_beams": k},
                   f"inference.num_beams {inf.num_beams} -> {k}" + (" (no beam search)" if k == 1 else ""))
            k //= 2
    if inf.quantization == "none":
        for q in ("int8", "nf4"):
            yield ("quantization", {"inference.quantization": q}, f"inference.quantization none -> {q} (bitsandbytes)")


def _serve_candidates(r: Resolved, rep: Report) -> Iterator[Candidate]:
    sv = r.scenario.serve
    fits_len = rep.serve.max_model_len_that_fits
    if fits_len and sv.max_model_len and fits_len < sv.max_model_len:
        yield ("max_model_len", {"serve.max_model_len": fits_len},
               f"serve.max_model_len {sv.max_model_len:,} -> {fits_len:,} (the longest the KV cache holds)")
    if sv.kv_cache_dtype == "auto":
        yield ("kv_cache_dtype", {"serve.kv_cache_dtype": "fp8"}, "serve.kv_cache_dtype auto -> fp8 (half the KV bytes)")
    if sv.quantization == "none":
        yield ("quantization", {"serve.quantization": "awq-4bit"},
               "serve.quantization none -> awq-4bit (an AWQ checkpoint of the model)")


def _more_gpus(r: Resolved) -> Iterator[Candidate]:
    s = r.scenario
    n = s.hardware.num_gpus
    if s.task == "train":
        shard = {} if s.parallel.zero_stage == 3 or s.parallel.fsdp != "none" else {"parallel.zero_stage": 3}
        k = max(2, n * 2)
        while k <= _MAX_GPUS:
            yield ("more_gpus", {"hardware.num_gpus": k, **shard},
                   f"hardware.num_gpus {n} -> {k}" + (" with parallel.zero_stage 3" if shard else ""))
            k *= 2
    else:
        tp = s.parallel.tp * 2
        while tp <= 8:
            yield ("more_gpus", {"hardware.num_gpus": tp, "parallel.tp": tp},
                   f"tensor parallelism over {tp} GPUs (hardware.num_gpus and parallel.tp {s.parallel.tp} -> {tp})")
            tp *= 2


def _larger_gpus(r: Resolved) -> Iterator[Candidate]:
    cap = r.gpu.total_memory_bytes
    larger = sorted((g for g in list_gpus() if g.vendor == r.gpu.vendor and g.total_memory_bytes > cap),
                    key=lambda g: (g.total_memory_bytes, g.name))
    for g in larger:
        yield ("larger_gpu", {"hardware.gpu": g.name, "hardware.capacity_gib": None},
               f"hardware.gpu {r.gpu.name} -> {g.name} ({g.total_memory_bytes / 2**30:,.1f} GiB)")


def remedies(source: Resolved | dict[str, Any], report: Report | None = None, *, margin: float = DEFAULT_MARGIN,
             limit: int = MAX_REMEDIES) -> list[Remedy]:
    """Up to ``limit`` verified changes that make a scenario fit with ``margin``, cheapest kind first (at most
    one per kind: the first that fits).  Empty when it already fits or nothing tried fits."""
    r = source if isinstance(source, Resolved) else resolve(source)
    rep = report if report is not None else estimate(r)
    if fits_with_margin(rep, margin):
        return []
    base = r.scenario.model_dump(mode="json")
    kinds: list[Callable[[Resolved], Iterator[Candidate]]] = []
    if r.scenario.task == "train":
        kinds.append(_train_candidates)
    elif r.scenario.task == "inference":
        kinds.append(_inference_candidates)
    else:
        kinds.append(lambda rr: _serve_candidates(rr, rep))
    kinds += [_more_gpus, _larger_gpus]
    out: list[Remedy] = []
    done: set[str] = set()
    for make in kinds:
        for kind, change, text in make(r):
            if kind in done or len(out) >= limit:
                continue
            fit = _try(base, change, margin)
            if fit is not None:
                done.add(kind)
                out.append(Remedy(kind, change, text, fit.per_gpu.device_used_bytes, fit.per_gpu.capacity_bytes))
    if not out:
        combined = _combined(r, base, kinds, margin)
        out += [combined] if combined is not None else []
    return out


def _combined(r: Resolved, base: dict[str, Any], kinds: list[Callable[[Resolved], Iterator[Candidate]]],
              margin: float) -> Remedy | None:
    """When no single change fits: the changes stacked in the same order (each kind's last, strongest
    variant: micro-batch 1, every memory saving of the task), then the fewest more GPUs, then the smallest
    larger GPU with them; the first stack that fits."""
    change: dict[str, Any] = {}
    texts: list[str] = []
    for kind_change_text in _strongest(kinds[0](r)):
        _, more, text = kind_change_text
        change, texts = {**change, **more}, [*texts, text]
        fit = _try(base, change, margin)
        if fit is not None:
            return Remedy("combined", change, "; ".join(texts), fit.per_gpu.device_used_bytes, fit.per_gpu.capacity_bytes)
    for make in kinds[1:]:
        for _, more, text in make(r):
            trial = {**change, **more}
            fit = _try(base, trial, margin)
            if fit is not None:
                return Remedy("combined", trial, "; ".join([*texts, text]), fit.per_gpu.device_used_bytes,
                              fit.per_gpu.capacity_bytes)
    return None


def _strongest(candidates: Iterator[Candidate]) -> list[Candidate]:
    """The last candidate of each kind (the smallest micro-batch, the 4-bit quantization), in order."""
    last: dict[str, Candidate] = {}
    for c in candidates:
        last[c[0]] = c
    return list(last.values())


def remedies_and_defaults(report: Report, doc: Mapping[str, Any]) -> dict[str, Any]:
    """For a job whose verdict is not ``FITS``: the verified remedies and the settings the input left at
    their defaults, as ``{"remedies": [...], "assumed_settings": {dotted key: value}}`` (the keys
    ``vramplan estimate --json`` and ``POST /api/estimate`` add beside the report's); ``{}`` when it fits.
    The assumed settings are the task's section, ``parallel``, ``framework`` and ``hardware.num_gpus``."""
    if report.verdict == "FITS" or (report.verdict is None and report.fits):
        return {}
    try:
        found = [r.to_json_dict() for r in remedies(dict(doc), report)]
    except VramplanError:
        found = []
    task = report.scenario.get("task", "train")
    given = flatten(doc)
    sections = (task, "parallel", "framework", "hardware.num_gpus")
    assumed = {k: v for k, v in flatten(report.scenario).items()
               if k not in given and k.startswith(sections) and v is not None}
    return {"remedies": found, "assumed_settings": assumed}
