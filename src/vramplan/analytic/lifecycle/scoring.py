"""GRPO's scoring: the no-grad forwards after each generation (``train.objective: grpo``).

TRL v1.9.0 ``GRPOTrainer._generate_and_score_completions``: under ``torch.no_grad()`` (with gradient
checkpointing disabled, ``disable_gradient_checkpointing``) the policy computes the old log-probabilities
(always with vLLM: "we always compute old_per_token_logps for importance sampling") and, with ``beta != 0``,
the reference model (or the policy with its adapters disabled) the reference ones, each through
``_get_per_token_logps_and_entropies(..., batch_size=per_device_train_batch_size)``: one chunk of
``micro_batch_size`` completions at a time, no entropies.  One chunk's largest live tensors:

* the head's: the logits over the completion, ``b (C + 1) V`` in the compute dtype, and one sequence's
  ``log_softmax`` output (``C V``; ``selective_log_softmax`` gathers from it and drops it); or one MLP's
  (gate, up and their product over ``b (P + C)`` tokens), whichever is larger;
* the residual stream in and out of a layer.

From TRL v1.15.0 (``software.trl``, facts/trl.py) the same forwards run TRL's fused LM head (``fused_lm_head=True``,
analytic/fused_head.py): the head's share is the gathered hidden states of the ``b C`` completion positions, the
kernel's seven fp32 statistics and its tiles, no logits.  From v0.16.0 to v0.29.x (facts/trl.py ``GRPO_EARLY_ROWS``)
``logits = logits / self.temperature`` makes the ``b C V`` quotient while the logits live (then drops them): the
head's share is ``b (C + 1) V + b C V``; v0.15.x divides nothing (as above).  Before v0.23.0 with beta 0 no scoring
forward runs at GRPOConfig's defaults (analytic/grpo.py ``scores_nothing``): the phase is what stays between steps.

Nothing is saved for a backward.  The phase runs at the start of a step, after the previous step's
``zero_grad``: over what the trainer keeps between steps, the reference model, and what the engine holds
after generating (its share between rollouts: it sleeps again right after ``generate`` with sleep mode).
"""

from __future__ import annotations

from vramplan.analytic.events import StepLayout
from vramplan.analytic.fused_head import fused_forward_bytes
from vramplan.analytic.grpo import quotient_copy, scores_nothing, uses_fused_head
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.loss import fused_head_dtypes
from vramplan.spec.defaults import completion_len
from vramplan.units import ceil_div

__all__ = ["scoring_forward_bytes", "scoring_phase"]


def scoring_forward_bytes(c: StepContext, lay: StepLayout) -> int:
    """One no-grad scoring forward's largest live tensors (module docstring)."""
    t, ro = c.s.train, c.s.rl.rollout
    if scores_nothing(c.s):
        return 0
    b, comp = t.micro_batch_size, completion_len(c.s)
    tokens = ceil_div(b * (ro.max_prompt_len + comp), c.s.parallel.cp)
    vocab, cb = c.m.vocab_size, lay.compute_bytes
    if not lay.has_head:
        head = 0
    elif uses_fused_head(c.s):
        head = fused_forward_bytes(b * comp, c.m.hidden_size, *fused_head_dtypes(c))
    elif quotient_copy(c.s):
        # v0.16.0-v0.29.x: logits / temperature makes the b C V quotient while the head's logits live
        head = b * (comp + 1) * vocab * cb + b * comp * vocab * cb
    else:
        head = b * (comp + 1) * vocab * cb + comp * vocab * cb
    mlp = tokens * lay.inter * cb * (3 if lay.gated else 2)
    return 2 * tokens * lay.hidden * lay.residual_bytes + max(head, mlp)


def scoring_phase(c: StepContext, lay: StepLayout, resident: Moment) -> Moment:
    """The scoring's highest moment over ``resident`` (between steps, with the reference and the engine)."""
    return resident.copy("scoring").add(K.SCORING_FORWARD, scoring_forward_bytes(c, lay))
