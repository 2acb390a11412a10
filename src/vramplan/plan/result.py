"""What ``plan()`` returns (and ``vramplan plan --json`` prints): plain pydantic models.

Byte counts are integers with the unit in the name, times are seconds; every ranked setup carries
the estimator's full ``Report`` (its per-GPU breakdown) and the scenario document that reproduces
it with ``vramplan estimate``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vramplan.report import Report

__all__ = ["GpuCountBest", "PlanResult", "RankedSetup", "Rung", "SearchStats", "SolveResult", "Suggestion"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class RankedSetup(_Frozen):
    """One setup that fits, with its predicted speed and memory."""

    rank: int
    label: str
    kind: Literal["train", "serve"]
    setup: dict[str, Any]
    scenario: dict[str, Any]
    step_time_s: float  # training: one optimizer step; serving: one decode step
    tokens_per_s: float  # training: tokens trained per second; serving: tokens generated per second
    step_time: dict[str, float]  # the terms of the step-time model
    device_used_bytes: int
    usable_bytes: int
    capacity_bytes: int
    headroom_bytes: int  # usable - used: what is left inside the margin
    host_offloaded_bytes_per_gpu: int = 0
    max_concurrency: int = 0  # serving: sequences of max_model_len the KV cache holds per replica
    trade: str = ""  # runners-up: what this setup gives and takes compared with the chosen one
    report: Report


class Rung(_Frozen):
    """One step of the decision tree (cheapest first), tried on its own and measured."""

    step: int
    title: str
    label: str
    fits: bool
    device_used_bytes: int
    usable_bytes: int
    over_bytes: int  # > 0: by how much it does not fit
    largest_parts: list[tuple[str, int]]  # the biggest parts of memory at its peak
    host_offloaded_bytes_per_gpu: int = 0
    why: str


class Suggestion(_Frozen):
    kind: Literal["more_gpus", "larger_gpu", "shorter_sequence", "peft", "quantization", "smaller_batch"]
    text: str
    value: Any = None
    label: str = ""
    scenario: dict[str, Any] = Field(default_factory=dict)  # the setup that would fit, for `vramplan estimate`


class GpuCountBest(_Frozen):
    num_gpus: int
    fits: bool
    label: str = ""
    step_time_s: float = 0.0
    tokens_per_s: float = 0.0


class SearchStats(_Frozen):
    """How the search went.  Every candidate is enumerated and timed by the step-time model; its memory
    is then decided by a lower bound (``bound_rejected``: the static terms', or the steady step's peak
    moment's, both never above the estimate), by a full estimate, or it is dropped by the branch-and-bound
    rule (``pruned``: enough fitting setups with a shorter predicted step, or a faster member of its
    family, were already found, so it cannot enter the answer)."""

    candidates: int
    bound_rejected: int
    estimated: int
    estimated_fit: int
    pruned: int
    host_memory_rejected: int = 0
    seconds: float
    candidates_per_s: float
    exhaustive: bool = False


class PlanResult(_Frozen):
    task: Literal["train", "serve"]
    model: str
    gpu: str
    num_gpus: list[int]
    job: dict[str, Any]
    margin: float
    capacity_bytes: int
    usable_bytes: int
    fits: bool
    chosen: RankedSetup | None = None
    runners_up: list[RankedSetup] = Field(default_factory=list)
    ladder: list[Rung] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    by_gpu_count: list[GpuCountBest] = Field(default_factory=list)
    explanation: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    stats: SearchStats

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class SolveResult(_Frozen):
    kind: Literal["max-batch", "max-seq", "min-gpus"]
    knob: str
    value: int | None
    margin: float
    usable_bytes: int
    probes: int
    note: str
    scenario: dict[str, Any] = Field(default_factory=dict)
    report: Report | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
