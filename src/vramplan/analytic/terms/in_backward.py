"""The optimizer step fused into the backward (``train.optimizer_in_backward``): each parameter's gradient
and its step temporaries, alive one parameter at a time.

torchtune v0.3.0 ``recipes/full_finetune_single_device.py`` ``_setup_optimizer`` makes one optimizer per
parameter (``config.instantiate(cfg_optimizer, [p])``) and ``training/memory.py`` ``register_optim_in_bwd_hooks``
registers ``p.register_post_accumulate_grad_hook(optim_step)``, whose ``optim_step`` runs
``optim_dict[param].step()`` then ``optim_dict[param].zero_grad()`` (``set_to_none=True``, torch >= 2.0): the
gradient is freed as soon as its parameter is updated, and there is no optimizer-step phase.  PyTorch's
autograd engine runs an ``AccumulateGrad`` node as soon as its input is ready (its sequence number is the
highest, torch/csrc/autograd/functions/accumulate_grad.h), so the hook of one parameter finishes before the
next node's backward starts: at most one parameter's gradient and its step temporaries exist at a time.

The terms (the same keys as the step's gradients and temporaries, so the breakdown keeps its rows):

* per layer: its largest trainable tensor's gradient and that tensor's step temporaries, from the layer's
  MLP backward to its end: an upper bound of each moment of its backward, whichever parameter is updated;
* the LM head's gradient (with the final norm's) and the head's step temporaries, at the last layer's MLP
  point, where the step's gradients are born without the key (terms/gradients.py), an upper bound: the
  head is updated before the last layer's backward starts;
* the input embedding's gradient and step temporaries last, at the step point (the backward's last hook,
  no separate step follows); a tied embedding's gradient lives from the head's backward to there, its
  hook firing once both contributions are summed.

Worked example (Llama-2-7B, full fine-tuning, bf16, torch AdamW foreach, one GPU): a layer's largest tensor
is an MLP matrix of 4096 x 11008 = 45,088,768 elements, so its gradient is 2 x 45,088,768 = 90,177,536 B
and its ``_foreach_sqrt`` temporary (one second-moment-sized tensor, bf16) another 90,177,536 B; the
step's 13.5 GB of gradients are never all alive.
"""

from __future__ import annotations

from vramplan.analytic.layout import split_on_rank
from vramplan.analytic.moment import K
from vramplan.analytic.optimizer import STEP_TEMPORARIES
from vramplan.analytic.optimizer import StepContext as OptimizerStep
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.gradients import (
    embedding_gradient_bytes,
    has_tied_embedding_backward,
    layer_gradient_bytes,
    total_gradient_bytes,
)
from vramplan.analytic.timeline import END, STEP, Loc, attention, layer_done, mlp
from vramplan.facts.optimizers import optimizer_facts, runs_as

__all__ = ["gradients", "layer_largest_params", "param_step_bytes", "step_temporaries"]


def layer_largest_params(c: StepContext) -> list[int]:
    """Elements of each layer's largest trainable tensor on this rank: a base tensor (full fine-tuning) or an
    adapter matrix (LoRA's A is rank x in, B is out x rank; the adapters peft's ParamWrapper puts on transformers
    5's fused experts are not counted)."""
    lset = {i: j for j, i in enumerate(c.rp.layers)}
    out = [0] * len(lset)
    peft, tp, ep = c.peft, c.tp, c.ep
    targets = c.lt.linear
    for p in c.m.params:
        if peft is None:
            n = split_on_rank(p, tp, ep)
        elif p.role in ("linear", "expert") and p.module in targets and p.in_features:
            n = peft.rank * max(p.in_features, p.out_features)
        else:
            continue
        for i in p.layer_span:
            j = lset.get(i)
            if j is not None and n > out[j]:
                out[j] = n
    return out


def param_step_bytes(c: StepContext, elements: int) -> int:
    """The step temporaries of one optimizer holding one tensor of ``elements`` (torchtune's per-parameter
    optimizers): the row's strategy (analytic/optimizer.py ``STEP_TEMPORARIES``) with that tensor as its whole
    group, e.g. torch's foreach AdamW: ``_foreach_sqrt`` of its one second moment."""
    if not elements:
        return 0
    f = optimizer_facts(runs_as(c.s.train.optimizer, c.framework))
    param_bytes = 4 if c.pol.master_bytes else c.pol.param_bytes
    return STEP_TEMPORARIES[f.step_temporary](f, OptimizerStep(elements, param_bytes, elements, ()))


def _head_elements(c: StepContext) -> int:
    """Elements of the untied LM head on this rank (its step runs at the head's backward)."""
    return c.rp.lm_head if c.peft is None and c.rp.has_lm_head else 0


def _outside(c: StepContext) -> int:
    """Gradient bytes outside the layers: the head and final norm (the tied embedding), the untied embedding."""
    return max(0, total_gradient_bytes(c) - sum(layer_gradient_bytes(c)))


def gradients(c: StepContext) -> list[Term]:
    """The gradients of the step with the optimizer in the backward, or with torchao's CPUOffloadOptimizer
    freeing each GPU gradient once copied to the host (none otherwise; then the step point stands for the end of
    the backward, the embedding's gradient copied last)."""
    if not c.grads_one_at_a_time:
        return []
    grad_bytes = c.pol.grad_bytes
    largest = layer_largest_params(c)
    n = len(largest)
    outside = _outside(c)
    embed = embedding_gradient_bytes(c, outside)
    head_dies: Loc = END if has_tied_embedding_backward(c) else attention(n - 1)
    out = [Term(K.GRADIENTS, outside - embed, mlp(n - 1), head_dies, "gradients.head"),
           Term(K.GRADIENTS, embed, STEP, END, "gradients.embedding")]
    return out + device_terms(K.GRADIENTS, [(largest[j] * grad_bytes, mlp(j), layer_done(j), "gradients.layer", j)
                                            for j in range(n - 1, -1, -1)])


def step_temporaries(c: StepContext) -> list[Term]:
    """Each parameter's step temporaries as its hook runs (none without the optimizer in the backward)."""
    if not c.in_backward:
        return []
    largest = layer_largest_params(c)
    n = len(largest)
    head = _head_elements(c)
    embed = embedding_gradient_bytes(c, _outside(c)) // c.pol.grad_bytes
    if has_tied_embedding_backward(c):
        embed = c.m.vocab_size * c.m.hidden_size  # the tied parameter, updated once both contributions are in
    out = [Term(K.OPTIMIZER_STEP, param_step_bytes(c, head), mlp(n - 1), attention(n - 1),
                "optimizer.step.in_backward.head") if head else None,
           Term(K.OPTIMIZER_STEP, param_step_bytes(c, embed), STEP, END, "optimizer.step.in_backward.embedding")
           if embed else None]
    return [t for t in out if t is not None] + device_terms(
        K.OPTIMIZER_STEP, [(param_step_bytes(c, largest[j]), mlp(j), layer_done(j), "optimizer.step.in_backward", j)
                           for j in range(n - 1, -1, -1)])
