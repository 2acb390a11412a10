"""OpenRLHF's defaults that decide what lives on each GPU of its Ray layout, by release, as data.

OpenRLHF (github.com/OpenRLHF/OpenRLHF) runs RL post-training as Ray actors: the actor (policy) and the reference
model each a DeepSpeed engine in processes of their own, vLLM engines generating the rollouts, and, with
``--colocate_all_models``, all of them packed on the same GPUs (Ray placement-group bundles shared at 0.2 GPU per
actor).  Each row below was read from OpenRLHF's source at the release's tag (``git show TAG:path``); the option
names are OpenRLHF's own (``openrlhf/cli/train_ppo_ray.py``), named once here and in ``spec/scenario.py``
``OpenRlhf``.  Release read: v0.8.11 (``READ_AT``).  From v0.9.x the options are renamed (``--bf16`` and
``--prompt_max_len`` gone from ``train_ppo_ray.py`` at v0.9.10; v0.11.0 spells them ``--train.colocate_all``
etc.): those releases are not read.

Sources (v0.8.11, ``openrlhf/cli/train_ppo_ray.py`` unless named; line of the ``add_argument``):

* ``--zero_stage`` 2 (line 272), ``--gradient_checkpointing`` false (273), ``--bf16`` false (275),
  ``--adam_offload`` false (280), ``--attn_implementation`` flash_attention_2 (283), ``--deepspeed_enable_sleep``
  false (294), ``--packing_samples`` false (302);
* ``--colocate_actor_ref`` false (200), ``--colocate_critic_reward`` false (211), ``--colocate_all_models`` false
  (217), ``--ref_reward_offload`` false (419), ``--init_kl_coef`` 0.01 (361: above 0 the reference model is built, ``train`` ``ref_model =
  RayActorGroup(...)`` unless ``args.init_kl_coef <= 0``);
* ``--vllm_num_engines`` None (225: no vLLM engine), ``--vllm_tensor_parallel_size`` 1 (228), ``--enforce_eager``
  false (236), ``--vllm_enable_sleep`` false (238; set back to false without ``--colocate_all_models``),
  ``--vllm_gpu_memory_utilization`` 0.95 (244);
* ``--micro_rollout_batch_size`` 8 (323), ``--prompt_max_len`` 1024 (325), ``--generate_max_len`` 1024 (326),
  ``--micro_train_batch_size`` 4 (338), ``--n_samples_per_prompt`` 1 (352), ``--advantage_estimator`` gae (384:
  gae builds a critic, the others do not: ``args.critic_pretrain = None`` for them, line 481);
* the critic and the reward model (``train``): ``--reward_pretrain`` None (415) and ``--remote_rm_url`` None (416):
  without a remote reward a ``RewardModelActor`` group is built (line 125); ``--critic_pretrain`` None (417) is,
  under gae, the reward model's path, or the policy's with ``--remote_rm_url`` (lines 482-486); both are
  ``get_llm_for_sequence_regression`` (``openrlhf/models/model.py`` line 20): the base model (``AutoModel``) and a
  ``nn.Linear(hidden_size, 1, bias=False)`` value head (lines 174, 238), no LM head.  The critic is a DeepSpeed
  training engine of its own (``openrlhf/trainer/ray/ppo_critic.py`` ``CriticModelActor``: ``ds_config=
  strategy.get_ds_train_config(is_actor=False)`` line 180, the actor's ZeRO stage and ``adam_offload``;
  ``create_optimizer`` line 196; ``offload_states`` under ``deepspeed_enable_sleep`` lines 227-228), the reward
  model an eval engine like the reference (``openrlhf/trainer/ray/launcher.py`` ``RewardModelActor``,
  ``get_ds_eval_config(offload=ref_reward_offload)`` line 157).  Placement (``train`` lines 98-136): with
  ``colocate_all_models`` both share the actor's placement group (0.2 GPU each), else a group of their own,
  shared by the two with ``colocate_critic_reward``, each of ``critic_num_gpus_per_node`` /
  ``reward_num_gpus_per_node`` GPUs (8, lines 197, 209);
* the engine's ``max_model_len`` = ``prompt_max_len + generate_max_len`` (``train``), ``dtype="bfloat16"``,
  ``enable_sleep_mode=vllm_enable_sleep`` (``openrlhf/trainer/ray/vllm_engine.py`` ``create_vllm_engines``); its
  ``sleep`` is ``llm.sleep(level=1)`` (``LLMRayActor.sleep(self, level=1)``) and ``wake_up`` wakes everything;
* the reference's DeepSpeed config ``get_eval_ds_config(offload=ref_reward_offload, stage=zero_stage if zero_stage
  == 3 else 0)`` (``openrlhf/utils/deepspeed/deepspeed.py`` ``get_ds_eval_config``): a whole bf16 copy per GPU below
  ZeRO-3; the actor's ``get_train_ds_config(offload=False, adam_offload, stage=zero_stage, bf16)`` with
  ``DeepSpeedCPUAdam`` under ``adam_offload``, else ``FusedAdam`` (``create_optimizer``);
* ``--deepspeed_enable_sleep``: ``offload_deepspeed_states`` (``openrlhf/utils/deepspeed/deepspeed_utils.py``)
  moves the optimizer states, the fp32 master (``hp_params``), the contiguous gradient buffer and (DeepSpeed >=
  0.16.5) the half gradients to host memory, not the half parameters; nothing under ``adam_offload``;
* the vLLM and DeepSpeed releases installed: ``setup.py`` extras ``vllm==0.10.2`` (line 77), ``requirements.txt``
  ``deepspeed==0.17.6``, ``flash-attn==2.8.3`` (so ``log_probs_from_logits`` takes flash-attn's
  ``cross_entropy_loss`` path).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADVANTAGE_ESTIMATORS", "CRITIC_FREE", "DEFAULT_OPENRLHF_RELEASE", "READ_AT", "VLLM_PIN",
           "OpenRlhfDefaults", "openrlhf_defaults"]

READ_AT = ("0.8.11",)
DEFAULT_OPENRLHF_RELEASE = "0.8.11"
# setup.py extras_require["vllm"]: vllm==0.10.2
VLLM_PIN = (0, 10, 2)
# train_ppo_ray.py line 384 choices
ADVANTAGE_ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo")
# every estimator but gae sets critic_pretrain = None (train_ppo_ray.py, argument checks)
CRITIC_FREE = ("reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo")


@dataclass(frozen=True)
class OpenRlhfDefaults:
    """One release's defaults (the module docstring gives each one's line)."""

    release: str
    zero_stage: int = 2
    gradient_checkpointing: bool = False
    bf16: bool = False
    adam_offload: bool = False
    attn_implementation: str = "flash_attention_2"
    deepspeed_enable_sleep: bool = False
    packing_samples: bool = False
    colocate_actor_ref: bool = False
    colocate_critic_reward: bool = False
    colocate_all_models: bool = False
    ref_reward_offload: bool = False
    init_kl_coef: float = 0.01
    vllm_num_engines: int | None = None
    vllm_tensor_parallel_size: int = 1
    enforce_eager: bool = False
    vllm_enable_sleep: bool = False
    vllm_gpu_memory_utilization: float = 0.95
    micro_rollout_batch_size: int = 8
    prompt_max_len: int = 1024
    generate_max_len: int = 1024
    micro_train_batch_size: int = 4
    n_samples_per_prompt: int = 1
    advantage_estimator: str = "gae"
    # LLMRayActor.sleep(self, level=1)
    sleep_level: int = 1


_ROWS = {"0.8.11": OpenRlhfDefaults("0.8.11")}


def openrlhf_defaults(release: str | None) -> OpenRlhfDefaults:
    """The row of ``release`` (one of ``READ_AT``), or of ``DEFAULT_OPENRLHF_RELEASE`` when None."""
    return _ROWS[release or DEFAULT_OPENRLHF_RELEASE]
