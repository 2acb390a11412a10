"""PPO's job (``train.objective: ppo``, TRL v1.12.0 ``PPOTrainer``; analytic/ppo.py): the value model's share of the
policy's step, what stays on the GPU between the phases, and the rollout and scoring phases.

* **value model**: the policy's architecture with a one-column score head (analytic/ppo.py ``value_params``), fully
  trained by the same optimizer, never checkpointed.  Its bytes come from the training step of the same scenario
  without adapters, quantization or checkpointing (``train.objective: sft``): its parameters, optimizer states,
  fp32 masters and gradients scaled by ``value parameters / model parameters`` (every parameter has the same
  dtype and state layout), its saved activations as that step's at the forward's end (the LM head's logits and loss
  are its temporaries, not its activations);
* **between phases**: the value model's weights and states, the reference copy (none under PEFT), the reward model,
  the kept generate scores (``B R V`` fp32) and the rollout buffers;
* **training step**: every policy moment with them and, in a mini-batch of several micro-batches, what the previous
  micro-batch still holds (analytic/ppo.py ``carried_bytes``); before ``optimizer.step()`` the value's saved activations (its
  forward ran first, its backward runs after the policy's) and, with gradient accumulation, its gradients; at the
  optimizer its gradients and its share of the step's temporaries (one optimizer); and one more moment, the value's backward (its highest moment in the same step without
  adapters, the LM head's loss left out) over the policy's gradients, whole by then;
* **rollout**: what the trainer keeps between steps, the value, reference and reward models, the previous rollout's
  scores, and the larger of the last generate chunk (its KV cache and sampling, the earlier chunks' stacked scores,
  its own scores and their stacked copy) and ``pad`` (every chunk's scores and the padded copy);
* **scoring**: the same residents, the new scores and the buffers, and one no-grad forward of ``rf`` sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic import ppo
from vramplan.analytic.lifecycle import PhasePeak, packed_reserved
from vramplan.analytic.lifecycle.hf_rollout import hf_generate_parts
from vramplan.analytic.lifecycle.steps import between_steps
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.train import TrainResult, train_step
from vramplan.spec.defaults import completion_len
from vramplan.spec.load import Resolved

__all__ = ["PpoJob", "ValueParts", "ppo_job", "value_parts"]


@dataclass(frozen=True)
class ValueParts:
    """The value model's bytes on this GPU: ``resident`` (weights, optimizer states, masters, DDP buckets) from the
    load on, ``gradients`` during the step, ``activations`` saved by its forward until its backward."""

    resident: Moment
    gradients: int
    activations: int
    # its own backward's highest moment: (gradients, saved activations, layer temporaries)
    backward: tuple[int, int, int] = (0, 0, 0)
    # its share of optimizer.step()'s temporaries (one optimizer over both models: torch's foreach step takes every
    # parameter of a group at once)
    step: int = 0


@dataclass(frozen=True)
class PpoJob:
    """PPO's parts beside the policy's step: ``extra`` (between phases), the step's moments with them, the rollout and
    scoring phases, and the models' weights at the end of the load."""

    extra: Moment
    moments: list[Moment]
    rollout: PhasePeak
    scoring: PhasePeak
    loaded: Moment


def _part(mo: Moment, part: str) -> int:
    return sum(mo.parts.get(part, {}).values())


def value_parts(r: Resolved) -> ValueParts:
    """The value model's parts for the policy's scenario ``r`` (module docstring)."""
    s = r.scenario
    train = s.train.model_copy(update={"objective": "sft", "peft": None, "quantization": "none",
                                       "gradient_checkpointing": "none"})
    tv = train_step(Resolved(s.model_copy(update={"train": train}), r.model, r.gpu, ()))
    assert tv.context is not None  # one pipeline stage (ppo_problems refuses pp > 1)
    rp = tv.context.rp
    n = rp.total
    nv = ppo.value_params(n, rp.lm_head, r.model.hidden_size)
    between = between_steps(tv.terms, "load")
    resident = Moment("")
    resident.add(K.VALUE_WEIGHTS, between.get(K.PARAMETERS) * nv // n)
    resident.add(K.VALUE_OPTIMIZER, _part(between, "optimizer_states") * nv // n)
    resident.add(K.VALUE_MASTER, _part(between, "master_weights") * nv // n)
    resident.add(K.VALUE_GRADIENTS, between.get(K.DDP_BUCKETS) * nv // n)
    grads = max(_part(mo, "gradients") for mo in tv.moments) - between.get(K.DDP_BUCKETS)
    acts = max((_part(mo, "activations") for mo in tv.moments if mo.phase == "forward"), default=0)
    # its backward, layer by layer, as the same step's (the LM head's loss tensors left out: a score head instead)
    loss_keys = (K.LOSS_FORWARD, K.LOSS_BACKWARD)
    backward = max((((_part(mo, "gradients") - between.get(K.DDP_BUCKETS)) * nv // n, _part(mo, "activations"),
                     _part(mo, "temporaries") - sum(mo.get(k) for k in loss_keys))
                    for mo in tv.moments if mo.phase == "backward"), key=sum, default=(0, 0, 0))
    step = max((mo.get(K.OPTIMIZER_STEP) for mo in tv.moments if mo.phase == "optimizer"), default=0)
    return ValueParts(resident, grads * nv // n, acts, backward, step * nv // n)


def _plus(mo: Moment, extra: Moment, phase: str | None = None) -> Moment:
    out = mo.copy(mo.phase if phase is None else phase)
    for part, rows in extra.parts.items():
        d = out.parts.setdefault(part, {})
        for label, nbytes in rows.items():
            d[label] = d.get(label, 0) + nbytes
    return out


def _step_moments(tr: TrainResult, extra: Moment, v: ValueParts, accumulates: bool,
                  carried: tuple[int, int]) -> list[Moment]:
    out: list[Moment] = []
    for mo in tr.moments:
        m = _plus(mo, extra)
        m.add(K.PPO_CARRIED, carried[0] if mo.phase == "forward" else carried[1])
        if mo.phase == "optimizer":
            m.add(K.VALUE_GRADIENTS, v.gradients).add(K.OPTIMIZER_STEP, v.step if mo.get(K.OPTIMIZER_STEP) else 0)
        else:
            m.add(K.VALUE_ACTIVATIONS, v.activations)
            if accumulates:
                m.add(K.VALUE_GRADIENTS, v.gradients)
        out.append(m)
    # the value's backward runs after the policy's (its forward ran first: lower autograd sequence numbers): the
    # policy's gradients whole, its step temporaries not yet made
    opt = [mo for mo in tr.moments if mo.phase == "optimizer"]
    if opt:
        last = _plus(opt[-1], extra, "backward").add(K.PPO_CARRIED, carried[1])
        last.parts["temporaries"] = {k: n for k, n in last.parts.get("temporaries", {}).items()
                                     if k != K.OPTIMIZER_STEP.label}
        g, a, t = v.backward
        out.append(last.add(K.VALUE_GRADIENTS, g).add(K.VALUE_ACTIVATIONS, a).add(K.LAYER_BACKWARD, t))
    return out


def ppo_job(pr: Resolved, tr: TrainResult) -> PpoJob:
    """PPO's parts for the policy's scenario ``pr`` (with PPO's defaults) and its step ``tr`` (module docstring)."""
    c = tr.context
    assert c is not None
    s, m = pr.scenario, pr.model
    ro = s.rl.rollout
    b_all, rf, p, r = ppo.rollout_batch(s), ppo.forward_batch(s), ro.max_prompt_len, completion_len(s)
    v = value_parts(pr)
    models = v.resident.copy("")
    models.add(K.REFERENCE_WEIGHTS, c.rp.total * c.pol.param_bytes if ppo.reference_kind(s) == "separate" else 0)
    # the reward model: the value model's architecture and dtype (under PEFT c.pol.param_bytes is the adapters')
    models.add(K.REWARD_WEIGHTS, v.resident.get(K.VALUE_WEIGHTS))
    scores = ppo.scores_bytes(b_all, r, m.vocab_size)
    extra = _plus(models, Moment("").add(K.PPO_SCORES, scores).add(K.PPO_BUFFERS, ppo.rollout_buffers_bytes(b_all, p, r)))
    carried = (ppo.carried_bytes(len(c.layer_specs), s.train.micro_batch_size, p, r, m.hidden_size, m.vocab_size,
                                 c.pol.compute_bytes) if ppo.carries(s) else (0, 0))
    moments = _step_moments(tr, extra, v, s.train.grad_accum_steps > 1, carried)
    # the rollout: the previous update's scores live until batch_generation returns
    base = _plus(between_steps(tr.terms, "rollout"), models)
    kv, other, casts = hf_generate_parts(c, pr, rf)
    chunk = ppo.scores_bytes(rf, r, m.vocab_size)
    gen = base.copy("rollout").add(K.PPO_SCORES, scores + ppo.scores_bytes(b_all - rf, r, m.vocab_size) + 2 * chunk)
    gen.add(K.GENERATE_KV, kv).add(K.GENERATE_TENSORS, other).add(K.GENERATE_CASTS, casts)
    pad = base.copy("rollout").add(K.PPO_SCORES, 3 * scores)
    rollout = max(gen, pad, key=lambda mo: mo.total)
    lay = tr.layout
    assert lay is not None
    scoring = _plus(between_steps(tr.terms, "scoring"), extra)
    scoring.add(K.SCORING_FORWARD, ppo.scoring_forward_bytes(len(c.layer_specs), rf, p, r, m.hidden_size, m.vocab_size,
                                                            lay.inter, lay.gated, lay.compute_bytes))
    loaded = Moment("load").add(K.PARAMETERS, between_steps(tr.terms, "load").get(K.PARAMETERS))
    loaded = _plus(loaded, models)
    loaded.parts.pop(K.VALUE_OPTIMIZER.part, None)
    loaded.parts.pop(K.VALUE_MASTER.part, None)
    loaded.parts.pop(K.VALUE_GRADIENTS.part, None)
    return PpoJob(extra, moments, PhasePeak("rollout", rollout, packed_reserved(rollout)),
                  PhasePeak("scoring", scoring, packed_reserved(scoring)), loaded)
