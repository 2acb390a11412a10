"""How Unsloth's patched causal LM computes its loss, by release and family, as data (``software.unsloth``).

Unsloth's ``FastLanguageModel`` replaces the causal LM's ``forward`` of the families its loader dispatches
(``unsloth/models/loader.py``) with its own: ``unsloth/models/llama.py`` ``CausalLM_fast_forward`` for Llama, Qwen2,
Gemma, Gemma 2 and Qwen3, ``unsloth/models/mistral.py`` ``MistralForCausalLM_fast_forward`` for Mistral, whose loss
path changed later.  One row per release where the path changed; each row holds from its ``first`` release until
the next row's.  Read from the PyPI wheels from 2024.8 on (``pip download unsloth==X --no-deps``: 2024.8, 2024.11.7,
2024.11.8, 2024.12.4, 2024.12.5, 2025.2.14, 2025.2.15, 2025.3.1, 2025.3.9-2025.3.19, 2025.4.1-2025.4.4, 2025.8.4,
2025.8.5) and, before 2024.8 (Unsloth was installed from git then), from the git history of unslothai/unsloth, whose
``__version__`` string names the release a commit belongs to:

* ``fast-ce`` (2023.12 on): ``logits = self.lm_head(hidden_states.to(lm_head.dtype))``, ``logits.to(config.torch_dtype)``
  (no fp32 copy in the forward), the labels shifted instead of the logits (an int64 copy), then
  ``fast_cross_entropy_loss`` (``unsloth/kernels/cross_entropy_loss.py`` ``Fast_CrossEntropyLoss``): the forward
  saves the logits, the labels and an fp32 logsumexp per row (per row and 65,536-column chunk above a 65,536-entry
  vocabulary, ``MAX_FUSED_SIZE``); the backward writes the logits' gradient into the logits themselves (``return
  logits, None, None``) -- read at commit dde6a0f (2024.5) and in the 2024.8 wheel.
* ``cce``: ``if HAS_CUT_CROSS_ENTROPY and labels is not None`` the forward calls unsloth-zoo's
  ``fused_linear_cross_entropy``, Apple's Cut Cross-Entropy (``cut_cross_entropy.linear_cross_entropy``: no
  logits), which unsloth-zoo declares a dependency of and enables with torch >= 2.4 and triton >= 3.0 (and, from
  unsloth-zoo commit a90bf5a of 2024-11-28, a compute capability of at least 7.5: ``unsloth_zoo/loss_utils.py``).
  llama.py from the 2024.11.8 wheel (not in 2024.11.7), only above 1,024 tokens per micro-batch from the 2024.12.5
  wheel (``if bsz*q_len <= 1024: RETURN_LOGITS = True``: the ``fast-ce`` path below); mistral.py from the 2025.3.1
  wheel (not in 2025.2.15), with the same threshold.
* ``unmodelled`` (2025.8.5 on): llama.py calls ``unsloth_fused_ce_loss`` (unsloth-zoo
  ``fused_losses/cross_entropy_loss.py``), whose chunk count comes from the GPU memory free at run time
  (``target_gb = min(free_gb, 4.0)``); mistral.py was not read past 2025.8.5: both refused.

The loader dispatches Llama and Mistral from 2023.12, Gemma from 2024.2 (git: gemma.py first at ``__version__``
2024.2), Qwen2 from 2024.5, Gemma 2 from 2024.7 and Qwen3 from the 2025.4.2 wheel (not in 2025.4.1); Cohere and
Granite went to ``FastModel`` in 2025.3 (their dispatch commented out in the 2025.3.19 loader): not modelled.

``use_gradient_checkpointing="unsloth"`` (``Unsloth_Offloaded_Gradient_Checkpointer``, ``unsloth/models/_utils.py``,
git commit 4474e4b of 2024-04-08, two days after ``__version__`` became "2024.4"): each decoder layer's input is copied
to the host (``hidden_states.to("cpu", non_blocking = True)``, a pinned copy) and the layer runs under
``torch.no_grad()``; the backward brings the input back, reruns the layer with gradients and backpropagates through
it.  Unsloth's own ``prepare_model_for_kbit_training`` (``unsloth/models/_utils.py``, 2024.5) casts only the LoRA
weights to fp32 and freezes everything else in the dtype it was loaded in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["UNSLOTH_FAMILIES", "UNSLOTH_FAST_CE_MAX_FUSED", "UNSLOTH_OFFLOADED_CKPT_FIRST", "UNSLOTH_ROWS",
           "UnslothLoss", "UnslothRow", "forward_of", "release3", "unsloth_row"]

UnslothLoss = Literal["fast-ce", "cce", "unmodelled"]


@dataclass(frozen=True)
class UnslothRow:
    first: tuple[int, int, int]
    loss: UnslothLoss
    # Cut Cross-Entropy only for a micro-batch of more than this many tokens (0: any); ``cce`` rows only
    cce_above_tokens: int
    source: str


# by the forward that computes the loss: llama.py's CausalLM_fast_forward, mistral.py's own
UNSLOTH_ROWS: dict[str, tuple[UnslothRow, ...]] = {
    "llama": (
        UnslothRow((2023, 12, 0), "fast-ce", 0,
                   "unsloth dde6a0f (2024.5) / 2024.8 wheel models/llama.py CausalLM_fast_forward: logits.to("
                   "config.torch_dtype), fast_cross_entropy_loss(logits, shift_labels); kernels/cross_entropy_loss.py "
                   "Fast_CrossEntropyLoss ctx.save_for_backward(logits, logsumexp, labels), backward returns logits"),
        UnslothRow((2024, 11, 8), "cce", 0,
                   "unsloth 2024.11.8 wheel models/llama.py: if HAS_CUT_CROSS_ENTROPY and labels is not None: "
                   "fused_linear_cross_entropy(hidden_states, lm_weight=lm_head, labels, ...)"),
        UnslothRow((2024, 12, 5), "cce", 1024,
                   "unsloth 2024.12.5 wheel models/llama.py: if bsz*q_len <= 1024: RETURN_LOGITS = True (the fast-ce "
                   "path), Cut Cross-Entropy above"),
        UnslothRow((2025, 8, 5), "unmodelled", 0,
                   "unsloth 2025.8.5 wheel models/llama.py unsloth_fused_ce_loss (unsloth-zoo "
                   "fused_losses/cross_entropy_loss.py: chunks from the free GPU memory, target min(free_gb, 4.0))"),
    ),
    "mistral": (
        UnslothRow((2023, 12, 0), "fast-ce", 0,
                   "unsloth dde6a0f (2024.5) / 2024.8-2025.2.15 wheels models/mistral.py "
                   "MistralForCausalLM_fast_forward: logits.to(config.torch_dtype), fast_cross_entropy_loss"),
        UnslothRow((2025, 3, 1), "cce", 1024,
                   "unsloth 2025.3.1 wheel models/mistral.py: HAS_CUT_CROSS_ENTROPY above 1,024 tokens per micro-batch"),
        UnslothRow((2025, 8, 5), "unmodelled", 0, "unsloth models/mistral.py not read from 2025.8.5"),
    ),
}

# the first release each family is dispatched to a patched model (unsloth/models/loader.py)
UNSLOTH_FAMILIES: dict[str, tuple[int, int, int]] = {
    "llama": (2023, 12, 0), "mistral": (2023, 12, 0), "gemma": (2024, 2, 0), "qwen2": (2024, 5, 0),
    "gemma2": (2024, 7, 0), "qwen3": (2025, 4, 2)}

# the first release with use_gradient_checkpointing="unsloth" (Unsloth_Offloaded_Gradient_Checkpointer, commit 4474e4b)
UNSLOTH_OFFLOADED_CKPT_FIRST = (2024, 4, 0)

# Fast_CrossEntropyLoss's chunk of the vocabulary (unsloth/kernels/utils.py MAX_FUSED_SIZE, 2024.5): a vocabulary above
# it keeps a logsumexp per row and chunk
UNSLOTH_FAST_CE_MAX_FUSED = 65536


def release3(version: tuple[int, ...]) -> tuple[int, int, int]:
    """A release as (year, month, patch): "2024.4" is 2024.4.0, so that it compares equal to the rows' firsts."""
    v = (*version, 0, 0, 0)
    return v[0], v[1], v[2]


def forward_of(family: str) -> str:
    """The forward that computes a family's loss: mistral.py's for Mistral, llama.py's for the others."""
    return "mistral" if family == "mistral" else "llama"


def unsloth_row(version: tuple[int, ...], family: str = "llama") -> UnslothRow:
    """The row of ``version`` for ``family`` (a release before the first row takes the first)."""
    v = release3(version)
    table = UNSLOTH_ROWS[forward_of(family)]
    rows = [r for r in table if r.first <= v]
    return rows[-1] if rows else table[0]
