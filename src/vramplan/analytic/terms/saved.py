"""Saved activations: what the forward keeps for the backward, and when the backward frees it.

Each layer's ``kept`` tensors (analytic/terms/layers.py) live from the forward to the end of that
layer's backward.  Checkpointing recomputes the rest (``full - kept``) when the layer's backward
comes: the whole layer with full checkpointing (alive through both parts), only the attention core
with attention-core (alive in the attention part); op-sac reruns the whole layer.  By the MLP's elementwise backward the output
projection's backward has freed its input; the attention's backward comes after the MLP's (and the
post-attention norm's) saved tensors are released: those frees are release terms (negative bytes).
1F1B keeps up to pp micro-batches in flight on the first stage (arXiv 2104.04473 sec. 2.2): the other
micro-batches' saved tensors stay through this one's backward.
"""

from __future__ import annotations

from vramplan.analytic import activations as act
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import FORWARD, TIED_EMBEDDING, Loc, attention, layer_done, mlp

__all__ = ["head_saved", "layer_saved", "shared_saved"]


def layer_saved(c: StepContext) -> list[Term]:
    """Per layer: the kept tensors, the recomputed ones, the frees before each backward part; the
    other micro-batches in flight."""
    la = layer_activations(c)
    kept, ckpt = la.kept, checkpoint_policy(c.s)
    # attention-core recomputes only the attention core; full and op-sac rerun the whole layer's forward
    selective = ckpt == "attention-core"
    in_flight = (c.in_flight - 1) * sum(kept)
    out = device_terms(K.SAVED, [(kept[j], FORWARD, layer_done(j), "saved.kept", j) for j in range(len(kept))])
    out.append(Term(K.SAVED, in_flight, FORWARD, TIED_EMBEDDING, "saved.in_flight"))
    if la.host:
        # DeepSpeed partition+cpu: the checkpointed inputs' slices wait in host memory
        out.append(Term(K.SAVED, la.host, FORWARD, TIED_EMBEDDING, "saved.host_checkpointed", where="host"))
    below = [0]  # below[j + 1]: kept bytes of layers 0..j
    for k in kept:
        below.append(below[-1] + k)
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j in range(len(kept) - 1, -1, -1):
        alive = below[j + 1] + in_flight
        recompute = la.full[j] - kept[j] if ckpt != "none" else 0
        at_mlp, at_attention, done = mlp(j), attention(j), layer_done(j)
        rows += [
            (recompute, at_attention if selective else at_mlp, done, "saved.recompute", j),
            (-min(la.mlp_released[j], alive + recompute), at_mlp, at_attention, "saved.freed_before_mlp", j),
            (-min(la.released[j], alive + recompute), at_attention, done, "saved.freed_before_attention", j),
        ]
    return out + device_terms(K.SAVED, rows)


def shared_saved(c: StepContext) -> list[Term]:
    """RoPE cos/sin, the eager mask, the embedding dropout mask: kept until the first layer's backward ends."""
    return [Term(K.SAVED, layer_activations(c).shared, FORWARD, TIED_EMBEDDING, "saved.shared")]


def head_saved(c: StepContext) -> list[Term]:
    """The final norm's saved tensors and the LM head's input, freed by the head's backward."""
    if not c.last:
        return []
    m, ctx = c.m, c.act
    nbytes = (act.layer_norm_saved(m, ctx) * m.hidden_size + (
        c.pol.compute_bytes * m.hidden_size if c.peft is None else 0)) * c.tokens
    return [Term(K.SAVED, nbytes, FORWARD, mlp(len(c.layer_specs) - 1), "saved.head")]
