"""OpenRLHF's Ray layout (``framework: openrlhf``; ``train.objective: grpo``, or ``ppo`` with a critic): what lives
on each actor GPU in each phase.

Read at OpenRLHF v0.8.11 (tag ``v0.8.11``; defaults in facts/openrlhf.py): ``openrlhf/cli/train_ppo_ray.py``
``train``, ``openrlhf/trainer/ray/ppo_actor.py`` ``PolicyModelActor`` / ``ActorPPOTrainer``,
``openrlhf/trainer/ray/launcher.py`` ``ReferenceModelActor``, ``openrlhf/trainer/ray/vllm_engine.py``,
``openrlhf/trainer/ppo_trainer.py``, ``openrlhf/trainer/ppo_utils/experience_maker.py``, ``openrlhf/models/actor.py``
and ``openrlhf/utils/deepspeed/``.  The actor, the reference and each vLLM engine are Ray actors, each its own
process (its own CUDA context).  An iteration runs, in order:

* **rollout** (``RemoteExperienceMaker``: the engines woken when ``vllm_enable_sleep``, ``generate``, asleep again at
  level 1): the engine's weights, KV cache and profiled activations on the GPUs it shares with the actor when
  ``colocate_all_models``, else on GPUs of its own;
* **scoring** (the actor's ``forward``: old log-probabilities of ``micro_rollout_batch_size`` sequences under
  ``torch.no_grad``; ``empty_cache`` after it when colocated);
* **reference scoring** (``ReferenceModelActor.forward``, the same ``Actor.forward``): the reference's log-probs;
* **training step** (``ppo_train``: ``reload_states`` first under ``deepspeed_enable_sleep``, the actor's DeepSpeed
  step on ``micro_train_batch_size`` sequences, ``offload_states`` after);
* **weight sync** (``_broadcast_to_vllm``: the engines woken whole, ``wake_up()``; each parameter gathered under
  ZeRO-3 (``GatheredParameters``, one at a time) and, colocated, cloned for its CUDA IPC handle
  (``weight = param.data.clone()``); broadcast over NCCL from rank 0 otherwise).

With ``advantage_estimator: gae`` (train.objective ppo) a critic (``openrlhf/trainer/ray/ppo_critic.py``
``CriticModelActor``) and, without ``--remote_rm_url``, a reward model (``launcher.py`` ``RewardModelActor``, under
every estimator) run as Ray actors too: both ``get_llm_for_sequence_regression`` (``openrlhf/models/model.py`` line
20: ``AutoModel``'s base and ``nn.Linear(hidden_size, 1, bias=False)``, lines 174 and 238, no LM head), the critic
a DeepSpeed training engine of its own (the actor's ``get_ds_train_config``, line 180; its own ``create_optimizer``,
line 196), the reward model an eval engine as the reference.  ``make_experience`` (``experience_maker.py`` lines
541-596) runs the reward model's forward, then the actor's, the critic's, the reference's, each synchronised with
an ``empty_cache`` when colocated; ``ppo_train`` (``ppo_trainer.py`` lines 119-152) fits the critic first (waited
for under ``colocate_all_models``, its states reloaded and offloaded around it under ``deepspeed_enable_sleep``),
then the actor.  With ``colocate_all_models`` both share the actor's GPUs; else their own (``colocate_critic_reward``:
the same ones), noted in the report.

The actor step is vramplan's DeepSpeed ZeRO step (framework deepspeed: bf16 half parameters, fp32 master and Adam
states, ``FusedAdam``, or ``DeepSpeedCPUAdam`` with ``offload_optimizer: cpu`` under ``adam_offload``) with the loss
of ``Actor.forward`` (``openrlhf_loss_tensors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from vramplan.analytic.logits import KernelLossTensors
from vramplan.analytic.ppo import value_params
from vramplan.errors import Problem
from vramplan.facts.openrlhf import CRITIC_FREE, VLLM_PIN, OpenRlhfDefaults, openrlhf_defaults
from vramplan.facts.vllm_releases import parse_release, release_text
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Hardware, Parallel, Scenario, Serve

if TYPE_CHECKING:  # analytic/terms/loss.py imports this module while the terms package loads
    from vramplan.analytic.events import StepLayout
    from vramplan.analytic.terms.context import StepContext

__all__ = ["OpenRlhfSetup", "critic_params", "eval_engine_bytes", "log_prob_forward_bytes", "marks_openrlhf_loss",
           "openrlhf_assumptions", "openrlhf_loss_tensors", "openrlhf_problems", "openrlhf_setup", "policy_scenario",
           "reference_bytes", "reward_bytes", "rollout_scenario", "sync_bytes", "value_forward_bytes"]

_T = TypeVar("_T", bool, float, int)


@dataclass(frozen=True)
class OpenRlhfSetup:
    """An OpenRLHF scenario's settings with OpenRLHF's defaults filled in (facts/openrlhf.py)."""

    row: OpenRlhfDefaults
    estimator: str
    zero_stage: int
    bf16: bool
    adam_offload: bool
    colocate_all: bool
    colocate_actor_ref: bool
    ref_offload: bool
    deepspeed_sleep: bool
    engines: int
    tensor_parallel: int
    gpu_memory_utilization: float
    vllm_sleep: bool
    enforce_eager: bool
    micro_train: int
    micro_rollout: int
    prompt: int
    response: int
    reference: bool
    packing: bool
    critic: bool
    reward: bool
    colocate_critic_reward: bool

    @property
    def sleep_level(self) -> int:
        """The engines' sleep level between generations: 1 (``LLMRayActor.sleep(level=1)``) with
        ``vllm_enable_sleep``, which OpenRLHF resets to false without ``colocate_all_models``; 0 awake."""
        return self.row.sleep_level if self.vllm_sleep and self.colocate_all else 0

    @property
    def ref_on_actor_gpu(self) -> bool:
        """The reference's process on the actor's GPUs: ``colocate_all_models`` or ``colocate_actor_ref`` share
        the actor's placement group (``train``: ``pg`` for both groups)."""
        return self.reference and (self.colocate_all or self.colocate_actor_ref)

    @property
    def critic_on_actor_gpu(self) -> bool:
        """The critic's process on the actor's GPUs: ``colocate_all_models`` keeps the actor's placement group for
        the critic and the reward model (``train``: ``pg = None`` only without it)."""
        return self.critic and self.colocate_all

    @property
    def reward_on_actor_gpu(self) -> bool:
        """The reward model's process on the actor's GPUs (``colocate_all_models``, as the critic's)."""
        return self.reward and self.colocate_all

    @property
    def states_offloaded(self) -> bool:
        """``offload_deepspeed_states`` moves the states outside the step: with ``deepspeed_enable_sleep`` and
        no ``adam_offload`` (it returns at once under ``adam_offload``)."""
        return self.deepspeed_sleep and not self.adam_offload


def _pick(given: _T | None, default: _T) -> _T:
    return default if given is None else given


def openrlhf_setup(s: Scenario) -> OpenRlhfSetup:
    """The settings OpenRLHF runs ``s`` with (``vllm_num_engines`` null reads as 0: ``openrlhf_problems`` refuses
    it first)."""
    o = s.rl.openrlhf
    row = openrlhf_defaults(o.release)
    return OpenRlhfSetup(
        row=row,
        estimator=o.advantage_estimator or "group_norm",
        zero_stage=_pick(o.zero_stage, row.zero_stage),
        bf16=_pick(o.bf16, row.bf16),
        adam_offload=_pick(o.adam_offload, row.adam_offload),
        colocate_all=_pick(o.colocate_all_models, row.colocate_all_models),
        colocate_actor_ref=_pick(o.colocate_actor_ref, row.colocate_actor_ref),
        ref_offload=_pick(o.ref_reward_offload, row.ref_reward_offload),
        deepspeed_sleep=_pick(o.deepspeed_enable_sleep, row.deepspeed_enable_sleep),
        engines=o.vllm_num_engines or 0,
        tensor_parallel=_pick(o.vllm_tensor_parallel_size, row.vllm_tensor_parallel_size),
        gpu_memory_utilization=_pick(o.vllm_gpu_memory_utilization, row.vllm_gpu_memory_utilization),
        vllm_sleep=_pick(o.vllm_enable_sleep, row.vllm_enable_sleep),
        enforce_eager=_pick(o.enforce_eager, row.enforce_eager),
        micro_train=_pick(o.micro_train_batch_size, row.micro_train_batch_size),
        micro_rollout=_pick(o.micro_rollout_batch_size, row.micro_rollout_batch_size),
        prompt=_pick(o.prompt_max_len, row.prompt_max_len),
        response=_pick(o.generate_max_len, row.generate_max_len),
        reference=s.rl.reference_model != "none",
        packing=_pick(o.packing_samples, row.packing_samples),
        # train_ppo_ray.py: critic_pretrain None for every estimator but gae (line 481)
        critic=(o.advantage_estimator or "group_norm") == "gae",
        # a RewardModelActor group unless --remote_rm_url (line 125)
        reward=s.rl.reward_model is not None,
        colocate_critic_reward=_pick(o.colocate_critic_reward, row.colocate_critic_reward),
    )


def policy_scenario(s: Scenario) -> Scenario:
    """The actor's update as a step vramplan computes: DeepSpeed ZeRO at ``zero_stage`` over every actor GPU
    (``get_train_ds_config``), Adam's states offloaded with ``adam_offload``, ``micro_train_batch_size`` sequences of
    ``prompt_max_len + generate_max_len`` tokens, flash attention (``attn_implementation`` flash_attention_2), the
    head on every position (objective ppo's layout; the loss is ``openrlhf_loss_tensors``), gradient
    checkpointing as ``--gradient_checkpointing`` (null: none)."""
    o = openrlhf_setup(s)
    t = s.train
    ckpt = t.gradient_checkpointing or ("full" if o.row.gradient_checkpointing else "none")
    train = t.model_copy(update={"objective": "ppo", "seq_len": o.prompt + o.response, "gradient_checkpointing": ckpt,
                                 "micro_batch_size": o.micro_train, "attention": "flash"})
    rollout = s.rl.rollout.model_copy(update={"max_prompt_len": o.prompt, "max_completion_len": o.response,
                                              "engine": "vllm"})
    # the release set marks the step's loss as OpenRLHF's (analytic/terms/loss.py kernel_loss_tensors)
    block = s.rl.openrlhf.model_copy(update={"release": o.row.release})
    par = s.parallel.model_copy(update={"zero_stage": o.zero_stage,
                                        "offload": "optimizer" if o.adam_offload else "none"})
    return s.model_copy(update={"framework": "deepspeed", "train": train, "parallel": par,
                                "rl": s.rl.model_copy(update={"rollout": rollout, "openrlhf": block})})


def marks_openrlhf_loss(s: Scenario) -> bool:
    """The step is ``policy_scenario``'s (framework deepspeed, objective ppo, ``rl.openrlhf.release`` set)."""
    return s.effective_framework == "deepspeed" and s.train.objective == "ppo" and s.rl.openrlhf.release is not None


def rollout_scenario(s: Scenario) -> Scenario:
    """One engine ``create_vllm_engines`` builds, as a ``task: serve`` scenario of the same model and GPU:
    ``LLM(tensor_parallel_size, enforce_eager, max_model_len = prompt_max_len + generate_max_len, dtype="bfloat16",
    gpu_memory_utilization, enable_sleep_mode)``: neither ``max_num_seqs`` nor ``max_num_batched_tokens`` passed, so
    vLLM's defaults at ``rl.rollout.vllm_version`` on this GPU apply."""
    o, hw = openrlhf_setup(s), s.hardware
    return Scenario(
        model=s.model, task="serve",
        hardware=Hardware(gpu=hw.gpu, capacity_gib=hw.capacity_gib, cuda_module_loading=hw.cuda_module_loading,
                          memory_in_use_gib=hw.memory_in_use_gib, num_gpus=o.tensor_parallel),
        serve=Serve(dtype="bf16", gpu_memory_utilization=o.gpu_memory_utilization, max_num_seqs=None,
                    max_num_batched_tokens=None, max_model_len=o.prompt + o.response,
                    cuda_graphs=not o.enforce_eager, vllm_version=s.rl.rollout.vllm_version),
        parallel=Parallel(tp=o.tensor_parallel), software=s.software,
    )


def _schema_problems(s: Scenario) -> list[Problem]:
    """Keys of the scenario OpenRLHF does not read, or reads under another name."""
    out: list[Problem] = []
    ro, t = s.rl.rollout, s.train
    if s.rl.beta is not None:
        out.append(Problem("rl.beta", "is not read under framework openrlhf: its KL switch is --init_kl_coef (above "
                           "0 builds the reference model)", "use rl.reference_model: separate (init_kl_coef > 0) or "
                           "none (0), leave rl.beta out"))
    moved = {"gpu_memory_utilization": "rl.openrlhf.vllm_gpu_memory_utilization",
             "sleep_mode": "rl.openrlhf.vllm_enable_sleep", "colocate": "rl.openrlhf.colocate_all_models",
             "max_prompt_len": "rl.openrlhf.prompt_max_len", "max_completion_len": "rl.openrlhf.generate_max_len"}
    for key in changed_fields(ro, tuple(moved)):
        out.append(Problem(f"rl.rollout.{key}", f"is TRL's setting; under framework openrlhf use {moved[key]}",
                           f"leave rl.rollout.{key} out"))
    sequence = "rl.openrlhf.prompt_max_len + generate_max_len"
    for key, where in (("micro_batch_size", "rl.openrlhf.micro_train_batch_size"), ("seq_len", sequence)):
        if changed_fields(t, (key,)):
            out.append(Problem(f"train.{key}", f"is not read under framework openrlhf: use {where}",
                               f"leave train.{key} out"))
    if ro.engine == "hf-generate":
        out.append(Problem("rl.rollout.engine", "OpenRLHF's generation without vLLM engines is not modelled",
                           "set rl.rollout.engine: vllm or leave it out"))
    if s.rl.reference_model == "shared":
        out.append(Problem("rl.reference_model", "shared is a LoRA reference; OpenRLHF builds a separate reference "
                           "model (init_kl_coef > 0) or none", "use none or separate"))
    return out


def _setup_problems(s: Scenario, o: OpenRlhfSetup) -> list[Problem]:
    """Setups OpenRLHF runs that this estimate does not model, and setups OpenRLHF refuses."""
    out: list[Problem] = []
    n = s.hardware.num_gpus

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if s.train.objective not in ("grpo", "ppo"):
        no("train.objective", f"{s.train.objective} under framework openrlhf is not modelled (train_ppo_ray.py: "
           "grpo, a critic-free advantage estimator, or ppo, gae with a critic, are)", "use train.objective: grpo or ppo")
    elif s.train.objective == "grpo" and o.estimator not in CRITIC_FREE:
        no("rl.openrlhf.advantage_estimator", "gae builds a critic model (CriticModelActor): PPO, not a critic-free "
           "estimator", "set train.objective: ppo, or use group_norm, dr_grpo, rloo, reinforce or reinforce_baseline")
    elif s.train.objective == "ppo" and o.estimator in CRITIC_FREE:
        no("rl.openrlhf.advantage_estimator", f"{o.estimator} builds no critic (train_ppo_ray.py sets critic_pretrain "
           "None): a critic-free estimator, not PPO with a critic", "set train.objective: grpo, or use gae")
    for key, given in (("reward_model", s.rl.reward_model), ("value_model", s.rl.value_model)):
        if given is not None and given != s.model:
            no(f"rl.{key}", f"is {given!r}: a {'critic' if key == 'value_model' else 'reward model'} of another "
               "architecture than the policy's is not modelled (get_llm_for_sequence_regression: that model's base "
               "and a value head)", f"leave rl.{key} out or set it to the policy's model {s.model!r}")
    if not o.bf16:
        no("rl.openrlhf.bf16", "is false (OpenRLHF's default): fp32 models (torch_dtype auto) and DeepSpeed without "
           "bf16 are not modelled", "set rl.openrlhf.bf16: true (--bf16)")
    if o.engines < 1:
        no("rl.openrlhf.vllm_num_engines", "is required: without vLLM engines (OpenRLHF's default None) the "
           "generation is not modelled", f"set it, e.g. to {max(1, n // o.tensor_parallel)}")
    elif o.colocate_all and o.engines * o.tensor_parallel != n:
        # train_ppo_ray.py train(): the assertion under colocate_all_models (not async_train)
        no("rl.openrlhf.vllm_num_engines", f"{o.engines} x vllm_tensor_parallel_size {o.tensor_parallel} must equal "
           f"the actor's {n} GPUs under colocate_all_models (OpenRLHF asserts 'actor_num_nodes * "
           "actor_num_gpus_per_node must be equal to vllm_num_engines * vllm_tensor_parallel_size')",
           f"set vllm_num_engines to {max(1, n // o.tensor_parallel)}")
    if o.packing:
        no("rl.openrlhf.packing_samples", "packed samples (flash-attn varlen over the unpadded tokens) are not "
           "modelled", "leave it out (OpenRLHF's default false)")
    if o.ref_offload and o.zero_stage != 3 and (o.reference or o.reward):
        no("rl.openrlhf.ref_reward_offload", "offloads the reference's and the reward model's parameters through "
           "ZeRO-3's offload_param; with zero_stage below 3 they are stage-0 engines, whose offload is not modelled",
           "use zero_stage 3 or leave ref_reward_offload out")
    if o.deepspeed_sleep and not o.colocate_all:
        no("rl.openrlhf.deepspeed_enable_sleep", "without colocate_all_models is not modelled (the option is meant "
           "for colocated models)", "set colocate_all_models: true or leave it out")
    return out + _step_problems(s)


def _step_problems(s: Scenario) -> list[Problem]:
    """The actor's step settings this estimate does not model under OpenRLHF."""
    out: list[Problem] = []
    t, par = s.train, s.parallel

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.peft is not None or t.quantization != "none":
        no("train.peft", "LoRA and 4-bit bases (--lora_rank, --load_in_4bit) under openrlhf are not modelled",
           "train the full model")
    if t.precision != "bf16-mixed" or t.optimizer not in ("adamw", "adamw-fused"):
        no("train.precision", "OpenRLHF's actor is DeepSpeed bf16 (half parameters, fp32 master) with FusedAdam or "
           "DeepSpeedCPUAdam: other precisions or optimizers are not modelled",
           "use precision bf16-mixed and optimizer adamw")
    if par.tp > 1 or par.pp > 1 or par.cp > 1 or par.zero_stage or par.fsdp != "none" or par.offload != "none":
        no("parallel", "OpenRLHF's actor is DeepSpeed ZeRO over every actor GPU with its own keys; ring attention "
           "(--ring_attn_size), DeepSpeed tensor parallel and other layouts are not modelled",
           "leave parallel at its defaults (rl.openrlhf.zero_stage, adam_offload set the actor's)")
    if t.loss != "standard" or t.packing or s.lifecycle.evaluation or t.attention != "sdpa":
        no("train", "a loss kernel (--use_liger_kernel), packing, evaluation or another attention under openrlhf is "
           "not modelled (flash_attention_2, OpenRLHF's default, is)", "leave train.loss, packing, attention and "
           "lifecycle.evaluation out")
    return out


def openrlhf_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (framework openrlhf) cannot be estimated; empty: it can."""
    return _schema_problems(s) + _setup_problems(s, openrlhf_setup(s))


def openrlhf_loss_tensors(micro_batch: int, tokens: int, vocab: int, logits_bytes: int) -> KernelLossTensors:
    """``Actor.forward`` in the update (v0.8.11 ``openrlhf/models/actor.py``): the head on every position
    (``L = b S V`` elements, S = prompt + response, in the compute dtype c), ``output["logits"].to(torch.float32)``
    (line 171: the fp32 copy, 4 L bytes, made while the half logits are alive, which are freed once the dict entry
    is replaced), then ``log_probs_from_logits``: flash-attn's ``cross_entropy_loss`` (flash-attn 2.8.3 in
    ``requirements.txt``) on ``logits.reshape(-1, V)`` (a view) saves the fp32 logits for its backward
    (``ctx.save_for_backward(logits, lse, labels)``) and returns per-token numbers.  ``ActorPPOTrainer.training_step``
    keeps ``output`` (so the fp32 logits) until it returns, after ``strategy.backward`` and ``optimizer_step``.
    Backward: ``cross_entropy_loss``'s ``inplace_backward=False`` writes the gradient into a new fp32 tensor
    (``dlogits = ... torch.empty_like(logits)``, flash-attn ``flash_attn/ops/triton/cross_entropy.py``
    ``CrossEntropyLoss.backward``, 4 L); ``ToCopyBackward`` then casts it to c (c L) while the held logits and the
    fp32 gradient are alive.  So saved = 4 L, forward_extra = c L, backward_extra = 4 L + c L; after the head's
    backward the 4 L held by ``output`` stay to the step's end (analytic/terms/loss.py ``kernel_loss``).

    Example (Qwen2.5-7B: V = 152,064; b = 1, S = 2,048, bf16): L = 311,427,072; saved 1,245,708,288 B; forward
    extra 622,854,144 B; backward extra 1,868,562,432 B."""
    logits = micro_batch * tokens * vocab
    return KernelLossTensors(saved=4 * logits, forward_extra=logits_bytes * logits,
                             backward_extra=(4 + logits_bytes) * logits)


def log_prob_forward_bytes(c: StepContext, lay: StepLayout, micro_batch: int, tokens: int) -> int:
    """One no-grad ``Actor.forward`` (the actor's old log-probs or the reference's) of ``micro_batch`` sequences of
    ``tokens`` (prompt + response) tokens, V vocabulary, c compute bytes: the half logits and their fp32 copy alive
    together (``L (c + 4)``; flash-attn's ``cross_entropy_loss`` forward writes only per-token numbers), or, if
    larger, one MLP's gate, up and product over ``b S`` tokens; plus the residual stream in and out of a layer
    (``2 b S H``, the residual dtype).

    Worked example (Qwen2.5-7B: V = 152,064, H = 3,584, I = 18,944; b = 8, S = 2,048, bf16): L = 2,491,416,576
    elements, head 6 L = 14,948,499,456 B; MLP 16,384 x 18,944 x 2 x 3 = 1,862,270,976; residual 2 x 16,384 x 3,584
    x 2 = 234,881,024: 15,183,380,480 B."""
    b = micro_batch * tokens
    cb = lay.compute_bytes
    head = b * c.m.vocab_size * (cb + 4) if lay.has_head else 0
    mlp = b * lay.inter * cb * (3 if lay.gated else 2)
    return 2 * b * lay.hidden * lay.residual_bytes + max(head, mlp)


def sync_bytes(c: StepContext, o: OpenRlhfSetup) -> int:
    """``_broadcast_to_vllm``'s transient on an actor GPU: the largest parameter whole in bf16 (the embedding or the
    LM head, ``V H``, or the largest linear), gathered under ZeRO-3 (``GatheredParameters``, one at a time) and,
    colocated (CUDA IPC), cloned (``param.data.clone()``): 2 copies at ZeRO-3 colocated, 1 at ZeRO-3 or colocated
    alone, 0 otherwise (below ZeRO-3 rank 0 broadcasts ``param.data`` itself)."""
    largest = 2 * max(c.m.vocab_size * c.m.hidden_size, c.rp.largest_linear)
    return largest * ((1 if o.zero_stage == 3 else 0) + (1 if o.colocate_all else 0))


def eval_engine_bytes(o: OpenRlhfSetup, params: int, gpus: int) -> int:
    """An eval engine's bf16 parameters resident on one of its GPUs (the reference's, the reward model's):
    ``get_ds_eval_config(offload=ref_reward_offload)`` is stage 3 when ``zero_stage`` is 3 (a shard, ``2 P / N``;
    nothing with ``ref_reward_offload``), else stage 0 (``2 P``)."""
    if o.zero_stage == 3:
        return 0 if o.ref_offload else 2 * params // gpus
    return 2 * params


def reference_bytes(c: StepContext, o: OpenRlhfSetup, gpus: int) -> int:
    """The reference's bf16 parameters resident on one of its GPUs (``eval_engine_bytes`` of the policy's P)."""
    return eval_engine_bytes(o, c.rp.total, gpus) if o.reference else 0


def critic_params(c: StepContext) -> int:
    """The critic's (and the reward model's) parameters: the policy's without an untied LM head, with the value head
    (``nn.Linear(hidden_size, 1, bias=False)``: H), analytic/ppo.py ``value_params``.

    Example (Llama-3-8B: 8,030,261,248 parameters, untied head 128,256 x 4,096 = 525,336,576, H = 4,096):
    7,504,928,768."""
    return value_params(c.rp.total, c.rp.lm_head, c.m.hidden_size)


def reward_bytes(c: StepContext, o: OpenRlhfSetup, gpus: int) -> int:
    """The reward model's bf16 parameters on one of its GPUs (``RewardModelActor``: an eval engine)."""
    return eval_engine_bytes(o, critic_params(c), gpus) if o.reward else 0


def value_forward_bytes(c: StepContext, lay: StepLayout, micro_batch: int, tokens: int, response: int) -> int:
    """One no-grad forward of the critic (``CriticModelActor.forward``) or the reward model (``RewardModelActor.
    forward``) on ``micro_batch`` sequences of ``tokens`` tokens: the residual stream in and out of a layer
    (``2 b S H``, the residual dtype) with, if larger, one MLP's tensors (``log_prob_forward_bytes`` without the
    LM head) or the value head's output (``b S`` in the compute dtype) with the critic's masked fp32 values
    (``values[:, -R:] * action_mask.float()``: the mask's fp32 copy and the product, ``2 x 4 b R``).

    Worked example (Llama-3-8B: H = 4,096, I = 14,336; b = 8, S = 2,048, bf16): MLP 16,384 x 14,336 x 2 x 3 =
    1,409,286,144; residual 2 x 16,384 x 4,096 x 2 = 268,435,456: 1,677,721,600 B."""
    b = micro_batch * tokens
    cb = lay.compute_bytes
    mlp = b * lay.inter * cb * (3 if lay.gated else 2)
    values = b * cb + 8 * micro_batch * response
    return 2 * b * lay.hidden * lay.residual_bytes + max(mlp, values)


def _critic_reward_assumptions(s: Scenario, o: OpenRlhfSetup) -> list[str]:
    """The critic's and the reward model's lines of the report."""
    out = []
    where = "on the actor's GPUs (colocate_all_models)" if o.colocate_all else (
        "on GPUs of their own, shared by the two (colocate_critic_reward; noted below)" if o.colocate_critic_reward
        and o.critic and o.reward else "on GPUs of its own (noted below)")
    stage = 3 if o.zero_stage == 3 else 0
    if o.reward:
        out.append(f"OpenRLHF: the reward model (--reward_pretrain {s.rl.reward_model}) {where}: the policy's "
                   f"architecture with a value head instead of the LM head, a DeepSpeed eval engine stage {stage}"
                   + (" with its parameters in host memory (ref_reward_offload)" if o.ref_offload and stage == 3
                      else "") + "; its forwards in micro-batches of micro_rollout_batch_size, padded")
    if o.critic:
        pretrain = s.rl.value_model or (s.rl.reward_model if o.reward else s.model)
        out.append(f"OpenRLHF: the critic (--critic_pretrain {pretrain}) {where}: the policy's architecture with a "
                   f"value head, its own DeepSpeed ZeRO-{o.zero_stage} training engine ("
                   + ("DeepSpeedCPUAdam, states in host memory" if o.adam_offload else "FusedAdam")
                   + f") on micro_train_batch_size = {o.micro_train} sequences, gradient checkpointing as the "
                   "actor's; its step is the actor's model's step (objective sft) with the parameters, fp32 master, "
                   "Adam states and gradient partitions scaled by the critic's parameters over the policy's, the LM "
                   "head's logits and loss left out (a value head: b S numbers), the gathered units (ZeRO-3) as the "
                   "policy's"
                   + ("; its states in host memory outside its update (deepspeed_enable_sleep)"
                      if o.states_offloaded else ""))
    if o.colocate_critic_reward and (o.colocate_all or not (o.critic and o.reward)):
        out.append("OpenRLHF: rl.openrlhf.colocate_critic_reward not read: it places a critic and a reward model "
                   "together on GPUs of their own (train_ppo_ray.py line 102), "
                   + ("which colocate_all_models already puts on the actor's" if o.colocate_all
                      else "and this job has not both"))
    return out


def openrlhf_assumptions(s: Scenario) -> list[str]:
    """What the OpenRLHF estimate takes as given, for the report."""
    o = openrlhf_setup(s)
    out = []
    if parse_release(s.rl.rollout.vllm_version) != VLLM_PIN:
        out.append(f"OpenRLHF v{o.row.release}'s setup.py installs vllm=={release_text(VLLM_PIN)}; rl.rollout."
                   f"vllm_version {s.rl.rollout.vllm_version} is assumed installed instead")
    if s.rl.rollout.num_generations is not None:
        out.append(f"OpenRLHF: rl.rollout.num_generations (--n_samples_per_prompt) {s.rl.rollout.num_generations} "
                   "not read: the engines' budget is gpu_memory_utilization's, and every scoring and update runs in "
                   "micro-batches")
    where = ("on the actor's GPUs (colocate_all_models)" if o.colocate_all else
             "on GPUs of their own (the report is an actor GPU's; the engines' GPUs are noted below)")
    ref = ("not built (init_kl_coef 0)" if not o.reference else
           ("on the actor's GPUs" if o.ref_on_actor_gpu else "on GPUs of its own (noted below)")
           + (f", DeepSpeed eval engine stage {3 if o.zero_stage == 3 else 0}"
              + (" (its shard only: ZeRO-3's persistent small parameters not counted)" if o.zero_stage == 3 else "")
              + (" with its parameters in host memory (ref_reward_offload)" if o.ref_offload else "")))
    out += _critic_reward_assumptions(s, o)
    return out + [
        (f"OpenRLHF v{o.row.release} (Ray, DeepSpeed, vLLM; facts/openrlhf.py), advantage_estimator {o.estimator} "
         f"({'a critic: below' if o.critic else 'no critic'}): the actor's update on micro_train_batch_size = {o.micro_train} sequences of {o.prompt} prompt "
         f"+ {o.response} response tokens as DeepSpeed ZeRO-{o.zero_stage} (bf16, fp32 master, "
         + ("DeepSpeedCPUAdam with its states in host memory" if o.adam_offload else "FusedAdam")
         + "), flash_attention_2; the loss as Actor.forward: the logits over every position in bf16, their fp32 "
         "copy saved by flash-attn's cross_entropy_loss and held by training_step's output to the step's end, a fresh "
         "fp32 gradient and its bf16 cast in its backward; no entropy "
         "(entropy_loss_coef None)"),
        (f"OpenRLHF: vLLM engines {o.engines} x tensor parallel {o.tensor_parallel} {where}, "
         f"gpu_memory_utilization {o.gpu_memory_utilization}, enforce_eager {o.enforce_eager}, max_model_len "
         f"{o.prompt + o.response}, max_num_seqs and max_num_batched_tokens vLLM's defaults (not passed); "
         + (f"sleep level {o.sleep_level} outside the generation and the weight sync" if o.sleep_level
            else "awake in every phase")
         + "; the engines assumed started before the actor and the reference load"),
        f"OpenRLHF: the reference model {ref}",
        ("OpenRLHF: " + ("deepspeed_enable_sleep: the actor's Adam states, fp32 master and gradient buffers in host "
                         "memory outside the training step" if o.states_offloaded else
                         "the actor's states on the GPU in every phase")),
        (f"OpenRLHF scoring: the actor's and the reference's log-probs in micro-batches of {o.micro_rollout}, padded: "
         "the half logits over every position with their fp32 copy"),
        ("OpenRLHF: one CUDA context per process on a GPU (actor, reference, vLLM engine"
         + (", critic" if o.critic_on_actor_gpu else "") + (", reward model" if o.reward_on_actor_gpu else "")
         + "); the reference's and the "
         "engines' NCCL buffers, the weight-sync group's on rank 0 (NCCL broadcast when not colocated), "
         + ("the critic's NCCL buffers, " if o.critic else "")
         + ("the reward model's NCCL buffers, " if o.reward else
            "the reward (assumed from a remote reward function, --remote_rm_url: no reward model on the GPUs), ")
         + "the Ray object store and the job's load and checkpoint phases are not modelled; every "
         "sequence at the longest prompt and response"),
    ]
