"""torchao float8 training's own terms (analytic/float8.py): each layer's backward float8 casts, the LM
head's when it is converted, and the precomputed weight scales; with MXFP8 training (analytic/mx.py) the same
casts' terms under their own key and names (``mx.mlp``, ``mx.attention``, ``mx.head``).

A layer's backward runs one linear at a time and ``matmul_with_hp_or_float8_args.backward`` frees its casts
when it returns, so each part of the layer holds the largest of its linears' peaks, beside the part's
gradient temporaries (terms/transients.py): the MLP's at its point, the attention's at its own; a layer with
no attention point shows the larger at its MLP point (as ``transient.attention_over_mlp``).  The forward's
casts (the input's and the weight's, freed when each linear's forward returns) are at no point of the
timeline: the forward's end is the loss, after the last linear's forward.
"""

from __future__ import annotations

from vramplan.analytic.float8 import (
    converted_layer_linears,
    float8_on,
    head_backward_bytes,
    layer_cast_peaks,
    low_precision_linears,
    mx_on,
)
from vramplan.analytic.moment import K, Key
from vramplan.analytic.terms.base import Term, device_terms, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import LOSS, Loc, attention, layer_done, mlp

__all__ = ["head_casts", "layer_casts", "precomputed_scales"]


def _key_and_prefix(c: StepContext) -> tuple[Key, str]:
    return (K.MX_CASTS, "mx") if mx_on(c.s) else (K.FLOAT8_CASTS, "float8")


def layer_casts(c: StepContext) -> list[Term]:
    if not low_precision_linears(c.s):
        return []
    key, pre = _key_and_prefix(c)
    split = layer_activations(c).attention_split
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j, layer in enumerate(c.rp.layers[:len(c.layer_specs)]):
        mt, at = layer_cast_peaks(c.s, c.m, layer, c.tp, c.tokens)
        rows += [(mt, mlp(j), attention(j), f"{pre}.mlp", j), (at, attention(j), layer_done(j), f"{pre}.attention", j)]
        if at > mt and not split[j]:
            rows.append((at - mt, mlp(j), attention(j), f"{pre}.attention_over_mlp", j))
    return device_terms(key, rows)


def head_casts(c: StepContext) -> list[Term]:
    """The converted head's backward casts, from the loss gradient to the last layer's backward (the standard loss
    only: the fused and chunked losses read the head's weight without calling the module)."""
    if not (low_precision_linears(c.s) and c.last and c.s.train.loss == "standard"):
        return []
    nbytes = head_backward_bytes(c.s, c.m, c.tp, c.tokens)
    key, pre = _key_and_prefix(c)
    return [Term(key, nbytes, LOSS, mlp(len(c.layer_specs) - 1), f"{pre}.head")] if nbytes else []


def precomputed_scales(c: StepContext) -> list[Term]:
    """``precompute_float8_dynamic_scale_for_fsdp``: ``torch.stack`` of one fp32 amax per converted weight, whose
    scales each weight keeps a view of (``_precomputed_scale``) for the whole run."""
    f8 = c.s.train.float8
    if not (float8_on(c.s) and f8.enable_fsdp_float8_all_gather and f8.precompute_float8_dynamic_scale_for_fsdp):
        return []
    n = sum(len(converted_layer_linears(c.m, layer, c.tp)) for layer in c.rp.layers)
    n += 1 if c.last and head_backward_bytes(c.s, c.m, c.tp, 1) else 0  # the head, when it is converted
    return [resident(K.FLOAT8_SCALES, 4 * n, "float8.scales")]
