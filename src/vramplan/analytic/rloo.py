"""RLOO post-training (``train.objective: rloo``): TRL's ``RLOOTrainer`` as of TRL v1.16.0, modelled as GRPO is.

Read in TRL v1.16.0 (the PyPI wheel ``trl-1.16.0``): ``trl/trainer/rloo_config.py`` ``RLOOConfig`` and
``trl/trainer/rloo_trainer.py`` ``RLOOTrainer.__init__``, ``_get_per_token_logps_and_entropies``,
``_generate_and_score_completions`` and ``_compute_loss``.  The trainer is GRPO's in everything the memory sees:

* the policy step: prompt + completion sequences, ``per_device_train_batch_size`` counted in completions, the log-probs
  and entropies of the completion's positions through TRL's fused LM head (``add_fused_lm_head(..., outputs=
  ("log_probs", "entropy"))``, ``labels[:, :-logits_to_keep] = -100``): ``grpo.grpo_fused_loss_tensors``;
  gradient checkpointing on (``RLOOConfig``: "``gradient_checkpointing``: Defaults to ``True``");
* the scoring: under ``no_grad`` the policy's old log-probs (always) and, with ``beta != 0``, the reference's, in
  chunks of ``per_device_train_batch_size``, through the same fused head (analytic/lifecycle/scoring.py); the KL
  goes into the reward (``rewards - beta * kl``), not the loss, so no reference forward inside the step;
* the reference model: none when ``beta == 0``, the policy with its adapters disabled under PEFT, else a second copy
  (``create_model_from_path`` with ``dtype`` defaulting to the policy's): GRPO's rule (``grpo.reference_kind``);
* the rollout: the same ``VLLMGeneration`` with the same arguments (``vllm_gpu_memory_utilization``, ``max_num_seqs
  = per_device_train_batch_size x steps_per_generation``, sleep mode): serve/rollout.py.

What differs is ``RLOOConfig``'s defaults, taken where the scenario's fields are null (``with_defaults``,
spec/defaults.py): ``beta`` 0.05 (so a reference model is loaded without PEFT), ``num_generations`` 2 (and at least 2:
``RLOOConfig.__post_init__`` "RLOO requires at least 2 generations per prompt") and ``max_completion_length`` 512.
"""

from __future__ import annotations

from vramplan.analytic.grpo import grpo_assumptions, grpo_problems
from vramplan.errors import Problem
from vramplan.facts.trl import RLOO_BETA, RLOO_MAX_COMPLETION, RLOO_NUM_GENERATIONS
from vramplan.spec.defaults import with_trainer_defaults
from vramplan.spec.scenario import Scenario

__all__ = ["RLOO_BETA", "RLOO_MAX_COMPLETION", "RLOO_NUM_GENERATIONS", "RLOO_TRL_RELEASE", "rloo_assumptions",
           "rloo_problems", "with_defaults"]

RLOO_TRL_RELEASE = "1.16.0"
# trl/trainer/rloo_config.py RLOOConfig (v1.16.0): beta=0.05, num_generations=2, max_completion_length=512 (the values
# live in facts/trl.py, where spec/defaults.py resolves a null with them)


def with_defaults(s: Scenario) -> Scenario:
    """``s`` with RLOOConfig's defaults where its fields are null: ``rl.beta``, ``rl.rollout.num_generations`` and
    ``rl.rollout.max_completion_len`` (spec/defaults.py ``with_trainer_defaults``, which the resolved scenario has
    been through already)."""
    return with_trainer_defaults(s)


def rloo_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (``train.objective: rloo``) cannot be estimated; empty: it can.  GRPO's refusals (ZeRO-3 and FSDP,
    tensor, pipeline or context parallelism, a loss kernel, packing, evaluation, hf-generate rollouts, a colocated
    engine over a bitsandbytes policy, a batch not divisible by num_generations, a reference TRL would not use) on
    the scenario with RLOOConfig's defaults, and a release other than v1.16.0.  Fewer than 2 generations, which
    ``RLOOConfig.__post_init__`` refuses, the schema refuses for every objective (``Rollout.num_generations``)."""
    return grpo_problems(with_defaults(s), "RLOO")


def rloo_assumptions(s: Scenario) -> list[str]:
    """What the RLOO estimate takes as given, for the report (``s`` with RLOOConfig's defaults filled in)."""
    s = with_trainer_defaults(s)
    rl, ro = s.rl, s.rl.rollout
    return [*grpo_assumptions(s, "RLOO"),
            (f"RLOO (RLOOConfig defaults where the scenario gives none): beta = {rl.beta} (KL in the reward, its "
             f"reference forward in the scoring only), num_generations = {ro.num_generations}, max_completion_length "
             f"= {ro.max_completion_len}")]
