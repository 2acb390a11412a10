"""The loss and the logits (the stage with the LM head), or a head-less stage's layer forward
temporaries at the end of its forward."""

from __future__ import annotations

from vramplan.analytic import activations as act
from vramplan.analytic.dpo import dpo_fused_loss_tensors, dpo_loss_tensors
from vramplan.analytic.dpo import reference_kind as dpo_reference_kind
from vramplan.analytic.grpo import grpo_fused_loss_tensors, grpo_loss_tensors, uses_fused_head
from vramplan.analytic.kto import kto_loss_tensors
from vramplan.analytic.layout import gathers_logits
from vramplan.analytic.logits import (
    TORCHTUNE_OUTPUT_CHUNKS,
    KernelLossTensors,
    LossRelease,
    LossTensors,
    cce_bytes,
    chunked_ce_bytes,
    family_loss_release,
    liger_flce_bytes,
    loss_bytes,
)
from vramplan.analytic.moment import K
from vramplan.analytic.openrlhf import marks_openrlhf_loss, openrlhf_loss_tensors
from vramplan.analytic.orpo import orpo_loss_tensors
from vramplan.analytic.ppo import ppo_loss_tensors
from vramplan.analytic.precision import framework_family
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.casts import reference_casts_bytes
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import END, FORWARD, LOSS, mlp
from vramplan.analytic.trl_sft import (
    chunked_nll_fp32_head,
    chunked_nll_loss_tensors,
    metrics_extra_bytes,
    sft_fused_loss_tensors,
    sft_row,
    trl_sft,
)
from vramplan.analytic.unsloth import UnslothHead, unsloth, unsloth_loss_tensors
from vramplan.facts.trl import grpo_early_row
from vramplan.spec.defaults import completion_len
from vramplan.units import ceil_div

__all__ = [
    "LITGPT_HEAD_NOTE",
    "accelerate_converts_outputs",
    "fused_head_dtypes",
    "kernel_loss",
    "layer_forward",
    "litgpt_head_dequant",
    "litgpt_head_dequant_bytes",
    "loss",
    "shifted_positions",
    "standard_loss_tensors",
    "trl_sft_metrics",
    "unsloth_head",
]

LITGPT_HEAD_NOTE = (
    "Lit-GPT: its own LM head (an nn.Linear, held even where the checkpoint ties it) is quantized by Lightning's "
    "BitsandbytesPrecision like the other linears, and bitsandbytes dequantizes it for each 128-token chunk's "
    "matmul, forward and backward (MatMul4Bit: F.dequantize_4bit(B, state).to(A.dtype), fp16 then the compute "
    "dtype); the head's backward also holds every chunk's logits and their gradients (lit-gpt 8641822 "
    "finetune/lora.py train, lit_gpt/utils.py chunked_cross_entropy; lightning 71aed75; bitsandbytes 0.41.1)")


def vocab_on_rank(c: StepContext) -> int:
    """Megatron's vocabulary-parallel cross-entropy keeps the logits sharded; transformers' tp_plan
    all-gathers them (layout.HF_TP_FRAMEWORKS)."""
    m = c.m
    return m.vocab_size if gathers_logits(c.framework, c.tp) else ceil_div(m.vocab_size, c.tp)


def shifted_positions(c: StepContext) -> int:
    """The positions a causal LM's loss scores on this rank: b (s - 1), split over the context-parallel ranks."""
    t = c.s.train
    return ceil_div(t.micro_batch_size * (t.seq_len - 1), c.s.parallel.cp)


def loss_release_of(c: StepContext) -> LossRelease:
    """The loss code of ``software.transformers`` for the model's family (analytic/logits.py)."""
    sw = c.s.software
    if c.m.encoder_decoder is not None:
        return "unshifted_no_upcast"
    return family_loss_release(sw.transformers_version, c.m.traits, c.framework, c.m.encoder_only, sw.torchtune_version)


def loss(c: StepContext) -> list[Term]:
    """At the forward's log_softmax: the logits, their fp32 copy and the log-probabilities (the tensors,
    in that order, of ``logits.loss`` ); at the backward's start the loss's gradients (analytic/logits.py).
    Made once per stage (the step's registry and ``transients.mixer_forward`` both read them)."""
    return list(c.memo("loss_terms", lambda: _loss(c)))


def _loss(c: StepContext) -> list[Term]:
    if not c.last:
        return []
    if c.s.train.loss != "standard" or unsloth(c.s):
        return kernel_loss(c)
    if c.s.train.objective in ("grpo", "rloo", "dpo", "kto", "orpo", "ppo"):
        return kernel_loss(c)
    if trl_sft(c.s) and sft_row(c.s).path != "logits":
        return kernel_loss(c)   # TRL's SFTTrainer without logits (analytic/trl_sft.py)
    lt = standard_loss_tensors(c)
    terms = [Term(K.LOSS_FORWARD, lt.forward_peak, FORWARD, LOSS, "logits.loss", tensors=lt.forward_tensors),
             Term(K.LOSS_BACKWARD, lt.backward_peak, LOSS, mlp(len(c.layer_specs) - 1), "logits.loss_gradients")]
    if trl_sft(c.s):
        terms += trl_sft_metrics(c, lt)
    return terms


def trl_sft_metrics(c: StepContext, lt: LossTensors) -> list[Term]:
    """TRL SFTTrainer's token-accuracy (and entropy) metrics on the logits after the loss, before the backward
    (analytic/trl_sft.py ``metrics_extra_bytes``): what that moment holds beyond the loss's forward peak, a bound of
    the loss moment (the event stream does not replay it).  ``outputs.logits`` is fp32 where the release's model
    upcasts them in its forward (the ``shifted`` loss release), the compute dtype otherwise.

    Worked example (tests/test_trl_sft.py): GPT-2 (V = 50,257) in fp32, b = 2 sequences of s = 128, trl 0.16: the
    logits 4 x 256 V and the log-probs 4 x 256 V at the loss (no upcast copy: fp32), then the copy 4 x 2 x 127 V:
    1,016 V = 51,061,112 B above the loss's peak."""
    t, row = c.s.train, sft_row(c.s)
    d = 4 if loss_release_of(c) == "shifted" else c.pol.compute_bytes
    extra = metrics_extra_bytes(lt, c.tokens, shifted_positions(c), ceil_div(t.seq_len, c.s.parallel.cp),
                                vocab_on_rank(c), d, t.micro_batch_size, c.s.data_parallel_degree, row)
    return [Term(K.LOSS_FORWARD, extra, FORWARD, LOSS, "logits.trl_sft_metrics")] if extra else []


def litgpt_head_dequant_bytes(c: StepContext) -> int:
    """Lit-GPT's 4-bit LM head dequantized for one matmul: float16 (the dtype Lightning quantized it from),
    then its copy in the compute dtype (none when that is float16), alive together during the cast."""
    n = c.litgpt_head
    return n * 2 + (0 if c.pol.half == "fp16" else n * c.pol.compute_bytes)


def litgpt_head_dequant(c: StepContext) -> list[Term]:
    """Lit-GPT's 4-bit LM head dequantized for its matmul (``StepContext.litgpt_head``), beyond the loss's
    own tensors at the same points: a bound of each moment, not an allocation (the event stream reads
    neither record).

    lit-gpt 8641822 ``finetune/lora.py`` ``train`` runs ``logits = model(input_ids, lm_head_chunk_size=128)``
    (the head per chunk of 128 tokens), ``chunked_cross_entropy`` per chunk, then the backward with the list
    ``logits`` still held.  Each chunk's ``MatMul4Bit`` (bitsandbytes 0.41.1 ``autograd/_functions.py``)
    computes ``F.dequantize_4bit(B, state).to(A.dtype)``, forward and backward (``grad_A``): the head in the
    dtype it was quantized from, float16 (Lightning's ``_quantize_weight``: ``weight.to(dtype=torch.half)``),
    and its copy in the compute dtype (none when that is float16), ``dequant`` = N (2 + c) bytes.

    * forward, at the last chunk's matmul: every chunk's logits (c V T) and ``dequant``;
    * backward, at the head's first chunk: the logits (c V T), every chunk's gradient (c V T: the autograd
      engine runs all the chunks' losses, created later, before the head's chunks) and ``dequant``.

    Worked example, Falcon-40B (V 65,024, H 8,192, N = 532,676,608), bf16, 1 x 1,079 tokens: dequant
    4 N = 2,130,706,432; logits 2 x 65,024 x 1,079 = 140,321,792; backward 2 x 140,321,792 + 2,130,706,432 =
    2,411,350,016 B, beside the standard loss's backward record 6 x 140,321,792 = 841,930,752: 1,569,419,264 B
    more.
    """
    if not c.litgpt_head or c.s.train.loss != "standard":
        return []
    cb = c.pol.compute_bytes
    dequant = litgpt_head_dequant_bytes(c)
    logits = cb * vocab_on_rank(c) * c.tokens
    lt = standard_loss_tensors(c)
    last = mlp(len(c.layer_specs) - 1)
    return [Term(K.LOSS_FORWARD, max(0, logits + dequant - lt.forward_peak), FORWARD, LOSS,
                 "logits.head_dequant_over_loss"),
            Term(K.LOSS_BACKWARD, max(0, 2 * logits + dequant - lt.backward_peak), LOSS, last,
                 "logits.head_dequant_over_loss_gradients")]


def standard_loss_tensors(c: StepContext) -> LossTensors:
    """The standard loss's tensors (analytic/logits.py ``loss_bytes``), whatever ``train.loss`` says: what an
    evaluation forward makes, since Liger's and CCE's patches materialize the logits outside training."""
    m, cb = c.m, c.pol.compute_bytes
    # padded (current releases): forward_peak = c V + (4 V when c < 4) + saved log-probs (4 V, with Gemma 2's
    # soft-cap output); older releases copy the shifted logits over b (s - 1) tokens (analytic/logits.py)
    return loss_bytes(c.tokens, vocab_on_rank(c), cb, softcap=m.final_logit_softcapping is not None,
                      release=loss_release_of(c), shifted_tokens=shifted_positions(c),
                      autocast=c.pol.autocast)


def kernel_loss_tensors(c: StepContext) -> KernelLossTensors:
    """The bytes of ``train.loss``'s kernel (analytic/logits.py) for this stage's head."""
    m, pol, t = c.m, c.pol, c.s.train
    vocab, hidden, cb = vocab_on_rank(c), m.hidden_size, pol.compute_bytes
    if unsloth(c.s):
        # Unsloth's forward and loss (analytic/unsloth.py): the frozen head in the dtype it was loaded in (its own
        # k-bit preparation casts only the LoRA weights), the hidden states in the final norm's output dtype
        return unsloth_loss_tensors(c.s, m.family, unsloth_head(c, c.tokens), t.micro_batch_size * t.seq_len,
                                    c.gpu.cuda_capability)
    if trl_sft(c.s) and (row := sft_row(c.s)).path != "logits":
        x, _, w = fused_head_dtypes(c)
        if row.path == "fused-head":
            return sft_fused_loss_tensors(shifted_positions(c), vocab, hidden, x, cb, w, c.peft is None)
        return chunked_nll_loss_tensors(shifted_positions(c), vocab, hidden, x, w, c.peft is None,
                                        chunked_nll_fp32_head(c.s))
    if t.objective in ("grpo", "rloo", "dpo", "kto") and uses_fused_head(c.s):
        return _fused_head_loss_tensors(c)
    if marks_openrlhf_loss(c.s):
        # OpenRLHF's Actor.forward: fp32 logits over every position, flash-attn's cross-entropy (analytic/openrlhf.py)
        return openrlhf_loss_tensors(t.micro_batch_size, t.seq_len, vocab, cb)
    if t.objective == "ppo":
        # TRL's PPO policy loss: the head on every position, the response's log-probs per sequence (analytic/ppo.py)
        ro = c.s.rl.rollout
        return ppo_loss_tensors(t.micro_batch_size, ro.max_prompt_len, completion_len(c.s), vocab, cb)
    if t.objective == "grpo":
        # TRL's GRPO loss: the head on the completion's positions only (analytic/grpo.py grpo_loss_tensors)
        return grpo_loss_tensors(t.micro_batch_size, completion_len(c.s), vocab, cb,
                                 grpo_early_row(c.s.software.trl_version))
    if t.objective == "dpo":
        # TRL's DPO loss: the head on every position, then the reference's no-grad forward (analytic/dpo.py)
        casts = reference_casts_bytes(c) if dpo_reference_kind(c.s) == "separate" else 0
        return dpo_loss_tensors(t.micro_batch_size, t.seq_len, vocab, cb, reference_layer_bytes(c), casts)
    if t.objective == "orpo":
        # TRL's ORPO loss (analytic/orpo.py): the HF Trainer's autocast forward returns fp32 logits (accelerate's
        # convert_outputs_to_fp32, as the traced step models it: trace/step.py)
        return orpo_loss_tensors(t.micro_batch_size // 2, t.seq_len, vocab, cb, accelerate_converts_outputs(c))
    if t.loss == "chunked":
        # torch.chunk over the sequence: chunks of ceil(s / 8) positions of every sequence
        chunk = t.micro_batch_size * ceil_div(ceil_div(t.seq_len, c.s.parallel.cp), TORCHTUNE_OUTPUT_CHUNKS)
        return chunked_ce_bytes(c.tokens, min(chunk, c.tokens), vocab, cb,
                                softcap=m.final_logit_softcapping is not None)
    # the head's weight as the kernel reads it: fp32 under autocast (the master), half under DeepSpeed's half
    # module and FSDP's param_dtype; a frozen head (PEFT) is the base's dtype (fp32 after k-bit preparation)
    if c.peft is not None:
        weight = 4 if c.kbit else pol.frozen_param_bytes
    else:
        weight = pol.param_bytes if framework_family(c.s) == "autocast" else cb
    # the hidden states the head reads: the final norm's output dtype (the residual's under transformers' RMSNorm)
    x = act._norm_out_bytes(m.norm, c.act)
    if t.loss == "liger-fused-linear-ce":
        # torch.addmm(out_dtype=fp32) accumulates a half gradient into the fp32 one on sm80+ (torch >= 2.8 assumed)
        # (an AMD GPU's capability, "gfx942", is not CUDA's: the mm-then-cast path, the larger of the two, is taken)
        cap = c.gpu.cuda_capability
        addmm = weight == 4 and cb < 4 and (not c.gpu.compute_capability or (cap is not None and cap >= (8, 0)))
        return liger_flce_bytes(c.tokens, vocab, hidden, x, cb, weight if c.peft is None else 0, addmm)
    return cce_bytes(c.tokens, vocab, hidden, x, cb, weight, head_trainable=c.peft is None)


def unsloth_head(c: StepContext, tokens: int) -> UnslothHead:
    """Unsloth's head over ``tokens`` positions on this rank (analytic/unsloth.py ``UnslothHead``): the logits
    converted to fp32 by accelerate under the HF Trainer's fp16/bf16 autocast."""
    pol = c.pol
    return UnslothHead(tokens, vocab_on_rank(c), c.m.hidden_size, act._norm_out_bytes(c.m.norm, c.act),
                       pol.compute_bytes, pol.frozen_param_bytes, accelerate_converts_outputs(c))


def accelerate_converts_outputs(c: StepContext) -> bool:
    """accelerate's ``convert_outputs_to_fp32`` wraps the prepared model's forward under fp16/bf16 autocast
    (``Accelerator.prepare_model``), as the HF Trainer and accelerate loops run it: half outputs (the logits) are
    returned as an fp32 copy (trace/step.py models the same)."""
    pol = c.pol
    return pol.autocast and pol.compute_bytes < 4 and c.s.effective_framework in ("hf-trainer", "accelerate")


def fused_head_dtypes(c: StepContext) -> tuple[int, int, int]:
    """TRL's fused LM head's bytes per element (analytic/fused_head.py): the hidden states it reads (the final
    norm's output dtype, x), the compute dtype (c) and the head's weight as the kernel reads it (w: the parameter,
    fp32 master under autocast, the base's dtype under PEFT, fp32 after k-bit preparation)."""
    pol = c.pol
    if c.peft is not None:
        weight = 4 if c.kbit else pol.frozen_param_bytes
    else:
        weight = pol.param_bytes if framework_family(c.s) == "autocast" else pol.compute_bytes
    return act._norm_out_bytes(c.m.norm, c.act), pol.compute_bytes, weight


def _fused_head_loss_tensors(c: StepContext) -> KernelLossTensors:
    """TRL's fused LM head losses: KTO's (v1.16.0, analytic/kto.py), DPO's and GRPO's from v1.15.0 (analytic/dpo.py,
    analytic/grpo.py); the reference's no-grad forwards inside the step for KTO and DPO."""
    m, t = c.m, c.s.train
    x, cb, w = fused_head_dtypes(c)
    vocab, trainable = vocab_on_rank(c), c.peft is None
    if t.objective in ("grpo", "rloo"):
        # RLOOTrainer (v1.16.0) runs GRPO's fused-head log-probs (analytic/rloo.py)
        ro = c.s.rl.rollout
        return grpo_fused_loss_tensors(t.micro_batch_size, ro.max_prompt_len, completion_len(c.s), vocab,
                                       m.hidden_size, x, cb, w, trainable)
    casts = reference_casts_bytes(c, head=False) if dpo_reference_kind(c.s) == "separate" else 0
    if t.objective == "dpo":
        return dpo_fused_loss_tensors(t.micro_batch_size, t.seq_len, vocab, m.hidden_size, x, cb, w, trainable,
                                      reference_layer_bytes(c), casts)
    tokens = t.micro_batch_size * (t.seq_len - 1)
    return kto_loss_tensors(tokens, vocab, m.hidden_size, x, cb, w, trainable, reference_layer_bytes(c), casts)


def reference_layer_bytes(c: StepContext) -> int:
    """A no-grad forward's largest layer tensors over the step's tokens (DPO's reference forward): one MLP's
    (gate, up and their product, or the two of a plain MLP; routed MoE experts at top_k times the width) and
    the residual stream in and out, as GRPO's scoring forward (analytic/lifecycle/scoring.py)."""
    m, cb = c.m, c.pol.compute_bytes
    inter = m.intermediate_size
    if m.moe is not None:
        inter = max(inter, m.moe.expert_intermediate_size * m.moe.top_k + m.moe.shared_intermediate_size)
    return c.tokens * inter * cb * (3 if m.mlp_gated else 2) + 2 * c.tokens * m.hidden_size * c.act.residual_bytes


def kernel_loss(c: StepContext) -> list[Term]:
    """A loss kernel's bytes (``train.loss``, or GRPO's loss): what it keeps from the forward to the backward, with its forward
    temporaries at the forward's end and its backward buffers at the loss's backward.  Named apart from the
    standard loss's terms: the allocator's event stream reads their tensors as (kept, temporary)."""
    kt = kernel_loss_tensors(c)
    last = mlp(len(c.layer_specs) - 1)
    terms = [Term(K.LOSS_FORWARD, kt.forward_peak, FORWARD, LOSS, "logits.kernel_loss",
                  tensors=(kt.saved, kt.forward_extra)),
             Term(K.LOSS_BACKWARD, kt.backward_peak, LOSS, last, "logits.kernel_loss_gradients",
                  tensors=(kt.saved, kt.backward_extra))]
    if marks_openrlhf_loss(c.s):
        # OpenRLHF's training_step keeps ``output`` (its fp32 logits) until it returns: through the rest of the
        # backward and the optimizer step (analytic/openrlhf.py openrlhf_loss_tensors)
        terms.append(Term(K.OUTPUT_LOGITS_HELD, kt.saved, last, END, "logits.openrlhf_output_held"))
    return terms


def layer_forward(c: StepContext) -> list[Term]:
    """A stage without the head peaks at its last layer's forward: the largest layer's live tensors."""
    if c.last:
        return []
    la = layer_activations(c)
    transient = [max(mt, at) for mt, at in zip(la.mlp_transient, la.attn_transient, strict=True)]
    return [Term(K.LAYER_FORWARD, max(transient) if transient else 0, FORWARD, LOSS, "layer.forward")]
