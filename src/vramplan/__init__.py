"""vramplan: per-GPU memory budgets for LLM training, inference and serving.

>>> from vramplan import estimate
>>> report = estimate({"model": "meta-llama/Llama-2-7b-hf", "task": "inference",
...                    "hardware": {"gpu": "A100-80GB"}})
>>> report.fits
True
"""

from vramplan.analytic.engine import estimate
from vramplan.catalog import list_gpus, list_models, load_model, resolve_gpu
from vramplan.errors import Problem, ScenarioError, VramplanError
from vramplan.measure.record import record
from vramplan.measure.snapshot import read_snapshot
from vramplan.report import Report
from vramplan.spec.load import Resolved, resolve
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

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
