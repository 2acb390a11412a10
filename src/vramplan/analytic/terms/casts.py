"""Autocast's cached half-precision copies of the trainable linear weights (HF/Lightning mixed precision),
the fp32 LM head's cast under k-bit PEFT, and the half copies of Lit-GPT's fp32 frozen base under a mixed
precision that each matmul saves for its backward."""

from __future__ import annotations

from vramplan.analytic.checkpointing import checkpointed_layer
from vramplan.analytic.grpo import uses_fused_head
from vramplan.analytic.inference import litgpt_head_params
from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.precision import litgpt_fp32_base
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import FORWARD, LOSS, Loc, layer_done, mlp
from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div

__all__ = ["LITGPT_HEAD_CHUNK_TOKENS", "casts_apply", "frozen_casts_apply", "generate_casts_bytes", "head_casts",
           "layer_casts", "reference_casts_bytes"]

CAST_ASSUMPTION = ("autocast keeps a half-precision copy of each trainable linear weight from the forward pass "
                   "until its backward (torch.autocast weight cache)")


def casts_apply(c: StepContext) -> bool:
    """Autocast caches half copies of fp32 trainable weights (not of a frozen PEFT base)."""
    pol = c.pol
    return bool(pol.weight_cast_bytes and c.peft is None and pol.autocast)


# Lit-GPT's finetune scripts run the LM head per chunk of 128 positions: ``model(input_ids, lm_head_chunk_size=128)``
# (lit-gpt 8641822 finetune/lora.py train; litgpt v0.4.0-v0.5.13 litgpt/finetune/lora.py fit)
LITGPT_HEAD_CHUNK_TOKENS = 128

FROZEN_CAST_NOTE = (
    "Lit-GPT under a mixed precision: Lightning Fabric's MixedPrecision leaves the model fp32 (no convert_module, "
    "no init dtype), so the frozen base is held in fp32 (4 B per weight) and autocast casts each frozen linear's "
    "weight to the half dtype at every use without caching it (torch caches only leaves that require grad); the "
    "matmul saves that copy to compute its input's gradient, so every decoder linear's half copy lives from its "
    "forward (under checkpointing, its recomputation) to its layer's backward, and the LM head's once per 128-token "
    "chunk (lm_head_chunk_size=128). The "
    "first layer's first projection, whose input needs no gradient, saves none but is counted (a bound of one "
    "projection); the adapters' own cached copies are not counted (lit-gpt 8641822 and litgpt v0.3.1-v0.5.13 "
    "finetune/lora.py; lightning 71aed75-2.4.0 plugins/precision/amp.py, precision.py)")


def frozen_casts_apply(c: StepContext) -> bool:
    """Lit-GPT's fp32 frozen base under autocast (analytic/precision.py ``litgpt_fp32_base``): each use casts it to a
    half copy that its matmul saves."""
    return c.pol.autocast and litgpt_fp32_base(c.s) and c.pol.frozen_param_bytes > c.pol.compute_bytes


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
    frozen = frozen_casts_apply(c)
    if not casts_apply(c) and not frozen:
        return []
    m, tp = c.m, c.tp
    if frozen:
        # Lit-GPT's frozen fp32 linears, experts included (its LLaMAMoE runs each expert as an nn.Linear MLP):
        # one half copy each, saved by its matmul (FROZEN_CAST_NOTE)
        wcb = c.pol.compute_bytes
        per_layer = c.rp.linear // len(c.rp.layers) * wcb if c.rp.layers else 0
    else:
        wcb = c.pol.weight_cast_bytes
        per_layer = _linear_params_per_layer(c.rp, m) * wcb
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j, ls in enumerate(c.layer_specs):
        # a checkpointed layer (full, every n-th, op-sac: the casts are not on torchtitan's save list)
        full_ckpt = checkpointed_layer(c.s, j)
        down = m.hidden_size * ceil_div(ls.intermediate_size, tp) * wcb if per_layer and not ls.moe else 0
        at_mlp, done = mlp(j), layer_done(j)
        if not (frozen and full_ckpt):
            # a checkpointed forward saves nothing, so the frozen linears' uncached copies are freed after each
            # matmul (torch.utils.checkpoint); only the recomputation's, below, live to the layer's backward
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
    if frozen_casts_apply(c):
        # Lit-GPT's own fp32 head, cast anew for each 128-token chunk and saved by that chunk's matmul: every copy
        # is alive at the loss (FROZEN_CAST_NOTE).  Llama-2-7B, 1,304 tokens: 11 chunks x 131,072,000 x 2 B
        chunks = ceil_div(c.s.train.seq_len, LITGPT_HEAD_CHUNK_TOKENS)
        head = litgpt_head_params(m, rp.lm_head, tp)
        out.append(Term(K.CASTS, chunks * head * pol.compute_bytes, FORWARD, dies, "casts.head_chunks_frozen"))
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
