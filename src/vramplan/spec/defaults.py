"""What a scenario's null means where the default is a trainer's own: resolved here, in one place, with the release.

A few scenario fields are null in the schema because their default depends on what runs (docs/rl.md):

* ``train.gradient_checkpointing``: TRL's trainer configs turn checkpointing on (``_BaseConfig.gradient_checkpointing
  = True``, facts/trl.py ``GRADIENT_CHECKPOINTING_ROWS``: GRPOConfig before v0.22.0 inherits TrainingArguments'
  False) under a post-training objective (dpo, kto, orpo, grpo, rloo); PPO's trainer replaces the Trainer's loop and never calls ``gradient_checkpointing_enable`` (trl 1.12.0
  experimental/ppo/ppo_trainer.py), so ppo resolves to none, as the HF Trainer's
  ``TrainingArguments.gradient_checkpointing`` (False) does for every other objective;
* ``serve.dtype``: auto is ``vllm serve --dtype auto``, resolved with the GPU (``served_dtype``, which needs the
  GPU and so is applied by ``catalog.resolve`` once the GPU is known: ``with_served_dtype``);
* ``rl.beta``, ``rl.rollout.num_generations``, ``rl.rollout.max_completion_len``: RLOOConfig's 0.05, 2 and 512
  (TRL v1.16.0) under ``train.objective: rloo``, else GRPOConfig's beta (0.04 before v0.19.0, 0.0 from it: facts/trl.py
  ``GRPO_BETA_ROWS``), 8 and its ``max_completion_length`` at ``software.trl`` (256 up to v1.9.x, 512 from v1.10.0:
  facts/trl.py ``COMPLETION_DEFAULT_ROWS``); under ppo the
  completion is PPOConfig's ``response_length`` 53 (facts/trl.py ``PPO_RESPONSE_LENGTH``);
* ``rl.rollout.engine``: hf-generate under ppo (TRL 1.12.0 ``PPOTrainer`` generates with the policy's ``generate``
  in ``batch_generation`` and has no vLLM path), vllm under every other objective.

Under ``framework: verl`` the nulls are verl's (``with_verl_defaults``, facts/verl.py): gradient checkpointing full
(``enable_gradient_checkpointing: true``), the response ``max_response_length`` 512, the engine vllm, and every
``rl.verl`` key at the release's value; ``rl.beta`` and ``num_generations`` stay null (verl reads neither here).

Under ``framework: openrlhf`` the nulls are OpenRLHF's (``with_openrlhf_defaults``, facts/openrlhf.py): gradient
checkpointing none (``--gradient_checkpointing`` false), ``rl.reference_model`` separate (``--init_kl_coef`` 0.01),
``advantage_estimator`` group_norm (gae under ppo), and every other ``rl.openrlhf`` key at the release's value but
``bf16`` and ``vllm_num_engines`` (their defaults are refused); TRL's rollout keys stay as given.

``with_trainer_defaults`` fills each null with that value (``catalog.resolve`` calls it), so the estimate, and the
report's ``scenario``, hold the resolved values: a report's scenario estimated again resolves to itself.  A value
given equal to the default means the same as leaving it out: no check reads whether a key was present.
"""

from __future__ import annotations

from vramplan.facts.openrlhf import openrlhf_defaults
from vramplan.facts.trl import (
    GRPO_BETA,
    GRPO_NUM_GENERATIONS,
    PPO_RESPONSE_LENGTH,
    RLOO_BETA,
    RLOO_MAX_COMPLETION,
    RLOO_NUM_GENERATIONS,
    gradient_checkpointing_default,
    grpo_beta_default,
    grpo_completion_default,
)
from vramplan.facts.verl import verl_defaults
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.scenario import Checkpointing, HalfDtype, RolloutEngine, Scenario

__all__ = ["PRE_AMPERE", "TRL_OBJECTIVES", "UNREAD_SERVE_DTYPE", "beta", "checkpointing", "completion_len",
           "expandable_segments", "fsdp_group", "megatron_distributed_optimizer", "num_generations", "ppo_beta_default",
           "rollout_engine", "served_dtype", "torch_fsdp2", "torchtitan_fsdp2", "with_openrlhf_defaults", "with_served_dtype",
           "with_trainer_defaults",
           "with_verl_defaults"]

# GPU architectures below compute capability 8.0: no bf16 (vLLM's CudaPlatform.supported_dtypes: fp16, fp32)
PRE_AMPERE = frozenset({"pascal", "volta", "turing"})
# serve.dtype auto where no serving engine reads it (another task, llama.cpp, whose weights' types are the GGUF
# file's): bf16, the schema's default before auto, so such a scenario's echo reads as it did
UNREAD_SERVE_DTYPE: HalfDtype = "bf16"

# the objectives TRL's trainers run (their configs subclass trl/trainer/base_config.py _BaseConfig)
TRL_OBJECTIVES = frozenset({"dpo", "kto", "orpo", "grpo", "ppo", "rloo"})


def checkpointing(s: Scenario) -> Checkpointing:
    """``train.gradient_checkpointing``, or the trainer's default: full under a TRL objective whose release turns it
    on, none otherwise."""
    given = s.train.gradient_checkpointing
    if given is not None:
        return given
    if (s.train.objective in TRL_OBJECTIVES and s.train.objective != "ppo"
            and gradient_checkpointing_default(s.software.trl_version)):
        return "full"
    return "none"


def ppo_beta_default() -> float:
    """``rl.beta`` under ppo when left out: PPO has no such key (its ``kl_coef`` changes no memory), so GRPOConfig's
    0.0, the value that reads as "not given"."""
    return GRPO_BETA


def beta(s: Scenario) -> float:
    """``rl.beta``, or the trainer's default (RLOOConfig's 0.05, GRPOConfig's at ``software.trl``: 0.04 before
    v0.19.0, 0.0 from it, facts/trl.py ``GRPO_BETA_ROWS``; under ppo ``ppo_beta_default``)."""
    given = s.rl.beta
    if given is not None:
        return given
    return RLOO_BETA if s.train.objective == "rloo" else grpo_beta_default(s.software.trl_version)


def num_generations(s: Scenario) -> int:
    """``rl.rollout.num_generations``, or the trainer's default (RLOOConfig's 2, GRPOConfig's 8)."""
    given = s.rl.rollout.num_generations
    if given is not None:
        return given
    return RLOO_NUM_GENERATIONS if s.train.objective == "rloo" else GRPO_NUM_GENERATIONS


def completion_len(s: Scenario) -> int:
    """``rl.rollout.max_completion_len``, or the trainer's default at the release (RLOOConfig's 512; GRPOConfig's
    256 at TRL v1.9.0, 512 from v1.10.0)."""
    given = s.rl.rollout.max_completion_len
    if given is not None:
        return given
    if s.train.objective == "ppo":
        return PPO_RESPONSE_LENGTH
    return RLOO_MAX_COMPLETION if s.train.objective == "rloo" else grpo_completion_default(s.software.trl_version)


def rollout_engine(s: Scenario) -> RolloutEngine:
    """``rl.rollout.engine``, or the trainer's way: hf-generate under ppo (PPOTrainer has no vLLM rollout), else
    vllm."""
    given = s.rl.rollout.engine
    if given is not None:
        return given
    return "hf-generate" if s.train.objective == "ppo" else "vllm"


def with_trainer_defaults(s: Scenario) -> Scenario:
    """``s`` with every null trainer default resolved (the module docstring); ``s`` itself when none is null."""
    if s.framework == "verl":
        return with_verl_defaults(s)
    if s.framework == "openrlhf":
        return with_openrlhf_defaults(s)
    t, rl, ro = s.train, s.rl, s.rl.rollout
    generations_null = ro.num_generations is None and s.train.objective != "ppo"
    if None not in (t.gradient_checkpointing, rl.beta, ro.max_completion_len, ro.engine) and not generations_null:
        return s
    # PPOTrainer samples one response per query (batch_generation): the key stays null under ppo, which reads none
    generations = ro.num_generations if s.train.objective == "ppo" else num_generations(s)
    rollout = ro.model_copy(update={"num_generations": generations, "max_completion_len": completion_len(s),
                                    "engine": rollout_engine(s)})
    return s.model_copy(update={
        "train": t.model_copy(update={"gradient_checkpointing": checkpointing(s)}),
        "rl": rl.model_copy(update={"beta": beta(s), "rollout": rollout}),
    })


def served_dtype(s: Scenario, gpu: GpuSpec) -> HalfDtype:
    """``serve.dtype`` with auto resolved as ``vllm serve --dtype auto`` does on ``gpu`` (spec/scenario.py
    ``Serve.dtype``): fp16 before Ampere (compute capability < 8.0), else bf16, the checkpoint's dtype assumed bf16
    (an fp16 or fp32 checkpoint runs fp16: the same 2 bytes).  A GPU of unknown generation takes bf16."""
    d = s.serve.dtype
    if d != "auto":
        return d
    return "fp16" if gpu.architecture in PRE_AMPERE else "bf16"


def with_served_dtype(s: Scenario, gpu: GpuSpec | None) -> Scenario:
    """``s`` with ``serve.dtype`` auto resolved: by ``served_dtype`` for a vLLM or SGLang engine on ``gpu`` (left
    auto while no GPU is known), ``UNREAD_SERVE_DTYPE`` where no engine reads it.  The estimate and the report's
    scenario hold the dtype that runs; ``s`` itself when it gives one."""
    if s.serve.dtype != "auto":
        return s
    read = s.task == "serve" and s.serve.engine != "llamacpp"
    if read and gpu is None:
        return s
    dtype = served_dtype(s, gpu) if read and gpu is not None else UNREAD_SERVE_DTYPE
    return s.model_copy(update={"serve": s.serve.model_copy(update={"dtype": dtype})})


def expandable_segments(s: Scenario) -> bool:
    """``software.expandable_segments``, or the launcher's default: torchtitan's ``run_train.sh`` exports
    ``PYTORCH_ALLOC_CONF="expandable_segments:True"`` (``PYTORCH_CUDA_ALLOC_CONF`` until pytorch/torchtitan#1577,
    2025-08-15; added by #643, 2024-10-22, before the first tagged release v0.1.0), so a torchtitan training job takes
    it; every other launcher leaves PyTorch's default, off."""
    given = s.software.expandable_segments
    if given is not None:
        return given
    return s.task == "train" and s.effective_framework == "torchtitan"


def fsdp_group(s: Scenario, dp: int) -> int:
    """The ranks one FSDP unit is sharded over: the data-parallel degree, within a node under hybrid_shard."""
    return max(1, min(dp, s.hardware.gpus_per_node)) if s.parallel.fsdp == "hybrid_shard" else dp


def megatron_distributed_optimizer(s: Scenario) -> bool:
    """``parallel.megatron.use_distributed_optimizer``, or Megatron-LM's default: false (``--use-distributed-optimizer``
    is a ``store_true`` flag, arguments.py line 2658 at core_v0.15.0; facts/megatron.py)."""
    given = s.parallel.megatron.use_distributed_optimizer if s.parallel.megatron is not None else None
    return bool(given)


def torch_fsdp2(s: Scenario) -> bool:
    """The job's torch FSDP is FSDP2 (``fully_shard``): framework accelerate as vramplan exports it
    (``fsdp_version: 2``, export/accelerate.py), torchtitan, and torchtune from v0.3.0 (its distributed recipes
    wrapped the model in FSDP1 before); the HF Trainer's default, Lightning / Lit-GPT and verl run FSDP1."""
    fw = s.effective_framework
    if fw == "torchtune":
        v = s.software.torchtune_version
        return v is None or v >= (0, 3)
    return fw in ("accelerate", "torchtitan")


def torchtitan_fsdp2(s: Scenario) -> bool:
    """A training job laid out as torchtitan's FSDP2 units (analytic/terms/sharding.py ``fsdp2_root_unit``):
    framework torchtitan, parameters sharded over more than one rank (full_shard, or hybrid_shard within a node of
    more than one GPU), one pipeline stage, no PEFT and no offload (torchtitan trains neither with adapters, and its
    ``CPUOffloadPolicy`` path is not modelled)."""
    par = s.parallel
    if s.task != "train" or s.effective_framework != "torchtitan" or par.fsdp not in ("full_shard", "hybrid_shard"):
        return False
    return fsdp_group(s, s.shard_degree) > 1 and par.pp == 1 and s.train.peft is None and par.offload == "none"


def with_verl_defaults(s: Scenario) -> Scenario:
    """``s`` (framework verl) with verl's defaults at ``rl.verl.release`` in its null keys (facts/verl.py);
    ``log_prob_micro_batch_size_per_gpu`` and the reference's stay null (verl refuses them null)."""
    v = s.rl.verl
    row = verl_defaults(v.release)
    given = v.model_dump()
    fill = {"release": row.release, "param_offload": row.param_offload, "optimizer_offload": row.optimizer_offload,
            "gpu_memory_utilization": row.gpu_memory_utilization,
            "tensor_model_parallel_size": row.tensor_model_parallel_size, "free_cache_engine": row.free_cache_engine,
            "enforce_eager": row.enforce_eager, "use_remove_padding": row.use_remove_padding,
            "entropy_coeff": row.entropy_coeff, "strategy": row.strategy, "rollout_name": row.rollout_name}
    filled = v.model_copy(update={k: x for k, x in fill.items() if given[k] is None})
    t, ro = s.train, s.rl.rollout
    ckpt = t.gradient_checkpointing or ("full" if row.enable_gradient_checkpointing else "none")
    rollout = ro.model_copy(update={"max_completion_len": ro.max_completion_len or row.max_response_length,
                                    "engine": ro.engine or "vllm"})
    return s.model_copy(update={"train": t.model_copy(update={"gradient_checkpointing": ckpt}),
                                "rl": s.rl.model_copy(update={"rollout": rollout, "verl": filled})})


def with_openrlhf_defaults(s: Scenario) -> Scenario:
    """``s`` (framework openrlhf) with OpenRLHF's defaults at ``rl.openrlhf.release`` in its null keys
    (facts/openrlhf.py): ``advantage_estimator`` null is group_norm under grpo, gae (OpenRLHF's own) under ppo,
    ``rl.reference_model`` null is separate (``--init_kl_coef`` 0.01 > 0), gradient checkpointing null is
    ``--gradient_checkpointing``'s false; ``vllm_num_engines`` and ``bf16`` stay as given (their defaults, no engine
    and fp32, are refused).  The rollout's TRL keys stay as given (OpenRLHF reads its own)."""
    o = s.rl.openrlhf
    row = openrlhf_defaults(o.release)
    given = o.model_dump()
    estimator = row.advantage_estimator if s.train.objective == "ppo" else "group_norm"
    fill = {"release": row.release, "advantage_estimator": estimator, "zero_stage": row.zero_stage,
            "adam_offload": row.adam_offload, "colocate_all_models": row.colocate_all_models,
            "colocate_actor_ref": row.colocate_actor_ref, "colocate_critic_reward": row.colocate_critic_reward,
            "ref_reward_offload": row.ref_reward_offload,
            "deepspeed_enable_sleep": row.deepspeed_enable_sleep,
            "vllm_tensor_parallel_size": row.vllm_tensor_parallel_size,
            "vllm_gpu_memory_utilization": row.vllm_gpu_memory_utilization,
            "vllm_enable_sleep": row.vllm_enable_sleep, "enforce_eager": row.enforce_eager,
            "micro_train_batch_size": row.micro_train_batch_size,
            "micro_rollout_batch_size": row.micro_rollout_batch_size, "prompt_max_len": row.prompt_max_len,
            "generate_max_len": row.generate_max_len, "packing_samples": row.packing_samples}
    filled = o.model_copy(update={k: x for k, x in fill.items() if given[k] is None})
    t = s.train
    ckpt = t.gradient_checkpointing or ("full" if row.gradient_checkpointing else "none")
    return s.model_copy(update={"train": t.model_copy(update={"gradient_checkpointing": ckpt}),
                                "rl": s.rl.model_copy(update={"reference_model": s.rl.reference_model or "separate",
                                                              "openrlhf": filled})})
