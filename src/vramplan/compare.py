"""Two to four setups side by side: each one's report, and which settings and results differ.

``compare`` estimates each scenario with one engine and returns plain JSON data, so the command line
(``vramplan compare``) and a web page render the same document.  The scenario keys compared are those of
each report's ``scenario`` (the validated scenario with every default filled in), so a key left out of one
input and set to its default in another does not count as a difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.report import flatten
from vramplan.spec.scenario import Scenario

__all__ = ["MAX_SETUPS", "MIN_SETUPS", "RESULT_KEYS", "compare", "differing_keys", "flatten"]

MIN_SETUPS = 2
MAX_SETUPS = 4
# the per-GPU results set side by side (integers in bytes), in the order a reader compares them
RESULT_KEYS: tuple[str, ...] = ("verdict", "fits", "per_gpu.device_used_bytes", "per_gpu.peak_reserved_bytes",
                                "per_gpu.peak_allocated_bytes", "per_gpu.headroom_bytes",
                                "per_gpu.capacity_bytes", "per_gpu.peak_phase")


_MISSING = object()


def _leaves(doc: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) for every leaf of a JSON document; a list or an empty mapping is one leaf."""
    if isinstance(doc, Mapping) and doc:
        return [leaf for k, v in doc.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix, doc)]


def differing_keys(docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The dotted leaf keys whose values are not equal in every document, in first-seen order (a key
    missing from one document counts as a difference).

    >>> differing_keys([{"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3, "d": 0}}])
    ['b.c', 'b.d']
    """
    flat = [dict(_leaves(d)) for d in docs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return [k for k in keys if len({repr(f.get(k, _MISSING)) for f in flat}) > 1]


def _estimate(scenario: Scenario | Mapping[str, Any], engine: str, index: int) -> dict[str, Any]:
    source: Scenario | dict[str, Any] = scenario if isinstance(scenario, Scenario) else dict(scenario)
    try:
        if engine == "analytic":
            from vramplan.engine import estimate

            return estimate(source).to_json_dict()
        from vramplan.trace import estimate as trace_estimate

        return trace_estimate(source).to_json_dict()
    except ScenarioError as exc:
        # every problem, each under the setup it belongs to
        raise ScenarioError([Problem(f"setup {index + 1}: {p.where}" if p.where else f"setup {index + 1}",
                                     p.message, p.hint) for p in exc.problems]) from None


def _differing(flat: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for key in keys:
        values = [f.get(key) for f in flat]
        if any(v != values[0] for v in values[1:]):
            out.append({"key": key, "values": values})
    return out


def compare(scenarios: Sequence[Scenario | Mapping[str, Any]], engine: str = "analytic") -> dict[str, Any]:
    """Estimate 2 to 4 scenarios with ``engine`` ("analytic" or "trace") and set them side by side.

    Returns ``{"engine", "reports": [each report's JSON document], "differences": [{"key": dotted scenario
    key, "values": [one per setup]}], "results": [{"key": result key, "values": [...], "differs": bool}],
    "differing_keys": [every dotted leaf of the whole report documents, results and scenario, whose value
    differs], "best": index of the setup that fits with the least memory per GPU, or None}``.  Raises
    ``ScenarioError`` (every setup's problems at once, each prefixed with its setup number) for a bad input.
    """
    problems: list[Problem] = []
    if isinstance(scenarios, (str, bytes, Mapping)) or not isinstance(scenarios, Sequence):
        raise ScenarioError([Problem("scenarios", "give a list of 2 to 4 scenarios", "")])
    if not MIN_SETUPS <= len(scenarios) <= MAX_SETUPS:
        problems.append(Problem("scenarios", f"{len(scenarios)} setups given; compare takes "
                                f"{MIN_SETUPS} to {MAX_SETUPS}", "give 2, 3 or 4 scenarios"))
    if engine not in ("analytic", "trace"):
        problems.append(Problem("engine", f"unknown engine {engine!r}", "use analytic or trace"))
    bad = [i + 1 for i, s in enumerate(scenarios) if not isinstance(s, (Scenario, Mapping))]
    if bad:
        problems.append(Problem("scenarios", f"setup(s) {bad} are not scenarios", "give mappings or Scenario objects"))
    if problems:
        raise ScenarioError(problems)
    reports: list[dict[str, Any]] = []
    for i, s in enumerate(scenarios):
        try:
            reports.append(_estimate(s, engine, i))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ScenarioError(problems)
    flat_scenarios = [flatten(r["scenario"]) for r in reports]
    keys = list(dict.fromkeys(k for f in flat_scenarios for k in f))
    flat_results = [flatten(r) for r in reports]
    results = [{"key": k, "values": [f.get(k) for f in flat_results],
                "differs": any(f.get(k) != flat_results[0].get(k) for f in flat_results[1:])} for k in RESULT_KEYS]
    fitting = [i for i, r in enumerate(reports) if r["fits"]]
    best = min(fitting, key=lambda i: reports[i]["per_gpu"]["device_used_bytes"]) if fitting else None
    return {"engine": engine, "reports": reports, "differences": _differing(flat_scenarios, keys),
            "results": results, "differing_keys": differing_keys(reports), "best": best}
