"""Markdown tables of a validation result (for the README and benchmarks/)."""

from __future__ import annotations

from vramplan.validate.metrics import Summary
from vramplan.validate.runner import PredictorSummary, ValidationResult

__all__ = ["band_lines", "fmt_fraction", "fmt_pct", "summary_cells", "to_markdown"]


def fmt_pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def fmt_fraction(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "-"


def summary_cells(s: Summary) -> list[str]:
    """n, median |e|, p90 |e|, median e, under/over, fits/OOM correct, missed OOM, false OOM."""
    return [str(s.n_error), fmt_pct(s.median_abs_error), fmt_pct(s.p90_abs_error),
            fmt_pct(s.median_signed_error, signed=True), f"{s.under} / {s.over}",
            fmt_fraction(s.fits_correct, s.n_fits_checked), str(s.missed_oom), str(s.false_oom)]


HEAD = ["n", "median abs err", "p90 abs err", "median signed err", "under / over", "fits/OOM correct",
        "said fits, OOMed", "said OOM, fitted"]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(first: list[str], rows: list[list[str]]) -> list[str]:
    head = first + HEAD
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows)]


def _predictor_rows(p: PredictorSummary) -> list[str]:
    if p.unavailable_reason:
        return [p.label, p.applies_to, f"unavailable: {p.unavailable_reason}"] + [""] * (len(HEAD) - 1)
    return [p.label, p.applies_to, *summary_cells(p.overall)]


def _coverage(s: Summary) -> str:
    return f"{s.band_covered}/{s.band_n_checked} ({fmt_pct(s.band_coverage)})" if s.band_n_checked else "-"


def band_lines(result: object) -> list[str]:
    """Per engine, one line each: the band's verdicts, FITS for runs that OOMed, coverage (overall and
    per workload, leave-one-source-out for the calibration's sources), and the error of entries that
    motivated a behaviour of the engine and of the others."""
    assert isinstance(result, ValidationResult)
    out: list[str] = []
    for p in result.predictors:
        if p.kind != "engine" or p.unavailable_reason:
            continue
        o = p.overall
        out.append(f"{p.label} band: FITS {o.band_fits}, MAY NOT FIT {o.band_may_not_fit}, DOES NOT FIT "
                   f"{o.band_does_not_fit}; said FITS, OOMed {o.band_missed_oom}; coverage {_coverage(o)} ("
                   + ", ".join(f"{w} {_coverage(s)}" for w, s in p.by_workload.items() if s.band_n_checked) + ")")
        parts = [f"{k}: n {s.n_error}, median |e| {fmt_pct(s.median_abs_error)}, p90 |e| {fmt_pct(s.p90_abs_error)}"
                 for k, s in p.by_motivation.items() if s.n_error]
        if parts:
            out.append(f"{p.label} error by entries that motivated a behaviour: " + "; ".join(parts))
    return out


def to_markdown(result: ValidationResult, worst: int = 12) -> str:
    """Summary, by task, by source, the worst entries and the skipped ones, as markdown."""
    lines = [
        (f"Dataset `{result.dataset}`: {result.n_entries} entries, {result.n_resolved} resolved, "
         f"{result.n_usable} with a known measured quantity on a run that fitted (they give the errors), "
         f"{result.n_skipped} skipped. Error = (predicted - measured) / measured, of the quantity that was "
         "measured (max_memory_allocated, max_memory_reserved, nvidia-smi or vLLM's KV pool)."),
        "",
    ]
    lines += _table(["predictor", "applies to"], [_predictor_rows(p) for p in result.predictors])
    band = band_lines(result)
    if band:
        lines += ["", "Band (docs/validation.md; coverage leave-one-source-out for the calibration's sources):", ""]
        lines += [f"- {x}" for x in band]
    lines += ["", "By task (training split into full fine-tuning and adapters, LoRA/QLoRA):", ""]
    rows: list[list[str]] = []
    for p in result.predictors:
        if p.unavailable_reason:
            continue
        for task, s in p.by_workload.items():
            if s.n_error or s.n_fits_checked:
                rows.append([p.label, task, *summary_cells(s)])
    lines += _table(["predictor", "task"], rows)
    lines += ["", "By source (engines):", ""]
    rows = []
    for p in result.predictors:
        if p.kind != "engine" or p.unavailable_reason:
            continue
        for source, s in p.by_source.items():
            rows.append([p.label, source, *summary_cells(s)])
    lines += _table(["predictor", "source"], rows)
    for p in result.predictors:
        if p.kind != "engine" or p.unavailable_reason:
            continue
        bad = result.worst(p.key, worst)
        if not bad:
            continue
        lines += ["", f"Largest errors, {p.label}:", "",
                  _row(["entry", "task", "quantity", "measured GiB", "predicted GiB", "error"]),
                  _row(["---"] * 6)]
        for e in bad:
            pr = e.predictions[p.key]
            lines.append(_row([e.id, e.task, e.quantity, f"{e.measured_bytes / 2**30:.2f}",
                               f"{(pr.predicted_bytes or 0) / 2**30:.2f}", fmt_pct(pr.signed_error, signed=True)]))
        missed = [e for e in result.entries if e.predictions.get(p.key) and e.predictions[p.key].verdict == "missed_oom"]
        if missed:
            lines += ["", f"Said fits but the run OOMed ({p.label}): " + ", ".join(e.id for e in missed)]
    uncompared = [e for e in result.entries if e.not_compared]
    if uncompared:
        lines += ["", "Fits/OOM only, bytes not compared:", ""]
        lines += [f"- `{e.id}`: {e.not_compared}" for e in uncompared]
    if result.skipped:
        lines += ["", "Skipped (not resolved):", ""]
        lines += [f"- `{e.id}`: {e.skip_reason}" for e in result.skipped]
    return "\n".join(lines) + "\n"
