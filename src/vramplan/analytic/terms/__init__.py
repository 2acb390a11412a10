"""The memory terms of a training step: one function per term (or small group of related terms),
each returning ``Term`` records (terms/base.py) for one pipeline stage (terms/context.py).

``TERMS`` is the registry: the step's terms are ``[t for f in TERMS for t in f(ctx)]``, in this
order (a moment lists its keys in the order their first term comes here).  Adding a term adds its
function to a module here and one line to ``TERMS`` (docs/checklists/memory-term.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vramplan.analytic.terms import (
    casts,
    cpu_offload,
    cross_attention,
    deepspeed,
    encoder_decoder,
    float8,
    gradients,
    in_backward,
    loss,
    optimizer_state,
    resident,
    saved,
    sharding,
    transients,
    vision,
)
from vramplan.analytic.terms.base import Term, by_layer, bytes_of
from vramplan.analytic.terms.context import StepContext
from vramplan.spec.load import Resolved

__all__ = ["STATIC_TERMS", "TERMS", "StepContext", "Term", "by_layer", "bytes_of", "static_by_stage", "static_bytes",
           "static_terms", "step_terms"]

TermFn = Callable[[StepContext], list[Term]]

TERMS: tuple[TermFn, ...] = (
    resident.parameters,              # weights: this rank's parameters (or their offloaded copy)
    resident.hf_buffers,              # weights: buffers older transformers releases register (rotary caches)
    sharding.root_gathered,           # weights: the FSDP root unit, unsharded
    deepspeed.persistent,             # weights: DeepSpeed ZeRO-3's persistent (small) parameters, gathered
    sharding.split_units_gathered,    # ... or torchtitan >= 0.2's embedding and head units, while gathered
    optimizer_state.optimizer_states,  # optimizer states (managed, offloaded)
    optimizer_state.master,           # fp32 master weights
    resident.workspaces,              # cuBLAS workspaces
    resident.ddp_buckets,             # DDP's gradient buckets
    deepspeed.reduce_buckets,         # DeepSpeed ZeRO's reduce buckets (and ZeRO-1/2 offload staging)
    gradients.gradients,              # parameter gradients, layer by layer
    in_backward.gradients,            # ... or one parameter's at a time (optimizer in the backward)
    cpu_offload.small_gradients,      # torchao's offload_gradients: the GPU-kept tensors' gradients
    saved.layer_saved,                # saved activations per layer (checkpointing, in-flight micro-batches)
    saved.shared_saved,               # RoPE cos/sin, masks
    saved.rotary_layer_copies,        # ... and a layer's own cos/sin (GLM)
    saved.release_causal_mask,        # ... transformers 4.38's 4-D mask of max_position_embeddings^2
    saved.training_cache,             # ... the DynamicCache of a training forward with use_cache on
    vision.tower_saved,               # a vision-language model's vision tower, trained on the batch's images
    cross_attention.cross_saved,      # mllama: the projected vision states and masks the cross-attention layers share
    encoder_decoder.encoder_saved,    # an encoder-decoder model's encoder stack, its output and T5's shared biases
    saved.head_saved,                 # final norm + LM-head input
    casts.layer_casts,                # autocast weight copies per layer
    casts.head_casts,                 # the head's weight copy
    float8.layer_casts,               # torchao float8: each layer's backward casts
    float8.head_casts,                # ... the converted head's
    float8.precomputed_scales,        # ... the precomputed weight scales
    transients.layer_backward,        # each layer's backward temporaries
    transients.nf4_dequant,           # ... torchtune's NF4 weight dequantized in each layer's backward
    transients.mixer_scan_products,   # ... a Mamba2 scan's broadcast products before transformers 5.18
    transients.mixer_forward,         # the last Mamba2 mixer's forward temporaries (without checkpointing)
    sharding.gathered,                # ZeRO-3/FSDP all-gathered units
    deepspeed.zero3_gathered,         # ... DeepSpeed ZeRO-3's: running module, prefetch, kept for reuse
    gradients.unsharded_gradients,    # a layer's full gradients before reduce-scatter
    deepspeed.grad_in_flight,         # ... DeepSpeed ZeRO-3's, on their way into the reduce bucket
    gradients.fsdp2_reduce_scatter,   # torchtitan's FSDP2: reduce-scatter inputs, the root unit's gradients
    sharding.root_resharded,          # ... and its root unit resharded after its reduce
    loss.loss,                        # logits and loss
    loss.litgpt_head_dequant,         # Lit-GPT's 4-bit LM head dequantized per chunk
    loss.layer_forward,               # a head-less stage's last layer forward
    gradients.tied_embedding,         # tied embedding gradient contributions
    optimizer_state.step_temporary,   # optimizer.step() temporaries
    deepspeed.step_norm_and_flatten,  # ... DeepSpeed ZeRO's fp32 gradient, and its norm and flattening before it
    deepspeed.offload_norm_copies,    # ... or, with ZeRO-Offload, the norm's fp64 copies in the backward
    deepspeed.zero3_offload_grad_copies,  # ... ZeRO-3's: each gradient partition's GPU and fp32 copies
    in_backward.step_temporaries,     # ... or each parameter's, in the backward
    gradients.embedding_shard_copy,   # the step's copy of a replicated TP embedding gradient's shard
)


def step_terms(c: StepContext, registry: Sequence[TermFn] = TERMS) -> list[Term]:
    """Every term of one stage's step, in registry order."""
    return [t for f in registry for t in f(c)]


# the terms resident for the whole step whatever the micro-batch and sequence length: every moment
# starts from them (plus the managed states, outside the allocator)
STATIC_TERMS: tuple[TermFn, ...] = (
    resident.parameters,
    resident.hf_buffers,
    sharding.root_gathered,
    deepspeed.persistent,
    optimizer_state.optimizer_states,
    optimizer_state.master,
    resident.workspaces,
    resident.ddp_buckets,
    deepspeed.reduce_buckets,
    float8.precomputed_scales,
)


def static_by_stage(r: Resolved) -> list[tuple[int, int]]:
    """(device bytes, managed bytes) of the static terms on each stage worth estimating (``stages``):
    the device terms alive the whole step (weights, the FSDP root unit, optimizer states, fp32 masters,
    cuBLAS workspaces, DDP buckets) and the managed (paged) optimizer states.  It needs no activation:
    ``static_terms`` runs only the resident term functions."""
    from vramplan.analytic.attention import resolve_attention
    from vramplan.analytic.terms.context import layout_style, stages, step_policy

    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    out = []
    for stage in stages(r.scenario.parallel.pp, layout_style(r.scenario)):
        device = managed = 0
        for t in static_terms(StepContext(r, stage, attention, repeat)):
            if t.where == "device":
                device += t.nbytes
            elif t.where == "managed":
                managed += t.nbytes
        out.append((device, managed))
    return out


def static_bytes(r: Resolved) -> int:
    """The static floor of ``peak_allocated + managed``: the heaviest stage's static device terms plus
    the smallest managed states of any stage.

    Every moment of a stage holds its static device terms, and the estimate reports the stage with the
    highest peak, so its peak allocated bytes are at least every stage's static device bytes; the managed
    states it adds are its own stage's, at least the smallest.  With one stage this is the static terms'
    sum.  The planner's lower bound (plan/bound.py) is this plus the CUDA context and NCCL buffers.
    """
    per = static_by_stage(r)
    return max(d for d, _ in per) + min(m for _, m in per)


def static_terms(c: StepContext) -> list[Term]:
    """The stage's static terms (``STATIC_TERMS``)."""
    return step_terms(c, STATIC_TERMS)
