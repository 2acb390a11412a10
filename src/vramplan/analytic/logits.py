"""The LM head's logits and the cross-entropy loss: vocabulary-sized tensors.

transformers >= 4.46 (``loss_utils.ForCausalLMLoss``) upcasts the logits to fp32,
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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossTensors:
    forward_peak: int  # transient at log_softmax in the forward pass
    saved_after_forward: int  # alive from the end of the forward pass into backward
    backward_peak: int  # transient at the start of the backward pass


def loss_bytes(tokens: int, vocab_on_rank: int, logits_bytes: int, softcap: bool = False) -> LossTensors:
    v = tokens * vocab_on_rank
    upcast = 4 if logits_bytes < 4 else 0
    cap = logits_bytes * v if softcap else 0  # Gemma 2's tanh soft-capping saves its output
    forward = (logits_bytes + upcast + 4) * v + cap
    saved = 4 * v + cap
    backward = 12 * v + cap
    return LossTensors(forward, saved, backward)
