"""Which fields of a scenario block are set: by value, never by a key's presence.

A report's ``scenario``, the planner's and the solvers' documents carry every field (``model_dump``), so a key
present at its default must mean what the key left out means: a field counts as set when its value differs from
its default (docs/conventions.md, No silent inputs).  ``changed_fields`` is that rule, once, for every check that
asks "was this given?" (another engine's options, another task's section, settings a framework does not read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["changed_fields"]


def changed_fields(part: BaseModel, keys: Iterable[str] | None = None, *,
                   defaults: BaseModel | Mapping[str, Any] | None = None) -> list[str]:
    """The names among ``keys`` (every field of ``part``'s model when None), in their order, whose value in ``part``
    differs from the default: the field's own (a ``default_factory`` called), or ``defaults``' where it gives one
    (a block of defaults as the scenario resolves them, or a mapping of some fields' resolved defaults)."""
    fields = type(part).model_fields
    names = list(fields) if keys is None else list(keys)
    if isinstance(defaults, BaseModel):
        given: Mapping[str, Any] = {k: getattr(defaults, k) for k in names}
    else:
        given = defaults or {}
    out = []
    for k in names:
        default = given[k] if k in given else fields[k].get_default(call_default_factory=True, validated_data={})
        if getattr(part, k) != default:
            out.append(k)
    return out
