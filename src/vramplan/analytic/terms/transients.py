"""Each layer's backward temporaries: the gradients alive together in its MLP's backward, then in its
attention's.  A layer that frees nothing between the two (no attention point on the timeline) shows
the larger of the two at its one moment."""

from __future__ import annotations

from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import Loc, attention, layer_done, mlp

__all__ = ["layer_backward"]


def layer_backward(c: StepContext) -> list[Term]:
    la = layer_activations(c)
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j in range(len(la.kept) - 1, -1, -1):
        mt, at = la.mlp_transient[j], la.attn_transient[j]
        split = la.attention_split[j]
        rows += [(mt if split else max(mt, at), mlp(j), attention(j), "transient.mlp", j),
                 (at, attention(j), layer_done(j), "transient.attention", j)]
    return device_terms(K.LAYER_BACKWARD, rows)
