"""Render the holdout scores saved by ``vramplan validate --json`` as markdown, for one batch alone, the batches
before it, and the whole file.

The engines are not run again: the scoring is the JSON this script reads (e.g.
benchmarks/data/holdout_batch2_before.json, written by the command in benchmarks/holdout_batch2_before.md).
Batch N is every entry between the ``# ---- batch N`` comment line of validation/holdout.yaml and the next
batch's line (or the end of the file).

    PYTHONPATH=src python benchmarks/render_holdout_batch2.py benchmarks/data/holdout_batch2_before.json
    PYTHONPATH=src python benchmarks/render_holdout_batch2.py benchmarks/data/holdout_batch3_before.json --batch 3

Several JSON files are put together in order (``merge``), e.g. the earlier batches' last scoring and a new batch's
files scored one by one; ``--drop ID`` leaves an entry out (a measurement collected twice); an id in two files keeps
the later file's score (an entry corrected before any engine change and scored again).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from vramplan.validate.markdown import fmt_pct, to_markdown
from vramplan.validate.metrics import Summary
from vramplan.validate.runner import (
    EntryResult,
    Prediction,
    ValidationResult,
    summarize_entries,
    summarize_run,
)

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "validation" / "holdout.yaml"
BATCH_MARK = "# ---- batch {n},"
ENGINES = ("analytic", "trace")
GIB = 2**30


def batch_ids(n: int = 2, path: Path = HOLDOUT) -> list[str]:
    """Ids of the entries between the batch-``n`` comment line and the next batch's, in file order."""
    text = path.read_text(encoding="utf-8")
    _, sep, tail = text.partition(BATCH_MARK.format(n=n))
    if not sep:
        raise SystemExit(f"{path}: no batch-{n} marker line")
    body = tail.split("\n", 1)[1].partition(BATCH_MARK.format(n=n + 1))[0]
    return [str(r["id"]) for r in yaml.safe_load(body) or []]



def load_result(path: Path) -> ValidationResult:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.pop("skipped", None)  # derived from the entries (ValidationResult.to_json_dict)
    return ValidationResult.model_validate(data)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def _cov(s: Summary) -> str:
    return f"{s.band_covered}/{s.band_n_checked}" if s.band_n_checked else "-"


SUMMARY_HEAD = ["n err", "median abs", "p90 abs", "median signed", "under/over", "verdicts right",
                "false fits (point)", "false OOMs (point)", "band FITS/MAY/DOES NOT", "false fits (band)",
                "band covers", "not run"]


def summary_cells(s: Summary) -> list[str]:
    return [str(s.n_error), fmt_pct(s.median_abs_error), fmt_pct(s.p90_abs_error),
            fmt_pct(s.median_signed_error, signed=True), f"{s.under}/{s.over}",
            f"{s.fits_correct}/{s.n_fits_checked}", str(s.missed_oom), str(s.false_oom),
            f"{s.band_fits}/{s.band_may_not_fit}/{s.band_does_not_fit}", str(s.band_missed_oom), _cov(s),
            str(s.not_run)]


def summary_table(entries: Sequence[EntryResult]) -> list[str]:
    """By engine: all entries, then each workload class."""
    out = [_row(["engine", "workload", *SUMMARY_HEAD]), _row(["---"] * (2 + len(SUMMARY_HEAD)))]
    workloads = sorted({e.workload for e in entries})
    for key in ENGINES:
        out.append(_row([key, "**all**", *summary_cells(summarize_entries(entries, key))]))
        for w in workloads:
            out.append(_row([key, w, *summary_cells(summarize_entries([e for e in entries if e.workload == w], key))]))
    return out


def _pred_cells(e: EntryResult, p: Prediction | None) -> list[str]:
    if p is None or p.status == "not_applicable":
        return ["n/a", "", "", ""]
    if p.status != "ok":
        return [f"not run: {p.reason.split(' (')[0]}", "", "", ""]
    err = fmt_pct(p.signed_error, signed=True) if p.signed_error is not None else "-"
    band = f"{p.band_verdict} [{_gib(p.low_bytes)}, {_gib(p.high_bytes)}]" if p.low_bytes else str(p.band_verdict)
    cov = "" if p.covered is None else (" in" if p.covered else " **out**")
    return [_gib(p.predicted_bytes), err, str(p.verdict), band + cov]


def rows_table(entries: Sequence[EntryResult]) -> list[str]:
    head = ["entry", "workload", "quantity", "outcome", "measured GiB"]
    for key in ENGINES:
        head += [f"{key} GiB", f"{key} error", f"{key} verdict", f"{key} band (GiB)"]
    out = [_row(head), _row(["---"] * len(head))]
    for e in entries:
        measured = _gib(e.measured_bytes) + (" (capacity)" if e.quantity == "unknown" else "")
        if e.not_compared:
            measured += " (not compared)"
        cells = [f"`{e.id}`", e.workload, e.quantity, e.outcome, measured]
        for key in ENGINES:
            cells += _pred_cells(e, e.predictions.get(key))
        out.append(_row(cells))
    return out


def render(result: ValidationResult, ids: Sequence[str], n: int = 2) -> str:
    by_id = {e.id: e for e in result.entries}
    batch = [by_id[i] for i in ids]
    earlier = " + ".join(f"batch {i}" for i in range(1, n))
    lines = [f"## Batch {n} alone", "", f"{len(batch)} entries from {len({e.source for e in batch})} sources.", "",
             "### Per row", "", *rows_table(batch), "", f"### Summary, batch {n}", "", *summary_table(batch), "",
             f"## The other entries ({earlier} and any later batch), scored in the same run", "",
             *summary_table([e for e in result.entries if e.id not in set(ids)]), "",
             f"## Whole holdout file ({len(result.entries)} entries)", "", *summary_table(result.entries), "",
             "### The validator's own rendering of the whole file (`vramplan.validate.markdown.to_markdown`)", "",
             to_markdown(result)]
    return "\n".join(lines)


def merge(results: Sequence[ValidationResult], drop: Sequence[str] = ()) -> ValidationResult:
    """Entries scored in several runs (e.g. the earlier batches' last scoring and a new batch's files scored one by
    one), put together in that order with their summaries recomputed; ``drop``: ids left out (a duplicate).  An id
    scored in two files keeps the later file's score, in the earlier one's place (an entry corrected before any engine
    change and scored again on the same engines)."""
    last = {e.id: e for r in results for e in r.entries if e.id not in set(drop)}
    entries, seen = [], set()
    for r in results:
        for e in r.entries:
            if e.id in last and e.id not in seen:
                seen.add(e.id)
                entries.append(last[e.id])
    engines = [p.key for p in results[0].predictors if p.kind == "engine"]
    return summarize_run(" + ".join(r.dataset for r in results), entries, engines)


def main(argv: Sequence[str]) -> int:
    args = list(argv[1:])
    n = 2
    drop: list[str] = []
    while "--drop" in args:
        i = args.index("--drop")
        drop.append(args[i + 1])
        del args[i:i + 2]
    if "--batch" in args:
        i = args.index("--batch")
        n = int(args[i + 1])
        del args[i:i + 2]
    if not args:
        print(__doc__)
        return 2
    results = [load_result(Path(a)) for a in args]
    result = results[0] if len(results) == 1 and not drop else merge(results, drop)
    sys.stdout.write(render(result, batch_ids(n), n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
