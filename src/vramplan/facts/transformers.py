"""The first transformers release that knows each model family, as data.

``data/transformers_model_types.json`` lists, for every ``model_type`` transformers has shipped, the first
release whose ``AutoConfig`` maps it (read off the release wheels on PyPI by
``benchmarks/transformers_first_release.py``).  A scenario that names ``software.transformers`` older than
its model's first release describes a run that cannot load the model (``spec/checks.py`` refuses it), where
the loss code of that release would otherwise be applied to a family it never ran.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

__all__ = ["first_release", "release_tuple"]


@cache
def _table() -> dict[str, object]:
    text = resources.files("vramplan.facts").joinpath("data/transformers_model_types.json").read_text()
    doc: dict[str, object] = json.loads(text)
    return doc


def release_tuple(text: str) -> tuple[int, ...]:
    """A release string as a comparable tuple of three numbers: "4.45" -> (4, 45, 0)."""
    parts = [int(x) for x in text.split(".")]
    return tuple((parts + [0, 0, 0])[:3])


def first_release(model_type: str) -> str | None:
    """The first transformers release whose AutoConfig knows ``model_type``; None when the table does not
    list it or when the type is in the oldest release read (4.26.0), whose own first release is unknown.

    >>> first_release("qwen3"), first_release("llama"), first_release("gpt2")
    ('4.51.0', '4.28.0', None)
    """
    doc = _table()
    rows = doc["first_release"]
    assert isinstance(rows, dict)
    found = rows.get(model_type)
    if not isinstance(found, str) or found == doc["oldest_release_read"]:
        return None
    return found
