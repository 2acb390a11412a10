"""Traced engine: runs the real model code on the meta device and accounts every tensor.

Needs the ``trace`` extra (torch, transformers, peft).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramplan.errors import MissingExtraError

if TYPE_CHECKING:
    from vramplan.report import Report
    from vramplan.spec.load import Resolved
    from vramplan.spec.scenario import Scenario

__all__ = ["estimate"]


def estimate(source: str | Path | dict[str, Any] | Scenario | Resolved) -> Report:
    """Trace one step of the scenario and return the same Report as the analytic engine."""
    raise MissingExtraError("the traced engine is not available in this build; use --engine analytic")
