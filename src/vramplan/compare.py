"""Several setups side by side: each scenario's report, and the report keys on which they differ.

``compare(scenarios)`` estimates every scenario with the same engine and lists, as dotted keys
(``per_gpu.breakdown.activations``, ``scenario.train.seq_len``), every leaf of the report documents
whose value is not the same in all of them (a key missing from one counts as a difference), so a
reader (the web page, a script) highlights what changed and what it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from vramplan.engine import estimate
from vramplan.errors import Problem, ScenarioError
from vramplan.report import Report
from vramplan.spec.scenario import Scenario

__all__ = ["compare", "differing_keys"]

_MISSING = object()


def _leaves(doc: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a JSON document; a list is one leaf (compared whole)."""
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, doc


def differing_keys(docs: Sequence[dict[str, Any]]) -> list[str]:
    """The dotted leaf keys whose values are not equal in every document, in first-seen order.

    >>> differing_keys([{"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3, "d": 0}}])
    ['b.c', 'b.d']
    """
    flat = [dict(_leaves(d)) for d in docs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return [k for k in keys if len({repr(f.get(k, _MISSING)) for f in flat}) > 1]


def compare(scenarios: Sequence[str | Path | dict[str, Any] | Scenario], engine: str = "analytic") -> dict[str, Any]:
    """``{"reports": [report JSON, ...], "differences": [dotted key, ...]}`` for the given scenarios.

    ``engine`` is ``analytic`` or ``trace`` (the traced engine needs the ``trace`` extra)."""
    run: Callable[[Any], Report]
    if engine == "analytic":
        run = estimate
    elif engine == "trace":
        from vramplan.trace import estimate as trace_estimate

        run = trace_estimate
    else:
        raise ScenarioError([Problem("engine", f"unknown engine {engine!r}", "use analytic or trace")])
    reports = [run(s).to_json_dict() for s in scenarios]
    return {"reports": reports, "differences": differing_keys(reports)}
