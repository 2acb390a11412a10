"""The colocated vLLM rollout engine of GRPO (``train.objective: grpo``, ``rl.rollout.colocate: true``).

TRL v1.9.0 ``trl/generation/vllm_generation.py`` ``VLLMGeneration`` builds, in colocate mode, inside every
training process::

    LLM(model=model.name_or_path, tensor_parallel_size=vllm_tensor_parallel_size (1),
        gpu_memory_utilization=vllm_gpu_memory_utilization (0.3), max_model_len=vllm_max_model_length (None:
        the model's), max_num_seqs=per_device_train_batch_size * vllm_tensor_parallel_size *
        steps_per_generation, enable_sleep_mode=vllm_enable_sleep_mode, max_num_batched_tokens=4096,
        distributed_executor_backend="external_launcher")

so its start-up is vLLM's, as ``serve/vllm.py`` ``decide`` models it for those settings: weights, the
profile run's peak, the non-torch increase and the KV cache fill ``gpu_memory_utilization x total``; CUDA
graphs are captured after the KV cache (no ``enforce_eager``).  Only the releases whose budget rule is
``profiled_increase`` (vLLM >= 0.9.1, V0 0.6.5-0.7.3; ``facts/vllm_releases.py``) are modelled: they
charge the budget with what the engine itself adds after its first snapshot, so the trainer's tensors
already on the GPU are not taken from it; they must leave ``gpu_memory_utilization x total`` free, or
``init_device`` refuses to start ("Free memory on device ... is less than desired GPU memory
utilization").  The older rules count the whole device's usage and are refused.

The engine loads the checkpoint as stored: a pre-quantized policy (``quantization_config``: fp8, MXFP4, AWQ, ...)
keeps its format in vLLM although the trainer holds it dequantized (spec/load.py ``checkpoint_quantization_for``,
as for ``task: serve``); a format ``task: serve`` cannot estimate is refused.

Between rollouts (TRL: after ``llm.generate``) the engine keeps, without sleep mode, its weights, KV
cache, CUDA graphs and non-torch memory; the profile-sized activation blocks are cached by the shared
caching allocator and reused by the training step.  With sleep mode (``vllm_enable_sleep_mode``) TRL calls
``llm.sleep(level=2)``: weights and KV cache are freed (level 1 would offload the weights to host memory);
the CUDA graphs and non-torch memory stay (vLLM ``CuMemAllocator`` manages only the tagged weights and
KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.vllm_releases import V0_ENGINE_STANDIN
from vramplan.serve.vllm import VllmDecision, behaviour, decide, engine_choice
from vramplan.spec.load import Resolved, checkpoint_quantization_for
from vramplan.spec.scenario import Hardware, Scenario, Serve
from vramplan.units import GiB

__all__ = ["TRL_MAX_NUM_BATCHED_TOKENS", "RolloutMemory", "rollout_memory", "rollout_scenario"]

# VLLMGeneration: LLM(max_num_batched_tokens=4096) ("Latest vLLM v1 memory profiler is misled by the high
# default value")
TRL_MAX_NUM_BATCHED_TOKENS = 4096


def rollout_scenario(s: Scenario) -> Scenario:
    """The engine TRL builds, as a one-GPU ``task: serve`` scenario of the same model and GPU."""
    ro = s.rl.rollout
    # GRPOConfig.__post_init__: steps_per_generation defaults to gradient_accumulation_steps
    seqs = s.train.micro_batch_size * 1 * s.train.grad_accum_steps
    hw = s.hardware
    return Scenario(
        model=s.model, task="serve",
        hardware=Hardware(gpu=hw.gpu, capacity_gib=hw.capacity_gib, cuda_module_loading=hw.cuda_module_loading,
                          memory_in_use_gib=hw.memory_in_use_gib),
        # the engine in bf16, as the report says (docs/rl.md, Assumed)
        serve=Serve(dtype="bf16", gpu_memory_utilization=ro.gpu_memory_utilization, max_num_seqs=seqs,
                    max_num_batched_tokens=TRL_MAX_NUM_BATCHED_TOKENS, vllm_version=ro.vllm_version),
        software=s.software,
    )


@dataclass(frozen=True)
class RolloutMemory:
    """The colocated engine's bytes on one GPU, by phase, and whether it starts beside the trainer."""

    decision: VllmDecision
    weights: int
    kv_cache: int
    activations: int  # the profiled forward/sampler peak, reached while generating
    other: int  # CUDA graphs and non-torch memory, kept while asleep
    sleep_level: int
    starts: bool
    problem: str = ""
    assumptions: list[str] = field(default_factory=list)

    @property
    def generating_bytes(self) -> int:
        """Everything the engine holds while it generates."""
        return self.weights + self.kv_cache + self.activations + self.other

    @property
    def training_bytes(self) -> dict[str, int]:
        """What stays on the GPU during the training step, by part (weights, kv_cache, other)."""
        if self.sleep_level:
            return {"weights": 0, "kv_cache": 0, "other": self.other}
        return {"weights": self.weights, "kv_cache": self.kv_cache, "other": self.other}

    @property
    def host_bytes(self) -> int:
        """Host RAM of the weights offloaded by sleep level 1."""
        return self.weights if self.sleep_level == 1 else 0


def _refuse(where: str, message: str, fix: str) -> ScenarioError:
    return ScenarioError([Problem(where, message, fix)])


def rollout_memory(r: Resolved, trainer_bytes_at_start: int, context_bytes: int, method: str = "GRPO",
                   built: tuple[Scenario, int, str] | None = None, usage: str = "serve") -> RolloutMemory:
    """The colocated engine of the GRPO scenario ``r`` (its policy scenario), started when the trainer holds
    ``trainer_bytes_at_start`` on the GPU beside the CUDA context (``context_bytes``, shared by the process); ``method``
    names the trainer (GRPO, or RLOO: TRL v1.16.0's RLOOTrainer builds the same VLLMGeneration).

    ``built``: another trainer's engine (verl's ``vLLMRollout``, analytic/verl.py) as its serve scenario, its sleep
    level between rollouts and the sentence that says who built it with which settings; null: TRL's.  ``usage``:
    whose batch defaults vLLM applies where the builder passes none (serve/vllm.py ``default_batch_limits``):
    ``vllm serve``'s, or, with any other word, the offline ``LLM`` class's (OpenRLHF passes neither limit)."""
    ro = r.scenario.rl.rollout
    rs, sleep = (rollout_scenario(r.scenario), ro.sleep_mode) if built is None else built[:2]
    # the engine reads the checkpoint's quantization_config (vLLM ModelConfig ``_verify_quantization``) whatever the
    # trainer made of it (an fp8 or MXFP4 policy is trained dequantized): it holds the weights as stored
    rs, stored, problems = checkpoint_quantization_for(rs, r.model)
    if problems:
        raise ScenarioError([Problem(p.where, f"the colocated vLLM engine loads the checkpoint as stored: {p.message}",
                                     f"{p.hint}; or use rl.rollout.colocate: false") for p in problems])
    # the budget rule of the engine that runs: a V1 release of 0.8.0-0.10.1 that falls back to V0 (a GPU before
    # compute capability 8.0, an fp8 KV cache ...: serve/vllm.py engine_choice) sizes its pool by V0's rule
    engine, _ = engine_choice(Resolved(rs, r.model, r.gpu, ()), ro.vllm_version)
    release_row = behaviour(ro.vllm_version).rules
    row = behaviour(V0_ENGINE_STANDIN).rules if engine == "v0" and release_row.engine == "v1" else release_row
    # verl's engine on a V1 release before 0.9.1 (verl v0.4.1 / v0.5.0 pin vllm<=0.8.5): its budget rule charges
    # torch's allocated peak and every non-torch byte, so the trainer's tensors in the same process come out of
    # gpu_memory_utilization x total, as another process's would (serve/vllm.py _charged): counted as such
    charges_trainer = built is not None and row.budget == "peak_plus_non_torch"
    if row.budget != "profiled_increase" and not charges_trainer:
        raise _refuse("rl.rollout.vllm_version", f"vLLM {ro.vllm_version} charges gpu_memory_utilization with "
                      f"the whole device's usage ({row.budget.replace('_', ' ')} rule): a colocated engine beside "
                      "the trainer's tensors is not modelled for it", "use rl.rollout.vllm_version >= 0.9.1")
    gpu = r.gpu
    if charges_trainer:
        gpu = replace(gpu, total_memory_bytes=gpu.total_memory_bytes - trainer_bytes_at_start,
                      in_use_by_others_bytes=gpu.in_use_by_others_bytes + trainer_bytes_at_start)
    d = decide(Resolved(rs, r.model, gpu, ()), ro.vllm_version, usage=usage)
    total, requested = d.total_memory_bytes, d.requested_bytes
    # under charges_trainer the trainer's bytes are in d.in_use_by_others_bytes (and decide's own start check)
    free = total - context_bytes - (0 if charges_trainer else trainer_bytes_at_start) - d.in_use_by_others_bytes
    problem = d.problem
    if free < requested:
        problem = (f"Free memory on device ({free / GiB:.2f}/{total / GiB:.2f} GiB) on startup is less than desired "
                   f"GPU memory utilization ({d.gpu_memory_utilization}, {requested / GiB:.2f} GiB): the trainer "
                   f"already holds {trainer_bytes_at_start / GiB:.2f} GiB when "
                   f"{method + 'Trainer' if built is None else method} starts vLLM")
    trl_settings = (f"max_num_seqs {d.max_num_seqs}, max_num_batched_tokens {d.max_num_batched_tokens}, max_model_len "
                    f"{d.max_model_len} (the model's: TRL's vllm_max_model_length default), dtype bf16 assumed")
    builders = {"verl": "verl vLLMRollout", "OpenRLHF": "OpenRLHF LLMRayActor"}
    builder, settings = ("TRL VLLMGeneration", trl_settings) if built is None else (builders[method], built[2])
    notes = [
        (f"{method} rollout: vLLM {d.version} colocated ({builder}): gpu_memory_utilization "
         f"{d.gpu_memory_utilization} of {total / GiB:.2f} GiB = {requested / GiB:.2f} GiB for weights "
         f"{d.weights_bytes / GiB:.2f} GiB, profile peak {d.activation_peak_bytes / GiB:.2f} GiB, non-torch "
         f"{d.non_torch_bytes / GiB:.2f} GiB and KV cache {d.kv_cache_bytes / GiB:.2f} GiB "
         f"({d.kv_cache_tokens:,} tokens); CUDA graphs {d.cudagraph_bytes / GiB:.2f} GiB outside it; {settings}"),
        {0: f"{method} rollout: no sleep mode: the engine's weights, KV cache, CUDA graphs and non-torch memory stay "
            "through the training step (its profile-sized activation blocks are reused by the trainer)",
         1: f"{method} rollout: sleep level 1 between rollouts: weights offloaded to host RAM, KV cache discarded; "
            "CUDA graphs and non-torch memory stay",
         2: f"{method} rollout: sleep level 2 between rollouts (TRL's llm.sleep(level=2)): weights and KV cache "
            "discarded; CUDA graphs and non-torch memory stay"}[sleep],
    ]
    notes += [f"{method} rollout engine: {n}" for n in stored]
    if problem:
        notes.append(f"{method} rollout: vLLM would not start: {problem}")
    return RolloutMemory(
        decision=d, weights=d.weights_bytes, kv_cache=d.kv_cache_bytes, activations=d.activation_peak_bytes,
        other=d.cudagraph_bytes + d.non_torch_bytes, sleep_level=sleep, starts=not problem,
        problem=problem, assumptions=notes + [f"{method} rollout engine: {a}" for a in d.assumptions],
    )
