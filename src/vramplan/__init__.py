"""vramplan: per-GPU memory budgets for LLM training, inference and serving.

>>> from vramplan import estimate
>>> report = estimate({"model": "meta-llama/Llama-2-7b-hf", "task": "inference",
...                    "hardware": {"gpu": "A100-80GB"}})
>>> report.fits
True
"""

from typing import TYPE_CHECKING, Any

from vramplan.catalog import list_gpus, list_models, load_model, resolve_gpu
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import Problem, ScenarioError, VramplanError
from vramplan.report import Report
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

if TYPE_CHECKING:
    from vramplan.measure.record import record
    from vramplan.measure.snapshot import read_snapshot

__version__ = "0.1.0"
__all__ = [
    "ModelSpec",
    "Problem",
    "Report",
    "Resolved",
    "Scenario",
    "ScenarioError",
    "VramplanError",
    "__version__",
    "estimate",
    "list_gpus",
    "list_models",
    "load_model",
    "read_snapshot",
    "record",
    "resolve",
    "resolve_gpu",
]


def __getattr__(name: str) -> Any:
    # the measure tools load on first use: an estimate does not need them (about 50 ms of imports)
    if name == "record":
        from vramplan.measure.record import record
        return record
    if name == "read_snapshot":
        from vramplan.measure.snapshot import read_snapshot
        return read_snapshot
    raise AttributeError(f"module 'vramplan' has no attribute {name!r}")
