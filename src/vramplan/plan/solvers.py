"""Solvers: one knob of a scenario pushed as far as the estimator allows, with the margin.

* ``max-batch``: the largest micro-batch (training) or batch (inference) that fits; for serving,
  the concurrency the band's low KV cache holds at ``max_model_len`` (``max_concurrency_low``).
* ``max-seq``: the longest sequence (training ``seq_len``, inference ``prompt_len``; serving: the
  longest ``max_model_len`` one sequence can reach), up to the model's ``max_position_embeddings``.
* ``min-gpus``: the fewest GPUs (a multiple of tp x pp x cp) that fit, everything per GPU kept
  (micro-batch, accumulation: the global batch grows with the data-parallel degree).

``max_batch_size`` and ``max_prompt_len`` are the inference solvers ``vramplan generate`` prints: the
largest batch and the longest prompt for which the whole estimate (allocator rounding and memory
outside PyTorch included) still fits the device, with no margin.

The search doubles the knob until it stops fitting, then bisects.  That assumes memory grows with
the batch and the sequence and shrinks with more GPUs, which holds for every term of the
estimator; the answer is always re-checked by a full estimate (it fits) and its neighbour (it
does not), and ``probes`` counts the estimates.

"Fits" is ``fit.fits_with_margin``: within ``(1 - margin)`` of the capacity *and* the verdict
``FITS`` (the band's high bound within the capacity, ``report/band.py``).  The band is monotone in
the point estimate, so the doubling and bisection stay valid.  ``max-seq`` for serving reports
vLLM's own longest ``max_model_len`` at the point estimate (the band is not applied to it), and
``max_batch_size``/``max_prompt_len`` judge the point estimate, as ``generate`` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import Problem, ScenarioError
from vramplan.facts.autoawq import autoawq_release
from vramplan.monotone import largest_true
from vramplan.plan.fit import DEFAULT_MARGIN, fits_with_margin, usable_bytes
from vramplan.plan.result import SolveResult
from vramplan.report import Report
from vramplan.spec.autoawq import autoawq_window
from vramplan.spec.load import Resolved, read_document
from vramplan.spec.scenario import Scenario

__all__ = ["SolveKind", "max_batch_size", "max_prompt_len", "solve", "solve_max_batch", "solve_max_seq",
           "solve_min_gpus"]

SolveKind = Literal["max-batch", "max-seq", "min-gpus"]
MAX_GPUS = 4096


def _load(source: str | Path | dict[str, Any] | Scenario) -> tuple[Resolved, dict[str, Any]]:
    if isinstance(source, (str, Path)):
        doc = read_document(source)
    elif isinstance(source, Scenario):
        doc = source.model_dump(mode="json")
    else:
        doc = dict(source)
    r = resolve(doc)
    if r.scenario.task == "train" and r.scenario.train.objective != "sft":
        # the knobs solved (micro-batch, sequence length, GPU count) are the SFT step's; a post-training job's
        # sequence is its prompt and completion and its batch a multiple of num_generations: not searched
        raise ScenarioError([Problem("train.objective", f"is {r.scenario.train.objective!r}: solve searches "
                                     "supervised fine-tuning (sft) jobs only",
                                     "check the setup with `vramplan estimate`")])
    return r, doc


def _with(r: Resolved, section: str, **changes: Any) -> Resolved:
    s = r.scenario
    part = getattr(s, section).model_copy(update=changes)
    return Resolved(s.model_copy(update={section: part}), r.model, r.gpu, r.assumptions)


def _bisect_max(ok: Callable[[int], bool], lo: int, limit: int) -> tuple[int | None, int]:
    """Largest v in [lo, limit] with ok(v), doubling then bisecting; (None, probes) if not ok(lo)."""
    probes = 1
    if not ok(lo):
        return None, probes
    good, step = lo, lo
    while True:
        nxt = min(limit, good + step)
        if nxt == good:
            return good, probes
        probes += 1
        if ok(nxt):
            good, step = nxt, step * 2
        else:
            bad = nxt
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        probes += 1
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, probes


def _result(kind: SolveKind, knob: str, value: int | None, r: Resolved, rep: Report | None, margin: float,
            probes: int, note: str) -> SolveResult:
    # serving: the margin is the scenario's gpu_memory_utilization; the device's capacity is the limit
    usable = r.gpu.total_memory_bytes if r.scenario.task == "serve" else usable_bytes(r.gpu.total_memory_bytes, margin)
    return SolveResult(kind=kind, knob=knob, value=value, margin=margin, usable_bytes=usable, probes=probes, note=note,
                       scenario=rep.scenario if rep is not None else {}, report=rep)


def solve_max_batch(source: str | Path | dict[str, Any] | Scenario, margin: float = DEFAULT_MARGIN,
                    limit: int = 1 << 20) -> SolveResult:
    r, _ = _load(source)
    task = r.scenario.task
    if task == "serve":
        srep = estimate(r)
        low = srep.serve.max_concurrency_low
        held = low if low is not None else srep.serve.max_concurrency
        return _result("max-batch", "serve.max_num_seqs", held or None, r, srep, margin, 1,
                       "sequences of max_model_len the band's low KV cache holds at once (vLLM's maximum "
                       "concurrency at the low bound)")
    section, knob = ("train", "micro_batch_size") if task == "train" else ("inference", "batch_size")

    def ok(v: int) -> bool:
        return fits_with_margin(estimate(_with(r, section, **{knob: v})), margin)

    value, probes = _bisect_max(ok, 1, limit)
    rep = estimate(resolve(_doc_with(r, section, knob, value))) if value else None
    return _result("max-batch", f"{section}.{knob}", value, r, rep, margin, probes,
                   "largest value that fits with the margin (other settings unchanged)")


def _doc_with(r: Resolved, section: str, knob: str, value: int | None) -> dict[str, Any]:
    doc = r.scenario.model_dump(mode="json")
    if section == "hardware":
        doc["hardware"][knob] = value
    else:
        doc[section][knob] = value
    return doc


def solve_max_seq(source: str | Path | dict[str, Any] | Scenario, margin: float = DEFAULT_MARGIN,
                  limit: int | None = None) -> SolveResult:
    r, _ = _load(source)
    task = r.scenario.task
    cap = limit or r.model.max_position_embeddings
    if task == "serve":
        srep = estimate(r)
        v = min(srep.serve.max_model_len_that_fits, cap) or None
        return _result("max-seq", "serve.max_model_len", v, r, srep, margin, 1,
                       "tokens the KV cache holds for one sequence, capped at the model's context length")
    section, knob = ("train", "seq_len") if task == "train" else ("inference", "prompt_len")
    step = r.scenario.parallel.cp if task == "train" else 1

    def ok(v: int) -> bool:
        return fits_with_margin(estimate(_with(r, section, **{knob: v * step})), margin)

    units, probes = _bisect_max(ok, 1, max(1, cap // step))
    value = units * step if units else None
    rep = estimate(resolve(_doc_with(r, section, knob, value))) if value else None
    return _result("max-seq", f"{section}.{knob}", value, r, rep, margin, probes,
                   f"longest that fits with the margin, up to {cap:,} tokens")


def solve_min_gpus(source: str | Path | dict[str, Any] | Scenario, margin: float = DEFAULT_MARGIN,
                   limit: int = MAX_GPUS) -> SolveResult:
    r, _ = _load(source)
    par = r.scenario.parallel
    unit = par.tp * par.pp * par.cp

    def ok(k: int) -> bool:
        return fits_with_margin(estimate(_with(r, "hardware", num_gpus=k * unit)), margin)

    # fewest: smallest k with ok(k); search k = 1, 2, 4, ... then bisect
    probes = 1
    k = 1
    if not ok(k):
        while True:
            if k * unit >= limit:
                return _result("min-gpus", "hardware.num_gpus", None, r, None, margin, probes,
                               f"no count up to {limit} GPUs fits (per-GPU memory that does not shrink with "
                               "more GPUs: use ZeRO-3/FSDP, or tensor/pipeline parallelism)")
            lo, k = k, min(k * 2, max(1, limit // unit))
            probes += 1
            if ok(k):
                break
        while k - lo > 1:
            mid = (lo + k) // 2
            probes += 1
            if ok(mid):
                k = mid
            else:
                lo = mid
    value = k * unit
    rep = estimate(resolve(_doc_with(r, "hardware", "num_gpus", value)))
    return _result("min-gpus", "hardware.num_gpus", value, r, rep, margin, probes,
                   "fewest GPUs that fit with the margin, settings per GPU unchanged")


def solve(kind: str, source: str | Path | dict[str, Any] | Scenario, margin: float = DEFAULT_MARGIN) -> SolveResult:
    if kind == "max-batch":
        return solve_max_batch(source, margin)
    if kind == "max-seq":
        return solve_max_seq(source, margin)
    if kind == "min-gpus":
        return solve_min_gpus(source, margin)
    raise ScenarioError([Problem("solve", f"unknown solver {kind!r}", "use max-batch, max-seq or min-gpus")])


# ---- inference: the largest batch and the longest prompt that fit, without a margin ----------------------


def _fits(r: Resolved, batch: int, prompt: int) -> bool:
    inf = r.scenario.inference.model_copy(update={"batch_size": batch, "prompt_len": prompt})
    sc = r.scenario.model_copy(update={"inference": inf})
    return estimate(Resolved(sc, r.model, r.gpu, r.assumptions)).fits


def _largest(known_ok: int, upper: int, ok: Callable[[int], bool]) -> int:
    """Largest x in [known_ok, upper] with ok(x) true, given ok(known_ok) (ok is monotone)."""
    found = largest_true(known_ok, upper, ok)
    return known_ok if found is None else found


def max_batch_size(r: Resolved, limit: int = 1 << 20) -> int:
    """The largest batch (at the scenario's prompt and new tokens) that fits; 0 if none does."""
    p = r.scenario.inference.prompt_len
    if not _fits(r, 1, p):
        return 0
    hi = 1
    while hi < limit and _fits(r, min(limit, hi * 2), p):
        hi = min(limit, hi * 2)
    return _largest(hi, min(limit, hi * 2), lambda b: _fits(r, b, p))


def max_prompt_len(r: Resolved, limit: int | None = None) -> int:
    """The longest prompt (at the scenario's batch and new tokens) that fits; 0 if none does.

    Bounded by the model's context: prompt + new tokens <= max_position_embeddings (an encoder-decoder model: the
    prompt alone, the encoder's source); under framework autoawq also by
    AutoAWQ's cache window, which a longer prompt cannot be written into (spec/autoawq.py).
    """
    b = r.scenario.inference.batch_size
    cap = max(0, (limit or r.model.max_position_embeddings) - r.scenario.inference.new_tokens)
    if r.model.encoder_decoder is not None:
        # an encoder-decoder model's prompt is the encoder's source, its new tokens the decoder's: each stack has its
        # own positions (BART: max_position_embeddings rows per stack; T5: n_positions, the length it was trained on)
        cap = limit or r.model.max_position_embeddings
    if r.scenario.effective_framework == "autoawq":
        cap = min(cap, autoawq_window(r.scenario, r.model, autoawq_release(r.scenario.software.autoawq)))
    if cap < 1 or not _fits(r, b, 1):
        return 0
    if _fits(r, b, cap):
        return cap
    return _largest(1, cap, lambda p: _fits(r, b, p))
