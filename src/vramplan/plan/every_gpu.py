"""Which GPUs fit this job: the same scenario estimated on every GPU of the catalog.

The scenario is resolved once (its model loaded, its fields checked); then only ``hardware.gpu``
changes, to each catalog entry in turn (and ``hardware.num_gpus``, to each asked count;
``hardware.capacity_gib`` is dropped, since it would override every capacity alike), and the
estimator's own verdict is kept: the report's ``verdict`` (``FITS`` when the calibrated band's high
bound of what nvidia-smi would show fits, ``MAY NOT FIT`` when only the point estimate does,
``DOES NOT FIT``; report/band.py), or ``error`` when the scenario cannot run on that GPU at all (the
error's message is kept).  The GPU count is the scenario's unless counts are asked for.
``smallest_fitting_counts`` answers instead, for each GPU, the smallest count (1, 2, 4, 8) that FITS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from vramplan.catalog.gpus import list_gpus
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import VramplanError
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario

__all__ = ["SMALLEST_COUNTS", "GpuFit", "fit_on_every_gpu", "smallest_fitting_counts"]

# the GPU counts tried, smallest first, by smallest_fitting_counts: one node's usual sizes
SMALLEST_COUNTS = (1, 2, 4, 8)

Verdict = Literal["FITS", "MAY NOT FIT", "DOES NOT FIT", "error"]


@dataclass(frozen=True)
class GpuFit:
    """One catalog GPU's answer for the job."""

    gpu: str
    vendor: str
    capacity_bytes: int
    num_gpus: int
    verdict: Verdict
    device_used_bytes: int | None
    headroom_bytes: int | None
    peak_phase: str | None
    message: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def _on(r: Resolved, name: str, count: int) -> Resolved:
    gpu = replace(_by_name()[name], cuda_module_loading=r.scenario.hardware.cuda_module_loading)
    hw = r.scenario.hardware.model_copy(update={"gpu": name, "capacity_gib": None, "num_gpus": count})
    sc = r.scenario.model_copy(update={"hardware": hw})
    if count != r.scenario.hardware.num_gpus:
        # another world size: the scenario's checks against the model (degrees dividing it) run again
        return resolve(sc)
    return Resolved(sc, r.model, gpu)


def _by_name() -> dict[str, GpuSpec]:
    """The catalog's GPUs by their catalog name."""
    return {g.name: g for g in list_gpus()}


def _base(source: str | Path | dict[str, Any] | Scenario) -> Resolved:
    if isinstance(source, dict) and not (source.get("hardware") or {}).get("gpu"):
        # any GPU lets the scenario resolve: each row replaces it
        hw = {**(source.get("hardware") or {}), "capacity_gib": None, "gpu": list_gpus()[0].name}
        source = {**source, "hardware": hw}
    return resolve(source)


def _catalog() -> list[GpuSpec]:
    return sorted(list_gpus(), key=lambda g: (g.total_memory_bytes, g.name))


def fit_on_every_gpu(source: str | Path | dict[str, Any] | Scenario,
                     counts: Sequence[int] | None = None) -> list[GpuFit]:
    """The job's verdict and headroom on every catalog GPU, smallest capacity first.

    ``counts``: GPU counts (``hardware.num_gpus``) to try on each GPU, each a row; default the
    scenario's own.  A count the scenario's degrees do not divide is an ``error`` row.  A scenario
    that is wrong whatever the GPU (an unknown model, a bad field) raises its ``ScenarioError`` once;
    its own GPU need not be given (``hardware.gpu`` is replaced)."""
    base = _base(source)
    rows: list[GpuFit] = []
    for g in _catalog():
        for n in counts or [base.scenario.hardware.num_gpus]:
            rows.append(_row(base, g, n))
    return rows


def smallest_fitting_counts(source: str | Path | dict[str, Any] | Scenario,
                            counts: Sequence[int] = SMALLEST_COUNTS) -> list[GpuFit]:
    """For each catalog GPU, the row of the smallest of ``counts`` whose verdict is ``FITS``.

    Each count is tried in increasing order, as ``fit_on_every_gpu`` would estimate it (the scenario's
    parallel settings kept: more GPUs shrink the per-GPU memory only where the scenario shards over
    them, e.g. ZeRO or FSDP); the first ``FITS`` is that GPU's row.  A GPU on which no count fits keeps
    the row of the largest count tried that ran (its ``MAY NOT FIT`` or ``DOES NOT FIT``), or its last
    ``error`` when none ran.  Smallest capacity first, one row per GPU."""
    base = _base(source)
    wanted = sorted(set(counts))
    rows: list[GpuFit] = []
    for g in _catalog():
        kept: GpuFit | None = None
        for n in wanted:
            row = _row(base, g, n)
            if kept is None or row.verdict != "error":
                kept = row
            if row.verdict == "FITS":
                break
        if kept is not None:
            rows.append(kept)
    return rows


def _row(base: Resolved, g: GpuSpec, n: int) -> GpuFit:
    try:
        rep = estimate(_on(base, g.name, n))
    except VramplanError as exc:
        return GpuFit(g.name, g.vendor, g.total_memory_bytes, n, "error", None, None, None, str(exc).splitlines()[0])
    pg = rep.per_gpu
    verdict: Verdict = rep.verdict or ("FITS" if rep.fits else "DOES NOT FIT")
    return GpuFit(g.name, g.vendor, g.total_memory_bytes, n, verdict, pg.device_used_bytes, pg.headroom_bytes,
                  pg.peak_phase)
