"""The LM head's logits and the cross-entropy loss: vocabulary-sized tensors.

transformers >= 4.49 (``loss_utils.ForCausalLMLoss``) upcasts the logits to fp32,
pads the labels instead of slicing the logits, and calls ``F.cross_entropy``, whose
``log_softmax`` saves its fp32 output.  Per token, with V the vocabulary (divided by
tp under a vocabulary-parallel head) and c the logits' dtype bytes:

* forward, at the log_softmax: logits (c V) + fp32 logits (4 V, a copy when c < 4)
  + log_softmax output (4 V)  ->  (8 + c) V when c < 4, 8 V in fp32;
* after the loss, until the model output is dropped: logits (c V) + saved log-probs (4 V);
* backward at the loss: saved log-probs (4 V) + nll_loss's gradient (4 V) + the
  gradient of the fp32 logits (4 V)  ->  12 V.

Worked example, Llama-3-8B (V = 128,256), micro-batch 1 x 2048 tokens, bf16:
backward peak at the loss = 12 * 128,256 * 2048 = 3.15 GB, more than a tenth of an
80 GB card, which is why the logits dominate small-batch fine-tuning of large-vocab models.

Older releases (``software.transformers``, ``loss_release``; read off each release's wheel) copy the
shifted logits, ``shift_logits = logits[..., :-1, :].contiguous()``, over b (s - 1) tokens (V' below):

* ``shifted`` (4.46-4.48, and a family's first releases on ``self.loss_function``): ``ForCausalLMLoss``
  upcasts inside the loss, then copies the shift: c V + 4 V + 4 V' (shift) + 4 V' (log-probs) forward;
  backward 12 V' at the log_softmax, then the slice's zero-filled 4 V gradient beside the 4 V' one
  (``slice_backward``), the larger of the two;
* ``shifted_upcast_in_model`` (4.31-4.45 for Llama and the families whose causal-LM forward did
  ``logits = logits.float()``, ``Traits.upcasts_all_logits``): the model output is the fp32 logits (the
  head's c V output dies at the cast): 4 V + 4 V' + 4 V' forward, the same backward;
* ``shifted_no_upcast`` (Llama before 4.31; GPT-2, GPT-J, GPT-NeoX, Falcon, BLOOM, OPT before 4.49;
  StableLM before 4.46): ``CrossEntropyLoss`` on the shifted logits in their own dtype; autocast runs
  ``log_softmax`` in fp32 on a 4 V' copy (the autocast fp32 op list), so the log-probs have l = 4 bytes
  under autocast or in fp32 and c bytes in true half precision: c V + c V' + (4 V' under autocast) + l V'
  forward, 3 l V' backward.

``num_logits_to_keep`` (4.45) is 0 in training (all positions) and changes nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.spec.model import Traits

LossRelease = Literal["padded", "shifted", "shifted_upcast_in_model", "shifted_no_upcast"]

# the transformers releases the loss code changed in (release wheels, ``models/llama/modeling_llama.py``
# ``LlamaForCausalLM.forward`` and ``loss/loss_utils.py`` ``ForCausalLMLoss``)
LLAMA_UPCAST_SINCE = (4, 31)  # 4.30.2 had no ``logits = logits.float()``; 4.31.0 added it
PADDED_LABELS_SINCE = (4, 49)  # 4.48 ForCausalLMLoss still sliced the logits; 4.49 pads the labels


def loss_release(version: tuple[int, ...] | None, upcasts_in_model: bool,
                 loss_function_since: tuple[int, int]) -> LossRelease:
    """Which loss code a transformers release runs for a family (None: the current release).

    >>> loss_release((4, 45, 2), True, (4, 46)), loss_release((4, 47), True, (4, 46))
    ('shifted_upcast_in_model', 'shifted')
    >>> loss_release((4, 45), False, (4, 49)), loss_release(None, True, (4, 46))
    ('shifted_no_upcast', 'padded')
    """
    if version is None or version >= PADDED_LABELS_SINCE:
        return "padded"
    if version >= loss_function_since:
        return "shifted"
    if upcasts_in_model and version >= LLAMA_UPCAST_SINCE:
        return "shifted_upcast_in_model"
    return "shifted_no_upcast"


def family_loss_release(version: tuple[int, ...] | None, traits: Traits, framework: str,
                        encoder_only: bool = False) -> LossRelease:
    """``loss_release`` for a model's family under a framework: torchtitan and Lit-GPT (lightning) run their
    own model and loss, and an encoder's masked-LM loss shifts nothing, so they keep the current code."""
    if framework in ("torchtitan", "lightning") or encoder_only:
        return "padded"
    return loss_release(version, traits.upcasts_all_logits, traits.loss_function_since)


def loss_release_note(release: LossRelease, version: str | None, family: str, framework: str,
                      encoder_only: bool = False) -> str | None:
    """The assumption naming the loss code modelled (None with no ``software.transformers``)."""
    if version is None:
        return None
    if framework in ("torchtitan", "lightning") or encoder_only:
        whose = f"{framework} runs its own model and loss" if not encoder_only else "an encoder's masked-LM loss"
        return f"not modelled: software.transformers {version} for the training loss ({whose})"
    code = {
        "padded": "loss_utils.ForCausalLMLoss upcasts the logits to fp32 and pads the labels (>= 4.49)",
        "shifted": "loss_utils.ForCausalLMLoss (4.46-4.48) upcasts the logits to fp32, then copies the shifted "
                   "logits (shift_logits = logits[..., :-1, :].contiguous())",
        "shifted_upcast_in_model": f"the {family} causal-LM forward (4.31-4.45) keeps fp32 logits as its output "
                                   "(logits = logits.float()), then copies the shifted logits for CrossEntropyLoss",
        "shifted_no_upcast": f"the {family} causal-LM forward copies the shifted logits in their own dtype for "
                             "CrossEntropyLoss (no upcast; autocast runs log_softmax in fp32)",
    }[release]
    return f"training loss as transformers {version} computes it: {code} (analytic/logits.py)"


@dataclass(frozen=True)
class LossTensors:
    forward_peak: int  # transient at log_softmax in the forward pass
    saved_after_forward: int  # alive from the end of the forward pass into backward
    backward_peak: int  # transient at the start of the backward pass
    # the forward peak's allocations: (model output logits, copies freed before the backward, log-probs)
    forward_tensors: tuple[int, int, int] = (0, 0, 0)


def loss_bytes(tokens: int, vocab_on_rank: int, logits_bytes: int, softcap: bool = False,
               release: LossRelease = "padded", shifted_tokens: int | None = None,
               autocast: bool = True) -> LossTensors:
    """The loss's tensors for ``tokens`` positions (``shifted_tokens``: b (s - 1), for the older releases)."""
    v, c = tokens * vocab_on_rank, logits_bytes
    vs = (tokens if shifted_tokens is None else shifted_tokens) * vocab_on_rank
    cap = c * v if softcap else 0  # Gemma 2's tanh soft-capping saves its output
    upcast = 4 * v if c < 4 else 0  # ``logits.float()`` copies only when the logits are not fp32
    if release == "padded":
        saved = 4 * v + cap
        return LossTensors(c * v + upcast + saved, saved, 12 * v + cap, (c * v, upcast, saved))
    if release == "shifted":
        saved = 4 * vs + cap
        return LossTensors(c * v + upcast + 4 * vs + saved, saved, max(12 * vs, 4 * vs + 4 * v) + cap,
                           (c * v, upcast + 4 * vs, saved))
    if release == "shifted_upcast_in_model":
        saved = 4 * vs + cap
        # the head's output dies at the cast, before the shifted copy is made
        tensors = (4 * v, 4 * vs, saved) if 8 * vs >= upcast else (c * v if c < 4 else 0, 4 * v, saved)
        return LossTensors(sum(tensors), saved, max(12 * vs, 4 * vs + 4 * v) + cap, tensors)
    lp = 4 if autocast or c == 4 else c
    copy = 4 * vs if autocast and c < 4 else 0  # autocast's fp32 input to log_softmax
    saved = lp * vs + cap
    return LossTensors(c * v + c * vs + copy + saved, saved, max(3 * lp * vs, c * vs + c * v) + cap,
                       (c * v, c * vs + copy, saved))
