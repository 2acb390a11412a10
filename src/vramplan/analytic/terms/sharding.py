"""ZeRO-3 / FSDP: full (all-gathered) parameters of the running unit and the prefetched one, and the
FSDP root unit (embeddings, head), which stays unsharded."""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, STEP
from vramplan.analytic.weights import weights_bytes

__all__ = ["gathered", "root_gathered"]


def _one_layer(rp: RankParams, params: int) -> RankParams:
    frac = params / rp.total if rp.total else 0
    return replace(rp, total=params, linear=int(rp.linear * frac), linear_out_features=int(
        rp.linear_out_features * frac), lm_head=0, tower_linear_shapes=())


def _gather_bytes(c: StepContext) -> int:
    """Bytes per gathered parameter: the compute dtype's (2 for half precision, else 4)."""
    return 2 if c.pol.compute_bytes <= 2 else 4


def gathered(c: StepContext) -> list[Term]:
    """Current + prefetched unit (FSDP limit_all_gathers; DeepSpeed's prefetch), from the forward to
    the end of the backward."""
    if c.shards[2] <= 1:
        return []
    rp, pol = c.rp, c.pol
    layer_p = max(rp.per_layer) if rp.per_layer else 0
    if c.peft is not None and c.quant != "none":
        layer_p_bytes = weights_bytes(_one_layer(rp, layer_p), pol.frozen_param_bytes, c.quant)
    else:
        layer_p_bytes = layer_p * _gather_bytes(c)
    return [Term(K.GATHERED, 2 * layer_p_bytes, FORWARD, STEP, "gathered")]


def root_gathered(c: StepContext) -> list[Term]:
    """The FSDP root unit (embeddings, head) stays unsharded for the whole step."""
    if c.shards[2] <= 1 or c.s.parallel.fsdp == "none":
        return []
    return [resident(K.GATHERED_ROOT, c.rp.outside_layers * _gather_bytes(c), "gathered.root")]
