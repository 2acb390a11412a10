"""Between two steps, and the first step.

Between steps (where evaluation and checkpoint saving run) the GPU holds what the step keeps resident:
the parameters, optimizer states, master weights, DDP buckets, cuBLAS workspaces.  Gradients are gone:
the HF Trainer calls ``model.zero_grad()`` after each optimizer step and torch >= 2.0 sets them to None
(``Optimizer.zero_grad(set_to_none=True)``); Lit-GPT calls ``optimizer.zero_grad()`` likewise.

The first step differs from the steady one in one way: the optimizer's states do not exist before its
``optimizer.step()``, which creates them (torch ``AdamW._init_group``: ``torch.zeros_like`` per parameter
on its first step) while every gradient is still alive.  So the first step's forward and backward carry
no states and its optimizer moment is the steady one's: the first step never peaks above the steady
step, which is why the steady step is what the step estimate reports.  The allocator's state that the
lazy states leave (states placed in blocks the first backward freed) is in the step's reserved bytes
already: ``analytic/events.py`` replays the first two steps, states created in the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.base import Term
from vramplan.analytic.timeline import END, FORWARD

__all__ = ["between_steps", "device_states_bytes", "first_step"]


def between_steps(terms: Sequence[Term], phase: str) -> Moment:
    """The device terms resident for the whole step, gradients left out (set to None after the step)."""
    out = Moment(phase)
    for key, nbytes, born, dies, _name, _layer, where, fields, _tensors in terms:
        if where == "device" and born is FORWARD and dies is END and key is not K.GRADIENTS:
            out.add(key, nbytes, **dict(fields))
    return out


def first_step(moments: Sequence[Moment], states_bytes: int) -> Moment:
    """The first step's highest moment: each steady moment before ``optimizer.step()`` without the
    optimizer's ``states_bytes`` (resident through the steady step), the optimizer moment as it is (the
    first highest wins ties).  Only the winner's parts are read (a step has a moment per layer part)."""
    totals = [mo.total - (0 if mo.phase == "optimizer" else states_bytes) for mo in moments]
    if not totals:
        return Moment("first step")
    best = moments[totals.index(max(totals))]
    return (best if best.phase == "optimizer" else best.without(K.OPTIMIZER_STATES)).copy("first step")


def device_states_bytes(terms: Sequence[Term]) -> int:
    """The optimizer's states on the device (their terms live through the whole steady step)."""
    return sum(t.nbytes for t in terms if t.key is K.OPTIMIZER_STATES and t.where == "device")
