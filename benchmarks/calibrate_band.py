"""Recompute the band's calibration from validation/published.yaml and write it into the package.

Scores both engines on every entry of the published set (the same code as ``vramplan validate``),
turns each usable entry into a residual ``ln(predicted / measured)`` and writes
``src/vramplan/report/data/band_calibration.json``: the residuals, the fitted table per class,
its leave-one-source-out coverage, and a digest of the dataset's entries, the commit, the date and this
command.  ``tests/test_band.py`` recomputes the analytic residuals (and a sample of the traced
ones) and fails when the file is stale: regenerate it after any change to an engine or to the
published set.  Run from the repository root::

    PYTHONPATH=src python benchmarks/calibrate_band.py               # both engines (the traced one takes minutes)
    PYTHONPATH=src python benchmarks/calibrate_band.py --keep-trace  # rescore the analytic engine only
    PYTHONPATH=src python benchmarks/calibrate_band.py --trace-from trace.json   # traced run kept aside

``--keep-trace`` keeps the traced engine's residuals of the current file (only when the traced
engine and the published set have not changed); ``--trace-from`` reads them from the output of
``vramplan validate validation/published.yaml --engine trace --json`` run on the same code.  Never run it on validation/holdout.yaml.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from vramplan.report.band import CALIBRATION_FILE, Residual, fit_calibration
from vramplan.validate import validate
from vramplan.validate.calibrate import calibration_document, residuals
from vramplan.validate.runner import ValidationResult

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "validation" / "published.yaml"
OUT = ROOT / "src" / "vramplan" / "report" / CALIBRATION_FILE


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+changes" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-trace", action="store_true", help="keep the traced engine's residuals of the current file")
    ap.add_argument("--trace-from", type=Path, help="traced engine's results: `vramplan validate ... --engine trace --json`")
    ap.add_argument("--markdown", action="store_true", help="also print the table of docs/validation.md")
    args = ap.parse_args()
    result = validate(DATASET, engine="analytic" if args.keep_trace or args.trace_from else "all")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = residuals(result)
    extra: dict[str, str] = {}
    if args.keep_trace:
        old = json.loads(OUT.read_text(encoding="utf-8"))
        rows += [Residual(**r) for r in old["residuals"] if r["engine"] == "trace"]
        extra["trace_residuals_from"] = str(old.get("commit", "?"))
    elif args.trace_from:
        traced = ValidationResult.model_validate(json.loads(args.trace_from.read_text(encoding="utf-8")))
        rows += residuals(traced, ("trace",))
        extra["trace_residuals_from"] = f"{args.trace_from.name} (vramplan validate --engine trace --json)"
    doc = {**calibration_document(rows, DATASET, _commit(), date), **extra}
    OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    n = {e: sum(r["engine"] == e for r in doc["residuals"]) for e in ("analytic", "trace")}
    sys.stdout.write(f"wrote {OUT.relative_to(ROOT)}: {n['analytic']} analytic and {n['trace']} traced residuals, "
                     f"LOSO coverage {doc['loso_coverage'].get('*', {}).get('coverage')}\n")
    if args.markdown:
        sys.stdout.write(_markdown(doc))


def _markdown(doc: dict[str, Any]) -> str:
    """The calibration table of docs/validation.md: each class, its own quantile, the band used and the
    leave-one-source-out coverage."""
    cal = fit_calibration([Residual(**r) for r in doc["residuals"]], float(doc["coverage"]))
    lines = ["| class | n | sources | own ln-quantile | band used (class) | LOSO coverage |", "|---|---|---|---|---|---|"]
    for key, fit in sorted(cal.classes.items()):
        parts = key.split("/")
        q, used = cal.lookup(*(parts + ["", "", ""])[:3]) if parts != ["*"] else (fit.quantile, "*")
        own = "-" if fit.quantile is None else f"{fit.quantile:.3f}"
        own += " (< 9 sources)" if fit.quantile is None else ""
        band = "-" if q is None else f"x{math.exp(-q):.3f} .. x{math.exp(q):.3f} (`{used}`)"
        cov = doc["loso_coverage"].get(key)
        covered = "-" if cov is None else f"{cov['covered']}/{cov['n']} ({100 * cov['coverage']:.1f}%)"
        lines.append(f"| `{key}` | {fit.n} | {fit.sources} | {own} | {band} | {covered} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
