"""The loss and the logits (the stage with the LM head), or a head-less stage's layer forward
temporaries at the end of its forward."""

from __future__ import annotations

from vramplan.analytic.layout import gathers_logits
from vramplan.analytic.logits import LossRelease, family_loss_release, loss_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import FORWARD, LOSS, mlp
from vramplan.units import ceil_div

__all__ = ["layer_forward", "loss"]


def vocab_on_rank(c: StepContext) -> int:
    """Megatron's vocabulary-parallel cross-entropy keeps the logits sharded; transformers' tp_plan
    all-gathers them (layout.HF_TP_FRAMEWORKS)."""
    m = c.m
    return m.vocab_size if gathers_logits(c.framework, c.tp) else ceil_div(m.vocab_size, c.tp)


def loss_release_of(c: StepContext) -> LossRelease:
    """The loss code of ``software.transformers`` for the model's family (analytic/logits.py)."""
    return family_loss_release(c.s.software.transformers_version, c.m.traits, c.framework, c.m.encoder_only)


def loss(c: StepContext) -> list[Term]:
    """At the forward's log_softmax: the logits, their fp32 copy and the log-probabilities (the tensors,
    in that order, of ``logits.loss`` ); at the backward's start the loss's gradients (analytic/logits.py)."""
    if not c.last:
        return []
    m, cb = c.m, c.pol.compute_bytes
    # padded (current releases): forward_peak = c V + (4 V when c < 4) + saved log-probs (4 V, with Gemma 2's
    # soft-cap output); older releases copy the shifted logits over b (s - 1) tokens (analytic/logits.py)
    lt = loss_bytes(c.tokens, vocab_on_rank(c), cb, softcap=m.final_logit_softcapping is not None,
                    release=loss_release_of(c), shifted_tokens=ceil_div(c.s.train.micro_batch_size * (c.s.train.seq_len - 1), c.s.parallel.cp),
                    autocast=c.pol.autocast)
    return [Term(K.LOSS_FORWARD, lt.forward_peak, FORWARD, LOSS, "logits.loss", tensors=lt.forward_tensors),
            Term(K.LOSS_BACKWARD, lt.backward_peak, LOSS, mlp(len(c.layer_specs) - 1), "logits.loss_gradients")]


def layer_forward(c: StepContext) -> list[Term]:
    """A stage without the head peaks at its last layer's forward: the largest layer's live tensors."""
    if c.last:
        return []
    la = layer_activations(c)
    transient = [max(mt, at) for mt, at in zip(la.mlp_transient, la.attn_transient, strict=True)]
    return [Term(K.LAYER_FORWARD, max(transient) if transient else 0, FORWARD, LOSS, "layer.forward")]
