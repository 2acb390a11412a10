"""How Unsloth's patched causal LM computes its loss, by release, as data (``software.unsloth``).

Unsloth's ``FastLanguageModel`` replaces the causal LM's ``forward`` of the families it supports with its own
(``unsloth/models/llama.py`` ``CausalLM_fast_forward``, which Qwen2, Gemma, Gemma 2, Cohere, Granite and Qwen3 reuse;
``unsloth/models/mistral.py`` ``MistralForCausalLM_fast_forward``, the same logits and loss).  One row per release
where the loss path changed; each row holds from its ``first`` release until the next row's.  Read from the git
history of unslothai/unsloth (its ``__version__`` in ``unsloth/models/_utils.py`` at each commit) and of
unslothai/unsloth-zoo:

* ``fast-ce`` (2023.12 on): ``logits = self.lm_head(hidden_states.to(lm_head.dtype))``, ``logits.to(config.torch_dtype)``
  (no fp32 copy), labels shifted instead of the logits (``torch.hstack((labels[..., 1:], extra_ignored_labels))``),
  then ``fast_cross_entropy_loss`` (``unsloth/kernels/cross_entropy_loss.py`` ``Fast_CrossEntropyLoss``): the
  forward saves the logits and an fp32 logsumexp per row (per row and 65,536-column chunk above a 65,536-entry
  vocabulary, ``MAX_FUSED_SIZE``), the backward writes the logits' gradient into the logits themselves (``return
  logits, None, None``) -- read at commit dde6a0f (2024.5).
* ``cce`` (2024.11.8 on, commit ddf118a "Vision support"): ``if HAS_CUT_CROSS_ENTROPY and labels is not None``
  the forward calls unsloth-zoo's ``fused_linear_cross_entropy``, Apple's Cut Cross-Entropy
  (``cut_cross_entropy.linear_cross_entropy``: no logits), which unsloth-zoo declares a dependency of and enables
  with torch >= 2.4, triton >= 3.0 and a compute capability of at least 7.5 (``unsloth_zoo/loss_utils.py``); from
  2024.12.4 (commit b9fe258) only when the micro-batch has more than 1,024 tokens (``if bsz*q_len <= 1024:
  RETURN_LOGITS = True``), the ``fast-ce`` path otherwise.
* ``fused-ce`` (2025.8.5 on, commit 806bee2): ``unsloth_fused_ce_loss`` (unsloth-zoo
  ``fused_losses/cross_entropy_loss.py``), whose chunk count comes from the GPU memory free at run time
  (``target_gb = min(free_gb, 4.0)``): not modelled, refused with the nearest modelled release.

``use_gradient_checkpointing="unsloth"`` (``Unsloth_Offloaded_Gradient_Checkpointer``, ``unsloth/models/_utils.py``,
first in 2024.4, commit 4474e4b): each decoder layer's input is copied to the host (``hidden_states.to("cpu",
non_blocking = True)``) and the layer runs under ``torch.no_grad()``; the backward brings the input back, reruns
the layer with gradients and backpropagates through it.  Unsloth's own ``prepare_model_for_kbit_training``
(``unsloth/models/_utils.py``, 2024.5) casts only the LoRA weights to fp32 and freezes everything else in the
dtype it was loaded in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["UNSLOTH_FAMILIES", "UNSLOTH_FAST_CE_MAX_FUSED", "UNSLOTH_OFFLOADED_CKPT_FIRST", "UNSLOTH_ROWS",
           "UnslothLoss", "UnslothRow", "release3", "unsloth_row"]

UnslothLoss = Literal["fast-ce", "cce", "fused-ce"]


@dataclass(frozen=True)
class UnslothRow:
    first: tuple[int, int, int]
    loss: UnslothLoss
    # Cut Cross-Entropy only for a micro-batch of more than this many tokens (0: any); ``cce`` rows only
    cce_above_tokens: int
    source: str


UNSLOTH_ROWS: tuple[UnslothRow, ...] = (
    UnslothRow((2023, 12, 0), "fast-ce", 0,
               "unsloth dde6a0f (2024.5) models/llama.py CausalLM_fast_forward: logits.to(config.torch_dtype), "
               "fast_cross_entropy_loss(logits, shift_labels); kernels/cross_entropy_loss.py Fast_CrossEntropyLoss "
               "ctx.save_for_backward(logits, logsumexp, labels), backward returns logits (in place)"),
    UnslothRow((2024, 11, 8), "cce", 0,
               "unsloth ddf118a (2024.11.8) models/llama.py: if HAS_CUT_CROSS_ENTROPY and labels is not None: "
               "fused_linear_cross_entropy(hidden_states, lm_weight=lm_head, labels, ...)"),
    UnslothRow((2024, 12, 4), "cce", 1024,
               "unsloth b9fe258 (2024.12.4) models/llama.py: if bsz*q_len <= 1024: RETURN_LOGITS = True (the "
               "fast-ce path), Cut Cross-Entropy above"),
    UnslothRow((2025, 8, 5), "fused-ce", 0,
               "unsloth 806bee2 (2025.8.5) models/llama.py unsloth_fused_ce_loss (unsloth-zoo "
               "fused_losses/cross_entropy_loss.py: chunks from the free GPU memory, target min(free_gb, 4.0))"),
)

# the first release with use_gradient_checkpointing="unsloth" (Unsloth_Offloaded_Gradient_Checkpointer, commit 4474e4b)
UNSLOTH_OFFLOADED_CKPT_FIRST = (2024, 4, 0)

# Fast_CrossEntropyLoss's chunk of the vocabulary (unsloth/kernels/utils.py MAX_FUSED_SIZE, 2024.5): a vocabulary above
# it keeps a logsumexp per row and chunk
UNSLOTH_FAST_CE_MAX_FUSED = 65536

# the model types whose causal LM forward Unsloth replaces with the loss above (unsloth/models/*.py): llama.py's
# CausalLM_fast_forward (llama, qwen2, gemma, gemma2, cohere, granite, qwen3), mistral.py's own
UNSLOTH_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "cohere", "granite"})


def release3(version: tuple[int, ...]) -> tuple[int, int, int]:
    """A release as (year, month, patch): "2024.4" is 2024.4.0, so that it compares equal to the rows' firsts."""
    v = (*version, 0, 0, 0)
    return v[0], v[1], v[2]


def unsloth_row(version: tuple[int, ...]) -> UnslothRow:
    """The row of ``version`` (a release before the first row takes the first)."""
    v = release3(version)
    rows = [r for r in UNSLOTH_ROWS if r.first <= v]
    return rows[-1] if rows else UNSLOTH_ROWS[0]
