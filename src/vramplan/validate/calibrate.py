"""The band's calibration, computed from a validation result (``benchmarks/calibrate_band.py`` writes it).

Each usable entry scored by an engine gives one residual ``ln(predicted / measured)``, classed by
engine, workload and quantity (``report/band.py``); the document holds those residuals, the
table fitted from them, its leave-one-source-out coverage, and where it came from (dataset and
a digest of its entries, commit, date, command), so that a test can recompute it and tell when it is stale.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vramplan.report.band import (
    COVERAGE,
    MIN_SOURCES,
    QUANTITY_CLASS,
    Calibration,
    Residual,
    fit_calibration,
    loso_coverage,
)
from vramplan.validate.runner import ENGINES, ValidationResult

__all__ = ["COMMAND", "METHOD", "calibration_document", "calibration_table", "dataset_digest", "residuals"]

COMMAND = "PYTHONPATH=src python benchmarks/calibrate_band.py"
METHOD = (
    "split conformal with sources weighted equally: per class (engine / workload / quantity) the smallest "
    "|ln(predicted/measured)| whose cumulative mass reaches 0.90 x (G + 1), each of the G sources having mass 1 "
    "shared by its rows; a class with fewer than 9 sources (infinite quantile) falls back to engine/workload, "
    "then engine, then all engines; coverage estimated leave-one-source-out (every source removed in turn, "
    "the table refitted, its rows checked)"
)


def residuals(result: ValidationResult, engines: tuple[str, ...] = ENGINES) -> list[Residual]:
    """One residual per usable entry and engine that scored it, in the dataset's order.

    ``allocated_plus_non_torch`` rows keep their own quantity class: no report quantity asks for
    it, so they count only where a class falls back to its workload or engine pooled."""
    out: list[Residual] = []
    for e in result.entries:
        if not e.usable or e.quantity not in QUANTITY_CLASS:
            continue
        for name in engines:
            p = e.predictions.get(name)
            if p is None or p.status != "ok" or p.signed_error is None or not p.predicted_bytes:
                continue
            out.append(Residual(id=e.id, source=e.source, engine=name, workload=e.workload,
                                quantity=QUANTITY_CLASS[e.quantity],
                                log_ratio=round(math.log(p.predicted_bytes / e.measured_bytes), 9)))
    return out


def dataset_digest(dataset: Path) -> str:
    """SHA-256 of what the residuals depend on: each entry's id, source, scenario, measured figure,
    outcome and ``not_compared`` (notes, quotes and ``motivated`` tags may change freely)."""
    from vramplan.validate.dataset import load_dataset

    rows = [[e.id, e.group, e.scenario, e.measured.quantity, e.measured.bytes, e.outcome, e.not_compared]
            for e in load_dataset(dataset).entries]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def calibration_table(cal: Calibration) -> dict[str, dict[str, Any]]:
    return {k: {"n": f.n, "sources": f.sources, "log_quantile": None if f.quantile is None else round(f.quantile, 6),
                "factor_high": None if f.quantile is None else round(math.exp(f.quantile), 4)}
            for k, f in cal.classes.items()}


def calibration_document(rows: list[Residual], dataset: Path, commit: str, date: str) -> dict[str, Any]:
    """The calibration file's content (``report/data/band_calibration.json``) from the residuals ``rows``."""
    cal = fit_calibration(rows, COVERAGE)
    return {
        "method": METHOD,
        "coverage": COVERAGE,
        "min_sources": MIN_SOURCES,
        "dataset": "validation/published.yaml",
        "dataset_digest": dataset_digest(dataset),
        "engines": sorted({x.engine for x in rows}),
        "commit": commit,
        "date": date,
        "command": COMMAND,
        "classes": calibration_table(cal),
        "loso_coverage": loso_coverage(cal),
        "residuals": [asdict(x) for x in rows],
    }
