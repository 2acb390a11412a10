"""The training step: memory over time on one GPU, and its peak.

A step is walked through the moments where memory can peak (not summed); the points of the
step's timeline (analytic/timeline.py):

1. end of the forward pass, at the loss's log_softmax;
2. start of the backward pass, at the loss gradient;
3. during each layer's backward, its MLP part then its attention part (activations shrink as
   gradients grow);
4. the tied embedding's backward, last (its two gradient contributions summed);
5. the optimizer step (all gradients + step temporaries).

Every byte comes from a term record (analytic/terms, registry ``TERMS``): ``train_step`` makes a
stage's terms, sweeps them over its timeline into moments, and turns the same records into the
allocator's event stream (analytic/events.py ``build_layout``).

Gradients exist during the forward pass only from the second micro-batch of a
gradient-accumulation window on (the Trainer zeroes them with ``set_to_none=True``
after each optimizer step), so with ``grad_accum_steps > 1`` the steady-state peak
micro-step carries all gradients.  Optimizer states are alive during the whole
steady-state step (they are created on the first ``step()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vramplan.analytic.activations import recompute_forward_bytes
from vramplan.analytic.attention import (
    BF16_MATH_NOTE,
    bf16_math_fallback,
    falls_back_to_eager,
    gqa_math_fallback,
    gqa_math_note,
    resolve_attention,
    sdpa_repeats_kv,
)
from vramplan.analytic.checkpointing import checkpoint_policy, policy_assumption
from vramplan.analytic.deepspeed import deepspeed_assumptions
from vramplan.analytic.events import StepLayout, build_layout
from vramplan.analytic.float8 import float8_assumptions, mx_assumptions
from vramplan.analytic.grpo import uses_fused_head
from vramplan.analytic.hf_buffers import hf_buffer_notes
from vramplan.analytic.layout import BNB_4BIT_FORMATS, lora_targets
from vramplan.analytic.logits import TORCHTUNE_LOSS_NOTES, family_loss_release, loss_release_note
from vramplan.analytic.moe_capacity import expert_capacity, routed_rows
from vramplan.analytic.moment import K, Key, Moment
from vramplan.analytic.optimizer import optimizer_assumptions
from vramplan.analytic.precision import PrecisionPolicy, litgpt_fp32_base
from vramplan.analytic.terms import StepContext, Term, step_terms
from vramplan.analytic.terms.base import WHERE
from vramplan.analytic.terms.casts import CAST_ASSUMPTION, FROZEN_CAST_NOTE, casts_apply, frozen_casts_apply
from vramplan.analytic.terms.context import (
    casts_back_for,
    communicators,
    layout_style,
    shards,
    stages,
    step_policy,
)
from vramplan.analytic.terms.encoder_decoder import encoder_decoder_notes, source_len_note
from vramplan.analytic.terms.gradients import has_root_reduce_point
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.terms.loss import LITGPT_HEAD_NOTE
from vramplan.analytic.terms.mamba2 import mixer_train_notes
from vramplan.analytic.terms.saved import (
    attention_only_decoder,
    cache_in_training_forward,
    fused_cache_unmodelled,
)
from vramplan.analytic.terms.transients import TORCHTUNE_NF4_NOTE
from vramplan.analytic.terms.vision import tower_forward_moment
from vramplan.analytic.timeline import Timeline, step_timeline, sweep_peak, sweep_totals
from vramplan.analytic.trl_sft import sft_loss_note, sft_row, trl_sft
from vramplan.analytic.unsloth import unsloth, unsloth_loss_note, unsloth_notes
from vramplan.facts.pipeline_schedules import in_flight_chunks, pipeline_schedule
from vramplan.facts.quantization import bnb_formats
from vramplan.facts.trainer_frameworks import trainer_framework
from vramplan.facts.transformers import CURRENT_RELEASE_NOTE, OWN_MODEL_FRAMEWORKS
from vramplan.spec.defaults import megatron_distributed_optimizer, torchtitan_fsdp2
from vramplan.spec.load import Resolved
from vramplan.spec.lora_match import (
    experts_are_parameters,
    partial_lora_targets,
    quantized_expert_loop,
    unmatched_lora_targets,
)
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div

__all__ = ["StepWalks", "TrainResult", "shards", "stage_timeline", "step_peak", "step_walks", "train_step"]


@dataclass
class TrainResult:
    moments: list[Moment]
    peak: Moment
    host_bytes: int
    nvme_bytes: int
    managed_bytes: int
    communicators: int
    assumptions: list[str]
    layout: StepLayout | None = None  # the peak stage's terms for the event stream (analytic/events.py)
    terms: list[Term] = field(default_factory=list)  # the peak stage's term records (analytic/terms)
    context: StepContext | None = None  # the peak stage's inputs (the job's other phases read them)


# the rows a layer's attention-backward moment lists even at 0 bytes (it sets them, as measured rows)
_SHOWN_AT_ATTENTION = frozenset({K.SAVED, K.LAYER_BACKWARD})


def stage_timeline(c: StepContext) -> Timeline:
    """The points of one stage's step (analytic/timeline.py)."""
    return step_timeline(len(c.layer_specs), c.last, layer_activations(c).attention_split,
                         has_root_reduce_point(c), _SHOWN_AT_ATTENTION)


def _elsewhere(terms: list[Term]) -> dict[str, int]:
    """Bytes of the terms by where they live (host, nvme, managed; the device too)."""
    out = dict.fromkeys(WHERE, 0)
    for t in terms:
        out[t[6]] += t[1]  # where, nbytes: indexed, not unpacked (a step has hundreds of records)
    return out


def _walks(r: Resolved, stage: int, attention: str, repeat: bool) -> list[StepContext]:
    """The micro-batch walks of one stage's step: one, or under GPipe with m >= 2 two (torch 2.13
    ``ScheduleGPipe._step_microbatches``: every forward, then every backward): the first backward, with the other
    m - 1 micro-batches in flight and no gradient before it, and a later one, with m - 2 in flight and every
    gradient there; the higher peak is the step's."""
    first = StepContext(r, stage, attention, repeat)
    par = r.scenario.parallel
    if par.pp == 1 or pipeline_schedule(par.pp_schedule).in_flight != "all" or r.scenario.train.grad_accum_steps < 2:
        return [first]
    return [first, StepContext(r, stage, attention, repeat, gpipe_later=True)]


@dataclass(frozen=True)
class StepWalks:
    """The term records of a step's walks (``_walks``: one per pipeline stage worth estimating, two under GPipe
    with accumulation), each with its stage's context, and the attention kernel they were made for: what
    ``train_step`` sweeps.  Term records are immutable and a context's derived values are computed once from
    its scenario, so one ``StepWalks`` answers the step floor and the estimates of the same scenario alike
    (the planner makes it once per setup: ``engine.train_step_walks``)."""

    attention: str
    repeat: bool
    walks: tuple[tuple[StepContext, list[Term]], ...]


def step_walks(r: Resolved) -> StepWalks:
    """The step's contexts and their term records (analytic/terms ``step_terms``), in ``train_step``'s order."""
    s, m = r.scenario, r.model
    attention, repeat = resolve_attention(s, m, step_policy(s), r.gpu)
    walks = tuple((c, step_terms(c)) for stage in stages(s.parallel.pp, layout_style(s))
                  for c in _walks(r, stage, attention, repeat))
    return StepWalks(attention, repeat, walks)


def step_peak(w: StepWalks) -> tuple[int, int]:
    """``train_step(r)``'s ``peak.total`` and ``managed_bytes`` from the walks' totals alone
    (timeline.py ``sweep_peak``): the highest walk's peak, the first of equal ones, as ``train_step``'s ``max``
    picks it; its managed bytes are that walk's."""
    best_total: int | None = None
    best_managed = 0
    for c, terms in w.walks:
        total = sweep_peak(terms, stage_timeline(c))
        tower = tower_forward_moment(c, terms)
        if tower is not None:
            total = max(tower.total, total)
        if best_total is None or total > best_total:
            best_total, best_managed = total, _elsewhere(terms)["managed"]
    assert best_total is not None  # a step has at least one walk (``stages``: at least rank 0)
    return best_total, best_managed


def train_step(r: Resolved, walks: StepWalks | None = None) -> TrainResult:
    """One steady-state step on the GPU of each pipeline stage worth estimating; the stage with the
    highest peak is the answer.  Each stage's terms (analytic/terms) are swept over its timeline.

    ``walks``: ``step_walks(r)`` made before (the planner's, for its step floor: ``step_peak``)."""
    s, m = r.scenario, r.model
    w = step_walks(r) if walks is None else walks
    attention, repeat = w.attention, w.repeat
    results: list[TrainResult] = []
    for c, terms in w.walks:
        moments, totals = sweep_totals(terms, stage_timeline(c))
        tower = tower_forward_moment(c, terms)
        if tower is not None:  # a frozen vision tower's forward, before the language model's first layer
            moments, totals = [tower, *moments], [tower.total, *totals]
        peak = moments[totals.index(max(totals))]  # the first highest, as max(moments, key=total)
        off = _elsewhere(terms)
        results.append(TrainResult(moments, peak, off["host"], off["nvme"], off["managed"], 0, [],
                                   build_layout(c, terms), terms, c))
    best = max(results, key=lambda x: x.peak.total)
    best.communicators = communicators(s)
    c0 = StepContext(r, 0, attention, repeat)
    casts = [CAST_ASSUMPTION] if casts_apply(c0) else [FROZEN_CAST_NOTE] if frozen_casts_apply(c0) else []
    pol = step_policy(s)
    math_note = ([gqa_math_note(s)] if attention == "math" and gqa_math_fallback(s, m, pol.compute_bytes, r.gpu)
                 else [BF16_MATH_NOTE] if attention == "math" and bf16_math_fallback(pol.half, r.gpu) else [])
    cap = r.gpu.cuda_capability
    liger_mm = ([(f"Liger's head gradient on {r.gpu.name} (compute capability {r.gpu.compute_capability}, not CUDA "
                  "sm80+) counted as torch.mm(...).float(), the larger of its two paths (torch.addmm's fp32 "
                  "accumulation is read for CUDA sm80+ only)")]
                if s.train.loss == "liger-fused-linear-ce" and r.gpu.compute_capability
                and (cap is None or cap < (8, 0)) else [])
    hf_notes = _release_term_notes(s, m, best.terms, attention)
    hf_notes += _fused_cache_note(c0)
    hf_notes += recompute_moment_note(c0)
    best.assumptions = list(dict.fromkeys(casts + _train_assumptions(s, m, attention, step_policy(s),
                                                                   s.effective_framework, c0.kbit)
                                          + math_note + liger_mm
                                          + hf_notes))
    return best


def _release_term_notes(s: Scenario, m: ModelSpec, terms: Sequence[Term], attention: str) -> list[str]:
    """The assumptions naming what the transformers release adds to the step's terms (analytic/hf_buffers.py, the
    training forward's cache: terms/saved.py ``training_cache``)."""
    def total(key: Key) -> int:
        return sum(t.nbytes for t in terms if t.key is key)

    sw = s.software
    notes = hf_buffer_notes(m, sw.transformers, sw.transformers_version, total(K.HF_ROPE_BUFFERS),
                            total(K.HF_CAUSAL_MASK), attention != "flash")
    if cache := total(K.TRAIN_CACHE):
        given = ("train.use_cache" if s.train.use_cache is not None else
                 "the config's use_cache, which this loop or a 4.x HF Trainer keeps")
        release = f"transformers {sw.transformers}" if sw.transformers else "the current transformers"
        notes.append(f"use_cache on in training ({given}) and no gradient checkpointing: {release} builds a "
                     f"DynamicCache in the forward that holds the grouped keys and values, {cache:,} B, beside the "
                     "copies repeated for the kernel, until the loss is returned; set train.use_cache: false where the "
                     "script turns it off (LLaMA-Factory, axolotl and Unsloth do)")
    elif s.train.use_cache and cache_in_training_forward(s, m) and not attention_only_decoder(m):
        notes.append(f"not modelled: train.use_cache: true with {m.family}, whose training forward would update its "
                     "mixers' cache in place (transformers' hybrid and recurrent models; their backward refuses it)")
    return notes


def _fused_cache_note(c: StepContext) -> list[str]:
    """What the report says of a fused-projection model's training-forward cache (terms/saved.py)."""
    if not fused_cache_unmodelled(c):
        return []
    note = (f"not modelled: the training forward's cache (use_cache on, no gradient checkpointing) with "
            f"{c.m.family}'s fused q/k/v projection: its copies of k and v come on top of the fused buffer a view "
            "keeps, or release it (set train.use_cache: false if the script does)")
    return [note]


def _release_assumptions(s: Scenario, m: ModelSpec, attention: str, fw: str) -> list[str]:
    """What the run's transformers release (or its absence) makes the report assume about the attention."""
    out = [CURRENT_RELEASE_NOTE] if s.software.transformers is None and fw not in OWN_MODEL_FRAMEWORKS else []
    if attention in ("flash", "efficient") and s.train.attention == "sdpa" and sdpa_repeats_kv(s, m):
        out.append(f"transformers {s.software.transformers} repeats the grouped K/V to every query head before SDPA "
                   "(repeat_kv; enable_gqa from 4.54): the kernel keeps the repeated copies for the backward")
    return out


# train.loss's kernels, as analytic/logits.py models them
KERNEL_LOSS_NOTES = {
    "liger-fused-linear-ce": "loss as Liger-Kernel 0.8.2's fused linear cross-entropy computes it: no full logits; "
                             "the input and head gradients are made chunk by chunk in the forward and kept for the "
                             "backward (torch >= 2.8's addmm accumulation on sm80+ assumed)",
    "cut-cross-entropy": "loss as Cut Cross-Entropy (ml-cross-entropy 25.6.4, impl cce, its defaults) computes it: "
                         "no logits; the log-sum-exp per token kept, the gradients made in the backward",
    "chunked": "loss as torchtune's CEWithChunkedOutputLoss computes it (8 output chunks, each upcast to fp32 on its "
               "own, not compiled); its log-softmax outputs are kept for the backward",
}
OFFLOAD_NOTE = ("activation offloading as torchtune's OffloadActivations does it (pinned memory, side stream, "
                "forward stash of 5): each checkpointed layer input in host memory from its layer's forward to its "
                "backward, on the GPU again only during that backward; the final norm's and the loss's tensors stay")
UNSLOTH_OFFLOAD_NOTE = ("Unsloth's use_gradient_checkpointing='unsloth' (Unsloth_Offloaded_Gradient_Checkpointer, "
                        "unsloth/models/_utils.py): each layer's input copied to the host in its forward and back in "
                        "its backward; counted as train.activation_offload's terms, whose forward stash of 5 inputs "
                        "Unsloth does not keep (an upper bound in the forward, the same at the loss and in the "
                        "backward); a non-blocking copy to the CPU is made in pinned memory (aten _to_copy: pin_out "
                        "when non_blocking from CUDA), rounded as torchtune's")
IN_BACKWARD_NOTE = ("optimizer in the backward as torchtune's optimizer_in_bwd runs it (one optimizer per parameter, "
                    "stepped by its post-accumulate-grad hook, then the gradient set to None): each layer's largest "
                    "tensor's gradient and step temporaries counted over its whole backward, the head's at the last "
                    "layer's, the embedding's last (the 'optimizer' moment); steady-state step, states exist")
TORCHAO_OFFLOAD_NOTE = ("torchao CPUOffloadOptimizer (v0.18.0): fused AdamW on the CPU for tensors of 4096 elements "
                        "or more, their states and pinned copies of each parameter and gradient in host memory "
                        "(pinned sizes rounded up to a power of two); smaller tensors stepped on the GPU; with "
                        "optimizer+gradients each GPU gradient is assumed freed (its copy done) before the next "
                        "parameter's is made")
PACKING_NOTE = ("packed sequences: flash-attention's varlen kernel from position_ids, no attention mask; "
                "seq_len is the packed length")


OBJECTIVE_LOSS_NOTES = {
    "dpo": "loss as TRL's DPOTrainer computes it: the policy's logits over every position, in the compute "
        "dtype, one log_softmax per sequence kept for the backward, then the reference's no-grad logits "
        "(analytic/dpo.py)",
    "kto": "loss as TRL v1.16.0's KTOTrainer computes it: the fused LM head (add_fused_lm_head), per-token "
        "log-probabilities from tiles of 4,096 tokens x 32,768 vocabulary columns, no logits tensor; then the "
        "reference's no-grad forwards (analytic/kto.py)",
    "orpo": "loss as TRL v1.16.0's ORPOTrainer (trl.experimental.orpo) computes it: the policy's logits over "
        "every position (fp32 from accelerate's autocast wrapper), the chosen half's cross-entropy and the "
        "log-probabilities by TRL's Triton kernel, which keeps the logits for the backward (analytic/orpo.py)",
    "grpo": "loss as TRL's GRPOTrainer computes it: the policy's logits over the completion only, in the "
        "compute dtype, and one log_softmax per sequence kept for the backward (analytic/grpo.py)",
    "ppo": "loss as TRL v1.12.0's PPOTrainer computes it: the policy's logits over every position, in the compute "
        "dtype, held to the backward; one log_softmax per sequence over the response kept for it; the in-place "
        "division by the temperature on a view, whose backward (CopySlices) clones the logits' gradient "
        "(analytic/ppo.py)",
}
# DPO and GRPO from TRL v1.15.0 (software.trl, facts/trl.py): the fused LM head, as KTO's
FUSED_HEAD_LOSS_NOTES = {
    "dpo": "loss as TRL's DPOTrainer computes it from v1.15.0: the fused LM head (add_fused_lm_head), per-token "
        "log-probabilities from tiles of 4,096 tokens x 32,768 vocabulary columns, no logits tensor; then the "
        "reference's no-grad forward through its own fused head (analytic/dpo.py)",
    "grpo": "loss as TRL's GRPOTrainer computes it from v1.15.0: the fused LM head (add_fused_lm_head) over the "
        "completion's positions, per-token log-probabilities and entropies from tiles of 4,096 tokens x 32,768 "
        "vocabulary columns, no logits tensor (analytic/grpo.py)",
    "rloo": "loss as TRL v1.16.0's RLOOTrainer computes it: GRPO's fused LM head over the completion's positions, "
        "per-token log-probabilities and entropies, no logits tensor (analytic/rloo.py)",
}


ENCODER_DECODER_LOSS_NOTE = ("loss as an encoder-decoder model computes it in its forward (T5ForConditionalGeneration / "
                             "BartForConditionalGeneration, transformers 5.24): CrossEntropyLoss on the logits in their "
                             "own dtype over the seq_len target tokens, labels not shifted (autocast runs log_softmax "
                             "in fp32)")


def _loss_assumption(s: Scenario, m: ModelSpec, fw: str) -> str:
    """The loss code modelled: the current release's, or the one ``software.transformers`` names."""
    if unsloth(s):
        return unsloth_loss_note(s, m.family)
    if s.train.loss != "standard":
        return KERNEL_LOSS_NOTES[s.train.loss]
    if s.train.objective in FUSED_HEAD_LOSS_NOTES and uses_fused_head(s):
        return FUSED_HEAD_LOSS_NOTES[s.train.objective]
    if s.train.objective in OBJECTIVE_LOSS_NOTES:
        return OBJECTIVE_LOSS_NOTES[s.train.objective]
    if trl_sft(s) and sft_row(s).path != "logits":
        return sft_loss_note(s)
    sw = s.software
    release = family_loss_release(sw.transformers_version, m.traits, fw, m.encoder_only, sw.torchtune_version)
    note = loss_release_note(release, sw.transformers, m.family, fw, m.encoder_only)
    if trl_sft(s):
        # SFTTrainer over the HF Trainer's loss (its logits rows): TRL's note, then the model release's own
        return sft_loss_note(s) if note is None else f"{sft_loss_note(s)}; {note}"
    if m.encoder_decoder is not None:
        # the release whose step is modelled: 5.24's, or a 4.x one's (T5's eager step; BART and Whisper are refused
        # there), whose loss is the same (modeling_t5.py 4.46.3 l.1924-1926)
        v = sw.transformers_version
        modelled = f"transformers {sw.transformers}" if v is not None and v < (5, 0) else "transformers 5.24"
        return ENCODER_DECODER_LOSS_NOTE.replace("transformers 5.24", modelled)
    if fw == "megatron" and not m.encoder_only:
        return MEGATRON_LOSS_NOTE if note is None else f"{MEGATRON_LOSS_NOTE}; {note}"
    if fw == "torchtune" and not m.encoder_only:
        tune = f"loss as torchtune {sw.torchtune or '0.6.1'} computes it: {TORCHTUNE_LOSS_NOTES[release]}"
        return tune if note is None else f"{tune}; {note}"
    # the text of the reports before software.transformers reached the loss (kept byte-identical; the labels
    # are padded from 4.49, analytic/logits.py)
    return note or "loss as transformers >= 4.46 computes it (fp32 logits, log_softmax saved)"


MEGATRON_STEADY_NOTE = ("steady-state step: optimizer states exist; the gradients are Megatron-Core's grad buffer, "
                        "allocated when the model is wrapped and zeroed, not freed, between steps "
                        "(core_v0.15.0 megatron/core/distributed/param_and_grad_buffer.py lines 722-727, 752)")
MEGATRON_LOSS_NOTE = ("not modelled: Megatron-Core's vocab_parallel_cross_entropy as such (core_v0.15.0 "
                      "megatron/core/tensor_parallel/cross_entropy.py lines 28, 65, 187: an fp32 copy of this rank's "
                      "vocabulary shard of the logits, exponentiated in place and saved); the loss is counted as the "
                      "fp32-logits row of transformers >= 4.49, over the same vocabulary shard")


def eager_fallback_note(m: ModelSpec) -> str:
    """What a report says when ``sdpa`` falls back to eager (``falls_back_to_eager``)."""
    dropped = m.traits.sdpa_dropped_in
    since = (f" from transformers {'.'.join(map(str, dropped))} (set software.transformers for an older run)"
             if dropped else "")
    return f"{m.family} has no SDPA attention{since}: transformers' default falls back to eager"


def _pipeline_schedule_notes(s: Scenario) -> list[str]:
    """The schedule's in-flight rule and the chunk layout, said where the schedule is not the default 1F1B."""
    par = s.parallel
    if par.pp == 1 or par.pp_schedule == "1f1b":
        return []
    row = pipeline_schedule(par.pp_schedule)
    m, v = s.train.grad_accum_steps, par.pp_virtual_stages
    first = in_flight_chunks(row, par.pp, 0, v, m)
    if s.effective_framework == "megatron":
        # spec/megatron.py megatron_schedule_problems: interleaved-1f1b only, M a multiple of pp
        return [(f"pipeline schedule {row.name} as Megatron-Core runs it: {first} chunk-micro-batches of activations "
                f"in flight on the first rank, 2 (pp - 1) + (v - 1) pp warmup forwards and one more (core_v0.15.0 "
                "megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, lines 728-729; the count of "
                f"torch's {row.torch_class} for micro-batches a multiple of pp)"),
                (f"{v} model chunks per rank of an even split of the layers over {par.pp * v} chunks, rank r holding "
                f"chunks r, r + {par.pp}, ... (Megatron-Core's virtual pipeline: model chunk i of rank r is virtual "
                "stage i x pp + r, get_transformer_layer_offset); each chunk's saved activations counted at its own "
                "layers' bytes")]
    note = (f"pipeline schedule {row.name} as torch's {row.torch_class} runs it: {first} chunk-micro-batches of "
            f"activations in flight on the first rank ({row.source})")
    if row.in_flight == "split":
        note += ("; each chunk-micro-batch's saved tensors are held to its weight-gradient pass (W), and from its "
                 "input-gradient pass (I) to W also the gradients into its parameter-consuming ops (linears, norms, "
                 "the head) and its received output gradients (torch _backward.py stage_backward_input, stage.py "
                 "backward_state; analytic/zero_bubble.py); the first stage runs its whole backward at W; the "
                 "walked micro-batch's own backward is timed as a full backward")
    if v == 1:
        return [note]
    held = (f"chunks r and {2 * par.pp - 1} - r (torch generate_stage_to_rank_mapping style v: rank 0 holds the "
            "embedding, the final norm and the head; every rank estimated, the highest reported"
            if row.style == "v" else f"chunks r, r + {par.pp}, ... (torchtitan stage_ids_this_rank, style loop")
    layout = (f"{v} model chunks per rank of an even split of the layers over {par.pp * v} chunks, rank r holding "
              f"{held}; torchtitan's own split "
              "counts the embedding and the head as one layer each: its first and last chunks hold one layer "
              "fewer); each chunk's saved activations counted at its own layers' bytes, in torch's action order")
    return [note, layout]


# analytic/terms/sharding.py and gradients.py ``fsdp2_reduce_scatter``
_TORCHTITAN_FSDP2_NOTE = (
    "torchtitan FSDP2 units as apply_fsdp made them up to v0.1 (commit 9dec370): one per TransformerBlock (the last "
    "not resharded after forward) and the root (embedding, final norm, head) gathered through the forward and "
    "backward and resharded at its reduce-scatter after the embedding's backward; each unit's gradients in "
    "param_dtype, copied into an fp32 reduce-scatter input (mixed_precision_reduce float32) kept until the next "
    "unit's reduce (torch _fully_shard foreach_reduce); the allocator replay leaves out the reduce-scatter "
    "buffers and unsharded gradients; set software.torchtitan 0.2 or later for the embedding and [norm, output] "
    "units of its later releases")
_TORCHTITAN_TIED_NOTE = (
    "torchtitan {} FSDP2 units on a tied model: the embedding, final norm and head share one unit (apply_fsdp keeps "
    "them together when the weights are tied), laid out as the v0.1 root unit: gathered through the forward and "
    "backward, each unit's gradients in param_dtype copied into an fp32 reduce-scatter input kept until the next "
    "unit's reduce (torch _fully_shard foreach_reduce)")
_TORCHTITAN_SPLIT_NOTE = (
    "torchtitan {} FSDP2 units (apply_fsdp_to_decoder, from v0.2.0): the embedding (resharded after forward, "
    "prefetched by the first block's backward), every TransformerBlock (resharded after forward) and [norm, output] "
    "(kept from its forward to its backward); each unit's gradients in param_dtype, copied into an fp32 "
    "reduce-scatter input (mixed_precision_reduce float32) kept until the next unit's reduce (torch _fully_shard "
    "foreach_reduce); the allocator replay keeps the head unit gathered for the whole step and leaves out the "
    "embedding unit, the reduce-scatter buffers and unsharded gradients")


def _framework_note(s: Scenario, fw: str) -> str:
    """Whose conventions the step follows; a framework that runs the HF Trainer named beside it."""
    row = trainer_framework(s.framework)
    if row is None:
        return f"framework behaviour: {fw}"
    return (f"framework behaviour: {fw} ({row.name} trains with the HF Trainer; its own handling of a k-bit base and "
            "its defaults read from facts/trainer_frameworks.py)")


def _kbit_cast_note(s: Scenario, m: ModelSpec, pol: PrecisionPolicy, kbit: bool) -> str:
    """What the step holds the k-bit base's non-quantized parameters in (``StepContext.kbit``)."""
    row = trainer_framework(s.framework)
    if row is not None and not row.kbit_prepares:
        return (f"{row.name} runs no prepare_model_for_kbit_training: embeddings, norms and LM head stay in the "
                f"model's dtype (as {row.name} >= {row.since}: {row.source}); its upcast_layernorm: true (fp32 norms, "
                "so fp32 linear outputs) is not modelled: framework hf-trainer counts fp32 norms and embeddings, more")
    if row is not None and row.casts_back and kbit:  # held fp32 although it casts back: its names do not reach
        return (f"{row.name}: prepare_model_for_kbit_training casts non-quantized parameters to fp32; its conversion "
                "back reaches only modules named *norm* and its embedding names, which do not cover every "
                f"non-quantized parameter of {m.family}: counted fp32, as peft leaves them (an upper bound; "
                "facts/trainer_frameworks.py)")
    if row is not None and casts_back_for(s, m) and not s.deepspeed_engine:
        return (f"{row.name}: prepare_model_for_kbit_training casts non-quantized parameters to fp32, then the norms "
                f"and embeddings are converted back to the model's dtype, as the step holds them (as {row.name} >= "
                f"{row.since}: {row.source})")
    if not kbit and s.deepspeed_engine and pol.frozen_param_bytes < 4:
        return ("non-quantized parameters in the half dtype: DeepSpeed's engine casts every floating parameter to it "
                "(DeepSpeedEngine._configure_distributed_model), whatever fp32 casts a k-bit preparation made")
    if not kbit:
        held = "fp32" if pol.frozen_param_bytes == 4 else pol.half
        return f"non-quantized parameters held in {held} under {s.effective_framework}, as the frozen base weights"
    return "prepare_model_for_kbit_training casts non-quantized parameters (embeddings, norms, LM head) to fp32"


def _kbit_input_assumptions(s: Scenario, fw: str) -> list[str]:
    """Whether a 4-bit base linear keeps its input: bitsandbytes' release, or torchtune's torchao NF4."""
    t = s.train
    if t.peft is not None and t.quantization != "none" and fw == "torchtune":
        return [TORCHTUNE_NF4_NOTE]
    if t.peft is None or t.quantization not in BNB_4BIT_FORMATS:
        return []
    if s.software.bnb_4bit_saves_input:
        return [(f"bitsandbytes {s.software.bitsandbytes} (< 0.43.2): each 4-bit linear keeps its input "
                 "for the backward (MatMul4Bit ctx.tensors = (A, B))")]
    return [("bitsandbytes >= 0.43.2: 4-bit linears keep no input for the backward "
             "(set software.bitsandbytes for older versions, which kept it)")]


def _routing_assumptions(s: Scenario, m: ModelSpec) -> list[str]:
    """The routed rows a rank's experts hold (analytic/moe_capacity.py): balanced without a capacity factor (said
    under expert parallelism, where the dispatch gathers other ranks' tokens), else the capacity's rows."""
    par = s.parallel
    if m.moe is None:
        return []
    tokens = ceil_div(s.train.micro_batch_size * s.train.seq_len, par.cp)
    k, e, f = m.moe.top_k, m.moe.num_experts, par.moe_expert_capacity_factor
    if f is None:
        if par.ep == 1:
            return []
        return [(f"expert parallelism (ep {par.ep}): dropless routing assumed perfectly balanced, each rank's experts "
                 f"holding {tokens} x {k} routed rows per micro-batch; set parallel.moe_expert_capacity_factor to "
                 "size them at the experts' capacity")]
    rows = routed_rows(tokens, k, e, par.ep, f, par.moe_pad_to_capacity)
    how = ("padded to capacity: exactly" if par.moe_pad_to_capacity else
           "tokens beyond capacity dropped: at most")
    return [(f"expert capacity factor {f} (Megatron-LM get_capacity): C = ceil({tokens} x {k} / {e} x {f}) = "
            f"{expert_capacity(tokens, k, e, f)} rows per expert, {how} {rows} routed rows on a rank per micro-batch "
            f"against {tokens * k} balanced; the experts' backward temporaries are counted at the balanced rows")]


_CP_BUFFERS_NOTE = ("not modelled: context parallelism's exchange buffers (ring attention's key/value blocks in "
                    "flight, Ulysses' all-to-all copies of q, k, v and the output), transient, of the order of one "
                    "layer's q, k, v of the local tokens")


def _context_parallel_assumptions(s: Scenario) -> list[str]:
    """What context parallelism splits (the tokens) and what it joins (the sharding group), and the buffers not
    counted.  The same bytes whatever the method: ring attention (torchtitan, Megatron-LM) keeps s / cp queries of
    every head with their keys and values passed round the ring, Ulysses (DeepSpeed, ms-swift, accelerate's sp) swaps
    to all s tokens of heads / cp inside attention; either way a rank saves s x heads / cp of each attention
    tensor."""
    par = s.parallel
    if par.cp == 1 or s.task != "train":
        return []
    t = s.train
    sharded = par.zero_stage > 0 or par.fsdp != "none" or (s.effective_framework == "megatron"
                                                             and megatron_distributed_optimizer(s))
    join = (f"; ZeRO / FSDP / the distributed optimizer shard over dp x cp = {s.data_parallel_degree} x {par.cp} = "
            f"{s.shard_degree} ranks (torchtitan's dp_shard_cp mesh, Megatron-LM's dp-cp group, DeepSpeed's "
            "seq_data_parallel_group)" if sharded else
            f"; gradients are reduced over dp x cp = {s.shard_degree} ranks")
    said = (f"context parallelism (cp {par.cp}): each rank holds {ceil_div(t.seq_len, par.cp)} of every sequence's "
            f"{t.seq_len} tokens in every layer, attention included (ring attention's s / cp queries of every head, "
            f"Ulysses' s tokens of heads / cp: the same bytes){join}; one more NCCL communicator (the cp group)")
    return [said, _CP_BUFFERS_NOTE]


def _sharding_assumptions(s: Scenario, m: ModelSpec, fw: str) -> list[str]:
    """DeepSpeed's ZeRO settings and buffers, and torchtitan's FSDP2 units."""
    out = deepspeed_assumptions(s, m.hidden_size)
    if torchtitan_fsdp2(s):
        split = s.software.torchtitan_split_units
        if split and m.tie_word_embeddings:
            out.append(_TORCHTITAN_TIED_NOTE.format(s.software.torchtitan))
        else:
            out.append(_TORCHTITAN_SPLIT_NOTE.format(s.software.torchtitan) if split else _TORCHTITAN_FSDP2_NOTE)
    elif fw == "torchtitan" and s.parallel.fsdp in ("full_shard", "hybrid_shard") and s.parallel.pp == 1 \
            and (s.train.peft is not None or s.parallel.offload != "none"):
        what = "adapters (train.peft)" if s.train.peft is not None else "CPU offload (FSDP2's CPUOffloadPolicy)"
        out.append(f"not modelled: torchtitan's FSDP2 units with {what}; the generic FSDP terms are counted instead "
                   "(no fp32 reduce-scatter input, two gathered units)")
    return out


# peft's LoRA layers under full checkpointing: a recomputed layer's forward peaks inside it, before its MLP's
# backward.  Where the adapters include the dense MLP's down projection, that moment is modelled
# (activations.recompute_forward_bytes); elsewhere it is stated.  With the standard loss the loss moment's logits are
# larger (Llama-2-7B, vocabulary 32,000, 2,048 tokens: the traced engine within 0.05% of this one); a fused or chunked
# loss removes them, and the traced engine, which runs peft's layers on the meta device, then peaks in the recomputed
# layer (benchmarks/recompute_moment.py).
RECOMPUTE_MOMENT_NOTE = (
    "not modelled: with full checkpointing, what a recomputed layer's forward holds beside its saved tensors (the "
    "layer's input and gradient, its unsaved intermediates, a 4-bit weight dequantized) is derived for peft's "
    "adapters on a Llama-style dense MLP's down projection or outside the MLP only; with these layers and a fused or "
    "chunked loss that moment can be the peak (traced engine, Llama-2-7B's layers: QLoRA on q_proj and v_proj was "
    "5.7% above the estimate before it was derived)")


def recompute_moment_note(c: StepContext) -> list[str]:
    """``RECOMPUTE_MOMENT_NOTE`` where it applies: peft's adapters, full checkpointing, a fused or chunked loss, and a
    layer whose recomputed forward is not derived (``activations.recompute_forward_bytes``)."""
    s, m, ctx = c.s, c.m, c.act
    if (s.train.peft is None or s.train.loss == "standard" or checkpoint_policy(s) != "full"
            or not ctx.peft_layer):
        return []
    derived = all(recompute_forward_bytes(m, ls, ctx) is not None for ls in m.layers)
    return [] if derived else [RECOMPUTE_MOMENT_NOTE]


def _train_assumptions(s: Scenario, m: ModelSpec, attention: str, pol: PrecisionPolicy, fw: str,
                       kbit: bool = False) -> list[str]:
    """The step's assumptions; ``kbit``: a k-bit base peft prepares (``StepContext.kbit``)."""
    t = s.train
    out = [
        _framework_note(s, fw),
        f"attention kernel: {attention} (as PyTorch SDPA would dispatch on the GPU)",
        "sequences are full length (no padding), so SDPA runs without an explicit mask",
        _loss_assumption(s, m, fw),
        *(encoder_decoder_notes(m, attention) if m.encoder_decoder is not None else source_len_note(t.source_len, m)),
        *([PACKING_NOTE] if t.packing else []),
        *([UNSLOTH_OFFLOAD_NOTE if unsloth(s) else OFFLOAD_NOTE] if t.activation_offload != "none" else []),
        *(unsloth_notes(s) if unsloth(s) else []),
        *([TORCHAO_OFFLOAD_NOTE] if t.torchao_cpu_offload != "none" else []),
        IN_BACKWARD_NOTE if t.optimizer_in_backward else MEGATRON_STEADY_NOTE if fw == "megatron" else
        "steady-state step: optimizer states exist; gradients are set to None after each step",
        "NCCL 128 MiB per communicator",
        *_pipeline_schedule_notes(s),
        *mixer_train_notes(m, peft=t.peft is not None, recomputed=checkpoint_policy(s) != "none",
                           kbit_autocast=kbit and pol.autocast and t.quantization in bnb_formats(bits=8)),
    ]
    out += _target_notes(s, m)
    if falls_back_to_eager(t.attention, m, s.software.transformers_version):
        out.append(eager_fallback_note(m))
    out += _release_assumptions(s, m, attention, fw)
    out += _kbit_input_assumptions(s, fw)
    out += optimizer_assumptions(t.optimizer, fw)
    out += float8_assumptions(s)
    out += mx_assumptions(s)
    out += _sharding_assumptions(s, m, fw)
    out += _context_parallel_assumptions(s)
    out += _routing_assumptions(s, m)
    if ckpt_note := policy_assumption(s):
        out.append(ckpt_note)
    if t.peft is not None:
        why = ("DeepSpeed's half module" if s.deepspeed_engine else
               "Lit-GPT under a mixed precision: Lightning Fabric's MixedPrecision leaves the model it builds in fp32; "
               "lit-llama's April-2023 scripts built theirs in bf16 and are precision bf16-true here"
               if litgpt_fp32_base(s) else
               "torchtune builds its LoRA layers with the model, in its dtype" if fw == "torchtune" else
               f"peft {s.software.peft} gives adapters their base weight's dtype" if s.software.peft_adapters_in_base_dtype
               else "peft >= 0.12 upcasts adapters; set software.peft for older versions, which kept the base dtype")
        out.append(f"PEFT: frozen base weights stored in {'fp32' if pol.frozen_param_bytes == 4 else pol.half}, "
                   f"adapters in {'fp32' if pol.param_bytes == 4 else pol.half} ({why})")
        # neither Lit-GPT nor torchtune runs peft's preparation; Unsloth runs its own (LoRA weights only)
        if t.quantization != "none" and fw not in ("lightning", "torchtune") and not unsloth(s):
            out.append(_kbit_cast_note(s, m, pol, kbit))
        if fw == "lightning" and t.quantization in BNB_4BIT_FORMATS:
            out.append(LITGPT_HEAD_NOTE)
    out += _moe_assumptions(s, m)
    return out


def _target_notes(s: Scenario, m: ModelSpec) -> list[str]:
    """The LoRA targets peft skips (they name no module) and those adapted on more modules than peft reaches."""
    t = s.train
    expert_params = experts_are_parameters(m, s.software.fused_moe_experts, t.quantization)
    out = []
    for target in unmatched_lora_targets(t.peft, m, expert_params):
        # PEFT adapts the targets that match and skips the others without a word (peft 0.21 inject_adapter)
        fused = (" (on transformers >= 5 the routed experts are parameters, not modules, and peft does not convert "
                 f"{m.name}'s names)") if expert_params else ""
        out.append(f"LoRA target {target!r} names no module of {m.name}{fused}: PEFT skips it silently, so it gets "
                   "no adapter here either (check the name)")
    for target, leaf in partial_lora_targets(t.peft, m, expert_params):
        out.append(f"LoRA target {target!r} reaches some of {m.name}'s {leaf!r} modules; every {leaf!r} is "
                   "adapted here (an over-estimate of the adapters, their states and saved inputs)")
    return out


def _moe_assumptions(s: Scenario, m: ModelSpec) -> list[str]:
    """How a MoE model's experts are held and run in the step (none for a dense model)."""
    t = s.train
    out: list[str] = []
    if m.moe is not None:
        if t.peft is not None and t.quantize_moe_experts and s.software.fused_moe_experts:
            run = ("estimated as transformers 4.x's per-expert Linear4bit run one expert at a time"
                   if quantized_expert_loop(m, t.quantization) else
                   "held at the format's bytes and run through the grouped GEMMs (its experts were never nn.Linear)")
            out.append("MoE experts 4-bit as train.quantize_moe_experts says (axolotl's quantize_moe_experts, "
                       "Unsloth's patch: stock bitsandbytes would leave transformers 5's fused experts unquantized, "
                       f"bitsandbytes issue #1849), {run}")
        if t.peft is not None and quantized_expert_loop(m, t.quantization):
            out.append("MoE experts quantized per expert by bitsandbytes and run one expert at a time, as "
                       "transformers 4.x loaded them (transformers 5 with stock bitsandbytes leaves its fused "
                       "experts unquantized, bitsandbytes issue #1849); routing is perfectly balanced")
        elif not s.software.fused_moe_experts:
            out.append(f"MoE experts as transformers {s.software.transformers} holds them: one nn.Linear MLP per "
                       "expert (LoRA: a lora.Linear per expert projection)")
        else:
            out.append("MoE experts run through transformers >= 5's grouped GEMMs (grouped_mm_experts_forward); "
                       "routing is perfectly balanced")
            lt = lora_targets(t.peft, m, True, t.quantization)
            if lt.experts_wrapped:
                out.append("LoRA on the fused experts through peft's ParamWrapper: each adapted expert stack "
                           "(W + s B A) is kept from the forward to the backward (as peft 0.21 does with transformers 5; "
                           "set software.transformers for 4.x's per-expert adapters)")
    return out
