"""Planning: the fastest setup that fits, explained, plus solvers over the estimator.

``plan(model, gpu, num_gpus, job)`` searches precision, optimizer, checkpointing, sharding,
offload, tensor/pipeline parallelism, the micro-batch split and (when allowed) LoRA/QLoRA; keeps
the setups that fit with a safety margin; and ranks them by the step-time model
(``vramplan.plan.steptime``).  ``solve_max_batch``, ``solve_max_seq`` and ``solve_min_gpus``
search one knob of a scenario.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vramplan.plan.fit import DEFAULT_MARGIN, fits_with_margin
    from vramplan.plan.result import PlanResult, RankedSetup, Rung, SolveResult, Suggestion
    from vramplan.plan.search import plan
    from vramplan.plan.setup import ServeSetup, TrainSetup
    from vramplan.plan.solvers import solve, solve_max_batch, solve_max_seq, solve_min_gpus
    from vramplan.plan.space import ServeJob, TrainJob

__all__ = [
    "DEFAULT_MARGIN", "PlanResult", "RankedSetup", "Rung", "ServeJob", "ServeSetup", "SolveResult", "Suggestion",
    "TrainJob", "TrainSetup", "fits_with_margin", "plan", "solve", "solve_max_batch", "solve_max_seq",
    "solve_min_gpus",
]

_WHERE = {
    "DEFAULT_MARGIN": "fit", "fits_with_margin": "fit", "PlanResult": "result", "RankedSetup": "result",
    "Rung": "result", "SolveResult": "result", "Suggestion": "result", "plan": "search", "ServeSetup": "setup",
    "TrainSetup": "setup", "solve": "solvers", "solve_max_batch": "solvers", "solve_max_seq": "solvers",
    "solve_min_gpus": "solvers", "ServeJob": "space", "TrainJob": "space",
}


def __getattr__(name: str) -> Any:
    # Imported on first use, so that importing a submodule (the step-time model, the setup record)
    # does not pull in the whole planner.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"vramplan.plan.{_WHERE[name]}"), name)
    raise AttributeError(name)
