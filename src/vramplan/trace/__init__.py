"""Traced engine: runs the real model code on the meta device and accounts every tensor.

Needs the ``trace`` extra (torch, transformers, peft): ``pip install 'vramplan[trace]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramplan.errors import MissingExtraError

if TYPE_CHECKING:
    from vramplan.report import Report
    from vramplan.spec.load import Resolved
    from vramplan.spec.scenario import Scenario

__all__ = ["estimate", "require_torch"]


def require_torch() -> None:
    """Raise a MissingExtraError naming the extra when torch/transformers/peft are absent."""
    missing = []
    for name in ("torch", "transformers", "peft"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtraError(
            f"the traced engine needs {', '.join(missing)}: pip install 'vramplan[trace]' "
            "(install torch for your platform first), or use --engine analytic")


def estimate(source: str | Path | dict[str, Any] | Scenario | Resolved) -> Report:
    """Trace one step of the scenario and return the same Report as the analytic engine."""
    require_torch()
    from vramplan.trace.engine import estimate as run

    return run(source)
