"""TRL's SFTTrainer: what its ``compute_loss`` adds to, or takes from, the HF Trainer's loss, by release
(``facts/trl.py`` ``SFT_LOSS_ROWS``).

A training job is a TRL SFT job when ``train.objective`` is ``sft``, ``software.trl`` names the release, the framework
is the HF Trainer (SFTTrainer subclasses it) and ``train.loss`` is ``standard`` (Liger's kernel replaces the logits
and TRL then skips its logits metrics).  Without ``software.trl`` the step is the HF Trainer's, as before.

* ``logits`` rows (0.9-1.6): the model's forward and loss are the HF Trainer's (``terms/loss.py`` ``loss``); after
  the loss, still in ``compute_loss`` and before the backward, the token-accuracy metric copies the shifted logits
  (``metrics_extra_bytes``).  At that moment the logits ``outputs`` holds, the loss's saved log-probabilities and the
  copies are alive; the loss's fp32 upcast (``logits.float()``) is already freed, so one copy of half logits stays
  below the loss's own peak (2 + 4 + 2 against 2 + 4 + 4 bytes per position and vocabulary entry) and only fp32
  logits, two copies (1.3-1.5), 0.15.0's gather over the data-parallel ranks or 0.22's per-sequence entropy can
  exceed it.  The excess is a record of its own (``logits.trl_sft_metrics``) at the loss moment; the allocator's
  event stream does not replay it.
* ``chunked-nll`` (1.7-1.14): ``chunked_nll_loss_tensors``.
* ``fused-head`` (1.15 on): TRL's fused LM head (analytic/fused_head.py) with the outputs SFTTrainer asks for.
"""

from __future__ import annotations

from vramplan.analytic.fused_head import fused_loss_tensors
from vramplan.analytic.logits import KernelLossTensors, LossTensors
from vramplan.facts.trl import CHUNKED_NLL_CAST_FROM, SFT_READ_AT, SftLossRow, release_text, sft_loss_row
from vramplan.spec.scenario import Scenario

__all__ = ["CHUNKED_NLL_ROWS", "SFT_FUSED_OUTPUT_BYTES", "chunked_nll_fp32_head", "chunked_nll_loss_tensors",
           "metrics_extra_bytes",
           "sft_fused_loss_tensors", "sft_loss_note", "sft_row", "trl_sft"]

# trl v1.7.0-1.14.0 sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE: positions per chunk of the patched LM head
CHUNKED_NLL_ROWS = 256
# SFTTrainer's fused-head outputs (log_probs, entropy: fp32; is_top1: bool) and compute_loss's per_token_loss =
# -outputs.log_probs (fp32): bytes per position
SFT_FUSED_OUTPUT_BYTES = 4 + 4 + 1 + 4


def trl_sft(s: Scenario) -> bool:
    """The step is TRL's SFTTrainer's at ``software.trl`` (module docstring)."""
    return (s.task == "train" and s.train.objective == "sft" and s.software.trl is not None
            and s.effective_framework == "hf-trainer" and s.train.loss == "standard")


def sft_row(s: Scenario) -> SftLossRow:
    """The SFTTrainer row of ``software.trl``."""
    return sft_loss_row(s.software.trl_version)


def chunked_nll_fp32_head(s: Scenario) -> bool:
    """``chunked_nll`` copies the head to fp32 for each chunk before ``CHUNKED_NLL_CAST_FROM`` (facts/trl.py)."""
    return (s.software.trl_version or CHUNKED_NLL_CAST_FROM) < CHUNKED_NLL_CAST_FROM


def metrics_extra_bytes(lt: LossTensors, positions: int, shifted: int, sequence: int, vocab: int, logits_bytes: int,
                        batch: int, world: int, row: SftLossRow) -> int:
    """How far the metrics' moment of a ``logits`` row exceeds the loss's forward peak (0 when it does not).

    ``positions``: the logits' positions on this rank (b s); ``shifted``: b (s - 1); ``sequence``: one sequence's
    positions (s); ``logits_bytes``: the bytes of an element of ``outputs.logits`` (d); ``lt``: the loss's tensors
    (analytic/logits.py ``loss_bytes``: the model's logits, the copies freed before the backward, the saved log-probs).

    moment = outputs.logits (positions V d) + the saved log-probs + the larger of the entropy's one-sequence
    transient (3 s V d, 0.22) and the copies (``copies`` x b (s - 1) V d when b > 1), plus 0.15.0's gather (the
    world's copies on every rank, ``world`` x b (s - 1) V d, beside its own copy)."""
    held = positions * vocab * logits_bytes
    saved = lt.saved_after_forward
    copy = shifted * vocab * logits_bytes if batch > 1 else 0
    entropy = 3 * sequence * vocab * logits_bytes if row.entropy_rows else 0
    gathered = world * shifted * vocab * logits_bytes if row.gather and world > 1 else 0
    moment = held + saved + max(entropy, row.copies * copy + gathered)
    return max(0, moment - lt.forward_peak)


def chunked_nll_loss_tensors(shifted: int, vocab: int, hidden: int, hidden_bytes: int, weight_bytes: int,
                             head_trainable: bool, fp32_weight_copy: bool) -> KernelLossTensors:
    """``loss_type='chunked_nll'`` (trl v1.7.0-1.14.0 ``_patch_chunked_ce_lm_head``): the head over the ``shifted`` =
    b (s - 1) positions in chunks of 256 under non-reentrant checkpointing, no logits returned, as (saved to the
    backward, forward extra, backward extra).

    * saved: the hidden states reordered for the chunks (``hidden[order]``, v1.8 on; ``hidden[valid]`` before, the
      same count when every position is labelled), b (s - 1) H x; the checkpoint keeps only its inputs;
    * forward, one chunk at a time: its fp32 logits, ``log_softmax``, ``exp`` and their product for the entropy
      (4 x 256 V x 4) and the head's weight as the matmul reads it: before 1.13 ``w.float()`` (an fp32 copy, V H 4,
      when the head is not fp32), from 1.13 ``w.to(h.dtype)`` (V H x when the dtypes differ);
    * backward, one chunk at a time: the chunk recomputed (the same transient), its logits' gradient (256 V 4), the
      weight copy's gradient in fp32 (V H 4, a trainable head) and the hidden states' gradient (b (s - 1) H 4).

    The chunk's logits are fp32 whatever the autocast dtype (``.float()``), so the compute dtype does not enter.  Read
    from the source (the chunk's transient is a count of the tensors the code makes, not a measurement)."""
    chunk = min(shifted, CHUNKED_NLL_ROWS)
    if fp32_weight_copy:
        w_copy = vocab * hidden * 4 if weight_bytes != 4 else 0
    else:
        w_copy = vocab * hidden * hidden_bytes if weight_bytes != hidden_bytes else 0
    transient = 4 * chunk * vocab * 4 + w_copy
    saved = shifted * hidden * hidden_bytes
    grad_w = vocab * hidden * 4 if head_trainable else 0
    backward = transient + chunk * vocab * 4 + grad_w + shifted * hidden * 4
    return KernelLossTensors(saved=saved, forward_extra=transient, backward_extra=backward)


def sft_fused_loss_tensors(shifted: int, vocab: int, hidden: int, hidden_bytes: int, compute_bytes: int,
                           weight_bytes: int, head_trainable: bool) -> KernelLossTensors:
    """SFTTrainer's fused head (trl 1.15.0 on): every shifted position labelled (N = b (s - 1)), the outputs
    ``log_probs``, ``entropy``, ``is_top1`` and the per-token loss (``SFT_FUSED_OUTPUT_BYTES``), no reference."""
    return fused_loss_tensors(shifted, shifted, SFT_FUSED_OUTPUT_BYTES, vocab, hidden, hidden_bytes, compute_bytes,
                              weight_bytes, head_trainable)


def sft_loss_note(s: Scenario) -> str:
    """The report's assumption for a TRL SFT job."""
    row = sft_row(s)
    head = (f"loss as TRL {s.software.trl} SFTTrainer computes it (its row from {release_text(row.first)}, "
            f"facts/trl.py SFT_LOSS_ROWS, read at {SFT_READ_AT}; default loss_type")
    if row.path == "fused-head":
        return (f"{head} nll): the fused LM head (add_fused_lm_head, outputs log_probs, entropy, is_top1) projects the "
                "labelled positions in tiles of 4,096 x 32,768 and never makes the logits; every position assumed "
                "labelled")
    if row.path == "chunked-nll":
        copy = ("an fp32 copy of the head's weight (w.float())" if chunked_nll_fp32_head(s)
                else "the head cast to the hidden dtype")
        return (f"{head} chunked_nll): the LM head in chunks of 256 positions under checkpointing, no full logits; "
                f"per chunk its fp32 logits, log-softmax and entropy terms and {copy}; loss_type='nll' or "
                "use_liger_kernel is not read (set train.loss for Liger)")
    parts = ["the HF Trainer's loss"]
    if row.copies:
        parts.append(f"then {row.copies} copy{'ies' if row.copies > 1 else ''} of the shifted logits for the token "
                     "accuracy (outputs.logits[..., :-1, :].contiguous(), a view when micro_batch_size is 1) "
                     "before the backward")
    if row.gather:
        parts.append("gathered over the data-parallel ranks (accelerator.gather_for_metrics)")
    if row.entropy_rows:
        parts.append("the entropy computed one sequence at a time (log_softmax, exp and their product)")
    return f"{head} nll): " + ", ".join(parts)
