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
* ``unshifted_no_upcast`` (an encoder-decoder model's loss in every release: ``CrossEntropyLoss`` on ``lm_logits`` in
  their own dtype, labels aligned with the decoder's positions): ``shifted_no_upcast`` without the shifted copy:
  c V + (4 V under autocast) + l V forward, 3 l V backward;
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

from vramplan.facts.torchtune import LABEL_SHIFT_SINCE
from vramplan.spec.model import Traits

LossRelease = Literal["padded", "shifted", "shifted_upcast_in_model", "shifted_no_upcast", "torchtune_shifted",
                      "unshifted_no_upcast"]

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
                        encoder_only: bool = False, torchtune: tuple[int, ...] | None = None) -> LossRelease:
    """``loss_release`` for a model's family under a framework: torchtitan and Lit-GPT (lightning) run their
    own model and loss, and an encoder's masked-LM loss shifts nothing, so they keep the current code;
    torchtune's recipes follow its release (``torchtune_loss_release``)."""
    if framework == "torchtune" and not encoder_only:
        return torchtune_loss_release(torchtune)
    if framework in ("torchtitan", "lightning", "torchtune", "megatron") or encoder_only:
        return "padded"
    return loss_release(version, traits.upcasts_all_logits, traits.loss_function_since)


TORCHTUNE_LOSS_NOTES: dict[str, str] = {
    "torchtune_shifted": "torchtune before v0.3.0: the model returns fp32 logits (output(h).float()), the recipe copies "
                         "the shifted logits (logits[..., :-1, :].contiguous()) and keeps that copy bound through the "
                         "backward beside CrossEntropyLoss's log-probs (recipes/lora_finetune_single_device.py v0.2.0)",
    "padded": "torchtune from v0.3.0 with nn.CrossEntropyLoss: fp32 logits (output(h).float()), labels shifted with the "
              "ignore index, the logits deleted before the backward (recipes/*_single_device.py _loss_step, v0.6.1); "
              "its configs name CEWithChunkedOutputLoss (train.loss: chunked)",
}


def torchtune_loss_release(version: tuple[int, ...] | None) -> LossRelease:
    """The loss code of a torchtune release's recipes (None: v0.6.1) with ``nn.CrossEntropyLoss``.

    * v0.1-v0.2 (``torchtune_shifted``): ``TransformerDecoder.forward`` returns ``self.output(h).float()`` and the
      recipe's ``train`` (recipes/lora_finetune_single_device.py v0.2.0) rebinds ``logits =
      logits[..., :-1, :].contiguous()``, then ``loss.backward()`` with that copy still bound;
    * from v0.3.0 (``padded``): the labels are shifted (``torch.hstack`` with the ignore index), the fp32 logits
      only reshaped, and ``_loss_step`` deletes them before the backward (v0.6.1: ``del logits``): the current
      transformers row.

    >>> torchtune_loss_release((0, 2, 1)), torchtune_loss_release(None)
    ('torchtune_shifted', 'padded')
    """
    return "torchtune_shifted" if version is not None and version < LABEL_SHIFT_SINCE else "padded"


def loss_release_note(release: LossRelease, version: str | None, family: str, framework: str,
                      encoder_only: bool = False) -> str | None:
    """The assumption naming the loss code modelled (None with no ``software.transformers``)."""
    if version is None:
        return None
    if framework in ("torchtitan", "lightning", "torchtune", "megatron") or encoder_only:
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
        "torchtune_shifted": TORCHTUNE_LOSS_NOTES["torchtune_shifted"],
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
    if release == "torchtune_shifted":
        # torchtune v0.1-v0.2: the fp32 model output (c V beside it while ``.float()`` copies) dies when the recipe
        # rebinds ``logits`` to its shifted copy, which stays bound through the backward beside the log-probs;
        # at the loss's backward the log-probs' gradient and nll_loss's (4 V' each) join them, then
        # ``slice_backward`` zero-fills a 4 V gradient beside the copy and the 4 V' incoming gradient
        kept, logp = 4 * vs, 4 * vs + cap
        cast = c * v + 4 * v if c < 4 else 4 * v
        # the forward's record is the largest of the cast, the shifted copy beside the fp32 output, and the
        # log_softmax beside the kept copy: (copy, what the larger earlier point adds, log-probs)
        extra = max(0, cast - kept - logp, 4 * v + 4 * vs - kept - logp)
        return LossTensors(kept + extra + logp, kept + logp, max(16 * vs, 8 * vs + 4 * v) + cap, (kept, extra, logp))
    if release == "shifted_upcast_in_model":
        saved = 4 * vs + cap
        # the head's output dies at the cast, before the shifted copy is made
        tensors = (4 * v, 4 * vs, saved) if 8 * vs >= upcast else (c * v if c < 4 else 0, 4 * v, saved)
        return LossTensors(sum(tensors), saved, max(12 * vs, 4 * vs + 4 * v) + cap, tensors)
    if release == "unshifted_no_upcast":
        # an encoder-decoder model's own loss (T5ForConditionalGeneration.forward, BartForConditionalGeneration.
        # forward, transformers 5.24: CrossEntropyLoss on lm_logits as they are, the labels not shifted): the
        # shifted_no_upcast code without the shifted copy
        lp = 4 if autocast or c == 4 else c
        copy = 4 * v if autocast and c < 4 else 0
        saved = lp * v + cap
        return LossTensors(c * v + copy + saved, saved, 3 * lp * v + cap, (c * v, copy, saved))
    lp = 4 if autocast or c == 4 else c
    copy = 4 * vs if autocast and c < 4 else 0  # autocast's fp32 input to log_softmax
    saved = lp * vs + cap
    return LossTensors(c * v + c * vs + copy + saved, saved, max(3 * lp * vs, c * vs + c * v) + cap,
                       (c * v, c * vs + copy, saved))


# ---------------------------------------------------------------------------------------------------------
# Loss kernels that replace the logits and the cross-entropy (``train.loss``; docs/conventions.md, Fused and
# chunked losses).  Each gives the bytes alive from the forward to the loss's backward (``saved``), what the
# forward adds on top of them at its peak, and what the loss's backward adds.

LossKernel = Literal["standard", "liger-fused-linear-ce", "cut-cross-entropy", "chunked"]

# torchtune v0.6.1 ``modules/loss/ce_chunked_output_loss.py``: ``CEWithChunkedOutputLoss(num_output_chunks=8)``,
# and the models' ``output`` applied per chunk of the sequence (``TransformerDecoder.chunked_output``)
TORCHTUNE_OUTPUT_CHUNKS = 8


@dataclass(frozen=True)
class KernelLossTensors:
    """A loss kernel's bytes: ``saved`` from the forward to the loss's backward; ``forward_extra`` and
    ``backward_extra`` on top of them at the forward's end and at the loss's backward."""

    saved: int
    forward_extra: int
    backward_extra: int

    @property
    def forward_peak(self) -> int:
        return self.saved + self.forward_extra

    @property
    def backward_peak(self) -> int:
        return self.saved + self.backward_extra


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the smallest power of two >= n (1 for n <= 1).

    >>> next_power_of_2(1), next_power_of_2(2048), next_power_of_2(2049)
    (1, 2048, 4096)
    """
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of Liger's fused linear cross-entropy per chunk: ``inc_factor = cdiv(V, H)``, ``chunk_size =
    next_power_of_2(cdiv(BT, inc_factor))`` (Liger-Kernel v0.8.2 ``fused_linear_cross_entropy_forward``), so
    that a chunk's logits are about as large as the hidden states; the last chunk takes what is left.

    >>> liger_chunk_rows(4096 * 4, 32000, 4096)  # the source's own example: inc_factor 8, chunk 2048
    2048
    >>> liger_chunk_rows(2048, 128256, 4096)  # Llama 3 8B: inc_factor 32, cdiv(2048, 32) = 64
    64
    """
    inc = -(-vocab // hidden)
    return min(tokens, next_power_of_2(-(-tokens // inc)))


def liger_flce_bytes(tokens: int, vocab: int, hidden: int, input_bytes: int, compute_bytes: int,
                     head_grad_bytes: int, addmm_out_dtype: bool = True) -> KernelLossTensors:
    """Liger-Kernel v0.8.2 ``LigerFusedLinearCrossEntropyFunction`` (``ops/fused_linear_cross_entropy.py``).

    The forward computes the gradients, chunk by chunk, and keeps them for the backward
    (``ctx.save_for_backward(grad_input, grad_weight, ...)``); the backward only scales them in place
    (``element_mul_kernel``), so it adds nothing.  With BT tokens, H, V, x the hidden states' dtype bytes
    (the final norm's output), c the matmuls' dtype, w the head's gradient dtype (0: a frozen head, no
    ``grad_weight``) and rows = ``liger_chunk_rows``:

    * saved: ``grad_input = zeros_like(_input)`` BT H x, ``grad_weight = zeros_like(weight)`` V H w
      (``accum_dtype`` None: the weight's dtype);
    * forward extra: ``loss_1d`` fp32 4 BT, one chunk's logits rows V c (the kernel writes their gradient in
      place), with either ``grad_logits_chunk @ weight`` (rows H c, copied into ``grad_input``) or, at the
      weight's update, the addmm's input cast (rows H c: ``torch.addmm(..., out_dtype=fp32)`` when the weight
      gradient is fp32 and the logits half, torch >= 2.8 on sm80+) or else ``torch.mm(...).float()``: V H c
      and, when c < 4, its fp32 copy V H 4.

    Worked example, Llama-3-8B (V 128,256, H 4096) bf16-mixed (x = 4, c = 2, w = 4), 1 x 2048 tokens: rows 64;
    saved 2048 x 4096 x 4 + 128,256 x 4096 x 4 = 33,554,432 + 2,101,346,304 = 2,134,900,736; forward extra
    4 x 2048 + 64 x (128,256 + 4096) x 2 = 8,192 + 16,941,056 = 16,949,248.  The V H w buffer is the head's
    gradient made early (the standard path makes it at the head's backward).
    """
    rows = liger_chunk_rows(tokens, vocab, hidden)
    grad_weight = vocab * hidden * head_grad_bytes
    saved = tokens * hidden * input_bytes + grad_weight
    chunk = rows * (vocab + hidden) * compute_bytes
    if grad_weight and not addmm_out_dtype:
        mm = vocab * hidden * compute_bytes + (vocab * hidden * 4 if compute_bytes < 4 else 0)
        chunk = max(chunk, rows * vocab * compute_bytes + mm)
    return KernelLossTensors(saved, 4 * tokens + chunk, 0)


def cce_bytes(tokens: int, vocab: int, hidden: int, input_bytes: int, compute_bytes: int, weight_bytes: int,
              head_trainable: bool) -> KernelLossTensors:
    """Apple's Cut Cross-Entropy, ml-cross-entropy 25.6.4 ``cut_cross_entropy/cce.py`` ``LinearCrossEntropyFunction``
    with its defaults (``filter_eps="auto"``, ``accum_e_fp32=False``, ``accum_c_fp32=False``).

    * saved (``ctx.save_for_backward(e, c, bias, lse, targets, valids, logit_avg)``): under autocast ``e`` and
      ``c`` are ``.to(autocast dtype)`` copies: the embeddings BT H c (the hidden states themselves when
      already c) and the classifier V H c when the weight is not c; ``lse`` fp32 4 BT; ``logit_avg`` fp32 4 V
      (``cce_lse_forward.py``, made when gradients are needed and ``filter_eps`` is set);
    * forward extra: ``neg_dot`` fp32 4 BT (``indexed_neg_dot_forward_kernel``; ``nll = neg_dot.add_(lse)`` in
      place), freed once the loss is reduced;
    * backward extra (``cce_backward.py`` ``cce_backward_kernel``): ``vocab_ordering = argsort(logit_avg)``
      int64 8 V; ``de = zeros_like(e)`` BT H c; ``dc = zeros_like(c)`` V H c for a trainable head; then
      ``dc.to(c_info.dtype)`` (V H w beside V H c) and ``de.to(e_info.dtype)`` (BT H x beside BT H c) when the
      dtypes differ: the larger of the two casts' moments.

    Worked example, Llama-3-8B bf16-mixed, 1 x 2048 tokens: saved 2048 x 4096 x 2 + 128,256 x 4096 x 2 +
    4 x 2048 + 4 x 128,256 = 16,777,216 + 1,050,673,152 + 8,192 + 513,024 = 1,067,971,584; forward extra
    4 x 2048 = 8,192; backward extra
    8 x 128,256 + 16,777,216 + max(1,050,673,152 + 2,101,346,304, 2,101,346,304 + 33,554,432)
    = 1,026,048 + 16,777,216 + 3,152,019,456 = 3,169,822,720.
    """
    e, bt_x = tokens * hidden * compute_bytes, tokens * hidden * input_bytes
    vh_c = vocab * hidden * compute_bytes
    c_copy = vh_c if weight_bytes != compute_bytes else 0
    saved = e + c_copy + 4 * tokens + 4 * vocab
    dc = vh_c if head_trainable else 0
    dc_up = vocab * hidden * weight_bytes if head_trainable and weight_bytes != compute_bytes else 0
    de_up = bt_x if input_bytes != compute_bytes else 0
    extra = 8 * vocab + e + max(dc + dc_up, (dc_up or dc) + de_up)
    return KernelLossTensors(saved, 4 * tokens, extra)


def chunked_ce_bytes(tokens: int, chunk_tokens: int, vocab: int, logits_bytes: int,
                     softcap: bool = False) -> KernelLossTensors:
    """torchtune v0.6.1 ``CEWithChunkedOutputLoss`` (eager: ``compute_cross_entropy`` not compiled), the
    head applied per chunk of ``chunk_tokens`` (b x ceil(s / 8)).

    Each chunk's ``logits.float()`` (4 V per token) lives only through its ``F.cross_entropy``, whose
    ``log_softmax`` saves its fp32 output (4 V per token, kept for the backward for every chunk).  The head's
    chunks (c V per token, the model's output list) are dropped before the backward (the recipes'
    ``del logits``); ``.float()``'s backward keeps nothing.  With T tokens and t per chunk:

    * saved: 4 V T (+ c V T for a soft-capped model's tanh output, as the standard path);
    * forward extra, at the last chunk: the logits c V T and its fp32 copy 4 V t when c < 4 (its log-probs are
      in saved);
    * backward extra: the autograd engine runs every chunk's loss backward before the head's chunks (created
      earlier in the forward): at the first, nll_loss's gradient and log_softmax's (4 V t each) beside all the
      saved log-probs; at the last, the earlier chunks' half-precision gradients c V (T - t) wait for the head.

    Worked example, Llama-3-8B (V 128,256) bf16, 1 x 2048 tokens, 8 chunks of 256: saved 4 x 128,256 x 2048
    = 1,050,673,152; forward extra 2 x 128,256 x 2048 + 4 x 128,256 x 256 = 525,336,576 + 131,334,144
    = 656,670,720; backward extra 8 x 128,256 x 256 = 262,668,288 (the standard path: 12 V T = 3,152,019,456).
    """
    v, vt = vocab * tokens, vocab * chunk_tokens
    c = logits_bytes
    cap = c * v if softcap else 0
    saved = 4 * v + cap
    forward_extra = c * v + (4 * vt if c < 4 else 0)  # ``.float()`` of fp32 logits returns them: no copy
    # first chunk's backward: all saved + 8 V t; last: its own 4 V t saved + 8 V t + the others' c V (T - t)
    last = 12 * vt + c * (v - vt)
    return KernelLossTensors(saved, forward_extra, max(8 * vt, last - saved))
