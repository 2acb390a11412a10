"""Resolving a scenario: validate it, look its model and GPU up in the catalog, cross-check the two.

It sits in ``catalog`` because it needs the catalog's look-ups, while ``spec`` (below the catalog)
holds what needs no catalog: reading a document (``spec.load.read_document``), validating it
(``parse_scenario``), the cross-checks between a scenario and its model (``cross_check``) and the
``Resolved`` record.  Every problem is collected and raised together as one ``ScenarioError``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from vramplan.catalog.gpus import resolve_gpu
from vramplan.catalog.hub import checkpoint_notes
from vramplan.catalog.models import load_model
from vramplan.errors import Problem, ScenarioError
from vramplan.spec.checks import capability_problems, chunked_attention_notes, contradictions
from vramplan.spec.defaults import with_served_dtype, with_trainer_defaults
from vramplan.spec.families.t5 import untied_head
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.load import (
    Resolved,
    checkpoint_quantization_for,
    cross_check,
    fsdp_upcast_for,
    lora_targets_for,
    parse_scenario,
    quant_format_assumptions,
    read_document,
    release_attention_for,
    unmodelled_inputs,
    unsloth_attention_for,
)
from vramplan.spec.model import ModelSpec, for_release
from vramplan.spec.scenario import Scenario
from vramplan.units import GiB

__all__ = ["resolve"]


def resolve(source: str | Path | dict[str, Any] | Scenario) -> Resolved:
    """Load (if a path), validate, look up model and GPU, and cross-check parallel degrees."""
    if isinstance(source, (str, Path)):
        source = read_document(source)
    try:
        scenario = parse_scenario(source)
    except ScenarioError as exc:
        # report the names that cannot be resolved too, so every problem shows at once
        extra: list[Problem] = []
        if isinstance(source, dict):
            extra = _name_problems(source)
        raise ScenarioError([*exc.problems, *extra]) from None
    # the trainer's defaults of the null fields, resolved once (spec/defaults.py): what the estimate and the report's
    # scenario hold, so a report's scenario resolves to itself
    scenario = with_trainer_defaults(scenario)
    problems: list[Problem] = []
    model: ModelSpec | None = None
    gpu: GpuSpec | None = None
    try:
        model = load_model(scenario.model, offline=scenario.offline)
        # a T5 config with tie_word_embeddings: false builds a separate lm_head on transformers 4.x (5.x ties it)
        model = untied_head(model, scenario.software.transformers_version)
        # the attention's inputs as the named transformers release makes them (4.38's 4-D mask on every forward)
        model = for_release(model, scenario.software.transformers_version)
    except ScenarioError as exc:
        problems.extend(exc.problems)
    hw = scenario.hardware
    if hw.gpu is None and hw.capacity_gib is None:
        problems.append(Problem("hardware.gpu", "no GPU given", "name a catalog GPU (see `vramplan gpus`) or give hardware.capacity_gib"))
    elif hw.gpu is not None:
        try:
            gpu = resolve_gpu(hw.gpu)
            if hw.capacity_gib is not None:
                gpu = replace(gpu, total_memory_bytes=int(hw.capacity_gib * GiB))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    else:
        assert hw.capacity_gib is not None
        gpu = GpuSpec.custom(hw.capacity_gib)
    if gpu is not None and hw.cuda_module_loading != gpu.cuda_module_loading:
        gpu = replace(gpu, cuda_module_loading=hw.cuda_module_loading)
    if gpu is not None:
        # serve.dtype auto as vLLM resolves it on this GPU (spec/defaults.py served_dtype): the checks and the estimate
        # read, and the report's scenario holds, the dtype that runs
        scenario = with_served_dtype(scenario, gpu)
    notes: list[str] = []
    if model is not None:
        scenario, notes, quant_problems = checkpoint_quantization_for(scenario, model)
        # target_modules: null as PEFT completes it for the model type (facts/peft_targets.py)
        scenario, target_notes, target_problems = lora_targets_for(scenario, model)
        notes += target_notes
        scenario, upcast_notes = fsdp_upcast_for(scenario)
        notes += upcast_notes
        scenario, attention_notes = release_attention_for(scenario, model)
        notes += attention_notes
        scenario, attention_notes = unsloth_attention_for(scenario, model)
        notes += attention_notes
        quant_problems += target_problems
        notes += checkpoint_notes(model)
        notes += quant_format_assumptions(scenario, model, gpu.compute_capability if gpu is not None else "")
        notes += unmodelled_inputs(scenario, model)
        notes += chunked_attention_notes(scenario, model)
        problems.extend(quant_problems)
        problems.extend(cross_check(scenario, model))
        problems.extend(contradictions(scenario, model))
    if gpu is not None and hw.memory_in_use_gib:
        gpu, problem, note = _others_share(gpu, hw.memory_in_use_gib)
        problems.extend(problem)
        notes.extend(note)
    if gpu is not None:
        problems.extend(capability_problems(scenario, gpu))
    if problems:
        raise ScenarioError(problems)
    assert model is not None and gpu is not None
    return Resolved(scenario, model, gpu, tuple(notes))


def _others_share(gpu: GpuSpec, in_use_gib: float) -> tuple[GpuSpec, list[Problem], list[str]]:
    """The GPU as this job sees it when other processes hold ``in_use_gib`` of it: its capacity is what they
    leave (``total_memory_bytes``), the device's whole memory stays in ``device_total_bytes``."""
    in_use, total = int(in_use_gib * GiB), gpu.total_memory_bytes
    if in_use >= total:
        return gpu, [Problem("hardware.memory_in_use_gib",
                             f"other processes hold {in_use / GiB:,.2f} GiB of the {gpu.name}'s {total / GiB:,.2f} GiB: "
                             "nothing is left for this job",
                             f"set hardware.memory_in_use_gib below {total / GiB:,.2f}")], []
    note = (f"other processes hold {in_use / GiB:,.2f} GiB on each GPU (hardware.memory_in_use_gib): this job's "
            f"capacity is {(total - in_use) / GiB:,.2f} of the device's {total / GiB:,.2f} GiB")
    return replace(gpu, total_memory_bytes=total - in_use, in_use_by_others_bytes=in_use), [], [note]


def _name_problems(raw: dict[str, Any]) -> list[Problem]:
    out: list[Problem] = []
    model = raw.get("model")
    if isinstance(model, (str, dict)) and model:
        try:
            load_model(model, offline=raw.get("offline") is True)
        except ScenarioError as exc:
            out.extend(exc.problems)
    hw = raw.get("hardware")
    if isinstance(hw, dict) and isinstance(hw.get("gpu"), str):
        try:
            resolve_gpu(hw["gpu"])
        except ScenarioError as exc:
            out.extend(exc.problems)
    return out
