"""DPO post-training (``train.objective: dpo``): TRL's ``DPOTrainer`` as of TRL v1.9.0.

Read in TRL v1.9.0 (tag ``v1.9.0``, commit 35def3ee): ``trl/trainer/dpo_config.py`` ``DPOConfig`` and
``trl/trainer/dpo_trainer.py`` ``DataCollatorForPreference``, ``DPOTrainer.__init__``, ``_compute_loss`` and
``compute_ref_log_probs``; ``trl/trainer/utils.py`` ``selective_log_softmax``.  (Releases before the 1.x
refactor had ``concatenated_forward`` and ``use_logits_to_keep``; v1.9.0 has neither: the collator does the
concatenation and the head runs on every position.)  What this module gives:

* the policy step's scenario (``policy_scenario``): ``train.micro_batch_size`` is TRL's
  ``per_device_train_batch_size`` counted in *pairs*; the collator stacks the prompts with the chosen and then
  the rejected completions along the batch (``torch.cat`` of the two ``pad``-ed halves), so one forward runs on
  ``2 x micro_batch_size`` sequences, each padded to the longest of the batch and cut at ``max_length``
  (``train.seq_len``; DPOConfig's default 1,024); gradient checkpointing on unless the scenario says otherwise
  (``DPOConfig``: "``gradient_checkpointing``: Defaults to ``True``");
* the reference model (``reference_kind``): ``DPOTrainer.__init__`` with ``ref_model=None`` keeps none under
  PEFT (the reference log-probs come from the policy with its adapters disabled, ``use_adapter(model, None)``)
  and otherwise loads a second copy with the policy's ``model_init_kwargs`` (``create_model_from_path``), then
  ``accelerator.prepare_model(ref_model, evaluation_mode=True)``: no gradients, no optimizer states;
* the loss's tensors (``dpo_loss_tensors``): ``_compute_loss`` runs the policy's forward, its log-probs, then the
  reference forward under ``torch.no_grad()`` while the policy's logits are still referenced (``outputs``), and
  returns; the backward follows;
* what the estimate refuses (``dpo_problems``).

``rl.precompute_ref_log_probs`` (TRL's ``precompute_ref_log_probs``, default False) true is refused: the estimate
is TRL's default, the reference forward inside each step (stated in the report).

By TRL release (``software.trl``, facts/trl.py ``LOG_PROB_ROWS``): up to v1.13 as above; v1.14 (TRL's Triton
log-prob kernel over the logits) refused; from v1.15.0 the fused LM head (``add_fused_lm_head``,
analytic/fused_head.py; ``dpo_fused_loss_tensors``).  Unset: v1.9.0.
"""

from __future__ import annotations

from vramplan.analytic.fused_head import fused_forward_bytes, fused_loss_tensors
from vramplan.analytic.grpo import (
    TRL_RELEASE,
    RefKind,
    checkpointing_notes,
    release_notes,
    trainer_problems,
    trl_release,
    uses_fused_head,
)
from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.spec.defaults import with_trainer_defaults
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Rl, Scenario

__all__ = ["dpo_assumptions", "dpo_fused_loss_tensors", "dpo_loss_tensors", "dpo_problems", "offline_reference_problems",
           "policy_scenario", "reference_kind", "reference_problems", "rl_settings"]


def policy_scenario(s: Scenario) -> Scenario:
    """The step TRL runs: ``2 x micro_batch_size`` sequences (chosen and rejected) of ``seq_len`` tokens,
    checkpointing on by DPOConfig's default where the scenario's is null (spec/defaults.py)."""
    s = with_trainer_defaults(s)
    return s.model_copy(update={"train": s.train.model_copy(update={"micro_batch_size": 2 * s.train.micro_batch_size})})


def reference_kind(s: Scenario) -> RefKind:
    """TRL's rule (``DPOTrainer.__init__`` with ``ref_model=None``): shared under PEFT, else a separate copy."""
    return "shared" if s.train.peft is not None else "separate"


def reference_problems(s: Scenario, trainer: str = "DPOTrainer", release: str = TRL_RELEASE) -> list[Problem]:
    """A ``rl.reference_model`` other than the one ``trainer`` (DPOTrainer, KTOTrainer: the same rule) uses."""
    ref, trl = s.rl.reference_model, reference_kind(s)
    if ref is None or ref == trl:
        return []
    why = {"shared": f"under PEFT {trainer} computes the reference with the adapters disabled",
           "separate": f"without PEFT {trainer} loads a second copy of the model (ref_model=None)"}[trl]
    if ref == "none":
        why += "; no reference at all needs precompute_ref_log_probs, which is not modelled"
    return [Problem("rl.reference_model", f"is {ref!r}, but {why} ({trainer}.__init__, TRL v{release})",
                    f"set rl.reference_model: {trl} or leave it out")]


def _setup_problems(s: Scenario) -> list[Problem]:
    """Combinations DPOTrainer runs but this estimate does not model, each refused with what to change."""
    t = s.train
    out: list[Problem] = []

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    # DPOTrainer.__init__: prepare_deepspeed / prepare_fsdp shard the reference copy too
    out += trainer_problems(s, "DPO", "the reference model's shards (prepare_deepspeed / prepare_fsdp) and their "
                            "gathers in its forward")
    if t.loss != "standard":
        no("train.loss", f"{t.loss} under DPO is not modelled (TRL's use_liger_kernel runs Liger's "
           "LigerFusedLinearDPOLoss, another kernel)", "use train.loss: standard")
    if t.packing:
        # DPOTrainer.__init__: "padding_free=True is temporarily unavailable ... Falling back to standard padding"
        no("train.packing", f"DPOTrainer (TRL v{TRL_RELEASE}) disables padding_free and pads the pairs",
           "set train.packing: false")
    # DPOTrainer.__init__ runs _precompute_ref_logps before the Trainer prepares the model (no autocast yet) and
    # keeps no reference during training: another step and a pass before it, neither modelled
    return out + offline_reference_problems(s, "DPO", "pairs", f"DPOTrainer.__init__, TRL v{TRL_RELEASE}")


def offline_reference_problems(s: Scenario, method: str, items: str, precompute_in: str) -> list[Problem]:
    """What DPO and KTO (trainers with a reference model and no rollout) share and this estimate does not model: their
    evaluation, precomputed reference log-probs (``precompute_in``: where the trainer runs that pass) and GRPO's
    rollout settings; each refused with what to change."""
    out: list[Problem] = []
    if s.lifecycle.evaluation:
        out.append(Problem("lifecycle.evaluation", f"{method}'s evaluation (policy and reference forwards of the eval "
                           f"{items}) is not modelled", "set lifecycle.evaluation: false"))
    if s.rl.precompute_ref_log_probs:
        out.append(Problem("rl.precompute_ref_log_probs", "precomputed reference log-probs (the pass over the dataset "
                           f"in {precompute_in}) are not modelled", "set rl.precompute_ref_log_probs: false"))
    rl = rl_settings(s, ("reference_model", "precompute_ref_log_probs"))
    if rl:
        shown = ", ".join(f"rl.{k}" for k in sorted(rl))
        out.append(Problem("rl", f"{shown} set, but {method} has no rollout and its beta does not change memory "
                           "(GRPO's settings)",
                           f"remove them ({method} reads rl.reference_model and rl.precompute_ref_log_probs)"))
    return out


def rl_settings(s: Scenario, read: tuple[str, ...]) -> list[str]:
    """The ``rl`` keys, other than ``read``, whose value differs from what the scenario resolves to without an ``rl``
    block (spec/defaults.py): what a trainer without a rollout is given but does not read.  A value, not a key's
    presence: a dumped scenario holds every key at its resolved default."""
    given, plain = with_trainer_defaults(s).rl, with_trainer_defaults(s.model_copy(update={"rl": Rl()})).rl
    return sorted(k for k in changed_fields(given, defaults=plain) if k not in read)


def dpo_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (a training scenario with ``train.objective: dpo``) cannot be estimated; empty: it can."""
    return _setup_problems(s) + reference_problems(s)


def dpo_loss_tensors(sequences: int, seq_len: int, vocab: int, logits_bytes: int,
                     reference_layer: int = 0, reference_casts: int = 0) -> KernelLossTensors:
    """The DPO loss's tensors for ``sequences`` (``2 x`` pairs) of ``seq_len`` tokens (``vocab`` on this rank, the
    logits in ``logits_bytes`` per element), as (saved to the backward, forward extra, backward extra).

    TRL v1.9.0 ``DPOTrainer._compute_loss``:

    * the policy's head on every position (no ``logits_to_keep``): ``L = n s V`` elements in the compute dtype;
      ``outputs.logits[..., :-1, :]`` is a view;
    * ``selective_log_softmax``: with half logits one ``F.log_softmax`` per sequence (``(s - 1) V``), whose
      output autograd saves: ``n (s - 1) V`` kept to the backward, the logits not (a temporary); with fp32
      logits ``torch.logsumexp`` per sequence, which saves its input: the logits themselves are kept, and one
      sequence's exponentials live at a time;
    * the reference forward under ``no_grad`` while ``outputs`` (the policy's logits) is still referenced: its
      logits (``L`` again, the same dtype: the reference runs under the same autocast) and one sequence's
      ``log_softmax`` (or, fp32, ``logsumexp``'s exponentials) at a time; nothing of it is saved.  Its layers'
      no-grad temporaries (``reference_layer``: one MLP's and the residual stream in and out, as GRPO's scoring
      forward, analytic/lifecycle/scoring.py) count instead when they are larger; with a separate fp32 copy under
      autocast, its cached half weights (``reference_casts``, analytic/terms/casts.py) add.

    The backward (the locals gone, the reference's logits freed): as GRPO's (analytic/grpo.py), the selected
    rows' gradients accumulated into one full-size tensor while a row's full-size gradient arrives, the slice's
    backward making the logits' gradient, and one row's gather and log_softmax gradients: ``2 L + 2 (s - 1) V``.

    Worked example (Qwen2.5-0.5B, V = 151,936, 2 pairs: n = 4, s = 512, bf16): L = 4 x 512 x 151,936 x 2 =
    622,329,856 B; saved = 4 x 511 x 151,936 x 2 = 621,114,368 B; forward extra = L (policy) + L (reference) +
    511 x 151,936 x 2 (155,278,592) = 1,399,938,304 B; backward extra = 2 L + 2 x 155,278,592 = 1,555,216,896 B.
    """
    n, s, v, e = sequences, seq_len, vocab, logits_bytes
    logits = n * s * v * e
    row = (s - 1) * v * e
    if e < 4:
        saved, policy_temp = n * row, logits
    else:
        saved, policy_temp = logits, 0  # logsumexp keeps the logits; one sequence's exp at a time
    reference = max(logits + row, reference_layer) + reference_casts
    return KernelLossTensors(saved=saved, forward_extra=policy_temp + reference, backward_extra=2 * logits + 2 * row)


def dpo_fused_loss_tensors(sequences: int, seq_len: int, vocab: int, hidden: int, hidden_bytes: int,
                           compute_bytes: int, weight_bytes: int, head_trainable: bool, reference_layer: int = 0,
                           reference_casts: int = 0) -> KernelLossTensors:
    """The DPO loss's tensors from TRL v1.15.0 (``software.trl``, facts/trl.py) for ``sequences`` (``2 x`` pairs) of
    ``seq_len`` tokens, as (saved to the backward, forward extra, backward extra).

    ``DPOTrainer.__init__`` patches the policy with ``add_fused_lm_head(..., outputs=("log_probs", "entropy",
    "mean_logits", "is_top1"))`` and a separate reference with ``add_fused_lm_head(ref_model)``; ``_compute_loss``
    calls both with ``fused_lm_head=True`` (analytic/fused_head.py): N = ``n (s - 1)`` labelled positions (every
    position after the first counted as a completion token: an upper bound, the prompt's labels are -100), the
    policy's four outputs scattered over the same positions (three fp32 and one bool: 13 bytes each), then the
    reference's no-grad forward while they live: its gathered hidden states, statistics and tiles, or its layers'
    temporaries (``reference_layer``) when larger; with a separate fp32 copy under autocast its layers' cached half
    weights (``reference_casts``; the fused head casts its chunks outside autocast's cache).  ``hidden_bytes`` (x) is
    the final norm's output dtype, ``compute_bytes`` (c) the autocast dtype, ``weight_bytes`` (w) the LM head's.

    Worked example (Qwen2.5-0.5B: V = 151,936, H = 896; 2 pairs: n = 4, s = 512, N = 4 x 511 = 2,044; bf16 autocast
    over fp32 weights: x = 4, c = 2, w = 4, trainable head): saved = 2,044 x 896 x 4 + 16 x 2,044 = 7,325,696 +
    32,704 = 7,358,400 B; tiles = 2,044 x 32,768 x 2 + 32,768 x 896 x 2 + 2,044 x 896 x 2 = 133,955,584 +
    58,720,256 + 3,662,848 = 196,338,688 B; reference = 7,325,696 + 28 x 2,044 + 196,338,688 = 203,721,616 B;
    forward extra = 13 x 2,044 + 203,721,616 = 203,748,188 B; backward extra = 7,325,696 + 151,936 x 896 x 4
    (544,538,624) + 196,338,688 = 748,203,008 B.
    """
    tokens = sequences * (seq_len - 1)
    reference = max(fused_forward_bytes(tokens, hidden, hidden_bytes, compute_bytes, weight_bytes),
                    reference_layer) + reference_casts
    return fused_loss_tensors(tokens, tokens, 13, vocab, hidden, hidden_bytes, compute_bytes, weight_bytes,
                              head_trainable, reference)


def dpo_assumptions(s: Scenario) -> list[str]:
    """What the DPO estimate takes as given, for the report."""
    t, fused = s.train, uses_fused_head(s)
    how = ("TRL's fused LM head (add_fused_lm_head, ChunkedLogProbFunction: tiles of 4,096 tokens x 32,768 "
           "vocabulary columns, no logits tensor) for the policy and the reference; every position after the first "
           "counted as a completion token (an upper bound: the prompt's positions are masked out of the head)"
           if fused else "logits over every position, log-probabilities per sequence (selective_log_softmax)")
    ref_how = ("its fused head's gathered hidden states, statistics and tiles beside the policy's saved activations "
               "and outputs" if fused else
               "its logits and one sequence's log_softmax beside the policy's saved activations and logits")
    out = [
        (f"DPO (TRL v{trl_release(s)} DPOTrainer): micro_batch_size = {t.micro_batch_size} preference pairs "
         f"(per_device_train_batch_size), so each forward runs on {2 * t.micro_batch_size} sequences (chosen and "
         f"rejected concatenated along the batch) of seq_len = {t.seq_len} tokens (DPOConfig.max_length; every "
         f"sequence padded to it); {how}"),
        {"shared": "DPO reference model: the policy with its adapters disabled (PEFT): no second copy",
         "separate": "DPO reference model: a second copy loaded like the policy (create_model_from_path with "
                     "model_init_kwargs), resident on every GPU, no gradients or optimizer states"}[reference_kind(s)],
        ("DPO reference forward: inside each step, under no_grad, after the policy's forward and before its "
         f"backward (precompute_ref_log_probs=False, TRL's default): {ref_how}, or one of its MLPs and the residual "
         "stream when larger"),
    ]
    return out + release_notes(s, "DPO") + checkpointing_notes(s, "DPO")
