"""Typed, validated inputs: the scenario, the model spec and the GPU spec."""

from vramplan.spec.gpu import GpuSpec
from vramplan.spec.model import LayerSpec, MLASpec, ModelSpec, MoESpec, ParamGroup, Traits
from vramplan.spec.scenario import Hardware, Inference, Parallel, Peft, Scenario, Serve, Train

__all__ = [
    "GpuSpec",
    "Hardware",
    "Inference",
    "LayerSpec",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "Parallel",
    "ParamGroup",
    "Peft",
    "Scenario",
    "Serve",
    "Train",
    "Traits",
]
