"""OpenRLHF's critic (``advantage_estimator: gae``, analytic/openrlhf.py): its DeepSpeed training engine on one of
its GPUs, as moments.

``CriticModelActor.init_model_from_pretrained`` (OpenRLHF v0.8.11 ``openrlhf/trainer/ray/ppo_critic.py`` lines
169-217): ``get_llm_for_sequence_regression`` (the policy's base, no LM head, ``nn.Linear(hidden_size, 1)``), the
actor's DeepSpeed train config (``get_ds_train_config(is_actor=False)``: the same ZeRO stage, bf16 and
``adam_offload``), its own ``create_optimizer`` (FusedAdam, or DeepSpeedCPUAdam under ``adam_offload``), gradient
checkpointing with ``--gradient_checkpointing``; ``CriticPPOTrainer.training_step`` (lines 110-153) runs
``micro_train_batch_size`` sequences, the value loss on ``b x R`` numbers, ``strategy.backward`` and
``optimizer_step``.

Its step is computed as the actor's model's DeepSpeed step with a plain loss (objective sft, no OpenRLHF loss
tensors): every tensor sized by the parameters (the half parameters' shard, the fp32 master, AdamW's two states, the
gradient partition) scaled by the critic's parameters over the policy's (``critic_params / P``: every parameter has
the same dtype and state layout), the LM head's logits and loss tensors left out (a value head's ``b S`` numbers
instead; with a tied head, its gradient's contribution to the embedding's too), the rest (saved activations, layer
temporaries, DeepSpeed's fixed reduce buckets, a gathered unit at ZeRO-3, cuBLAS workspaces) as computed.  Each row
is relabelled as the critic's so that it adds to, not merges with, the actor's rows of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic import openrlhf
from vramplan.analytic.lifecycle.steps import between_steps
from vramplan.analytic.moment import K, Key, Moment
from vramplan.analytic.train import train_step
from vramplan.spec.load import Resolved

__all__ = ["CriticStep", "critic_step"]

# rows sized by the parameters: scaled by critic_params / P, relabelled as the critic's
_SCALED: dict[tuple[str, str], Key] = {
    (K.PARAMETERS.part, K.PARAMETERS.label): K.CRITIC_WEIGHTS,
    (K.MASTER.part, K.MASTER.label): K.CRITIC_MASTER,
    (K.GRADIENTS.part, K.GRADIENTS.label): K.CRITIC_GRADIENTS,
}
# rows of a fixed size: relabelled as the critic's
_KEPT: dict[tuple[str, str], Key] = {
    (K.DS_REDUCE_BUCKETS.part, K.DS_REDUCE_BUCKETS.label): K.CRITIC_GRADIENTS,
}
# the LM head's loss tensors and, with a tied head, its gradient's contribution to the embedding's: absent from a
# value model's step (no LM head)
_DROPPED = frozenset((k.part, k.label) for k in (K.LOSS_FORWARD, K.LOSS_BACKWARD, K.TIED_EMBEDDING))


@dataclass(frozen=True)
class CriticStep:
    """The critic's step on one of its GPUs: its moments (forward, backward, optimizer) and what it keeps between
    its steps (``resident``), both relabelled; ``offloadable``: the rows ``offload_deepspeed_states`` moves to host
    memory outside its update (optimizer states, fp32 master, gradient buffers); ``host``: its states in host memory
    under ``adam_offload`` (scaled as the rest)."""

    moments: list[Moment]
    resident: Moment
    offloadable: int
    host: int


def _critic_rows(mo: Moment, params: int, total: int) -> Moment:
    out = Moment(mo.phase)
    for part, rows in mo.parts.items():
        for label, nbytes in rows.items():
            if (part, label) in _DROPPED:
                continue
            if part == K.OPTIMIZER_STATES.part:
                key, n = K.CRITIC_OPTIMIZER, nbytes * params // total
            elif (part, label) in _SCALED:
                key, n = _SCALED[(part, label)], nbytes * params // total
            elif (part, label) in _KEPT:
                key, n = _KEPT[(part, label)], nbytes
            elif part == "activations":
                key, n = K.CRITIC_ACTIVATIONS, nbytes
            else:
                out.parts.setdefault(part, {})[label] = out.parts.get(part, {}).get(label, 0) + nbytes
                continue
            out.add(key, out.get(key) + n)
    return out


def critic_step(pr: Resolved) -> CriticStep:
    """The critic's step for the actor's scenario ``pr`` (``openrlhf.policy_scenario``; module docstring)."""
    s = pr.scenario
    train = s.train.model_copy(update={"objective": "sft"})
    # release None: not the actor's loss (analytic/terms/loss.py marks_openrlhf_loss)
    block = s.rl.openrlhf.model_copy(update={"release": None})
    cs = s.model_copy(update={"train": train, "rl": s.rl.model_copy(update={"openrlhf": block})})
    tv = train_step(Resolved(cs, pr.model, pr.gpu, ()))
    assert tv.context is not None  # one pipeline stage (openrlhf_problems refuses pp > 1)
    total = tv.context.rp.total
    params = openrlhf.critic_params(tv.context)
    moments = [_critic_rows(mo, params, total) for mo in tv.moments]
    resident = _critic_rows(between_steps(tv.terms, "rollout"), params, total)
    offloadable = (resident.get(K.CRITIC_OPTIMIZER) + resident.get(K.CRITIC_MASTER)
                   + resident.get(K.CRITIC_GRADIENTS))
    return CriticStep(moments, resident, offloadable, tv.host_bytes * params // total)
