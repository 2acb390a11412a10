"""The step-time model: predicted seconds per training step and decode throughput.

Kept apart from the memory model (``vramplan.analytic``): each module holds one kind of term
(FLOPs, collectives, memory-bound kernels, offload, pipeline), each a small pure function with
its derivation and source.  ``train_step_time`` and ``decode_step_time`` add them up.
"""

from vramplan.plan.steptime.assumptions import DEFAULT_ASSUMPTIONS, PerfAssumptions
from vramplan.plan.steptime.facts import ModelFacts, model_facts
from vramplan.plan.steptime.serve import DecodeTime, decode_step_time
from vramplan.plan.steptime.train import StepTime, peak_flops_per_s, train_step_time

__all__ = [
    "DEFAULT_ASSUMPTIONS", "DecodeTime", "ModelFacts", "PerfAssumptions", "StepTime", "decode_step_time",
    "model_facts", "peak_flops_per_s", "train_step_time",
]
