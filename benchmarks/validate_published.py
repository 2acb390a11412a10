"""Analytic engine vs the published measurements in validation/published.yaml.

A first look until ``vramplan validate`` exists: for each entry that measured
max_memory_allocated, max_memory_reserved or nvidia-smi on a run that fit, print the
prediction of the same quantity and the signed relative error; entries whose model is
not in the catalog are listed as skipped.  Run: ``python benchmarks/validate_published.py``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from vramplan import estimate
from vramplan.errors import VramplanError

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    rows = yaml.safe_load((ROOT / "validation" / "published.yaml").read_text())
    errors: list[float] = []
    for r in rows:
        quantity = r["measured"]["quantity"]
        if quantity not in ("max_memory_allocated", "max_memory_reserved", "nvidia_smi") or r["outcome"] != "fits":
            continue
        try:
            pg = estimate(r["scenario"]).per_gpu
        except VramplanError as exc:
            print(f"{r['id']:55s} skipped: {str(exc).splitlines()[0][:70]}")
            continue
        pred = {"max_memory_allocated": pg.peak_allocated_bytes, "max_memory_reserved": pg.peak_reserved_bytes,
                "nvidia_smi": pg.device_used_bytes}[quantity]
        meas = r["measured"]["bytes"]
        err = (pred - meas) / meas
        errors.append(err)
        print(f"{r['id']:55s} {quantity:21s} measured {meas / 2**30:7.2f} GiB  predicted {pred / 2**30:7.2f} GiB"
              f"  {err * 100:+6.1f}%")
    if errors:
        print(f"n={len(errors)}  median |error| {statistics.median(abs(e) for e in errors) * 100:.1f}%  "
              f"under-predictions {sum(e < 0 for e in errors)}")


if __name__ == "__main__":
    main()
