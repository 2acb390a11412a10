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

from vramplan.analytic.logits import KernelLossTensors, cce_bytes
from vramplan.facts.unsloth import UNSLOTH_FAST_CE_MAX_FUSED, UnslothRow, unsloth_row
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div

__all__ = ["CCE_CAPABILITY_FIRST", "CCE_TORCH_FIRST", "fast_ce_bytes", "unsloth", "unsloth_cce_runs",
           "unsloth_loss_note", "unsloth_loss_tensors", "unsloth_notes", "unsloth_row_of"]

# unsloth_zoo/loss_utils.py HAS_CUT_CROSS_ENTROPY: torch >= 2.4.0 (which brings triton >= 3.0) and not a compute
# capability below 7.5 (``not ((major <= 7) and (minor < 5))``)
CCE_TORCH_FIRST = (2, 4)
CCE_CAPABILITY_FIRST = (7, 5)


def unsloth(s: Scenario) -> bool:
    """A training step whose model Unsloth patched (``software.unsloth``)."""
    return s.task == "train" and s.software.unsloth is not None


def unsloth_row_of(s: Scenario) -> UnslothRow:
    v = s.software.unsloth_version
    assert v is not None
    return unsloth_row(v)


def unsloth_cce_runs(s: Scenario, tokens_per_micro_batch: int, capability: tuple[int, int] | None) -> bool:
    """Whether the release's forward takes Cut Cross-Entropy: a ``cce`` row, more tokens than its threshold, torch
    >= 2.4 (``software.torch``; unset: the current release) and a compute capability of at least 7.5 (unknown, as
    on an AMD GPU: taken as met)."""
    row = unsloth_row_of(s)
    tv = s.software.torch_version
    return (row.loss == "cce" and tokens_per_micro_batch > row.cce_above_tokens
            and (tv is None or tv >= CCE_TORCH_FIRST) and (capability is None or capability >= CCE_CAPABILITY_FIRST))


def fast_ce_bytes(tokens: int, vocab: int, hidden: int, logits_bytes: int) -> KernelLossTensors:
    """Unsloth's ``fast_cross_entropy_loss`` (facts/unsloth.py, the ``fast-ce`` row) on ``tokens`` positions.

    * saved: the logits in the model's dtype (``Fast_CrossEntropyLoss`` keeps them; labels are shifted instead of
      the logits, so no copy) and the fp32 logsumexp per row;
    * forward extra: the fp32 losses per row, and above 65,536 vocabulary entries the per-chunk logsumexp
      (rows x chunks, fp32) reduced by ``torch.logsumexp``;
    * backward extra: the head's input gradient (tokens x hidden in the logits' dtype); the kernel writes the logits'
      gradient into the logits themselves.

    Llama-3-8B (V 128,256, H 4,096), fp16, 2 x 2,048 tokens: saved 4,096 x 128,256 x 2 + 4 x 4,096 =
    1,050,673,152 + 16,384 = 1,050,689,536; forward extra 4 x 4,096 + 4 x 4,096 x 2 chunks = 49,152; backward
    extra 4,096 x 4,096 x 2 = 33,554,432."""
    chunks = ceil_div(vocab, UNSLOTH_FAST_CE_MAX_FUSED)
    saved = tokens * vocab * logits_bytes + 4 * tokens
    forward_extra = 4 * tokens + (4 * tokens * chunks if chunks > 1 else 0)
    return KernelLossTensors(saved, forward_extra, tokens * hidden * logits_bytes)


def unsloth_loss_tensors(s: Scenario, tokens: int, tokens_per_micro_batch: int, vocab: int, hidden: int,
                         input_bytes: int, logits_bytes: int, weight_bytes: int,
                         capability: tuple[int, int] | None) -> KernelLossTensors:
    """The release's loss (``fast_ce_bytes`` or ``cce_bytes`` with a frozen head: PEFT only)."""
    if unsloth_cce_runs(s, tokens_per_micro_batch, capability):
        return cce_bytes(tokens, vocab, hidden, input_bytes, logits_bytes, weight_bytes, head_trainable=False)
    return fast_ce_bytes(tokens, vocab, hidden, logits_bytes)


def unsloth_loss_note(s: Scenario) -> str:
    """The loss assumption of an Unsloth step: its release's row."""
    row = unsloth_row_of(s)
    t = s.train
    path = ("Apple's Cut Cross-Entropy (no logits; ml-cross-entropy 25.6.4 as read) when the micro-batch has more than "
            f"{row.cce_above_tokens:,} tokens, torch >= 2.4 and a compute capability of at least 7.5, else "
            if row.loss == "cce" else "")
    chosen = ("Cut Cross-Entropy for this step" if row.loss == "cce" and t.micro_batch_size * t.seq_len
              > row.cce_above_tokens else "")
    return (f"training loss as Unsloth {s.software.unsloth} computes it: {path}the logits in the model's dtype (no "
            "fp32 copy) and its Triton cross-entropy, which keeps them and writes their gradient in place"
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
