"""GRPO post-training (``train.objective: grpo``): TRL's ``GRPOTrainer`` as of TRL v1.9.0, the policy side.

Read in TRL v1.9.0 (tag ``v1.9.0``, commit 35def3ee): ``trl/trainer/grpo_config.py`` ``GRPOConfig``,
``trl/trainer/grpo_trainer.py`` ``GRPOTrainer``, ``trl/trainer/utils.py`` ``selective_log_softmax`` and
``entropy_from_logits``, ``trl/generation/vllm_generation.py`` ``VLLMGeneration``.  What this module gives:

* the policy step's scenario (``policy_scenario``): sequences of ``max_prompt_len + max_completion_len``
  tokens (prompt and completion concatenated, ``prompt_completion_ids``); ``train.micro_batch_size`` is
  ``per_device_train_batch_size``, counted in completions; gradient checkpointing on unless the scenario
  says otherwise (``GRPOConfig``: "``gradient_checkpointing``: Defaults to ``True``");
* the reference model (``reference_kind``): ``GRPOTrainer.__init__`` loads none when ``beta == 0.0``
  (TRL's default since 0.19), uses the policy with its adapters disabled under PEFT (no second copy), and
  otherwise loads a second copy with the policy's ``model_init_kwargs`` (``create_model_from_path``): the
  same dtype as the policy's parameters (fp32 unless ``dtype`` is given);
* the loss's tensors (``grpo_loss_tensors``): ``_compute_loss`` calls ``_get_per_token_logps_and_entropies``
  with ``logits_to_keep = completion length``, so the head runs on the last ``C + 1`` positions only;
* what the estimate refuses (``grpo_problems``).

The rollout engine's memory (vLLM, colocated) is ``serve/rollout.py``; ``engine.py`` composes both.
"""

from __future__ import annotations

from typing import Literal

from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.spec.scenario import Scenario

__all__ = ["ENTROPY_CHUNK_ROWS", "TRL_RELEASE", "grpo_assumptions", "grpo_loss_tensors", "grpo_problems",
           "policy_scenario", "reference_kind", "sequence_len", "trainer_problems"]

TRL_RELEASE = "1.9.0"
# trl/trainer/utils.py entropy_from_logits(logits, chunk_size=128): rows of the flattened logits per chunk
ENTROPY_CHUNK_ROWS = 128

RefKind = Literal["none", "shared", "separate"]


def sequence_len(s: Scenario) -> int:
    """Tokens of one policy sequence: the prompt (left-padded to the longest) and the completion."""
    ro = s.rl.rollout
    return ro.max_prompt_len + ro.max_completion_len


def policy_scenario(s: Scenario) -> Scenario:
    """The training step TRL runs: ``seq_len`` = prompt + completion, checkpointing on by TRL's default."""
    update: dict[str, object] = {"seq_len": sequence_len(s)}
    if "gradient_checkpointing" not in s.train.model_fields_set:
        update["gradient_checkpointing"] = "full"
    return s.model_copy(update={"train": s.train.model_copy(update=update)})


def reference_kind(s: Scenario) -> RefKind:
    """TRL's rule (``GRPOTrainer.__init__``), or the scenario's ``rl.reference_model`` when given."""
    if s.rl.reference_model is not None:
        return s.rl.reference_model
    if s.rl.beta == 0.0:
        return "none"
    return "shared" if s.train.peft is not None else "separate"


def _reference_problems(s: Scenario) -> list[Problem]:
    ref, beta, peft = s.rl.reference_model, s.rl.beta, s.train.peft is not None
    if ref is None:
        return []
    trl = "none" if beta == 0.0 else "shared" if peft else "separate"
    if ref == trl:
        return []
    why = {"none": "with beta 0 TRL loads no reference model",
           "shared": "under PEFT TRL computes the reference with the adapters disabled",
           "separate": "without PEFT and with beta != 0 TRL loads a second copy of the model"}[trl]
    return [Problem("rl.reference_model", f"is {ref!r}, but {why} (GRPOTrainer.__init__, TRL v{TRL_RELEASE})",
                    f"set rl.reference_model: {trl} or leave it out")]


def trainer_problems(s: Scenario, method: str, sharded: str, parallel_also: str = "") -> list[Problem]:
    """What TRL's trainers (``GRPOTrainer``, ``DPOTrainer``: subclasses of the HF Trainer) share and this estimate
    does not model: another framework, sharded parameters (``sharded`` says what sharding would add) and tensor,
    pipeline or context parallelism; each refused with what to change."""
    par = s.parallel
    out: list[Problem] = []
    if s.effective_framework not in ("hf-trainer", "accelerate", "deepspeed"):
        out.append(Problem("framework", f"{method} runs on TRL's {method}Trainer (the HF Trainer), not "
                           f"{s.effective_framework}", "use framework: hf-trainer (or deepspeed for ZeRO-1/2)"))
    if par.zero_stage == 3 or par.fsdp not in ("none", "no_shard"):
        out.append(Problem("parallel", f"sharded parameters (ZeRO-3, FSDP) under {method} are not modelled: {sharded}",
                           "use ZeRO-1/2 or DDP"))
    if par.tp > 1 or par.pp > 1 or par.cp > 1:
        out.append(Problem("parallel", f"tensor, pipeline or context parallelism under {method}{parallel_also} is "
                           "not modelled", "use data parallelism only (tp = pp = cp = 1)"))
    return out


_UNMODELLED_OBJECTIVES = ("ppo", "rloo")


def _setup_problems(s: Scenario) -> list[Problem]:
    """Combinations GRPO runs but this estimate does not model, each refused with what to change."""
    t, ro = s.train, s.rl.rollout
    out: list[Problem] = []

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if s.rl.precompute_ref_log_probs:
        no("rl.precompute_ref_log_probs", "is a DPO setting (DPOConfig); GRPOTrainer has none",
           "set rl.precompute_ref_log_probs: false")
    if ro.engine != "vllm":
        no("rl.rollout.engine", "hf-generate rollouts (model.generate inside the trainer) are not modelled",
           "use rl.rollout.engine: vllm")
    out += trainer_problems(s, "GRPO", "the reference model's shards and the gather of the full weights for each "
                            "vLLM weight sync", " (and vllm_tensor_parallel_size)")
    if t.loss != "standard":
        no("train.loss", f"{t.loss} under GRPO is not modelled (TRL's use_liger_kernel runs Liger's "
           "LigerFusedLinearGRPOLoss, another kernel)", "use train.loss: standard")
    if t.packing:
        no("train.packing", "GRPO pads prompts and completions; packing is not modelled", "set train.packing: false")
    if s.lifecycle.evaluation:
        no("lifecycle.evaluation", "GRPO's evaluation (generation through the rollout engine) is not modelled",
           "set lifecycle.evaluation: false")
    if ro.colocate and t.quantization != "none":
        no("train.quantization", "a colocated vLLM engine over a bitsandbytes policy (vLLM's in-flight "
           "bitsandbytes loading) is not modelled", "use rl.rollout.colocate: false or an unquantized base")
    if "seq_len" in t.model_fields_set and t.seq_len != sequence_len(s):
        no("train.seq_len", f"is {t.seq_len}, but a GRPO sequence is rl.rollout.max_prompt_len + "
           f"max_completion_len = {sequence_len(s)} tokens", "leave train.seq_len out")
    batch = t.micro_batch_size * s.data_parallel_degree * t.grad_accum_steps
    if batch % ro.num_generations:
        # GRPOConfig.__post_init__: generation_batch_size = per_device_train_batch_size x num_processes x
        # steps_per_generation (gradient_accumulation_steps by default) must be divisible by num_generations
        no("rl.rollout.num_generations", f"the generation batch (micro_batch_size x data-parallel ranks x "
           f"grad_accum_steps = {batch}) is not divisible by num_generations = {ro.num_generations} "
           f"(GRPOConfig.__post_init__, TRL v{TRL_RELEASE})", "make the batch a multiple of num_generations")
    return out


def grpo_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (a training scenario with a post-training objective) cannot be estimated; empty: it can."""
    if s.train.objective in _UNMODELLED_OBJECTIVES:
        return [Problem("train.objective", f"{s.train.objective} is not modelled yet (only grpo, TRL's "
                        "GRPOTrainer with a vLLM rollout engine, dpo, kto and orpo, TRL's DPOTrainer, "
                        "KTOTrainer and ORPOTrainer)", "use train.objective: sft, dpo, kto, orpo or grpo")]
    return _setup_problems(s) + _reference_problems(s)


def grpo_loss_tensors(micro_batch: int, completion: int, vocab: int, logits_bytes: int) -> KernelLossTensors:
    """The GRPO loss's tensors for ``micro_batch`` completions of ``completion`` tokens (``vocab`` on this rank,
    the logits in ``logits_bytes`` per element), as (saved to the backward, forward extra, backward extra).

    TRL v1.9.0 ``_get_per_token_logps_and_entropies(..., logits_to_keep=C, compute_entropy=True)``:

    * the head on the last ``C + 1`` positions (transformers' ``logits_to_keep``): ``L = b (C + 1) V`` elements
      in the compute dtype (the head's output under autocast; no ``.float()`` without labels);
    * ``logits[:, :-1][:, -C:]`` and the in-place ``div_(temperature)`` make no copy;
    * ``selective_log_softmax``: with half logits, one ``F.log_softmax`` per sequence (``C V`` each), whose
      output autograd saves, so all ``b C V`` half elements are kept to the backward; with fp32 logits,
      ``torch.logsumexp`` per sequence, which saves its input: the logits themselves are kept;
    * ``entropy_from_logits`` under ``no_grad``: ``logits.reshape(-1, V)`` copies the non-contiguous slice when
      ``b > 1`` (``b C V``), then per chunk of 128 rows ``log_softmax``, ``exp`` and their product (3 x 128 V).

    The backward: the selected rows' gradients accumulate into one ``b C V`` tensor while a row's gradient of
    the same size arrives (``SelectBackward`` makes a full-size zero tensor per row), the slices' backward make
    the ``b (C + 1) V`` gradient of the logits, and one row's gather and log_softmax gradients (``2 C V``)
    live at once: counted as two full logits gradients and the row's two.

    Worked example (Qwen2.5-0.5B, V = 151,936, b = 8, C = 256, bf16): L = 8 x 257 x 151,936 x 2 =
    624,760,832 B; saved = 8 x 256 x 151,936 x 2 = 622,329,856 B; forward extra = L + 622,329,856 (copy) +
    3 x 128 x 151,936 x 2 = 1,363,777,536 B; backward extra = 2 L + 2 x 256 x 151,936 x 2 = 1,405,104,128 B.
    """
    b, c, v, e = micro_batch, completion, vocab, logits_bytes
    logits = b * (c + 1) * v * e
    rows = min(ENTROPY_CHUNK_ROWS, b * c)
    entropy = (b * c * v * e if b > 1 else 0) + 3 * rows * v * e
    if e < 4:
        saved, row_temp = b * c * v * e, 0
    else:
        saved, row_temp = logits, c * v * e  # logsumexp keeps the logits; one sequence's exp at a time
    forward_extra = (0 if e == 4 else logits) + entropy + row_temp
    return KernelLossTensors(saved=saved, forward_extra=forward_extra, backward_extra=2 * logits + 2 * c * v * e)


def grpo_assumptions(s: Scenario) -> list[str]:
    """What the GRPO estimate takes as given, for the report."""
    ro, ref = s.rl.rollout, reference_kind(s)
    out = [
        (f"GRPO (TRL v{TRL_RELEASE} GRPOTrainer): the policy step on micro_batch_size = {s.train.micro_batch_size} "
         f"completions of {ro.max_prompt_len} prompt + {ro.max_completion_len} completion tokens; logits over the "
         "completion only (logits_to_keep), log-probabilities per sequence (selective_log_softmax), entropies "
         "under no_grad"),
        {"none": "GRPO reference model: none (beta = 0: GRPOTrainer loads none)",
         "shared": "GRPO reference model: the policy with its adapters disabled (PEFT): no second copy",
         "separate": "GRPO reference model: a second copy loaded like the policy (create_model_from_path with "
                     "model_init_kwargs), resident on every GPU"}[ref],
        ("GRPO scoring: the old and reference log-probabilities as no-grad forwards of micro_batch_size "
         "completions (the logits over the completion and one sequence's log_softmax, or one MLP), over what "
         "stays between steps (analytic/lifecycle/scoring.py)"),
        "GRPO reward functions are assumed to run on the CPU (a reward model on the GPU is not modelled)",
        ("GRPO: every sequence at the longest prompt and completion (TRL pads both in the batch); the padding "
         "mask's few bytes and its attention kernel choice are not counted apart"),
    ]
    if s.train.peft is not None and ro.colocate:
        # VLLMGeneration.sync_weights merges the adapters into the base (peft merge_adapter), loads the merged
        # weights into the engine and unmerges them: one linear's delta at a time
        out.append("GRPO weight sync under PEFT: merge_adapter's one-linear-at-a-time delta temporaries are not "
                   "counted (one linear's weight, small beside the rollout phase's engine)")
    if "gradient_checkpointing" not in s.train.model_fields_set:
        out.append("GRPO: gradient_checkpointing full (GRPOConfig's default gradient_checkpointing=True)")
    return out
