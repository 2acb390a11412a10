"""Autocast's cached half-precision copies of the trainable linear weights (HF/Lightning mixed precision),
and the fp32 LM head's cast under k-bit PEFT."""

from __future__ import annotations

from vramplan.analytic.checkpointing import checkpointed_layer
from vramplan.analytic.grpo import uses_fused_head
from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, LOSS, Loc, layer_done, mlp
from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div

__all__ = ["casts_apply", "generate_casts_bytes", "head_casts", "layer_casts", "reference_casts_bytes"]

CAST_ASSUMPTION = ("autocast keeps a half-precision copy of each trainable linear weight from the forward pass "
                   "until its backward (torch.autocast weight cache)")


def casts_apply(c: StepContext) -> bool:
    """Autocast caches half copies of fp32 trainable weights (not of a frozen PEFT base)."""
    pol = c.pol
    return bool(pol.weight_cast_bytes and c.peft is None and pol.autocast)


def _linear_params_per_layer(rp: RankParams, m: ModelSpec) -> int:
    """Decoder linear parameters per layer on this rank that autocast casts (layers of one stage are alike).

    Routed experts are left out: transformers >= 5 multiplies them with ``grouped_mm``, which is not
    on autocast's lists, so their fp32 weights are used as they are (no cached half copy).
    """
    if not rp.layers:
        return 0
    linear_all = sum(p.total for p in m.params if p.role in ("linear", "expert") and p.in_features)
    experts = sum(p.total for p in m.params if p.role == "expert" and p.in_features)
    cast = rp.linear - (rp.linear * experts // linear_all if linear_all else 0)
    return cast // len(rp.layers)


def layer_casts(c: StepContext) -> list[Term]:
    """Each layer's cast weights, from its forward until its backward.

    With full checkpointing the layers' forward saves nothing, so their cast weights live only in
    autocast's cache, which is cleared when the forward's autocast region ends; the recomputation
    casts the layer's weights again and keeps them until that layer's backward.  The output
    projection's cast weight is released with its saved input, before the MLP's elementwise backward.
    """
    if not casts_apply(c):
        return []
    m, tp, wcb = c.m, c.tp, c.pol.weight_cast_bytes
    per_layer = _linear_params_per_layer(c.rp, m) * wcb
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j, ls in enumerate(c.layer_specs):
        # a checkpointed layer (full, every n-th, op-sac: the casts are not on torchtitan's save list)
        full_ckpt = checkpointed_layer(c.s, j)
        down = m.hidden_size * ceil_div(ls.intermediate_size, tp) * wcb if per_layer and not ls.moe else 0
        at_mlp, done = mlp(j), layer_done(j)
        rows.append((per_layer, FORWARD, LOSS if full_ckpt else done, "casts.layer", j))
        if full_ckpt:
            rows.append((per_layer, at_mlp, done, "casts.recomputed", j))
        rows.append((-down, at_mlp, done, "casts.freed_down_projection", j))
    return device_terms(K.CASTS, rows)


def head_casts(c: StepContext) -> list[Term]:
    """The LM head's cast weight (tied: the embedding's), until the head's backward; and under k-bit
    PEFT the frozen LM head, fp32 after prepare_model_for_kbit_training, which autocast casts to the
    half dtype for the matmul, saving that copy to compute the input's gradient.

    None under KTO: TRL v1.16.0's fused LM head (``add_fused_lm_head``, ``ChunkedLogProbFunction``) casts the head
    one vocabulary chunk at a time with ``Tensor.to``, outside autocast's cache (counted in its tiles,
    analytic/kto.py); likewise DPO and GRPO from TRL v1.15.0 (``software.trl``, analytic/fused_head.py)."""
    if not c.last or uses_fused_head(c.s):
        return []
    m, tp, pol, rp = c.m, c.tp, c.pol, c.rp
    dies = mlp(len(c.layer_specs) - 1)
    out = []
    if casts_apply(c):
        head_params = rp.lm_head if rp.lm_head else (ceil_div(m.vocab_size, tp) * m.hidden_size
                                                     if m.tie_word_embeddings else 0)
        out.append(Term(K.CASTS, head_params * pol.weight_cast_bytes, FORWARD, dies, "casts.head"))
    if c.kbit and pol.autocast:
        out.append(Term(K.CASTS, ceil_div(m.vocab_size, tp) * m.hidden_size * pol.compute_bytes, FORWARD, dies,
                        "casts.head_kbit"))
    return out


def reference_casts_bytes(c: StepContext, head: bool = True) -> int:
    """What a separate fp32 reference copy's no-grad forward (DPO, analytic/dpo.py) adds in autocast's cache at its
    head, beside what the step's timeline already counts there.

    torch's ``cached_cast`` caches the half copy of any fp32 leaf that requires grad, in ``no_grad`` too (the
    reference's parameters, loaded by ``from_pretrained``, do; nothing in TRL v1.9.0 freezes them), until the
    autocast region of its forward ends: at its head every linear's copy is cached.  The policy's copies of its
    checkpointed layers, which the timeline keeps until the loss, were dropped when the policy's own region ended
    (layer_casts), so the reference's replace them byte for byte; its head's and its uncheckpointed layers' copies
    add, the policy's being saved by their matmuls for the backward.  ``head`` False: a fused head (KTO's,
    analytic/kto.py) whose chunks are cast outside the cache.
    """
    if not casts_apply(c) or not c.last:
        return 0
    m, pol, rp = c.m, c.pol, c.rp
    per_layer = _linear_params_per_layer(rp, m) * pol.weight_cast_bytes
    layers = sum(per_layer for j in range(len(c.layer_specs)) if not checkpointed_layer(c.s, j))
    if not head:
        return layers
    params = rp.lm_head if rp.lm_head else (ceil_div(m.vocab_size, c.tp) * m.hidden_size if m.tie_word_embeddings else 0)
    return layers + params * pol.weight_cast_bytes


def generate_casts_bytes(c: StepContext) -> int:
    """What autocast holds of the policy's weights during one no-grad ``generate`` forward under the training's
    autocast (GRPO's hf-generate rollout, analytic/lifecycle/hf_rollout.py), at its head.

    ``cached_cast`` caches the half copy of every fp32 leaf that requires grad until the outermost autocast region
    exits (accelerate wraps each ``forward`` in one): at the head every layer's linear copies and the head's
    (tied: the embedding's) are cached.  A frozen fp32 base (PEFT) is not cached: one linear's copy at a time, the
    largest.  Half parameters (no autocast): none.
    """
    if not c.last:
        return 0
    m, pol, rp = c.m, c.pol, c.rp
    if casts_apply(c):
        per_layer = _linear_params_per_layer(rp, m) * pol.weight_cast_bytes
        head = rp.lm_head if rp.lm_head else (ceil_div(m.vocab_size, c.tp) * m.hidden_size
                                             if m.tie_word_embeddings else 0)
        return per_layer * len(c.layer_specs) + head * pol.weight_cast_bytes
    if pol.autocast and c.peft is not None and pol.frozen_param_bytes > pol.compute_bytes:
        return rp.largest_linear * pol.compute_bytes
    return 0
