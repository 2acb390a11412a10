"""A measurement beside its prediction: per part, the measured and predicted bytes and the error.

The relative error is ``(predicted - measured) / measured``: positive when the prediction is
above the measurement (safe), negative when below (an under-prediction, the dangerous kind).
Example: measured 1,000,000 B, predicted 1,050,000 B -> +0.05 (+5.0 %).

On a machine without a GPU the step runs on the CPU, where some predicted memory does not
exist: cuBLAS workspaces (CUDA-only, allocated through the caching allocator) are removed
from the prediction it is compared with, and listed in ``excluded_predicted``.  There is no
caching allocator on the CPU, so reserved memory and NVML are not measured (None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vramplan.analytic.moment import cuda_only_labels
from vramplan.report import BREAKDOWN_KEYS, Report

__all__ = ["CPU_MEASURED", "CUDA_MEASURED", "CUDA_ONLY_PARTS", "MeasureResult", "PartRow", "comparable_prediction",
           "compare", "relative_error"]

CPU_MEASURED = "cpu live tensor bytes (tracker)"
CUDA_MEASURED = "cuda max_memory_allocated"

# (part, sub-part) of the analytic breakdown that exist only on a CUDA device: the declared keys
# flagged cuda_only (analytic/moment.py), so every task's workspace is found under its one label
CUDA_ONLY_PARTS: tuple[tuple[str, str], ...] = cuda_only_labels()


def relative_error(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing or nothing was measured."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


@dataclass(frozen=True)
class PartRow:
    part: str
    measured_bytes: int | None
    predicted_bytes: int | None
    relative_error: float | None


def comparable_prediction(report: Report, device_type: str) -> tuple[dict[str, int], dict[str, int]]:
    """The predicted breakdown as it applies to the measured device, and what was removed.

    On the CPU the CUDA-only sub-parts (``CUDA_ONLY_PARTS``) are taken out.
    """
    parts = dict(report.per_gpu.breakdown)
    excluded: dict[str, int] = {}
    if device_type != "cuda":
        detail = report.per_gpu.breakdown_detail
        for part, sub in CUDA_ONLY_PARTS:
            nbytes = detail.get(part, {}).get(sub, 0)
            if nbytes:
                parts[part] = parts.get(part, 0) - nbytes
                excluded[f"{part}.{sub}"] = nbytes
    return parts, excluded


def compare(measured: dict[str, int], predicted: dict[str, int], measured_total: int, predicted_total: int,
            extra: list[tuple[str, int | None, int | None]] | None = None) -> tuple[PartRow, ...]:
    """One row per part that either side has, then the totals (and any extra rows)."""
    rows: list[PartRow] = []
    keys = [k for k in BREAKDOWN_KEYS if measured.get(k, 0) or predicted.get(k, 0)]
    keys += [k for k in measured if k not in BREAKDOWN_KEYS and measured[k]]
    for k in keys:
        mb, pb = measured.get(k, 0), predicted.get(k, 0)
        rows.append(PartRow(k, mb, pb, relative_error(pb, mb)))
    rows.append(PartRow("peak allocated", measured_total, predicted_total,
                        relative_error(predicted_total, measured_total)))
    for name, mb2, pb2 in extra or []:
        rows.append(PartRow(name, mb2, pb2, relative_error(pb2, mb2)))
    return tuple(rows)


@dataclass(frozen=True)
class MeasureResult:
    """One real step, measured, beside the analytic prediction for the same (shrunken) scenario.

    ``breakdown`` is the content of memory at the measured peak and sums to
    ``peak_allocated_bytes``; ``measured`` says which quantity that is.
    """

    model_name: str
    task: str
    device: str  # "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)"
    measured: str  # CPU_MEASURED or CUDA_MEASURED
    peak_allocated_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    breakdown_detail: dict[str, dict[str, int]]
    phases: dict[str, int]
    parameters: int
    trainable_parameters: int
    prediction: Report
    predicted_comparable: dict[str, int]
    predicted_peak_bytes: int  # comparable prediction of peak_allocated_bytes
    excluded_predicted: dict[str, int]
    rows: tuple[PartRow, ...]
    scenario: dict[str, Any]
    predicted_phases: dict[str, int] = field(default_factory=dict)  # comparable: excluded parts removed
    peak_reserved_bytes: int | None = None
    peak_active_bytes: int | None = None
    device_used_bytes: int | None = None
    outside_allocator_bytes: int | None = None
    capacity_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def relative_error(self) -> float | None:
        """The peak's relative error, (predicted - measured) / measured."""
        return relative_error(self.predicted_peak_bytes, self.peak_allocated_bytes)

    def to_json_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["prediction"] = self.prediction.to_json_dict()
        out["relative_error"] = self.relative_error
        return out
