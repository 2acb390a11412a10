"""The calibrated band around each reported quantity, and the verdict that respects it.

An estimate is a point; on measurements it has not seen it is off by some amount.  The band says
by how much, from the validation residuals of the same engine, workload class and quantity:

* **residual**: ``r = ln(predicted / measured)`` for each usable row of
  ``validation/published.yaml`` (``validate.calibrate`` computes them; the rows are stored in
  ``report/data/band_calibration.json`` with the table fitted from them);
* **class**: engine (``analytic``, ``trace``), workload (``train-full``, ``train-peft``,
  ``inference``, ``serve``) and quantity (``allocated``, ``reserved``, ``device_used``,
  ``kv_cache``; see ``QUANTITY_CLASS``);
* **quantile**: split conformal (Vovk et al., "Algorithmic Learning in a Random World", 2005;
  Lei et al., "Distribution-Free Predictive Inference for Regression", JASA 2018, sec. 2.2) on the
  scores ``|r|``, with every publication (``source``) weighted equally, as for a prediction in a
  new group (Dunn, Wasserman and Ramdas, "Distribution-Free Prediction Sets for Two-Layer
  Hierarchical Models", JASA 2023; weighted conformal: Tibshirani et al., NeurIPS 2019): each of
  the ``G`` sources has mass 1 shared by its rows, the new source one more mass at infinity, and
  ``q`` is the smallest score whose cumulative mass reaches ``0.9 x (G + 1)``.  The measured value
  then lies in ``[point x e^-q, point x e^q]``.  Rows of one publication share its setup and its
  way of measuring, so they are not independent draws: weighting rows equally would let the
  largest publications set the band and estimate the error on rows like those already seen;
* **small classes**: ``q`` is finite only when ``0.9 x (G + 1) <= G``, i.e. with ``MIN_SOURCES``
  = 9 sources or more.  A class with fewer falls back to the engine's workload pooled over
  quantities, then to the engine pooled over everything, then to every engine pooled; the
  report's ``band`` key names the class whose rows gave the quantile.  The fallback is floored by
  the largest score of the small classes it passed (their own rows' worst error): a pooled
  quantile mixes workloads whose errors have other causes (a KV pool at start-up, a training
  step's peak), and many accurate rows of one would otherwise narrow the band of another below an
  error that other has shown;
* **new sources**: the coverage on a publication the table has not seen is estimated
  leave-one-source-out: every publication in turn is removed, the table refitted on the others
  (fallbacks included) and the removed rows checked against it (``loso_coverage``).

Inputs accepted but not modelled (an assumption starting with ``not modelled: ``) widen every
band of the report to the widest band of the engine's table (its worst class, a small class's floor
included): no class measured that input, so the widest error seen anywhere is the least that can be said.

The verdict: ``DOES NOT FIT`` when the point estimate does not fit (``Report.fits``);
``FITS`` when the high bound of the device's used memory is at most the capacity as well;
``MAY NOT FIT`` when only the point fits.  Serving is sized by ``gpu_memory_utilization``
(vLLM fills what it is given with KV blocks), so the error shows in the KV pool, not in the
device's use: a server FITS when the low bound of its KV pool still holds one
``max_model_len`` request, and its start-up carries no risk (``ServeBlock.start_risk``: vLLM's CUDA graphs,
captured after the KV cache, whose band outgrows the room left outside ``gpu_memory_utilization``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from vramplan.report import Report

__all__ = [
    "CALIBRATION_FILE",
    "COVERAGE",
    "MIN_SOURCES",
    "NOT_MODELLED_PREFIX",
    "QUANTITY_CLASS",
    "Calibration",
    "ClassFit",
    "Residual",
    "Verdict",
    "band_bounds",
    "conformal_quantile",
    "fit_calibration",
    "load_calibration",
    "loso_coverage",
    "verdict_for",
    "with_band",
    "workload_of",
]

Verdict = Literal["FITS", "MAY NOT FIT", "DOES NOT FIT"]
COVERAGE = 0.90
MIN_SOURCES = 9  # the quantile is finite when 0.9 x (G + 1) <= G sources: G >= 9
NOT_MODELLED_PREFIX = "not modelled: "
CALIBRATION_FILE = "data/band_calibration.json"

# measured quantity (validate/dataset.py) -> the class of the report quantity that predicts it
QUANTITY_CLASS: dict[str, str] = {
    "max_memory_allocated": "allocated",
    "peak_active": "allocated",
    "max_memory_reserved": "reserved",
    "nvidia_smi": "device_used",
    "kv_cache": "kv_cache",
    "allocated_plus_non_torch": "allocated_plus_non_torch",
    # a serving engine's own buffers (llama.cpp's model and compute buffers, serve/llamacpp.py)
    "weights_gpu": "weights_gpu",
    "compute_buffer": "compute_buffer",
}


@dataclass(frozen=True)
class Residual:
    """One usable validation row of one engine: ``log_ratio = ln(predicted / measured)``."""

    id: str
    source: str
    engine: str
    workload: str
    quantity: str  # a value of QUANTITY_CLASS
    log_ratio: float


@dataclass(frozen=True)
class ClassFit:
    """The quantile of one class (``None`` when the class is too small), from its rows."""

    key: str
    n: int
    sources: int
    quantile: float | None
    largest: float = 0.0  # the largest score among its rows


def conformal_quantile(scores: Sequence[float], groups: Sequence[str] | None = None,
                       coverage: float = COVERAGE) -> float | None:
    """Split-conformal quantile with every group (source) weighted equally; None when it is infinite.

    Each of the ``G`` groups has mass 1, shared equally by its rows; a new group's row is one more
    mass of 1 at infinity.  ``q`` is the smallest score whose cumulative mass reaches
    ``coverage x (G + 1)``; it is finite only when ``coverage x (G + 1) <= G`` (``G >= 9`` at 90%).
    With one row per group this is the ``ceil((G + 1) x coverage)``-th smallest score.

    >>> conformal_quantile([0.05, 0.01, 0.03, 0.02, 0.04, 0.08, 0.06, 0.07, 0.09])   # 9 groups: the 9th
    0.09
    """
    groups = [str(i) for i in range(len(scores))] if groups is None else list(groups)
    sizes: dict[str, int] = {}
    for g in groups:
        sizes[g] = sizes.get(g, 0) + 1
    target = coverage * (len(sizes) + 1)
    mass = 0.0
    for score, g in sorted(zip(scores, groups, strict=True)):
        mass += 1.0 / sizes[g]
        if mass >= target - 1e-9:  # 1e-9: sums of 1/n_g in binary floating point
            return score
    return None


def _levels(engine: str, workload: str, quantity: str) -> tuple[str, ...]:
    return (f"{engine}/{workload}/{quantity}", f"{engine}/{workload}", engine, "*")


def _in(key: str, res: Residual) -> bool:
    parts = key.split("/")
    if parts == ["*"]:
        return True
    return parts == [res.engine, res.workload, res.quantity][: len(parts)]


def _fit_class(key: str, rows: Sequence[Residual], coverage: float) -> ClassFit:
    mine = [x for x in rows if _in(key, x)]
    sources = len({x.source for x in mine})
    q = conformal_quantile([abs(x.log_ratio) for x in mine], [x.source for x in mine], coverage)
    largest = max((abs(x.log_ratio) for x in mine), default=0.0)
    return ClassFit(key=key, n=len(mine), sources=sources, quantile=q, largest=largest)


@dataclass(frozen=True)
class Calibration:
    """The fitted table: every class with rows, at every level of the fallback."""

    coverage: float
    classes: dict[str, ClassFit]
    residuals: tuple[Residual, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def lookup(self, engine: str, workload: str, quantity: str) -> tuple[float | None, str]:
        """(quantile, class that gave it) for a report quantity, falling back over the levels.

        A class too small for a quantile still bounds it from below: the pooled quantile it falls back to
        is never used below the largest score of its own rows (the floor), so accurate rows of other
        workloads cannot narrow a band below an error its own workload has shown."""
        floor, floor_key = 0.0, ""
        for key in _levels(engine, workload, quantity):
            fit = self.classes.get(key)
            if fit is None:
                continue
            if fit.quantile is not None:
                return (floor, floor_key) if floor > fit.quantile else (fit.quantile, key)
            if fit.largest > floor:
                floor, floor_key = fit.largest, key
        return (floor, floor_key) if floor_key else (None, "")

    def worst(self, engine: str) -> tuple[float | None, str]:
        """The widest band of the engine's classes as ``lookup`` gives them (a small class's floor included;
        every engine's, if it has none)."""
        mine = [k for k in self.classes if k == engine or k.startswith(engine + "/")] or list(self.classes)
        found = [(q, key) for q, key in (self.lookup(*(k.split("/") + ["", "", ""])[:3]) for k in mine)
                 if q is not None]
        return max(found) if found else (None, "")


def fit_calibration(rows: Iterable[Residual], coverage: float = COVERAGE,
                    meta: dict[str, Any] | None = None) -> Calibration:
    """Fit every class that has rows, at each fallback level."""
    rows = tuple(rows)
    keys: set[str] = {"*"}
    for x in rows:
        keys.update(_levels(x.engine, x.workload, x.quantity))
    classes = {k: _fit_class(k, rows, coverage) for k in sorted(keys)}
    return Calibration(coverage=coverage, classes=classes, residuals=rows, meta=dict(meta or {}))


def loso_calibrations(cal: Calibration) -> dict[str, Calibration]:
    """Per source, the table refitted without that source's rows (leave-one-source-out)."""
    sources = sorted({x.source for x in cal.residuals})
    return {s: fit_calibration([x for x in cal.residuals if x.source != s], cal.coverage) for s in sources}


def loso_coverage(cal: Calibration) -> dict[str, dict[str, float | int]]:
    """Leave-one-source-out coverage per class key ``engine/workload/quantity``, per engine and overall
    (``*``): the share of rows with ``|r| <= q``, ``q`` fitted without the row's source."""
    held = loso_calibrations(cal)
    hits: dict[str, list[bool]] = {}
    for x in cal.residuals:
        q, _ = held[x.source].lookup(x.engine, x.workload, x.quantity)
        ok = q is not None and abs(x.log_ratio) <= q
        for key in (f"{x.engine}/{x.workload}/{x.quantity}", f"{x.engine}/{x.workload}", x.engine, "*"):
            hits.setdefault(key, []).append(ok)
    return {k: {"n": len(v), "covered": sum(v), "coverage": round(sum(v) / len(v), 4)} for k, v in sorted(hits.items())}


def _from_document(doc: dict[str, Any]) -> Calibration:
    rows = [Residual(**r) for r in doc.get("residuals", [])]
    meta = {k: v for k, v in doc.items() if k not in ("residuals", "classes", "loso_coverage")}
    return fit_calibration(rows, float(doc.get("coverage", COVERAGE)), meta)


@lru_cache(maxsize=1)
def load_calibration() -> Calibration:
    """The shipped table, refitted from the residuals stored in ``report/data/band_calibration.json``."""
    text = resources.files("vramplan.report").joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")
    return _from_document(json.loads(text))


def band_bounds(point: int, q: float) -> tuple[int, int]:
    """``[point x e^-q, point x e^q]`` in whole bytes (low rounded down, high rounded up)."""
    return math.floor(point * math.exp(-q)), math.ceil(point * math.exp(q))


def workload_of(scenario: dict[str, Any]) -> str:
    """``train-full`` / ``train-peft`` / ``inference`` / ``serve`` from a report's scenario."""
    task = str(scenario.get("task", "train"))
    if task != "train":
        return task
    return "train-peft" if (scenario.get("train") or {}).get("peft") else "train-full"


def verdict_for(fits: bool, high_bytes: int, limit_bytes: int) -> Verdict:
    """``DOES NOT FIT`` unless the point fits; ``FITS`` when the high bound is within the limit too."""
    if not fits:
        return "DOES NOT FIT"
    return "FITS" if high_bytes <= limit_bytes else "MAY NOT FIT"


def _quantiles(report: Report, cal: Calibration) -> tuple[dict[str, tuple[float, str]], list[str]]:
    engine, workload = report.engine, workload_of(report.scenario)
    out: dict[str, tuple[float, str]] = {}
    for qty in ("allocated", "reserved", "device_used", "kv_cache"):
        q, key = cal.lookup(engine, workload, qty)
        out[qty] = (q or 0.0, key)
    notes: list[str] = []
    ignored = [a for a in report.assumptions if a.startswith(NOT_MODELLED_PREFIX)]
    if ignored:
        wq, wkey = cal.worst(engine)
        if wq is not None:
            out = {k: (max(v[0], wq), wkey if wq > v[0] else v[1]) for k, v in out.items()}
            notes.append(f"band widened to the widest class of the calibration ({wkey}, x{math.exp(wq):.3f}): "
                         f"{len(ignored)} input(s) accepted but not modelled")
    return out, notes


def _describe(qs: dict[str, tuple[float, str]], cal: Calibration) -> dict[str, Any]:
    """The report's ``band`` key: method, coverage, and per quantity the class and its quantile."""
    def n_of(key: str) -> int:
        fit = cal.classes.get(key)
        return fit.n if fit is not None else 0

    return {
        "method": "split-conformal quantile of |ln(predicted/measured)| per engine, workload and quantity, "
                  "validation/published.yaml (docs/validation.md)",
        "coverage": cal.coverage,
        "classes": {qty: {"class": key, "n": n_of(key), "log_quantile": round(q, 6),
                          "factor_low": round(math.exp(-q), 6), "factor_high": round(math.exp(q), 6)}
                    for qty, (q, key) in qs.items()},
    }


def with_band(report: Report, cal: Calibration | None = None, blocks_per_request: int = 0,
              kv_unmodelled_bytes: int = 0) -> Report:
    """The report with its band keys (``*_low``/``*_high``), ``band`` (where they come from) and ``verdict``.

    ``blocks_per_request`` (serving) is the KV blocks one ``max_model_len`` request needs, to
    count the requests the band's low KV pool still holds.  ``kv_unmodelled_bytes`` (serving): an upper bound of
    what the KV pool may lose to a part of the start-up that is not modelled (serve/vllm_mm.py ``encoder_bound``):
    the low end of the KV band is at most the band's low end of the pool less it (the blocks in proportion)."""
    cal = load_calibration() if cal is None else cal
    # a report banded before (a validation run re-bands it with a held-out calibration) keeps both serving inputs
    blocks_per_request = blocks_per_request or int(report.band.get("kv_blocks_per_request", 0))
    kv_unmodelled_bytes = kv_unmodelled_bytes or int(report.band.get("kv_unmodelled_bytes", 0))
    qs, notes = _quantiles(report, cal)
    pg = report.per_gpu
    a_lo, a_hi = band_bounds(pg.peak_allocated_bytes, qs["allocated"][0])
    r_lo, r_hi = band_bounds(pg.peak_reserved_bytes, qs["reserved"][0])
    # managed memory (paged optimizer states) only fills what the rest leaves free (report
    # ``managed_in_capacity``): the band is the rest's, the managed bytes are added up to the capacity
    resident = pg.outside_allocator.get("managed", 0)
    managed = resident + report.host.managed_paged_out_bytes
    rest = pg.device_used_bytes - resident

    def fill(nbytes: int) -> int:
        return nbytes + min(managed, max(0, pg.capacity_bytes - nbytes))

    u_lo, u_hi = band_bounds(rest, qs["device_used"][0])
    # reserved holds the allocated blocks, and device used = reserved + memory outside the allocator
    # (Report.check): a high bound below what those identities imply would contradict the others
    r_hi = max(r_hi, a_hi, pg.peak_reserved_bytes + pg.reserved_excess_high_bytes)
    u_hi = max(u_hi, r_hi + rest - pg.peak_reserved_bytes)
    u_lo, u_hi = (fill(u_lo), fill(u_hi)) if managed else (u_lo, u_hi)
    per_gpu = pg.model_copy(update={
        "peak_allocated_bytes_low": a_lo, "peak_allocated_bytes_high": a_hi,
        "peak_reserved_bytes_low": r_lo, "peak_reserved_bytes_high": r_hi,
        "device_used_bytes_low": u_lo, "device_used_bytes_high": u_hi,
    })
    sv = report.serve
    serve = sv
    if report.scenario.get("task") == "serve":
        k_lo, k_hi = band_bounds(sv.kv_cache_bytes, qs["kv_cache"][0])
        # blocks scale with the pool (vLLM: available // page_bytes), requests with the blocks
        b_lo = math.floor(sv.num_gpu_blocks * math.exp(-qs["kv_cache"][0]))
        if kv_unmodelled_bytes > 0 and sv.kv_cache_bytes > 0:
            left = max(sv.kv_cache_bytes - kv_unmodelled_bytes, 0)
            k_lo = min(k_lo, band_bounds(left, qs["kv_cache"][0])[0])
            b_lo = min(b_lo, math.floor(sv.num_gpu_blocks * left / sv.kv_cache_bytes * math.exp(-qs["kv_cache"][0])))
        b_hi = math.floor(sv.num_gpu_blocks * math.exp(qs["kv_cache"][0]))
        c_lo = b_lo // blocks_per_request if blocks_per_request else 0
        c_hi = b_hi // blocks_per_request if blocks_per_request else 0
        serve = sv.model_copy(update={"kv_cache_bytes_low": k_lo, "kv_cache_bytes_high": k_hi,
                                      "max_concurrency_low": c_lo, "max_concurrency_high": c_hi})
        verdict = verdict_for(report.fits, 1, c_lo)  # FITS when the low pool holds one request
        if verdict == "FITS" and sv.start_risk:
            verdict = "MAY NOT FIT"  # the start-up itself may run out of memory (ServeBlock.start_risk)
    else:
        verdict = verdict_for(report.fits, u_hi, pg.capacity_bytes)
    described = _describe(qs, cal)
    if blocks_per_request:
        described["kv_blocks_per_request"] = blocks_per_request
    if kv_unmodelled_bytes:
        described["kv_unmodelled_bytes"] = kv_unmodelled_bytes
    update: dict[str, Any] = {"per_gpu": per_gpu, "serve": serve, "verdict": verdict, "band": described}
    if notes and notes[0] not in report.assumptions:  # only reports with inputs not modelled gain one
        update["assumptions"] = [*report.assumptions, *notes]
    return report.model_copy(update=update)
