"""PPO post-training (``train.objective: ppo``): TRL's ``PPOTrainer`` as of TRL v1.12.0, the last release that ships it.

Read in the wheel ``trl-1.12.0`` (``pip download trl==1.12.0 --no-deps``): ``trl/experimental/ppo/ppo_config.py``
``PPOConfig``, ``trl/experimental/ppo/ppo_trainer.py`` (``PolicyAndValueWrapper``, ``PPOTrainer.__init__`` and
``train``, ``batch_generation``, ``generate``, ``forward``), ``trl/experimental/utils.py`` (``get_reward``,
``create_reference_model``).  TRL 1.13.0 removed ``trl.experimental.ppo``; TRL 0.11.4's legacy ``PPOTrainer`` (a value
head on the policy) is another design (facts/trl.py ``PPO_ROWS``).  On each GPU:

* **policy and value model**, wrapped together (``PolicyAndValueWrapper``) and prepared by accelerate with one
  optimizer over both (``create_optimizer_and_scheduler`` on ``self.model``).  Under ``peft_config`` only the policy
  gets adapters (``get_peft_model(self.policy_model, ...)``): the value model stays fully trainable.  The wrapper's
  ``forward`` runs the value model's backbone (``critic_backbone``, ``output_hidden_states=True``) and its ``score``
  head, then the policy; ``gradient_checkpointing_enable`` reaches the policy only, and ``PPOTrainer.train`` (which
  overrides the HF Trainer's) never calls it, so ``PPOConfig.gradient_checkpointing=True`` is not applied: the
  policy is checkpointed only when the scenario says so (the user enabled it), the value model never;
* **reference policy**: ``create_reference_model(policy)`` (a deep copy in the policy's dtype, ``.to(device)``), or
  under PEFT none: the policy with its adapters disabled (``null_ref_context``);
* **reward model**: ``self.reward_model.to(device)``, frozen, no-grad forwards only.

The rollout (``train``, under ``torch.no_grad()``), per update, on ``local_batch_size = per_device_train_batch_size x
gradient_accumulation_steps`` queries:

* **generation**: ``unwrap_model_for_generation`` then ``batch_generation`` in chunks of
  ``local_rollout_forward_batch_size``: ``generate(..., return_dict_in_generate=True, output_scores=True)`` keeps every
  step's fp32 scores (``R`` tensors of ``rf x V``), ``torch.stack(output.scores, 1)`` copies them (the cache still in
  ``output``), and ``pad(logitss)`` copies every chunk's scores into one ``B x R x V`` fp32 tensor.  The trainer never
  deletes ``logitss`` (its ``del`` lists omit it): it lives through the scoring and the PPO epochs and until the next
  rollout's ``batch_generation`` returns;
* **scoring**, per chunk of ``rf``: the old log-probs from the kept scores (``selective_log_softmax``), the reference's
  full forward (``forward``: logits over every position, every hidden state kept, ``output_hidden_states=True``) and
  its log-probs, then the value and reward models' backbones (``get_reward``: every hidden state, the score head);
* **training**: ``num_ppo_epochs`` x ``num_mini_batches`` x micro-batches of ``per_device_train_batch_size`` through
  the wrapper: the policy's logits over every position (no ``logits_to_keep``), ``logits[:, P - 1 : -1]`` and the
  in-place ``/= temperature`` (a view), ``selective_log_softmax`` (one ``log_softmax`` per sequence with half logits),
  the clipped value and policy losses, ``accelerator.backward``; after it, under ``no_grad``, the entropy
  (``softmax(logits)`` and its product with the logits: below the backward's record, not a moment of its own).  The
  whole rollout batch's per-token tensors (query-responses, responses, log-probs, values, rewards, advantages,
  returns, masks) stay on the GPU throughout.
"""

from __future__ import annotations

from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.facts.trl import PPO_RELEASE, PPO_RESPONSE_LENGTH, ppo_row, release_text
from vramplan.spec.defaults import completion_len, ppo_beta_default, rollout_engine
from vramplan.spec.scenario import Rollout, Scenario

__all__ = ["PPO_RESPONSE_LENGTH", "carried_bytes", "carries", "forward_batch", "policy_scenario", "ppo_assumptions", "ppo_loss_tensors",
           "ppo_problems", "reference_kind", "rollout_batch", "rollout_buffers_bytes", "scores_bytes",
           "scoring_forward_bytes", "value_params", "with_defaults"]

# trl/experimental/ppo/ppo_config.py PPOConfig (v1.12.0): response_length=53 (facts/trl.py PPO_RESPONSE_LENGTH),
# local_rollout_forward_batch_size=64, num_mini_batches=1, num_ppo_epochs=4 (the epochs repeat the same
# micro-batches: no memory of their own)


def with_defaults(s: Scenario) -> Scenario:
    """``s`` with PPO's settings where the scenario gives none: the rollout by the policy's generate (PPOTrainer has
    no vLLM path) and ``PPOConfig.response_length`` (53) as the completion length."""
    ro = s.rl.rollout
    update: dict[str, object] = {}
    if ro.engine is None:  # spec/defaults.py resolves it (rollout_engine); a bare Scenario here
        update["engine"] = "hf-generate"
    if ro.max_completion_len is None:  # spec/defaults.py resolves it to PPO_RESPONSE_LENGTH; a bare Scenario here
        update["max_completion_len"] = PPO_RESPONSE_LENGTH
    if not update:
        return s
    return s.model_copy(update={"rl": s.rl.model_copy(update={"rollout": ro.model_copy(update=update)})})


def sequence_len(s: Scenario) -> int:
    """One query-response: the query (padded to the longest) and ``response_length`` tokens."""
    return s.rl.rollout.max_prompt_len + completion_len(s)


def policy_scenario(s: Scenario) -> Scenario:
    """The policy's training step: ``seq_len`` = query + response; gradient checkpointing as the scenario says (none
    by default: PPOTrainer never calls ``gradient_checkpointing_enable``)."""
    return s.model_copy(update={"train": s.train.model_copy(update={"seq_len": sequence_len(s)})})


def reference_kind(s: Scenario) -> str:
    """``PPOTrainer.__init__``: the policy with its adapters disabled under PEFT, else a deep copy."""
    return "shared" if s.train.peft is not None else "separate"


def rollout_batch(s: Scenario) -> int:
    """``local_batch_size``: queries per rollout on this GPU (``per_device_train_batch_size x
    gradient_accumulation_steps``)."""
    return s.train.micro_batch_size * s.train.grad_accum_steps


def forward_batch(s: Scenario) -> int:
    """Sequences per generate call and per scoring forward: ``local_rollout_forward_batch_size``, at most the rollout
    batch (the last chunk of ``range(0, B, rf)`` is the remainder)."""
    return min(s.rl.rollout_forward_batch_size, rollout_batch(s))


def value_params(total: int, untied_head: int, hidden: int) -> int:
    """Parameters of a value (or reward) model of the policy's architecture: ``AutoModelForSequenceClassification``
    (``num_labels=1``) has the backbone and a ``score`` linear of ``hidden x 1`` (no bias) instead of the LM head; a
    tied head was counted once, with the embedding, in ``total``."""
    return total - untied_head + hidden


def ppo_loss_tensors(micro_batch: int, query: int, response: int, vocab: int, logits_bytes: int) -> KernelLossTensors:
    """The PPO policy loss's tensors for ``micro_batch`` query-responses (``vocab`` columns, ``logits_bytes`` per
    element), as (saved to the backward, forward extra, backward extra).

    TRL v1.12.0 ``PPOTrainer.train``: ``output, vpred_temp = forward(model, mb_query_responses, ...)`` then ``logits =
    output.logits[:, context_length - 1 : -1]``, ``logits /= temperature``, ``selective_log_softmax(logits,
    mb_responses)``:

    * the head on every position: ``L = b (P + R) V`` elements (no ``logits_to_keep``, no labels, no ``.float()``),
      held by ``output`` until the mini-batch's ``del``;
    * with half logits, one ``log_softmax`` per sequence (``R V`` each), its output saved: ``b R V`` kept; with fp32
      logits ``logsumexp`` per sequence, which saves its input (the logits), one sequence's ``exp`` at a time;
    * the backward: per sequence the gather's and ``log_softmax``'s gradients (``2 R V``) while the view's gradient
      accumulates (``b R V`` plus an arriving full-size one); then the slice's backward makes the logits-sized
      gradient and ``CopySlices`` (the in-place division on a view) clones it and the slice: ``2 L + 2 b R V`` with
      the ``log_softmax`` outputs freed, i.e. ``2 L + b R V`` over what is saved.

    Worked example (Qwen2.5-0.5B, V = 151,936, bf16, b = 4, P = 128, R = 53): L = 4 x 181 x 151,936 x 2 =
    220,003,328 B; b R V x 2 = 64,420,864 B; saved = 284,424,192 B; forward extra 0; backward extra = max(2 x
    64,420,864 + 2 x 53 x 151,936 x 2, 2 x 220,003,328 + 64,420,864) = 504,427,520 B.
    """
    b, r, e = micro_batch, response, logits_bytes
    logits = b * (query + response) * vocab * e
    rows = b * r * vocab * e
    if e < 4:
        saved, forward_extra = logits + rows, 0
    else:
        saved, forward_extra = logits, r * vocab * e
    backward_extra = max(2 * rows + 2 * r * vocab * e, 2 * logits + rows)
    return KernelLossTensors(saved=saved, forward_extra=forward_extra, backward_extra=backward_extra)


def carries(s: Scenario) -> bool:
    """Whether a micro-batch's tensors outlive it: a mini-batch of more than one micro-batch (``local_mini_batch_size
    / per_device_train_batch_size = grad_accum_steps / num_mini_batches > 1``); the trainer deletes them only after
    each mini-batch."""
    return s.train.grad_accum_steps // s.rl.num_mini_batches > 1


def carried_bytes(layers: int, micro_batch: int, query: int, response: int, hidden: int, vocab: int,
                  compute_bytes: int) -> tuple[int, int]:
    """What the previous micro-batch of the same mini-batch still holds, as (during the next forward, after it).

    TRL v1.12.0 ``PPOTrainer.train`` rebinds ``output, vpred_temp = forward(...)`` only when the next forward returns
    and ``prob_dist`` only at the next entropy, and ``del``s them after the mini-batch: during the next forward the
    previous ``output`` (its logits, ``b S V``, and its ``layers + 1`` hidden states, ``output_hidden_states=True``)
    and ``prob_dist`` (``b R V``); after it ``prob_dist`` alone.  Seen on the CPU with TRL 1.12.0's own trainer
    (benchmarks/ppo_trl_cpu_check.py): two ``b x R x V`` tensors of the previous micro-batch alive at the next forward.

    Example (Qwen2.5-0.5B, bf16, b = 4, 128 + 53): logits 220,003,328 + states 25 x 4 x 181 x 896 x 2 = 32,435,200 +
    prob_dist 64,420,864 = 316,859,392 B during the forward; 64,420,864 B after it.
    """
    tokens = micro_batch * (query + response)
    rows = micro_batch * response * vocab * compute_bytes
    return tokens * vocab * compute_bytes + (layers + 1) * tokens * hidden * compute_bytes + rows, rows


def scores_bytes(batch: int, response: int, vocab: int) -> int:
    """The padded generate scores of ``batch`` sequences: ``B x R x V`` fp32 (transformers' generate takes the
    last-token logits ``.to(torch.float32)`` before the logits processors, whose outputs ``output_scores`` keeps)."""
    return batch * response * vocab * 4


def rollout_buffers_bytes(batch: int, query: int, response: int) -> int:
    """The rollout's per-token tensors kept through the PPO epochs (TRL v1.12.0 ``train``): ``query_responses`` (``B
    (P + R)`` int64); ``responses``, ``postprocessed_responses``, ``response_idxs`` (``B R`` int64 each); the float
    ``B R`` tensors ``logprobs``, ``ref_logprobs``, ``values``, ``logr``, ``kl``, ``non_score_reward``, ``rewards``,
    ``advantages``, ``returns`` and the list ``advantages_reversed`` (ten, counted at 4 bytes); ``padding_mask`` and
    ``padding_mask_p1`` (bool).  Example: B = 8, P = 128, R = 53: 8 x 181 x 8 + 3 x 8 x 53 x 8 + 10 x 8 x 53 x 4 +
    2 x 8 x 53 = 11,584 + 10,176 + 16,960 + 848 = 39,568 B."""
    tokens = batch * response
    return batch * (query + response) * 8 + 3 * tokens * 8 + 10 * tokens * 4 + 2 * tokens


def scoring_forward_bytes(layers: int, batch: int, query: int, response: int, hidden: int, vocab: int, inter: int,
                          gated: bool, compute_bytes: int) -> int:
    """One no-grad scoring forward of ``batch`` query-responses at its highest: the reference's (``forward`` with
    ``output_hidden_states=True``): every hidden state (``layers + 1`` tensors of ``b S H``) kept in the output, and
    the larger of the head's logits over every position with one sequence's ``log_softmax`` (``b S V + R V``) and one
    MLP's tensors (``b S I`` x 3 gated, x 2 plain).  The value and reward models' ``get_reward`` keep the same hidden
    states and a one-column score: below it.

    Example (Qwen2.5-0.5B: 24 layers, H 896, V 151,936, I 4,864, bf16; 8 x (128 + 53)): hidden states 25 x 8 x 181 x
    896 x 2 = 64,870,400; logits 8 x 181 x 151,936 x 2 + 53 x 151,936 x 2 = 440,006,656 + 16,105,216 = 456,111,872;
    MLP 8 x 181 x 4,864 x 2 x 3 = 42,258,432; total 64,870,400 + 456,111,872 = 520,982,272 B.
    """
    tokens = batch * (query + response)
    states = (layers + 1) * tokens * hidden * compute_bytes
    head = tokens * vocab * compute_bytes + response * vocab * compute_bytes
    mlp = tokens * inter * compute_bytes * (3 if gated else 2)
    return states + max(head, mlp)


_PURE_HALF = ("bf16-true", "fp16-true")
# the rollout keys only the vLLM engine reads (serve/rollout.py)
_VLLM_KEYS = ("colocate", "gpu_memory_utilization", "sleep_mode", "vllm_version")


def _release_problems(s: Scenario) -> list[Problem]:
    v = s.software.trl_version
    if v is None:
        return []
    row = ppo_row(v)
    if row.modelled and v[:2] == (1, 12):
        return []
    return [Problem("software.trl", f"is {release_text(v)}: TRL's PPO there is {row.design} ({row.sources}); only "
                    f"v{PPO_RELEASE}'s trl.experimental.ppo.PPOTrainer is modelled",
                    f"set software.trl: {PPO_RELEASE} or leave it out")]


def _setting_problems(s: Scenario) -> list[Problem]:
    t, rl, ro = s.train, s.rl, s.rl.rollout
    out: list[Problem] = []

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.precision not in _PURE_HALF:
        no("train.precision", f"{t.precision} under PPO is not modelled: accelerate's autocast wraps only "
           "PolicyAndValueWrapper.forward, so the generate, reference, value and reward forwards run in the "
           "parameters' dtype (and the HF generate model of the rollout runs bf16 or fp16 only)",
           "use bf16-true or fp16-true (every model loaded in half precision)")
    if rollout_engine(s) != "hf-generate":
        no("rl.rollout.engine", "PPOTrainer (TRL v1.12.0) has no vLLM rollout: it generates with the policy's "
           "generate (batch_generation)", "leave rl.rollout.engine out or set hf-generate")
    # compared by value with the schema's defaults, not by presence: a saved scenario carries every key
    if rl.beta not in (None, ppo_beta_default()):
        no("rl.beta", f"is {rl.beta}: GRPO's KL coefficient; PPOTrainer's kl_coef changes no memory (the reference "
           "is always used)", "leave rl.beta out")
    if rl.precompute_ref_log_probs:
        no("rl.precompute_ref_log_probs", "is a DPO setting; PPOTrainer has none", "leave it out")
    if ro.num_generations is not None:
        no("rl.rollout.num_generations", f"is {ro.num_generations}, but PPO samples one response per query",
           "leave it out")
    vllm_keys = [k for k in _VLLM_KEYS if getattr(ro, k) != Rollout.model_fields[k].default]
    if vllm_keys:
        no("rl.rollout", f"{', '.join('rl.rollout.' + k for k in vllm_keys)} set, but only a vLLM engine reads "
           "them (PPOTrainer generates with the policy)", "leave them out")
    if rl.reference_model is not None and rl.reference_model != reference_kind(s):
        no("rl.reference_model", f"is {rl.reference_model!r}, but PPOTrainer uses "
           f"{reference_kind(s)!r} here (a deep copy, or the policy with its adapters disabled under PEFT)",
           f"set rl.reference_model: {reference_kind(s)} or leave it out")
    for key, given in (("reward_model", rl.reward_model), ("value_model", rl.value_model)):
        if given is not None and given != s.model:
            no(f"rl.{key}", f"is {given!r}: a {key.replace('_', ' ')} of another architecture than the policy's "
               "is not modelled yet", f"leave rl.{key} out (the policy's architecture with a score head)")
    if rollout_batch(s) % rl.num_mini_batches:
        no("rl.num_mini_batches", f"the rollout batch (micro_batch_size x grad_accum_steps = {rollout_batch(s)}) "
           f"is not a multiple of num_mini_batches = {rl.num_mini_batches} (PPOTrainer.__init__ exact_div)",
           "make the batch a multiple of num_mini_batches")
    if "seq_len" in t.model_fields_set and t.seq_len != sequence_len(s):
        no("train.seq_len", f"is {t.seq_len}, but a PPO sequence is rl.rollout.max_prompt_len + "
           f"max_completion_len = {sequence_len(s)} tokens", "leave train.seq_len out")
    return out


def _unmodelled_problems(s: Scenario) -> list[Problem]:
    t, par = s.train, s.parallel
    out: list[Problem] = []
    if s.effective_framework not in ("hf-trainer", "accelerate", "deepspeed"):
        out.append(Problem("framework", f"PPO runs on TRL's PPOTrainer (accelerate), not {s.effective_framework}",
                           "use framework: hf-trainer"))
    if par.zero_stage == 3 or par.fsdp != "none":
        out.append(Problem("parallel", "ZeRO-3 and FSDP under PPO are not modelled (the gather for generation, "
                           "ds3_gather_for_generation; the reward and reference models' shards; FSDP's wrapping of "
                           "PolicyAndValueWrapper)", "use ZeRO-1/2 or DDP (parallel.fsdp: none)"))
    if par.tp > 1 or par.pp > 1 or par.cp > 1:
        out.append(Problem("parallel", "tensor, pipeline or context parallelism under PPO is not modelled",
                           "use data parallelism only (tp = pp = cp = 1)"))
    if t.quantization != "none":
        out.append(Problem("train.quantization", "a bitsandbytes policy under PPO (its generate inside the trainer, "
                           "peft_module_casting_to_bf16) is not modelled", "use an unquantized base"))
    if t.loss != "standard":
        out.append(Problem("train.loss", f"{t.loss} under PPO is not modelled (PPOTrainer computes its own "
                           "log-probabilities over the logits)", "use train.loss: standard"))
    if t.packing:
        out.append(Problem("train.packing", "PPO pads queries and responses; packing is not modelled",
                           "set train.packing: false"))
    if s.lifecycle.evaluation:
        out.append(Problem("lifecycle.evaluation", "PPO's evaluation (generate_completions) is not modelled",
                           "set lifecycle.evaluation: false"))
    return out


def ppo_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (``train.objective: ppo``, PPO's defaults filled in by ``with_defaults``) cannot be estimated; empty:
    it can."""
    return _release_problems(s) + _setting_problems(s) + _unmodelled_problems(s)


def ppo_assumptions(s: Scenario) -> list[str]:
    """What the PPO estimate takes as given, for the report (``s`` with PPO's defaults filled in)."""
    ro, t = s.rl.rollout, s.train
    b_all, rf = rollout_batch(s), forward_batch(s)
    ref = ("the policy with its adapters disabled (PEFT): no second copy" if reference_kind(s) == "shared" else
           "a deep copy of the policy (create_reference_model), in its dtype")
    return [
        (f"PPO (TRL v{PPO_RELEASE} trl.experimental.ppo.PPOTrainer): the policy and the value model trained together "
         f"(PolicyAndValueWrapper, one optimizer); micro_batch_size = {t.micro_batch_size} query-responses of "
         f"{ro.max_prompt_len} query + {ro.max_completion_len} response tokens (response_length), logits over every "
         "position, one log_softmax per sequence over the response"),
        ("PPO value and reward models: the policy's architecture with a one-output score head "
         "(AutoModelForSequenceClassification, num_labels=1), loaded in the policy's dtype; the value model fully "
         "trained (no adapters, never gradient-checkpointed): its saved activations alive through the policy's forward "
         "and backward, its own backward after the policy's (autograd runs the later-created policy nodes first)"),
        f"PPO reference model: {ref}",
        (f"PPO rollout: {b_all} queries (per_device_train_batch_size x gradient_accumulation_steps) generated in "
         f"chunks of {rf} (rl.rollout_forward_batch_size = local_rollout_forward_batch_size "
         f"{s.rl.rollout_forward_batch_size}, at most the rollout batch) with output_scores: the previous rollout's fp32 scores "
         "(never deleted by the trainer) beside the new chunks and their padded copy; every response at full "
         "response_length (no stop token); each chunk's generate (KV cache, running layer, last-token logits and "
         "sampling) as the inference engine counts it (analytic/inference.py), its top-k/top-p temporaries (a few MB) "
         "counted although PPOTrainer's top_k=0, top_p=1.0 add no warper, and at the stacked copy of the chunk's "
         "scores (an upper bound by the last step's sampling temporaries)"),
        (f"PPO scoring: no-grad forwards of {rf} query-responses (reference with every hidden state and its "
         "logits, value and reward backbones), over the kept scores and what stays between steps"),
        ("PPO: the launcher sets no mixed precision (ACCELERATE_MIXED_PRECISION unset or 'no'; PPOTrainer builds its "
         "own Accelerator without one and transformers 5's TrainingArguments no longer exports PPOConfig.bf16): with "
         "bf16 or fp16 there, accelerate's convert_outputs_to_fp32 would return the wrapper's logits in fp32 (not "
         "modelled)"),
        ("PPO: gradient checkpointing only as the scenario sets it (PPOTrainer.train never calls "
         "gradient_checkpointing_enable, so PPOConfig's gradient_checkpointing=True is not applied); the entropy after "
         "the backward (softmax of the logits) stays below the backward's record"),
    ]
