"""verl's defaults that decide what lives on each GPU of its hybrid engine, by release, as data.

verl (github.com/volcengine/verl) runs RL post-training with a "hybrid engine": on every GPU one process holds the
actor (FSDP), the reference policy (FSDP, when a KL term needs it) and a vLLM engine that generates the rollouts,
their weights swapped between phases by a sharding manager.  Each row below was read from verl's source at the
release's tag (``git show TAG:path``); the config keys are verl's own (``actor_rollout_ref.*``), named once here
and in ``spec/scenario.py`` ``Verl``.  Releases read: v0.4.1 and v0.5.0 (``READ_AT``); both have the same rows.

Sources (identical at v0.4.1 and v0.5.0 unless named; v0.4.1's trainer config is one file,
``verl/trainer/config/ppo_trainer.yaml``, v0.5.0's splits it into ``actor/``, ``ref/`` and ``rollout/``):

* ``actor.fsdp_config.param_offload: false``, ``optimizer_offload: false``: ppo_trainer.yaml lines 287, 290
  (v0.4.1); ``actor/dp_actor.yaml`` lines 57, 60 (v0.5.0);
* the reference's parameters always in host memory under ``strategy: fsdp`` (FSDP1), whatever
  ``ref.fsdp_config.param_offload`` says (that key is read by FSDP2 only): ``fsdp_workers.py``
  ``_build_model_optimizer`` ("We force reference policy to use CPUOffload to save memory": ``cpu_offload = None if
  role == "actor" else CPUOffload(offload_params=True)``, v0.4.1 line 319, v0.5.0 line 368);
* ``rollout.gpu_memory_utilization: 0.5``, ``enforce_eager: True``, ``free_cache_engine: True``,
  ``tensor_model_parallel_size: 2``, ``max_num_batched_tokens: 8192``, ``max_num_seqs: 1024``: ppo_trainer.yaml
  lines 413, 419, 422, 432, 435, 441 (v0.4.1); ``rollout/rollout.yaml`` lines 29, 35, 38, 41, 44, 50 (v0.5.0);
  ``max_num_seqs`` is not passed on: ``vllm_rollout_spmd.py`` ``vLLMRollout.__init__`` builds ``LLM(...)`` without it
  (v0.4.1 line 149, v0.5.0 line 165), so vLLM's own default applies (analytic/verl.py ``rollout_scenario``);
* what ``gpu_memory_utilization`` means: verl passes it to ``vllm.LLM`` unchanged (``vllm_rollout_spmd.py``), and its
  ``docs/examples/config.rst`` says "For vLLM v0.7.0 and later: The fraction of **total** GPU memory to be used for
  the vLLM instance" (line 313 at v0.4.1, 331 at v0.5.0); vLLM's own budget rule at ``rl.rollout.vllm_version`` decides what that
  share is charged with (facts/vllm_releases.py: from 0.9.1 only the engine's own increase, which is modelled;
  before, the whole device's usage, refused as under TRL);
* the vLLM releases verl installs: ``setup.py`` ``VLLM_REQUIRES``: ``vllm<=0.8.5`` (v0.4.1 line 51),
  ``vllm>=0.7.3,<=0.8.5`` (v0.5.0 line 51) (``VLLM_PIN``); a V1 release before 0.9.1 charges the trainer's tensors
  in the same process to the engine's budget (serve/rollout.py);
* ``model.enable_gradient_checkpointing: true``, ``model.use_remove_padding: false``: ppo_trainer.yaml lines 116,
  122 (v0.4.1), 62, 68 (v0.5.0);
* ``actor.use_dynamic_bsz: false``, ``ppo_max_token_len_per_gpu: 16384``, ``entropy_coeff: 0``: ppo_trainer.yaml
  lines 165, 169, 211 (v0.4.1); ``actor/actor.yaml`` lines 22, 66 (v0.5.0);
* ``actor.strategy: fsdp``, ``rollout.name: vllm``: ppo_trainer.yaml lines 153, 385 (v0.4.1); ``actor/dp_actor.yaml``
  line 17, ``rollout/rollout.yaml`` line 2 (v0.5.0);
* ``data.max_prompt_length: 512``, ``data.max_response_length: 512``: ppo_trainer.yaml lines 33, 36;
* ``ppo_micro_batch_size_per_gpu: null`` and ``log_prob_micro_batch_size_per_gpu: null`` with no dynamic batch:
  verl refuses to start (``ActorRolloutRefWorker.__init__`` normalizes them, ``check_mutually_exclusive`` in
  ``verl/trainer/main_ppo.py`` / ``ray_trainer.py`` asks for one of the two spellings);
* the actor's parameters in fp32, the reference's in bf16: ``verl/workers/fsdp_workers.py``
  ``_build_model_optimizer`` (``torch_dtype = torch.float32 if self._is_actor else torch.bfloat16``), FSDP
  ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=fp32)``, ``FULL_SHARD`` over every GPU
  (``fsdp_size: -1``);
* the engine asleep between rollouts at level 1 (weights to host memory, KV cache freed):
  ``verl/workers/sharding_manager/fsdp_vllm.py`` ``FSDPVLLMShardingManager.__exit__`` (``sleep(level=1)``;
  v0.5.0 only when ``free_cache_engine``), and right after it is built (``vllm_rollout_spmd.py``
  ``vLLMRollout.__init__``: ``LLM(..., enable_sleep_mode=True)`` then ``sleep(level=1)``);
* the old log-probabilities with entropies, the reference's without: ``fsdp_workers.py`` ``compute_log_prob``
  (``calculate_entropy=True``) and ``compute_ref_log_prob`` (``calculate_entropy=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_VERL_RELEASE", "READ_AT", "VLLM_PIN", "VerlDefaults", "verl_defaults"]

READ_AT = ("0.4.1", "0.5.0")
# unset: the later release read
DEFAULT_VERL_RELEASE = "0.5.0"
# the newest vLLM both releases' setup.py accept (VLLM_REQUIRES)
VLLM_PIN = (0, 8, 5)


@dataclass(frozen=True)
class VerlDefaults:
    """One release's defaults (the module docstring gives each one's file and line)."""

    release: str
    strategy: str = "fsdp"
    rollout_name: str = "vllm"
    param_offload: bool = False
    optimizer_offload: bool = False
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 2
    enforce_eager: bool = True
    free_cache_engine: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024  # in the config, but not passed to vllm.LLM (module docstring)
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = False
    entropy_coeff: float = 0.0
    max_prompt_length: int = 512
    max_response_length: int = 512
    # the vLLM sleep level of FSDPVLLMShardingManager.__exit__
    sleep_level: int = 1
    # v0.4.1's __exit__ sleeps whatever free_cache_engine says; v0.5.0 reads it
    reads_free_cache_engine: bool = True


_ROWS = {
    "0.4.1": VerlDefaults("0.4.1", reads_free_cache_engine=False),
    "0.5.0": VerlDefaults("0.5.0"),
}


def verl_defaults(release: str | None) -> VerlDefaults:
    """The row of ``release`` (one of ``READ_AT``), or of ``DEFAULT_VERL_RELEASE`` when None."""
    return _ROWS[release or DEFAULT_VERL_RELEASE]
