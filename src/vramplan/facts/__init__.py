"""Closed vocabularies as data: optimizers, precisions, quantization formats.

This package sits at the bottom of the dependency order, beside ``units`` and ``report``: the scenario
schema (``spec``), the engines, the planner, the exporters, the traced engine, ``measure`` and the CLI
all read the same rows, so a fact about an optimizer, a precision or a quantization format is written
once.  ``Choices`` marks a scenario field whose allowed values are the names of such a table: the
schema validates against it and the CLI lists its choices from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from vramplan.errors import suggest

__all__ = ["Choices", "OneOf", "row_named"]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_RowT = TypeVar("_RowT", bound=_Named)


def row_named(rows: Iterable[_RowT], name: str, what: str) -> _RowT:
    """The row of a table called ``name``; a KeyError names the known rows (``what``: the table's noun)."""
    rows = tuple(rows)
    for row in rows:
        if row.name == name:
            return row
    raise KeyError(f"unknown {what} {name!r}; known: {', '.join(r.name for r in rows)}")


@dataclass(frozen=True)
class Choices:
    """Marks a ``str`` scenario field whose allowed values are the row names of a data table.

    Used as ``Annotated[str, Choices("optimizer", optimizer_names)]``: the scenario validator checks
    the value against ``names()`` (with a close-name suggestion) and the generated CLI options list
    ``names()`` as the option's choices, so adding a row to the table is the only change needed.
    """

    what: str
    names: Callable[[], tuple[str, ...]]


@dataclass(frozen=True)
class OneOf:
    """Pydantic metadata that checks a ``str`` field against a table's names at validation time and lists
    them as the JSON schema's ``enum``: ``Annotated[str, Choices(...), OneOf(names)]``.

    An unknown value raises pydantic's ``literal_error`` (as a ``Literal`` field does) with the valid
    choices in ``expected`` and the close names (``errors.suggest``) in the message, so the scenario
    loader reports it like any other closed choice.  The table is read on each call: a row added at
    run time is accepted at once.
    """

    names: Callable[[], tuple[str, ...]]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        out["enum"] = list(self.names())
        return out

    def _check(self, value: str) -> str:
        names = self.names()
        if value in names:
            return value
        quoted = [repr(n) for n in names]
        expected = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)
        close = suggest(value, names)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PydanticCustomError("literal_error", "Input should be {expected}{hint}",
                                  {"expected": expected, "hint": hint})
