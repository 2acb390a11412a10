"""The memory terms of a training step: one function per term (or small group of related terms),
each returning ``Term`` records (terms/base.py) for one pipeline stage (terms/context.py).

``TERMS`` is the registry: the step's terms are ``[t for f in TERMS for t in f(ctx)]``, in this
order (a moment lists its keys in the order their first term comes here).  Adding a term adds its
function to a module here and one line to ``TERMS`` (docs/checklists/memory-term.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vramplan.analytic.moment import K
from vramplan.analytic.terms import (
    casts,
    gradients,
    loss,
    optimizer_state,
    resident,
    saved,
    sharding,
    transients,
)
from vramplan.analytic.terms.base import Term, by_layer, bytes_of
from vramplan.analytic.terms.context import StepContext

__all__ = ["TERMS", "StepContext", "Term", "by_layer", "bytes_of", "static_bytes", "step_terms"]

TermFn = Callable[[StepContext], list[Term]]

TERMS: tuple[TermFn, ...] = (
    resident.parameters,              # weights: this rank's parameters (or their offloaded copy)
    sharding.root_gathered,           # weights: the FSDP root unit, unsharded
    optimizer_state.optimizer_states,  # optimizer states (managed, offloaded)
    optimizer_state.master,           # fp32 master weights
    resident.workspaces,              # cuBLAS workspaces
    resident.ddp_buckets,             # DDP's gradient buckets
    gradients.gradients,              # parameter gradients, layer by layer
    saved.layer_saved,                # saved activations per layer (checkpointing, in-flight micro-batches)
    saved.shared_saved,               # RoPE cos/sin, masks
    saved.head_saved,                 # final norm + LM-head input
    casts.layer_casts,                # autocast weight copies per layer
    casts.head_casts,                 # the head's weight copy
    transients.layer_backward,        # each layer's backward temporaries
    sharding.gathered,                # ZeRO-3/FSDP all-gathered units
    gradients.unsharded_gradients,    # a layer's full gradients before reduce-scatter
    loss.loss,                        # logits and loss
    loss.layer_forward,               # a head-less stage's last layer forward
    gradients.tied_embedding,         # tied embedding gradient contributions
    optimizer_state.step_temporary,   # optimizer.step() temporaries
    gradients.embedding_shard_copy,   # the step's copy of a replicated TP embedding gradient's shard
)


def step_terms(c: StepContext, registry: Sequence[TermFn] = TERMS) -> list[Term]:
    """Every term of one stage's step, in registry order."""
    return [t for f in registry for t in f(c)]


# the terms alive on the device for the whole step, whatever the micro-batch: what every moment starts from
STATIC_KEYS = (K.PARAMETERS, K.GATHERED_ROOT, K.OPTIMIZER_STATES, K.MASTER, K.CUBLAS, K.DDP_BUCKETS)


def static_bytes(terms: Sequence[Term]) -> dict[str, int]:
    """Bytes of the step's static device terms (resident the whole step), by term name, and the managed
    (paged) optimizer states: what the planner's lower bound (plan/bound.py) restates."""
    from vramplan.analytic.timeline import END, FORWARD

    out: dict[str, int] = {}
    for t in terms:
        if (t.where == "device" and t.born == FORWARD and t.dies == END and t.key in STATIC_KEYS) \
                or t.where == "managed":
            out[t.name] = out.get(t.name, 0) + t.nbytes
    return out
