"""Closed vocabularies as data: optimizers, precisions, quantization formats.

This package sits at the bottom of the dependency order, beside ``units`` and ``report``: the scenario
schema (``spec``), the engines, the planner, the exporters, the traced engine, ``measure`` and the CLI
all read the same rows, so a fact about an optimizer, a precision or a quantization format is written
once.  ``Choices`` marks a scenario field whose allowed values are the names of such a table: the
schema validates against it and the CLI lists its choices from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Choices"]


@dataclass(frozen=True)
class Choices:
    """Marks a ``str`` scenario field whose allowed values are the row names of a data table.

    Used as ``Annotated[str, Choices("optimizer", optimizer_names)]``: the scenario validator checks
    the value against ``names()`` (with a close-name suggestion) and the generated CLI options list
    ``names()`` as the option's choices, so adding a row to the table is the only change needed.
    """

    what: str
    names: Callable[[], tuple[str, ...]]
