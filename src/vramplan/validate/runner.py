"""Run every predictor on every entry of a dataset and summarize the errors.

Predictors are the engines (``analytic``, ``trace``: functions from a resolved scenario
to a ``Report``) and the rules of thumb of ``rules.py``.  Each entry is resolved once;
an entry that does not resolve (unknown model, bad scenario) is listed as skipped
with the reason.  An engine that cannot run (the traced engine without its extra) is
reported as ``unavailable`` with the reason, per entry; one that fails on an entry is
reported as ``error`` for that entry, and the other entries still run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vramplan.catalog.resolve import resolve
from vramplan.errors import MissingExtraError, VramplanError
from vramplan.report import Report
from vramplan.report.band import (
    QUANTITY_CLASS,
    Calibration,
    band_bounds,
    load_calibration,
    loso_calibrations,
    with_band,
)
from vramplan.spec.load import Resolved
from vramplan.spec.scenario import Scenario
from vramplan.validate.dataset import Dataset, Entry, load_dataset
from vramplan.validate.metrics import FitsVerdict, Summary, fits_verdict, relative_error, summarize
from vramplan.validate.rules import RULES, Rule

__all__ = [
    "COMPARED_FIELD",
    "ENGINES",
    "BandSource",
    "EngineFn",
    "EntryResult",
    "Prediction",
    "PredictorSummary",
    "ValidationResult",
    "default_engines",
    "predicted_quantity",
    "run_validation",
    "summarize_entries",
    "summarize_run",
    "validate",
    "workload",
]

EngineFn = Callable[[Resolved], Report]
ENGINES: tuple[str, ...] = ("analytic", "trace")

# measured quantity -> the report field that predicts it
COMPARED_FIELD: dict[str, str] = {
    "max_memory_allocated": "per_gpu.peak_allocated_bytes",
    "max_memory_reserved": "per_gpu.peak_reserved_bytes",
    "nvidia_smi": "per_gpu.device_used_bytes",
    "kv_cache": "serve.kv_cache_bytes",
    "weights_gpu": "serve.weights_gpu_bytes",
    "compute_buffer": "serve.compute_buffer_bytes",
    "peak_active": "per_gpu.peak_allocated_bytes",
    "allocated_plus_non_torch": "per_gpu.peak_allocated_bytes + device_used_bytes - peak_reserved_bytes",
}

Status = Literal["ok", "unavailable", "error", "not_applicable"]


class Prediction(BaseModel):
    """One predictor on one entry."""

    model_config = ConfigDict(frozen=True)

    status: Status
    reason: str = ""
    predicted_bytes: int | None = None
    compared: str | None = None
    signed_error: float | None = None
    abs_error: float | None = None
    fits: bool | None = None
    verdict: FitsVerdict | None = None
    # engines only: the band's verdict and bounds of the compared quantity (report/band.py), fitted
    # without the entry's source when that source is in the calibration (``band_loso``)
    band_verdict: str | None = None
    low_bytes: int | None = None
    high_bytes: int | None = None
    covered: bool | None = None
    band_loso: bool = False


class EntryResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    source: str
    task: str
    workload: str
    model: str
    quantity: str
    measured_bytes: int
    outcome: str
    status: Literal["ok", "skipped"]
    skip_reason: str = ""
    not_compared: str = ""
    capacity_bytes: int | None = None
    predictions: dict[str, Prediction] = Field(default_factory=dict)
    motivated: list[str] = Field(default_factory=list)
    motivation: Literal["motivated", "not motivated"] = "not motivated"

    @property
    def usable(self) -> bool:
        """Resolves, and its measured quantity is known on a run that fitted: it gives an error."""
        return (self.status == "ok" and self.quantity != "unknown" and self.outcome == "fits"
                and not self.not_compared)


class PredictorSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    kind: Literal["engine", "rule"]
    label: str
    applies_to: str
    overall: Summary
    by_task: dict[str, Summary]
    by_workload: dict[str, Summary]
    by_source: dict[str, Summary]
    by_motivation: dict[str, Summary] = Field(default_factory=dict)
    unavailable_reason: str = ""


class ValidationResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    dataset: str
    n_entries: int
    n_resolved: int
    n_usable: int
    n_skipped: int
    predictors: list[PredictorSummary]
    entries: list[EntryResult]

    @property
    def skipped(self) -> list[EntryResult]:
        return [e for e in self.entries if e.status == "skipped"]

    def summary(self, key: str) -> PredictorSummary:
        for p in self.predictors:
            if p.key == key:
                return p
        raise KeyError(key)

    def worst(self, key: str, n: int = 10) -> list[EntryResult]:
        """Entries with the largest |error| for one predictor, largest first."""
        rows = [e for e in self.entries if key in e.predictions and e.predictions[key].abs_error is not None]
        return sorted(rows, key=lambda e: -(e.predictions[key].abs_error or 0.0))[:n]

    def to_json_dict(self) -> dict[str, object]:
        out = self.model_dump(mode="json")
        out["skipped"] = [{"id": e.id, "reason": e.skip_reason} for e in self.skipped]
        return out


def predicted_quantity(report: Report, quantity: str) -> int:
    """The report's prediction of a measured quantity (see ``COMPARED_FIELD``)."""
    pg = report.per_gpu
    if quantity in ("max_memory_allocated", "peak_active"):
        return pg.peak_allocated_bytes
    if quantity == "allocated_plus_non_torch":
        return pg.peak_allocated_bytes + pg.device_used_bytes - pg.peak_reserved_bytes
    if quantity == "max_memory_reserved":
        return pg.peak_reserved_bytes
    if quantity == "nvidia_smi":
        return pg.device_used_bytes
    if quantity == "kv_cache":
        return report.serve.kv_cache_bytes
    if quantity == "weights_gpu":
        # llama.cpp's report splits its weights between the GPU and the host; vLLM's and SGLang's weights are all on
        # the GPU ("Model loading took", "Load weight end ... mem usage"), their ``weights_bytes``
        sv = report.serve
        return sv.weights_gpu_bytes if sv.weights_gpu_bytes is not None else sv.weights_bytes
    if quantity == "compute_buffer":
        return report.serve.compute_buffer_bytes or 0
    raise KeyError(quantity)


def _analytic(r: Resolved) -> Report:
    from vramplan.engine import estimate

    return estimate(r)


def _trace(r: Resolved) -> Report:
    try:
        from vramplan.trace import estimate
    except ImportError as exc:  # the trace extra is missing
        raise MissingExtraError(f"the traced engine needs `pip install 'vramplan[trace]'` ({exc})") from None
    return estimate(r)


def default_engines(which: str = "all") -> dict[str, EngineFn]:
    """The engines named by ``--engine``: ``analytic``, ``trace`` or ``all``."""
    table: dict[str, EngineFn] = {"analytic": _analytic, "trace": _trace}
    if which == "all":
        return table
    if which not in table:
        from vramplan.errors import Problem, ScenarioError

        raise ScenarioError([Problem("--engine", f"unknown engine {which!r}", "use analytic, trace or all")])
    return {which: table[which]}


def _first_line(exc: BaseException) -> str:
    problems = getattr(exc, "problems", None)
    if problems:
        return "; ".join(str(p) for p in problems)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _score(entry: Entry, predicted: int, fits: bool, compared: str | None) -> Prediction:
    signed: float | None = None
    if compared is not None and entry.outcome == "fits":
        signed = relative_error(predicted, entry.measured.bytes)
    return Prediction(status="ok", predicted_bytes=predicted, compared=compared, signed_error=signed,
                      abs_error=None if signed is None else abs(signed), fits=fits,
                      verdict=fits_verdict(fits, entry.outcome))


class BandSource:
    """The calibration each entry's band is judged with: refitted without the entry's source when
    that source is in the calibration (leave-one-source-out), the shipped one otherwise."""

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = load_calibration() if calibration is None else calibration
        self._loso: dict[str, Calibration] | None = None

    def __call__(self, source: str) -> tuple[Calibration, bool]:
        if self._loso is None:
            self._loso = loso_calibrations(self.calibration)
        held = self._loso.get(source)
        return (self.calibration, False) if held is None else (held, True)


_BAND_FIELDS: dict[str, tuple[str, str]] = {
    "allocated": ("per_gpu", "peak_allocated_bytes"), "reserved": ("per_gpu", "peak_reserved_bytes"),
    "device_used": ("per_gpu", "device_used_bytes"), "kv_cache": ("serve", "kv_cache_bytes"),
}


def _band(report: Report, entry: Entry, predicted: int, bands: BandSource) -> dict[str, object]:
    cal, loso = bands(entry.group)
    banded = with_band(report, cal)
    qc = QUANTITY_CLASS.get(entry.measured.quantity, "")
    low = high = None
    if entry.compares_bytes and qc in _BAND_FIELDS:
        block, key = _BAND_FIELDS[qc]
        part = getattr(banded, block)
        low, high = getattr(part, key + "_low"), getattr(part, key + "_high")
    elif entry.compares_bytes and qc:
        from vramplan.report.band import workload_of

        q, _ = cal.lookup(banded.engine, workload_of(banded.scenario), qc)
        low, high = band_bounds(predicted, q or 0.0)
    covered = None
    if low is not None and high is not None and entry.outcome == "fits":
        covered = low <= entry.measured.bytes <= high
    return {"band_verdict": banded.verdict, "low_bytes": low, "high_bytes": high, "covered": covered,
            "band_loso": loso}


def _run_engine(fn: EngineFn, r: Resolved, entry: Entry, bands: BandSource | None = None) -> Prediction:
    try:
        report = fn(r)
    except MissingExtraError as exc:
        return Prediction(status="unavailable", reason=_first_line(exc))
    except VramplanError as exc:
        return Prediction(status="error", reason=_first_line(exc))
    except Exception as exc:  # noqa: BLE001 -- one failing entry must not stop the other entries
        return Prediction(status="error", reason=f"{type(exc).__name__}: {_first_line(exc)}")
    q = entry.measured.quantity
    if not entry.compares_bytes:
        pred = _score(entry, report.per_gpu.device_used_bytes, report.fits, None)
    else:
        pred = _score(entry, predicted_quantity(report, q), report.fits, COMPARED_FIELD[q])
    if bands is None:
        return pred
    return pred.model_copy(update=_band(report, entry, pred.predicted_bytes or 0, bands))


def _run_rule(rule: Rule, r: Resolved, entry: Entry) -> Prediction:
    if r.scenario.task not in rule.tasks:
        return Prediction(status="not_applicable", reason=f"for {'/'.join(rule.tasks)} only")
    if entry.measured.quantity == "kv_cache":
        return Prediction(status="not_applicable", reason="a rule of thumb does not predict vLLM's KV pool")
    if entry.measured.quantity in ("weights_gpu", "compute_buffer"):
        return Prediction(status="not_applicable", reason="a rule of thumb does not predict one engine buffer")
    predicted = rule.predict(r)
    compared = "rule" if entry.compares_bytes else None
    return _score(entry, predicted, predicted <= r.gpu.total_memory_bytes, compared)


def _model_name(entry: Entry) -> str:
    m = entry.scenario.get("model")
    return m if isinstance(m, str) else "inline config"


def workload(scenario: Scenario) -> str:
    """The task, with training split into full fine-tuning and adapters (``train-full`` / ``train-peft``)."""
    if scenario.task != "train":
        return scenario.task
    return "train-full" if scenario.train.peft is None else "train-peft"


def _evaluate(entry: Entry, engines: Mapping[str, EngineFn], rules: Sequence[Rule],
              bands: BandSource | None = None) -> EntryResult:
    base = {"id": entry.id, "source": entry.group, "task": entry.task, "workload": entry.task,
            "model": _model_name(entry), "quantity": entry.measured.quantity, "measured_bytes": entry.measured.bytes,
            "outcome": entry.outcome, "not_compared": entry.not_compared, "motivated": list(entry.motivated),
            "motivation": "motivated" if entry.motivated else "not motivated"}
    try:
        # a dataset is scored the same on every machine: a Hub id outside the catalog is read from the Hugging
        # Face cache only, never from the network (catalog/hub.py)
        r = resolve({**entry.scenario, "offline": True})
    except VramplanError as exc:
        return EntryResult(**base, status="skipped", skip_reason=_first_line(exc))
    preds: dict[str, Prediction] = {name: _run_engine(fn, r, entry, bands) for name, fn in engines.items()}
    for rule in rules:
        preds[rule.key] = _run_rule(rule, r, entry)
    return EntryResult(**{**base, "task": r.scenario.task, "workload": workload(r.scenario)}, status="ok",
                       capacity_bytes=r.gpu.total_memory_bytes, predictions=preds)


def summarize_entries(results: Iterable[EntryResult], key: str) -> Summary:
    """One predictor's summary (errors, verdicts, band verdicts, coverage, runs that failed) over some entries."""
    errors: list[float] = []
    verdicts: list[FitsVerdict] = []
    band: list[tuple[str, str]] = []
    covered: list[bool] = []
    not_run = 0
    for e in results:
        p = e.predictions.get(key)
        if p is None or p.status == "not_applicable":
            continue
        if p.status in ("unavailable", "error"):
            not_run += 1
            continue
        if p.signed_error is not None:
            errors.append(p.signed_error)
        if p.verdict is not None:
            verdicts.append(p.verdict)
        if p.band_verdict is not None:
            band.append((p.band_verdict, e.outcome))
        if p.covered is not None:
            covered.append(p.covered)
    return summarize(errors, verdicts, not_run, band, covered)


def _group(results: Sequence[EntryResult], key: str, attr: str) -> dict[str, Summary]:
    names = sorted({getattr(e, attr) for e in results})
    return {n: summarize_entries([e for e in results if getattr(e, attr) == n], key) for n in names}


def _unavailable_reason(results: Sequence[EntryResult], key: str) -> str:
    reasons = {e.predictions[key].reason for e in results if key in e.predictions
               and e.predictions[key].status == "unavailable"}
    ran = any(e.predictions[key].status == "ok" for e in results if key in e.predictions)
    return next(iter(reasons)) if len(reasons) == 1 and not ran else ""


def run_validation(dataset: Dataset, engines: Mapping[str, EngineFn] | None = None,
                   rules: Sequence[Rule] = RULES, calibration: Calibration | None = None) -> ValidationResult:
    """Score each engine and rule of thumb on every entry of ``dataset``.

    Each engine's prediction also gets the band's verdict and bounds (``BandSource``: the
    ``calibration``, default the shipped one, refitted without the entry's source when the
    calibration holds that source)."""
    engines = default_engines("all") if engines is None else engines
    bands = BandSource(calibration)
    results = [_evaluate(e, engines, rules, bands) for e in dataset.entries]
    return summarize_run(dataset.path, results, list(engines), rules)


def summarize_run(dataset: str, results: list[EntryResult], engines: Sequence[str],
                  rules: Sequence[Rule] = RULES) -> ValidationResult:
    """The scored entries with each engine's and rule's summaries: what ``run_validation`` returns, also for entries
    scored in several runs and put together (benchmarks/render_holdout_batch2.py)."""
    ok = [e for e in results if e.status == "ok"]
    summaries: list[PredictorSummary] = []
    for name in engines:
        summaries.append(PredictorSummary(
            key=name, kind="engine", label=name, applies_to="all",
            overall=summarize_entries(ok, name), by_task=_group(ok, name, "task"), by_workload=_group(ok, name, "workload"),
            by_source=_group(ok, name, "source"), by_motivation=_group(ok, name, "motivation"),
            unavailable_reason=_unavailable_reason(ok, name)))
    for rule in rules:
        summaries.append(PredictorSummary(
            key=rule.key, kind="rule", label=rule.label, applies_to="/".join(rule.tasks),
            overall=summarize_entries(ok, rule.key), by_task=_group(ok, rule.key, "task"),
            by_workload=_group(ok, rule.key, "workload"), by_source=_group(ok, rule.key, "source")))
    return ValidationResult(
        dataset=dataset, n_entries=len(results), n_resolved=len(ok), n_usable=sum(e.usable for e in results),
        n_skipped=len(results) - len(ok), predictors=summaries, entries=results)


def validate(path: str | Path, engine: str = "all", engines: Mapping[str, EngineFn] | None = None) -> ValidationResult:
    """Load a dataset file and score it: ``engine`` is analytic, trace or all (ignored if ``engines``)."""
    dataset = load_dataset(path)
    return run_validation(dataset, default_engines(engine) if engines is None else engines)
