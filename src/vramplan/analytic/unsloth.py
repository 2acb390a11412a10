"""Unsloth's patched causal LM in a LoRA/QLoRA step (``software.unsloth``; facts/unsloth.py ``UNSLOTH_ROWS``).

What changes against transformers' PEFT step (docs/conventions.md, Unsloth):

* the loss (``unsloth_loss_tensors``): the release's row, Unsloth's cross-entropy on the logits in the model's
  dtype (``fast-ce``) or Apple's Cut Cross-Entropy (``cce``, analytic/logits.py ``cce_bytes``);
* no PEFT k-bit preparation: Unsloth's ``prepare_model_for_kbit_training`` casts only the LoRA weights to fp32, so
  the embeddings, norms and LM head stay in the dtype they were loaded in (terms/context.py ``StepContext.kbit``);
* ``use_gradient_checkpointing="unsloth"`` is ``train.activation_offload: cpu`` with full checkpointing: each
  layer's input on the host, none on the GPU at the loss (terms/saved.py ``layer_saved``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic.logits import KernelLossTensors, cce_bytes
from vramplan.facts.unsloth import UNSLOTH_FAST_CE_MAX_FUSED, UnslothRow, unsloth_row
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div

__all__ = ["CCE_CAPABILITY_FIRST", "CCE_TORCH_FIRST", "UnslothHead", "fast_ce_bytes", "unsloth", "unsloth_cce_runs",
           "unsloth_eval_head_bytes", "unsloth_loss_note", "unsloth_loss_tensors", "unsloth_notes", "unsloth_row_of"]

# unsloth_zoo/loss_utils.py HAS_CUT_CROSS_ENTROPY: torch >= 2.4.0 (which brings triton >= 3.0) and, from unsloth-zoo
# a90bf5a, not a compute capability below 7.5 (``not ((major <= 7) and (minor < 5))``), taken for every release
CCE_TORCH_FIRST = (2, 4)
CCE_CAPABILITY_FIRST = (7, 5)


def unsloth(s: Scenario) -> bool:
    """A training step whose model Unsloth patched (``software.unsloth``)."""
    return s.task == "train" and s.software.unsloth is not None


def unsloth_row_of(s: Scenario, family: str) -> UnslothRow:
    v = s.software.unsloth_version
    assert v is not None
    return unsloth_row(v, family)


def unsloth_cce_runs(s: Scenario, family: str, tokens_per_batch: int, capability: tuple[int, int] | None) -> bool:
    """Whether the release's forward takes Cut Cross-Entropy for a batch of ``tokens_per_batch`` tokens: a ``cce``
    row, more tokens than its threshold, torch >= 2.4 (``software.torch``; unset: the current release) and a compute
    capability of at least 7.5 (unknown, as on an AMD GPU: taken as met)."""
    row = unsloth_row_of(s, family)
    tv = s.software.torch_version
    return (row.loss == "cce" and tokens_per_batch > row.cce_above_tokens
            and (tv is None or tv >= CCE_TORCH_FIRST) and (capability is None or capability >= CCE_CAPABILITY_FIRST))


@dataclass(frozen=True)
class UnslothHead:
    """What Unsloth's head and loss work in: the batch's positions, the vocabulary and hidden size on the rank, the
    bytes of the hidden states the head reads (``input_bytes``), of the compute dtype (``compute_bytes``), of the
    model's own dtype (``config_bytes``: ``config.torch_dtype``, what ``logits.to`` makes and the frozen head is held
    in), and whether accelerate's ``convert_outputs_to_fp32`` copies the returned logits to fp32 (the HF Trainer's
    forward under fp16/bf16 autocast: ``Accelerator.prepare_model``)."""

    tokens: int
    vocab: int
    hidden: int
    input_bytes: int
    compute_bytes: int
    config_bytes: int
    converted: bool


def fast_ce_bytes(h: UnslothHead) -> KernelLossTensors:
    """Unsloth's ``fast_cross_entropy_loss`` (facts/unsloth.py, the ``fast-ce`` rows) on ``h.tokens`` positions.

    * saved: the logits in the model's dtype (``Fast_CrossEntropyLoss`` keeps them; the labels are shifted instead
      of the logits, an int64 copy it keeps too) and the fp32 logsumexp per row;
    * forward extra: the fp32 losses per row, above 65,536 vocabulary entries the per-chunk logsumexp (rows x
      chunks, fp32) reduced by ``torch.logsumexp``, and the larger of the compute-dtype logits beside their
      ``.to(config.torch_dtype)`` copy (when the dtypes differ) and accelerate's fp32 copy of the returned logits
      (``convert_outputs_to_fp32``, alive until ``compute_loss`` returns the loss alone);
    * backward extra: the head's input gradient (tokens x hidden in the compute dtype); the kernel writes the logits'
      gradient into the logits themselves.

    Llama-3-8B (V 128,256, H 4,096), fp16 under autocast, 2 x 2,048 tokens: saved 4,096 x 128,256 x 2 + 8 x 4,096 +
    4 x 4,096 = 1,050,673,152 + 32,768 + 16,384 = 1,050,722,304; forward extra 4 x 4,096 + 4 x 4,096 x 2 chunks +
    4 x 4,096 x 128,256 (the fp32 copy) = 49,152 + 2,101,346,304 = 2,101,395,456; backward extra 4,096 x 4,096 x 2 =
    33,554,432."""
    t, v = h.tokens, h.vocab
    chunks = ceil_div(v, UNSLOTH_FAST_CE_MAX_FUSED)
    saved = t * v * h.config_bytes + 8 * t + 4 * t
    cast = t * v * h.compute_bytes if h.compute_bytes != h.config_bytes else 0
    fp32 = 4 * t * v if h.converted else 0
    forward_extra = 4 * t + (4 * t * chunks if chunks > 1 else 0) + max(cast, fp32)
    return KernelLossTensors(saved, forward_extra, t * h.hidden * h.compute_bytes)


def unsloth_loss_tensors(s: Scenario, family: str, h: UnslothHead, tokens_per_batch: int,
                         capability: tuple[int, int] | None) -> KernelLossTensors:
    """The release's loss for the step: ``cce_bytes`` with a frozen head in the model's dtype where Cut
    Cross-Entropy runs (it returns no logits, so nothing is converted), else ``fast_ce_bytes``."""
    if unsloth_cce_runs(s, family, tokens_per_batch, capability):
        return cce_bytes(h.tokens, h.vocab, h.hidden, h.input_bytes, h.compute_bytes, h.config_bytes,
                         head_trainable=False)
    return fast_ce_bytes(h)


def unsloth_eval_head_bytes(s: Scenario, family: str, h: UnslothHead, capability: tuple[int, int] | None) -> tuple[
        int, int]:
    """(largest head and loss bytes, logits returned) of one no-grad evaluation forward of ``h.tokens`` positions:
    Cut Cross-Entropy's forward (no logits) where it runs for that batch, else the ``fast-ce`` forward's tensors
    (the logits, the labels, the row statistics and the larger of the two copies), which returns the logits (in fp32
    after accelerate's conversion)."""
    if unsloth_cce_runs(s, family, h.tokens, capability):
        kt = cce_bytes(h.tokens, h.vocab, h.hidden, h.input_bytes, h.compute_bytes, h.config_bytes,
                       head_trainable=False)
        return kt.forward_peak, 0
    kt = fast_ce_bytes(h)
    return kt.forward_peak, h.tokens * h.vocab * (4 if h.converted else h.config_bytes)


def unsloth_loss_note(s: Scenario, family: str) -> str:
    """The loss assumption of an Unsloth step: its release's row for the family."""
    row = unsloth_row_of(s, family)
    t = s.train
    path = ("Apple's Cut Cross-Entropy (no logits; ml-cross-entropy 25.6.4 as read) when the micro-batch has more than "
            f"{row.cce_above_tokens:,} tokens, torch >= 2.4 and a compute capability of at least 7.5, else "
            if row.loss == "cce" else "")
    chosen = ("Cut Cross-Entropy for this step" if row.loss == "cce" and t.micro_batch_size * t.seq_len
              > row.cce_above_tokens else "")
    return (f"training loss as Unsloth {s.software.unsloth} computes it for {family}: {path}the logits in the model's "
            "dtype and its Triton cross-entropy, which keeps them and writes their gradient in place (accelerate's "
            "fp32 copy of the returned logits under fp16/bf16 autocast, until the loss is returned)"
            f"{' (' + chosen + ' where the GPU and torch allow)' if chosen else ''} ({row.source})")


def unsloth_notes(s: Scenario) -> list[str]:
    """What else an Unsloth step is modelled with, and what is not modelled."""
    t = s.train
    out = [(f"Unsloth {s.software.unsloth}: its own prepare_model_for_kbit_training casts only the LoRA weights to fp32 "
           "(embeddings, norms and LM head stay as loaded); its patched model drops the attention mask and turns "
           "use_cache off in training; the model is built by transformers (its release's buffers counted)")]
    if t.gradient_checkpointing in ("none", None):
        out.append("not modelled: Unsloth's fused LoRA kernels (fast_lora.py LoRA_MLP, LoRA_QKV, LoRA_W) save fewer "
                   "tensors per layer than PEFT's modules, counted here for every layer without checkpointing (an "
                   "overestimate)")
    else:
        out.append("Unsloth's fused LoRA kernels save fewer tensors than PEFT's modules: the checkpointed layer's "
                   "recompute is counted as PEFT's (one layer, an upper bound)")
    if s.software.trl is not None:
        out.append(f"not modelled: software.trl {s.software.trl} with Unsloth, which patches SFTTrainer "
                   "(unsloth_zoo); TRL's own loss rows (facts/trl.py) are not applied, Unsloth's loss is")
    return out
