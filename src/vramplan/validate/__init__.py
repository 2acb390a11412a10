"""Validation against measured runs: ``vramplan validate DATASET``.

>>> from vramplan.validate import validate
>>> result = validate("validation/published.yaml", engine="analytic")   # doctest: +SKIP
>>> result.summary("analytic").overall.median_abs_error                 # doctest: +SKIP
"""

from vramplan.validate.dataset import Dataset, Entry, Measured, load_dataset, parse_dataset
from vramplan.validate.markdown import to_markdown
from vramplan.validate.metrics import Summary, fits_verdict, percentile, relative_error, summarize
from vramplan.validate.rules import RULES, Rule
from vramplan.validate.runner import (
    COMPARED_FIELD,
    EngineFn,
    EntryResult,
    Prediction,
    PredictorSummary,
    ValidationResult,
    default_engines,
    predicted_quantity,
    run_validation,
    validate,
    workload,
)

__all__ = [
    "COMPARED_FIELD",
    "RULES",
    "Dataset",
    "EngineFn",
    "Entry",
    "EntryResult",
    "Measured",
    "Prediction",
    "PredictorSummary",
    "Rule",
    "Summary",
    "ValidationResult",
    "default_engines",
    "fits_verdict",
    "load_dataset",
    "parse_dataset",
    "percentile",
    "predicted_quantity",
    "relative_error",
    "run_validation",
    "summarize",
    "to_markdown",
    "validate",
    "workload",
]
