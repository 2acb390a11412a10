"""verl's hybrid engine (``framework: verl``, ``train.objective: grpo``): what lives on each GPU in each phase.

Read at verl v0.4.1 and v0.5.0 (tags ``v0.4.1``, ``v0.5.0``; defaults in facts/verl.py): ``verl/workers/
fsdp_workers.py`` ``ActorRolloutRefWorker``, ``verl/workers/sharding_manager/fsdp_vllm.py``
``FSDPVLLMShardingManager``, ``verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py`` ``vLLMRollout``,
``verl/workers/actor/dp_actor.py`` ``DataParallelPPOActor``, ``verl/utils/torch_functional.py``.  One process per
GPU holds the actor, the reference and the vLLM engine; an iteration runs, in order:

* **weight sync** (``FSDPVLLMShardingManager.__enter__``): the actor's shards back on the GPU if offloaded;
  ``module.state_dict()`` under ``SHARDED_STATE_DICT`` (FSDP1 unshards each unit in fp32 and keeps a clone of
  this rank's chunk of every parameter: one more copy of the actor's fp32 shards, torch's
  ``_sharded_post_state_dict_hook`` / ``_create_chunk_dtensor`` / ``Shard._replicate_to_shard(clone=True)``;
  checked on two CPU ranks by benchmarks/check_fsdp_sharded_state_dict.py: fp32 shards with storage of their own),
  the root unit unsharded in fp32 meanwhile (``state_dict_bytes``); then the engine's weights woken
  (``wake_up(tags=["weights"])``) and ``update_params`` feeding vLLM's ``load_weights`` one ``param.full_tensor()``
  at a time (one full fp32 parameter gathered): the phase is the larger of the two moments;
* **rollout**: the KV cache woken, the engine generating (weights, KV cache, profile-sized activations), the actor's
  shards offloaded again when ``param_offload``; on exit ``sleep(level=1)`` (weights to host memory, KV cache
  freed);
* **scoring** (``compute_log_prob``): the actor's no-grad forwards of ``log_prob_micro_batch_size_per_gpu``
  sequences, log-probabilities and entropies (``calculate_entropy=True``);
* **reference scoring** (``compute_ref_log_prob``, when a KL term loads the reference): the reference's forwards,
  log-probabilities only; its FSDP1 shards live in host memory (``CPUOffload(offload_params=True)``, forced);
* **training step** (``update_actor``): the actor's FSDP step on ``ppo_micro_batch_size_per_gpu`` sequences, the
  optimizer's states loaded back when ``optimizer_offload``.

The actor step is the FSDP step vramplan computes for accelerate's FSDP1 (the same wrapper: fp32 flat shards,
``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``, ``FULL_SHARD``), with the loss of TRL v1.12.0's
PPOTrainer (analytic/ppo.py ``ppo_loss_tensors``): the same mechanism, the head on every position (no
``logits_to_keep``) in the compute dtype, ``logits[:, -R - 1:-1]`` sliced, one ``log_softmax`` per sequence kept for
the backward (``logprobs_from_logits_v2`` with half logits; flash-attn's ``cross_entropy_loss``, which verl
installs, keeps one copy of the sliced logits instead: the same bytes).  Where it differs: verl divides the whole logits by
the temperature in place (``logits.div_``) before slicing, so the backward's second logits-sized gradient is
``DivBackward``'s, not ``CopySlices``' clone: the same count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from vramplan.analytic.events import StepLayout
from vramplan.analytic.terms.context import StepContext
from vramplan.errors import Problem
from vramplan.facts.verl import VLLM_PIN, VerlDefaults, verl_defaults
from vramplan.facts.vllm_releases import parse_release, release_text
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Hardware, Parallel, Scenario, Serve

__all__ = ["VerlSetup", "log_prob_forward_bytes", "policy_scenario", "rollout_scenario", "state_dict_bytes", "sync_gather_bytes", "verl_assumptions",
           "verl_problems", "verl_setup"]


_T = TypeVar("_T", bool, float, int)


@dataclass(frozen=True)
class VerlSetup:
    """A verl scenario's settings with verl's defaults filled in (facts/verl.py)."""

    row: VerlDefaults
    param_offload: bool
    optimizer_offload: bool
    gpu_memory_utilization: float
    tensor_parallel: int
    free_cache_engine: bool
    enforce_eager: bool
    log_prob_micro_batch: int
    ref_log_prob_micro_batch: int
    prompt: int
    response: int
    reference: bool

    @property
    def sleep_level(self) -> int:
        """The engine's sleep level between rollouts: 1 (FSDPVLLMShardingManager.__exit__), 0 when v0.5.0's
        ``free_cache_engine`` is off."""
        return self.row.sleep_level if self.free_cache_engine or not self.row.reads_free_cache_engine else 0


def _pick(given: _T | None, default: _T) -> _T:
    return default if given is None else given


def verl_setup(s: Scenario) -> VerlSetup:
    """The settings verl runs ``s`` with (``log_prob_micro_batch_size_per_gpu`` null reads as 1 here, and the
    reference's null as the rollout's: ``verl_problems`` refuses both first)."""
    v, ro = s.rl.verl, s.rl.rollout
    row = verl_defaults(v.release)
    log_prob = v.log_prob_micro_batch_size_per_gpu or 1
    return VerlSetup(
        row=row,
        param_offload=_pick(v.param_offload, row.param_offload),
        optimizer_offload=_pick(v.optimizer_offload, row.optimizer_offload),
        gpu_memory_utilization=_pick(v.gpu_memory_utilization, row.gpu_memory_utilization),
        tensor_parallel=_pick(v.tensor_model_parallel_size, row.tensor_model_parallel_size),
        free_cache_engine=_pick(v.free_cache_engine, row.free_cache_engine),
        enforce_eager=_pick(v.enforce_eager, row.enforce_eager),
        log_prob_micro_batch=log_prob,
        ref_log_prob_micro_batch=v.ref_log_prob_micro_batch_size_per_gpu or log_prob,
        prompt=ro.max_prompt_len,
        response=ro.max_completion_len or row.max_response_length,
        reference=s.rl.reference_model == "separate",
    )


def policy_scenario(s: Scenario) -> Scenario:
    """The actor's update as a step vramplan computes: accelerate's FSDP1 ``full_shard`` over every GPU (verl's
    ``fsdp_size: -1``), PPO's loss over ``max_prompt_len + response`` tokens, gradient checkpointing as
    ``enable_gradient_checkpointing`` (null: full)."""
    v = verl_setup(s)
    t = s.train
    ckpt = t.gradient_checkpointing or ("full" if v.row.enable_gradient_checkpointing else "none")
    train = t.model_copy(update={"objective": "ppo", "seq_len": v.prompt + v.response, "gradient_checkpointing": ckpt})
    rollout = s.rl.rollout.model_copy(update={"max_completion_len": v.response, "engine": "vllm"})
    fsdp = "full_shard" if s.hardware.num_gpus > 1 else "none"
    return s.model_copy(update={"framework": "accelerate", "train": train,
                                "parallel": s.parallel.model_copy(update={"fsdp": fsdp}),
                                "rl": s.rl.model_copy(update={"rollout": rollout})})


def rollout_scenario(s: Scenario) -> Scenario:
    """The engine ``vLLMRollout.__init__`` builds, as a ``task: serve`` scenario of the same model and GPU:
    ``LLM(tensor_parallel_size, dtype=bfloat16 (rollout.dtype), enforce_eager, gpu_memory_utilization,
    max_model_len = prompt_length + response_length, max_num_batched_tokens, enable_sleep_mode=True)``: no
    ``max_num_seqs`` (``vllm_rollout_spmd.py`` ``LLM(...)``, v0.4.1 line 149, v0.5.0 line 165, passes none; the
    config's ``rollout.max_num_seqs`` is not read there), so vLLM's default at ``rl.rollout.vllm_version`` on this GPU
    applies."""
    v, hw = verl_setup(s), s.hardware
    return Scenario(
        model=s.model, task="serve",
        hardware=Hardware(gpu=hw.gpu, capacity_gib=hw.capacity_gib, cuda_module_loading=hw.cuda_module_loading,
                          memory_in_use_gib=hw.memory_in_use_gib, num_gpus=v.tensor_parallel),
        serve=Serve(dtype="bf16", gpu_memory_utilization=v.gpu_memory_utilization, max_num_seqs=None,
                    max_num_batched_tokens=v.row.max_num_batched_tokens, max_model_len=v.prompt + v.response,
                    cuda_graphs=not v.enforce_eager, vllm_version=s.rl.rollout.vllm_version),
        parallel=Parallel(tp=v.tensor_parallel), software=s.software,
    )


def _schema_problems(s: Scenario) -> list[Problem]:
    """Keys of the scenario verl does not read, or reads under another name."""
    out: list[Problem] = []
    ro = s.rl.rollout
    if s.rl.beta is not None:
        out.append(Problem("rl.beta", "is not read under framework verl: its KL switch is actor.use_kl_loss / "
                           "algorithm.use_kl_in_reward, which loads the reference", "set rl.reference_model: "
                           "separate for a KL term, leave rl.beta out"))
    moved = {"gpu_memory_utilization": "rl.verl.gpu_memory_utilization", "sleep_mode": "rl.verl.free_cache_engine",
             "colocate": "(verl's hybrid engine always colocates)"}
    for key in changed_fields(ro, tuple(moved)):
        out.append(Problem(f"rl.rollout.{key}", f"is TRL's setting; under framework verl use {moved[key]}",
                           f"leave rl.rollout.{key} out"))
    if ro.engine == "hf-generate":
        out.append(Problem("rl.rollout.engine", "verl's FSDP workers generate with vLLM here (rollout.name: vllm); "
                           "hf-generate is not modelled under verl", "set rl.rollout.engine: vllm or leave it out"))
    if s.rl.reference_model == "shared":
        out.append(Problem("rl.reference_model", "shared is verl's LoRA reference (the actor with its adapters "
                           "disabled); LoRA under verl is not modelled", "use none or separate"))
    return out


def _setup_problems(s: Scenario) -> list[Problem]:
    """Setups verl runs that this estimate does not model: its own keys, then the actor's step."""
    out: list[Problem] = []
    v, t = s.rl.verl, s.train

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.objective != "grpo":
        no("train.objective", f"{t.objective} under framework verl is not modelled (GRPO's actor, reference and rollout "
           "are; PPO adds a critic worker)", "use train.objective: grpo")
    if v.log_prob_micro_batch_size_per_gpu is None and not v.use_dynamic_bsz:
        no("rl.verl.log_prob_micro_batch_size_per_gpu", "is required: verl refuses to start without it when dynamic "
           "batching is off ('Please set at least one of actor_rollout_ref.rollout.log_prob_micro_batch_size or "
           "..._per_gpu', ray_trainer.py check_mutually_exclusive)", "set it, e.g. to train.micro_batch_size")
    if (s.rl.reference_model == "separate" and v.ref_log_prob_micro_batch_size_per_gpu is None
            and not v.use_dynamic_bsz):
        # with a reference policy (use_kl_loss / use_kl_in_reward) RayPPOTrainer._validate_config checks the ref
        # section too, and ref.log_prob_micro_batch_size_per_gpu is null in verl's config (v0.4.1 ray_trainer.py
        # lines 408-410, ppo_trainer.yaml line 352; v0.5.0 ray_trainer.py lines 467-469, ref/ref.yaml line 13)
        no("rl.verl.ref_log_prob_micro_batch_size_per_gpu", "is required with the reference loaded: verl refuses to "
           "start without it when dynamic batching is off ('Please set at least one of actor_rollout_ref.ref."
           "log_prob_micro_batch_size or ..._per_gpu', ray_trainer.py check_mutually_exclusive)",
           "set it, e.g. to rl.verl.log_prob_micro_batch_size_per_gpu")
    strategy_why = {"fsdp2": "FSDP2 (fully_shard: per-parameter DTensor shards; the reference offloaded only with "
                    "ref.fsdp_config.param_offload, CPUOffloadPolicy) is not modelled",
                    "megatron": "verl's Megatron backend (megatron_workers.py: Megatron-LM's distributed optimizer, "
                    "tensor and pipeline parallel actor, its own weight resharding to the engine) is not modelled"}
    if v.strategy in strategy_why:
        no("rl.verl.strategy", strategy_why[v.strategy], "use strategy: fsdp (verl's default)")
    if v.rollout_name in ("sglang", "hf"):
        no("rl.verl.rollout_name", {"sglang": "the SGLang rollout (fsdp_sglang.py; mem_fraction_static is a share of "
                                    "the memory free when it starts) is not modelled",
                                    "hf": "the Hugging Face generate rollout (hf_rollout.py) under verl is not "
                                    "modelled"}[v.rollout_name], "use rollout_name: vllm (verl's default)")
    if v.use_dynamic_bsz:
        no("rl.verl.use_dynamic_bsz", "dynamic batching (micro-batches packed to ppo_max_token_len_per_gpu) is not "
           "modelled", "set it false and give the micro-batch sizes")
    if v.use_remove_padding:
        no("rl.verl.use_remove_padding", "the unpadded forward (flash-attn varlen, logits over every unpadded "
           "token, and the old log-probs' entropies over every token, by a torch.compile'd entropy_from_logits at "
           "v0.5.0 whose temporaries are not known) is not modelled", "leave it out (verl's default false)")
    if v.entropy_coeff:
        no("rl.verl.entropy_coeff", "a non-zero entropy bonus (entropy in the update's graph) is not modelled",
           "leave it out (verl's default 0)")
    setup = verl_setup(s)
    if setup.free_cache_engine and not setup.enforce_eager:
        no("rl.verl.enforce_eager", "is false with free_cache_engine on, which verl refuses (vLLMRollout: 'disable "
           "CUDA graph (enforce_eager = False) if free cache engine')", "set enforce_eager: true")
    if not setup.free_cache_engine and not setup.row.reads_free_cache_engine:
        no("rl.verl.free_cache_engine", f"is false, but verl v{setup.row.release}'s sharding manager sleeps the engine "
           "whatever it says", "leave it out, or use release 0.5.0")
    if s.hardware.num_gpus % setup.tensor_parallel:
        no("rl.verl.tensor_model_parallel_size", f"{setup.tensor_parallel} does not divide the "
           f"{s.hardware.num_gpus} GPUs (vLLMRollout: tensor parallel size <= world size, one engine per group)",
           "use a divisor of hardware.num_gpus (1 for one GPU)")
    return out + _step_problems(s, setup)


def _step_problems(s: Scenario, setup: VerlSetup) -> list[Problem]:
    """The actor's step settings this estimate does not model under verl."""
    out: list[Problem] = []
    t, par = s.train, s.parallel

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.peft is not None or t.quantization != "none":
        no("train.peft", "LoRA (and quantized bases) under verl are not modelled", "train the full model")
    if t.precision != "bf16-mixed" or t.optimizer not in ("adamw", "adamw-fused"):
        no("train.precision", "verl's actor is fp32 parameters under FSDP MixedPrecision(bf16) with torch AdamW: "
           "other precisions or optimizers are not modelled", "use precision bf16-mixed and optimizer adamw")
    if par.tp > 1 or par.pp > 1 or par.cp > 1 or par.zero_stage or par.fsdp not in ("none", "full_shard"):
        no("parallel", "verl's FSDP backend shards the actor over every GPU (FULL_SHARD); Ulysses sequence "
           "parallelism, the Megatron backend (tp, pp) and other sharding are not modelled",
           "leave parallel at its defaults (rl.verl.tensor_model_parallel_size sets the rollout's)")
    if par.offload != "none":
        no("parallel.offload", "verl offloads with its own keys", "use rl.verl.param_offload / optimizer_offload")
    if t.loss != "standard" or t.packing or s.lifecycle.evaluation:
        no("train", "a loss kernel (use_fused_kernels), packing or evaluation under verl is not modelled",
           "use train.loss standard, no packing, no evaluation")
    if changed_fields(t, ("seq_len",)) and t.seq_len != setup.prompt + setup.response:
        no("train.seq_len", f"is {t.seq_len}, but a verl sequence is max_prompt_len + max_completion_len = "
           f"{setup.prompt + setup.response} tokens", "leave train.seq_len out")
    return out


def verl_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (framework verl) cannot be estimated; empty: it can."""
    return _schema_problems(s) + _setup_problems(s)


def log_prob_forward_bytes(c: StepContext, lay: StepLayout, micro_batch: int, entropy: bool) -> int:
    """One no-grad log-prob forward's largest live tensors (``DataParallelPPOActor._forward_micro_batch``, padded
    path: ``use_remove_padding`` false) for ``micro_batch`` sequences of P + R tokens, V vocabulary, c compute bytes:

    * the logits over every position, ``L = b (P + R) V c`` (under ``torch.autocast(bfloat16)``; divided in place);
    * the log-probabilities of the response slice by flash-attn's ``cross_entropy_loss`` (flash-attn is in verl's
      ``requirements.txt`` and ``setup.py`` ``GPU_REQUIRES``, so ``logprobs_from_logits`` takes that path):
      ``reshape(-1, V)`` copies the non-contiguous slice, ``b R V c``, freed when it returns (no grad);
    * with ``entropy`` (the old log-probs): ``entropy_from_logits``: ``softmax``'s output and ``pd * logits`` alive
      together, ``2 b R V c`` (the log-probs' copy already freed);
    * or, if larger, one MLP's gate, up and product over ``b (P + R)`` tokens; plus the residual stream in and out
      of a layer (``2 b (P + R) H``, the residual dtype).

    Measured on an H100 (torch 2.11, benchmarks/gpu/verl_log_prob_head.py, the logits' tail alone, b = 2, P = R =
    512): 1,278,744,576 B with entropies against L + 2 b R V c = 1,244,659,712 (+2.7%); b = 4, P = 256, R = 768:
    3,112,716,288 against 3,111,649,280.  Without flash-attn (``logprobs_from_logits_v2``) the log-probs hold one
    row, ``R V c``, at a time (measured 778,438,656 against L + R V c = 777,912,320): below the count here.

    Worked example (Qwen2.5-0.5B: V = 151,936, H = 896, I = 4,864; b = 2, P = R = 512, bf16; the residual stream in
    bf16, FSDP's ``param_dtype``): L = 2 x 1,024 x 151,936 x 2 = 622,329,856; b R V c = 311,164,928; with entropy
    head = L + 2 x 311,164,928 = 1,244,659,712; MLP = 2,048 x 4,864 x 2 x 3 = 59,768,832; residual
    2 x 2,048 x 896 x 2 = 7,340,032: 1,251,999,744 B (without entropy: 622,329,856 + 311,164,928 + 7,340,032 =
    940,834,816 B).
    """
    s = c.s
    b, prompt, resp = micro_batch, s.rl.rollout.max_prompt_len, s.rl.rollout.max_completion_len or 0
    tokens = b * (prompt + resp)
    cb, vocab = lay.compute_bytes, c.m.vocab_size
    rows = b * resp * vocab * cb
    head = tokens * vocab * cb + (2 * rows if entropy else rows) if lay.has_head else 0
    mlp = tokens * lay.inter * cb * (3 if lay.gated else 2)
    return 2 * tokens * lay.hidden * lay.residual_bytes + max(head, mlp)


def sync_gather_bytes(c: StepContext) -> int:
    """The largest parameter whole in fp32: gathered by ``param.full_tensor()`` during ``update_params``, and cloned
    whole by the state dict's ``_create_chunk_dtensor``: the embedding (or the LM head), ``V H x 4`` bytes, or the
    largest linear weight (``RankParams.largest_linear``), whichever is larger."""
    return 4 * max(c.m.vocab_size * c.m.hidden_size, c.rp.largest_linear)


def state_dict_bytes(c: StepContext) -> int:
    """``module.state_dict()``'s own transient under FSDP1's ``SHARDED_STATE_DICT`` (torch
    ``_sharded_pre_state_dict_hook`` unshards a unit in full precision until its post hook): the root unit (embedding,
    final norm, untied head: ``RankParams.outside_layers``) unsharded in fp32 through the whole traversal, and beside
    it the larger of one layer unit unsharded in fp32 with its largest parameter's full clone, and the root's own
    largest parameter's clone at its post hook (``sync_gather_bytes``).

    Worked example (Qwen2.5-0.5B, tied: outside the layers 151,936 x 896 + 896 = 136,135,552 parameters; largest
    layer 14,912,384 parameters, largest linear 4,864 x 896 = 4,358,144): root 544,542,208 B; a layer 59,649,536 +
    17,432,576 = 77,082,112 B < the embedding's clone 544,538,624 B: 1,089,080,832 B.
    """
    rp = c.rp
    layer = 4 * (max(rp.per_layer, default=0) + rp.largest_linear)
    return 4 * rp.outside_layers + max(layer, sync_gather_bytes(c))


def verl_assumptions(s: Scenario) -> list[str]:
    """What the verl estimate takes as given, for the report."""
    v = verl_setup(s)
    generations = []
    if parse_release(s.rl.rollout.vllm_version) > VLLM_PIN:
        generations.append(f"verl v{v.row.release}'s setup.py pins vllm<={release_text(VLLM_PIN)}; rl.rollout."
                           f"vllm_version {s.rl.rollout.vllm_version} is assumed installed against the pin (set "
                           f"{release_text(VLLM_PIN)} for verl's own: its budget charges the actor's shards on the GPU "
                           "when the engine starts)")
    if s.rl.rollout.num_generations is not None:
        generations.append(f"verl: rl.rollout.num_generations (rollout.n) {s.rl.rollout.num_generations} not read: "
                           "the engine's budget is gpu_memory_utilization's, and every scoring and update runs in "
                           "micro-batches")
    return generations + [
        (f"verl v{v.row.release} (FSDP backend, vLLM rollout; facts/verl.py): GRPO's actor update on "
         f"ppo_micro_batch_size_per_gpu = {s.train.micro_batch_size} sequences of {v.prompt} prompt + {v.response} "
         "response tokens as accelerate's FSDP1 full_shard step (fp32 shards, bf16 compute), the loss as TRL's "
         "PPOTrainer's (the head on every position, one log_softmax per sequence kept; verl's in-place division is "
         "on the whole logits: DivBackward instead of CopySlices, the same bytes)"),
        (f"verl: param_offload {v.param_offload}, optimizer_offload {v.optimizer_offload} (the shards / AdamW states "
         "in host memory outside the phases that load them back); the reference "
         + ("loaded (use_kl_loss or use_kl_in_reward): FSDP1 with CPUOffload(offload_params=True), its bf16 shards "
            "in host memory, one unit gathered at a time" if v.reference else
            "not loaded (use_kl_loss and use_kl_in_reward false, verl's defaults)")),
        (f"verl rollout: vLLM with gpu_memory_utilization {v.gpu_memory_utilization}, tensor_model_parallel_size "
         f"{v.tensor_parallel}, enforce_eager {v.enforce_eager}, max_model_len {v.prompt + v.response} (prompt + "
         f"response), max_num_seqs vLLM's default (rollout.max_num_seqs is not passed to LLM), "
         f"max_num_batched_tokens {v.row.max_num_batched_tokens}; "
         + (f"sleep level {v.sleep_level} between rollouts (weights to host memory, KV cache freed)" if v.sleep_level
            else "awake in every phase (free_cache_engine false)")),
        ("verl weight sync: the actor's fp32 shards and one more copy of them (SHARDED_STATE_DICT's clones), with the "
         "larger of the state dict's own transient (the root unit unsharded in fp32, a layer unit or a parameter's "
         "clone) and the engine's woken weights with one full fp32 parameter (full_tensor) at a time; layers assumed "
         "of equal size to their largest"),
        (f"verl scoring: old log-probs with entropies in micro-batches of {v.log_prob_micro_batch}"
         + (f", reference log-probs in micro-batches of {v.ref_log_prob_micro_batch}" if v.reference else "")
         + ", padded (use_remove_padding false): the logits over every position in the compute dtype"),
        ("verl: every sequence at the longest prompt and response; the reward function on the CPU; the job's load "
         "and checkpoint save phases are not modelled for verl"),
    ]
