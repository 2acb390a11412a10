"""ORPO post-training (``train.objective: orpo``): TRL's ``ORPOTrainer`` as of TRL v1.16.0, where it lives in
``trl.experimental`` (``from trl.experimental.orpo import ORPOTrainer``), not in ``trl.trainer``.

Read in TRL v1.16.0 (the PyPI wheel ``trl-1.16.0``): ``trl/experimental/orpo/orpo_config.py`` ``ORPOConfig``;
``trl/experimental/orpo/orpo_trainer.py`` ``ORPOTrainer.concatenated_inputs``, ``concatenated_forward``,
``get_batch_logps``, ``odds_ratio_loss``, ``get_batch_loss_metrics``; ``trl/trainer/utils.py``
``selective_log_softmax``; ``trl/kernels/logprob_entropy.py`` ``selective_log_softmax_and_entropy``; and
accelerate 1.15.0 ``Accelerator.prepare_model`` (``convert_outputs_to_fp32``).  What this module gives:

* the policy step's scenario (``policy_scenario``): ``train.micro_batch_size`` is ``per_device_train_batch_size``
  counted in *pairs*; ``concatenated_inputs`` pads the chosen and the rejected sequences to the longer and
  ``torch.cat``-s them along the batch, so one forward runs on ``2 x micro_batch_size`` sequences of ``seq_len``
  (``ORPOConfig.max_length``, default 1,024); gradient checkpointing on unless the scenario says otherwise
  (``ORPOConfig``: "``gradient_checkpointing``: Defaults to ``True``");
* no reference model: the odds ratio compares the policy's own chosen and rejected log-probabilities
  (``odds_ratio_loss``), so nothing but the policy is on the GPU;
* the loss's tensors (``orpo_loss_tensors``);
* what the estimate refuses (``orpo_problems``).
"""

from __future__ import annotations

from vramplan.analytic.dpo import policy_scenario as dpo_policy_scenario
from vramplan.analytic.dpo import rl_settings
from vramplan.analytic.grpo import checkpointing_notes, trainer_problems
from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.spec.scenario import Scenario

__all__ = ["ORPO_TRL_RELEASE", "orpo_assumptions", "orpo_loss_tensors", "orpo_problems", "policy_scenario"]

ORPO_TRL_RELEASE = "1.16.0"


def policy_scenario(s: Scenario) -> Scenario:
    """The step TRL runs: ``2 x micro_batch_size`` sequences (chosen and rejected) of ``seq_len`` tokens,
    checkpointing on by ORPOConfig's default: DPO's (``dpo.policy_scenario``)."""
    return dpo_policy_scenario(s)


def orpo_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (a training scenario with ``train.objective: orpo``) cannot be estimated; empty: it can."""
    t = s.train
    out = trainer_problems(s, "ORPO", "the parameters' shards and their gathers in the forward")

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.loss != "standard":
        no("train.loss", f"{t.loss} under ORPO is not modelled (ORPOTrainer computes its cross-entropy and "
           "log-probabilities from the model's logits)", "use train.loss: standard")
    if t.packing:
        no("train.packing", f"ORPOTrainer (TRL v{ORPO_TRL_RELEASE}) pads the pairs (DPODataCollatorWithPadding); "
           "packing is not modelled", "set train.packing: false")
    if s.lifecycle.evaluation:
        no("lifecycle.evaluation", "ORPO's evaluation (the pairs' forwards) is not modelled",
           "set lifecycle.evaluation: false")
    if s.rl.reference_model not in (None, "none"):
        no("rl.reference_model", f"is {s.rl.reference_model!r}, but ORPO has no reference model (odds_ratio_loss "
           f"compares the policy's own log-probabilities, TRL v{ORPO_TRL_RELEASE})",
           "set rl.reference_model: none or leave it out")
    rl = rl_settings(s, ("reference_model",))
    if rl:
        shown = ", ".join(f"rl.{k}" for k in sorted(rl))
        no("rl", f"{shown} set, but ORPO has no reference model and no rollout", "remove them")
    return out


def orpo_loss_tensors(pairs: int, seq_len: int, vocab: int, compute_bytes: int, converted: bool) -> KernelLossTensors:
    """The ORPO loss's tensors for ``pairs`` preference pairs (``n = 2 pairs`` sequences) of ``seq_len`` tokens
    (``vocab`` on this rank), as (saved to the backward, forward extra, backward extra).  ``converted``: accelerate's
    autocast wrapper returns the model's outputs in fp32 (``convert_outputs_to_fp32``: ``tensor.float()`` of half
    outputs), as under the HF Trainer with bf16 or fp16 autocast, so the logits arrive in e = 4 bytes (else the
    compute dtype's c).  With L = n s V and R = pairs (s - 1) V elements (the chosen half, shifted):

    * the head's output c L, then (converted) its fp32 copy 4 L while the half one is returned: (c + 4) L at once;
    * ``concatenated_forward``'s ``cross_entropy_loss`` on the chosen half (the NLL term): ``logits[..., :-1, :]
      .contiguous()`` copies e R, and ``nn.CrossEntropyLoss`` (outside the model's autocast) runs ``log_softmax``,
      whose output e R autograd saves; the copy dies when the function returns;
    * ``get_batch_logps`` over all 2 x pairs sequences: ``selective_log_softmax`` on CUDA runs TRL's Triton kernel
      (``selective_log_softmax_and_entropy``, ``ctx.save_for_backward(logits, ...)``): it saves the logits (a view of
      ``all_logits``: no new bytes, but the logits live to the backward) and per-token fp32 values (counted as
      nothing: ``n s`` floats);
    * ``odds_ratio_loss``: per-sequence values only (``log1mexp``, ``logsigmoid`` on ``pairs`` floats).

    saved = e L + e R; forward extra = the larger of e R (the contiguous copy beside the saved tensors) and, when
    converted, (c + 4) L - saved (the conversion's moment), never below 0.  Backward: the logits' gradient
    accumulated (e L) while a full-size one arrives (the kernel's ``grad_logits = empty_like(logits)`` and the
    slices' backwards, e L) and the cross-entropy's log_softmax gradient (e R): 2 e L + e R; the conversion's
    backward to c L comes after the cross-entropy's gradient is freed (e L + c L, smaller).

    Worked example (Qwen2.5-0.5B, V = 151,936, 2 pairs of s = 512, bf16 autocast under the HF Trainer: c = 2, e = 4):
    L = 4 x 512 x 151,936 = 311,164,928; R = 2 x 511 x 151,936 = 155,278,592; saved = 4 L + 4 R = 1,244,659,712 +
    621,114,368 = 1,865,774,080 B; forward extra = max(4 R = 621,114,368, 6 L - saved = 1,866,989,568 - 1,865,774,080
    = 1,215,488) = 621,114,368 B; backward extra = 8 L + 4 R = 2,489,319,424 + 621,114,368 = 3,110,433,792 B.
    """
    c = compute_bytes
    e = 4 if converted else c
    big, rows = 2 * pairs * seq_len * vocab, pairs * (seq_len - 1) * vocab
    saved = e * big + e * rows
    conversion = (c + 4) * big - saved if converted else 0
    return KernelLossTensors(saved=saved, forward_extra=max(e * rows, conversion, 0),
                             backward_extra=2 * e * big + e * rows)


def orpo_assumptions(s: Scenario) -> list[str]:
    """What the ORPO estimate takes as given, for the report."""
    t = s.train
    out = [
        (f"ORPO (TRL v{ORPO_TRL_RELEASE} ORPOTrainer, in trl.experimental.orpo): micro_batch_size = "
         f"{t.micro_batch_size} preference pairs (per_device_train_batch_size), so each forward runs on "
         f"{2 * t.micro_batch_size} sequences (chosen and rejected concatenated along the batch, concatenated_inputs) "
         f"of seq_len = {t.seq_len} tokens (ORPOConfig.max_length; every sequence padded to it); logits over every "
         "position; the NLL term's cross-entropy over the chosen half; log-probabilities by TRL's Triton kernel "
         "(selective_log_softmax on CUDA)"),
        "ORPO reference model: none (the odds ratio compares the policy's own chosen and rejected log-probabilities)",
    ]
    return out + checkpointing_notes(s, "ORPO")
