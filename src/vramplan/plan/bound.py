"""A cheap lower bound of a training setup's device memory, to reject candidates early.

The analytic engine sweeps a step's term records (analytic/terms) over its timeline and reports the
largest moment.  The *static* terms -- the resident weights (or their ZeRO-3/FSDP shard), the FSDP
root unit, the optimizer states, the fp32 master weights, the cuBLAS workspaces, DDP's buckets -- are
alive at every moment, whatever the micro-batch and sequence length (``analytic.terms.STATIC_TERMS``).
Reserved memory is at least the peak moment, and ``device_used`` adds the CUDA context, the NCCL
buffers of each communicator and the managed (paged) optimizer states.  So

    bound = static terms (analytic.terms.static_by_stage) + CUDA context + NCCL buffers  <=  device_used

(the managed states filling at most what that leaves of the capacity, as the report counts them).

The bound runs the engine's own static term functions on the candidate's scenario, so the planner
and the engine cannot disagree on what a weight, a state or a master copy costs (every optimizer rule
of facts/optimizers.py, the k-bit casts of ``prepare_model_for_kbit_training``, the FSDP root unit and
the DDP buckets included).  It needs no activation: it costs a small fraction of an estimate.
``tests/test_plan_bound.py`` checks it against the estimate on random setups.
"""

from __future__ import annotations

from vramplan.analytic.overhead import cuda_context_bytes, nccl_bytes
from vramplan.analytic.terms import static_by_stage
from vramplan.analytic.terms.context import communicators
from vramplan.spec.load import Resolved

__all__ = ["PER_BATCH", "static_lower_bound_bytes"]

# the training fields the static terms cannot depend on (they are resident whatever the batch): the
# planner computes one bound for setups that differ only in these
PER_BATCH = frozenset({"micro_batch_size", "grad_accum_steps", "seq_len", "gradient_checkpointing", "attention"})


def static_lower_bound_bytes(r: Resolved) -> int:
    """Lower bound of ``device_used_bytes``: the static terms, the CUDA context and the NCCL buffers.

    Managed (paged) states hold at most what the rest leaves of the capacity (report
    ``managed_in_capacity``); ``x + min(managed, max(0, capacity - x))`` grows with ``x``, so the static
    floor of the rest, filled that way, stays at most the estimate's device-used bytes."""
    per = static_by_stage(r)
    rest = max(d for d, _ in per) + cuda_context_bytes(r.gpu) + nccl_bytes(communicators(r.scenario))
    managed = min(m for _, m in per)
    return rest + min(managed, max(0, r.gpu.total_memory_bytes - rest))
