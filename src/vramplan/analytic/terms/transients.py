"""Each layer's backward temporaries: the gradients alive together in its MLP's backward, then in its
attention's (analytic/activations.py ``backward_transients_per_token``).

The two records hold each part's own bytes, which the event stream (analytic/events.py) allocates in
that part.  A layer that frees nothing between the two parts has no attention point on the timeline:
its one moment, the MLP point, stands for its whole backward and shows the larger of the two parts.
The attention part's excess over the MLP's is then a third record, ``transient.attention_over_mlp``,
alive at that point only: a bound of the moment, not an allocation (the stream does not read it).

Worked example (one layer, MLP part 100 B, attention part 160 B): split, the MLP point shows 100 and
the attention point 160; not split, the MLP point shows 100 + (160 - 100) = 160.
"""

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
        at_mlp, at_attention = mlp(j), attention(j)
        rows += [(mt, at_mlp, at_attention, "transient.mlp", j),
                 (at, at_attention, layer_done(j), "transient.attention", j)]
        if at > mt and not la.attention_split[j]:
            rows.append((at - mt, at_mlp, at_attention, "transient.attention_over_mlp", j))
    return device_terms(K.LAYER_BACKWARD, rows)
