"""ZeRO-3 / FSDP: full (all-gathered) parameters of the running unit and the prefetched one, and the
FSDP root unit (embeddings, head), which stays unsharded."""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.float8 import converted_layer_linears, float8_on, head_backward_bytes
from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, STEP
from vramplan.analytic.weights import weights_bytes

__all__ = ["gathered", "one_layer", "root_gathered"]


def one_layer(rp: RankParams, params: int) -> RankParams:
    """``rp`` cut down to one layer of ``params`` elements (its linears in proportion): a gathered unit's layout."""
    frac = params / rp.total if rp.total else 0
    return replace(rp, total=params, linear=int(rp.linear * frac), linear_out_features=int(
        rp.linear_out_features * frac), lm_head=0, tower_linear_shapes=())


def _gather_bytes(c: StepContext) -> int:
    """Bytes per gathered parameter: the compute dtype's (2 for half precision, else 4)."""
    return 2 if c.pol.compute_bytes <= 2 else 4


def _float8_gathered(c: StepContext) -> bool:
    """torchao's float8 all-gather: ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts each converted
    weight's shard to float8, so FSDP2 gathers 1 byte per element of it instead of the half dtype's 2."""
    return float8_on(c.s) and c.s.train.float8.enable_fsdp_float8_all_gather


def _float8_saving(c: StepContext, layer: int) -> int:
    """Bytes the float8 all-gather saves on one gathered layer: 1 per element of its converted linears."""
    if not _float8_gathered(c):
        return 0
    return sum(fan_in * fan_out for _, fan_in, fan_out in converted_layer_linears(c.m, layer, c.tp))


def gathered(c: StepContext) -> list[Term]:
    """Current + prefetched unit (FSDP limit_all_gathers; DeepSpeed's prefetch), from the forward to
    the end of the backward."""
    if c.shards[2] <= 1 or deepspeed_zero(c.s):
        return []  # DeepSpeed fetches module by module (terms/deepspeed.py zero3_gathered)
    rp, pol = c.rp, c.pol
    layer_p = max(rp.per_layer) if rp.per_layer else 0
    if c.peft is not None and c.quant != "none":
        layer_p_bytes = weights_bytes(one_layer(rp, layer_p), pol.frozen_param_bytes, c.quant)
    else:
        largest = rp.layers[rp.per_layer.index(layer_p)] if rp.per_layer else 0
        layer_p_bytes = layer_p * _gather_bytes(c) - _float8_saving(c, largest)
    return [Term(K.GATHERED, 2 * layer_p_bytes, FORWARD, STEP, "gathered")]


def root_gathered(c: StepContext) -> list[Term]:
    """The FSDP root unit (embeddings, head) stays unsharded for the whole step."""
    if c.shards[2] <= 1 or c.s.parallel.fsdp == "none":
        return []
    root = c.rp.outside_layers * _gather_bytes(c)
    if _float8_gathered(c) and c.rp.lm_head and head_backward_bytes(c.s, c.m, c.tp, 1):
        root -= c.rp.lm_head  # the converted head gathered in float8 (its embedding, an nn.Embedding, is not)
    return [resident(K.GATHERED_ROOT, root, "gathered.root")]
