"""A cheap lower bound of a training setup's device memory, to reject candidates early.

The analytic engine walks a step moment by moment and reports the largest moment.  Every
moment it builds starts from the same *static* content -- the resident weights, the optimizer
states and the master weights (and the cuBLAS workspaces) -- and adds activations, gradients
and temporaries on top (``analytic/train.py``, ``static()``).  Reserved memory is at least the
peak moment, and ``device_used`` adds the CUDA context, the NCCL buffers of each communicator
and the managed (paged) optimizer states.  So

    bound = weights resident + optimizer states + master weights + workspaces
            + CUDA context + NCCL buffers + managed states  <=  device_used

for any micro-batch size.  Each term below is a *lower* value of the engine's term: weights of
a quantized PEFT base without the fp32 casts of ``prepare_model_for_kbit_training``; optimizer
states from the same row of ``facts/optimizers.py`` the engine reads, at their stored values only
(8-bit states at 2 bytes per parameter for every tensor: the engine charges small tensors 8 and
adds the block scales; factored Adafactor states at 0).  ``tests/test_plan_properties.py`` checks bound <= estimate on random setups.
"""

from __future__ import annotations

from vramplan.analytic.layout import RankParams
from vramplan.analytic.overhead import cublas_workspace_bytes, cuda_context_bytes, nccl_bytes
from vramplan.analytic.precision import PrecisionPolicy
from vramplan.analytic.weights import weights_bytes
from vramplan.facts.optimizers import optimizer_facts
from vramplan.plan.setup import TrainSetup
from vramplan.spec.gpu import GpuSpec
from vramplan.units import ceil_div

__all__ = ["shards", "static_lower_bound_bytes"]


def shards(s: TrainSetup) -> tuple[int, int, int]:
    """(optimizer/master, gradient, parameter) shard counts of ZeRO / FSDP over the data-parallel ranks."""
    dp = s.dp
    if s.fsdp in ("full_shard", "hybrid_shard"):
        group = min(dp, s.gpus_per_node) if s.fsdp == "hybrid_shard" else dp
        return group, group, group
    if s.fsdp == "shard_grad_op":
        return dp, dp, 1
    z = s.zero_stage
    return (dp if z >= 1 else 1, dp if z >= 2 else 1, dp if z >= 3 else 1)


def _states_lower(s: TrainSetup, trainable_shard: int, opt_param_bytes: int) -> int:
    """The optimizer row's stored state values for every parameter (``OptimizerFacts.state_lower_bytes_per_param``)."""
    return optimizer_facts(s.optimizer).state_lower_bytes_per_param(opt_param_bytes) * trainable_shard


def static_lower_bound_bytes(s: TrainSetup, rp: RankParams, gpu: GpuSpec, pol: PrecisionPolicy) -> int:
    """Lower bound of ``device_used_bytes`` from one pipeline stage's parameters ``rp``."""
    shard_os, _shard_g, shard_p = shards(s)
    trainable = rp.lora if s.peft is not None else rp.total
    if s.peft is not None:
        quant = s.quantization
        base = weights_bytes(rp, pol.frozen_param_bytes, quant)
        adapters = trainable * pol.param_bytes
    else:
        base, adapters = rp.total * pol.param_bytes, 0
    weights = 0 if s.offload == "optimizer+params" else ceil_div(base, shard_p) + ceil_div(adapters, shard_p)
    states = master = 0
    if s.offload == "none":
        opt_param_bytes = 4 if pol.master_bytes else pol.param_bytes
        states = _states_lower(s, ceil_div(trainable, shard_os), opt_param_bytes)
        if pol.master_bytes:
            master = ceil_div(trainable, shard_os) * pol.master_bytes
    communicators = (1 if s.dp > 1 else 0) + (1 if s.tp > 1 else 0) + (1 if s.pp > 1 else 0)
    outside = cuda_context_bytes(gpu) + nccl_bytes(communicators)
    return weights + states + master + cublas_workspace_bytes(gpu, handles=2) + outside
