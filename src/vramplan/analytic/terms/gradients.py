"""Parameter gradients: produced layer by layer in the backward, kept until the optimizer step.

Gradients exist during the forward pass only from the second micro-batch of a gradient-accumulation
window on (the Trainer zeroes them with ``set_to_none=True`` after each optimizer step), or on a
pipeline stage with several micro-batches in flight: then all of them are there from the start.
Otherwise the head's (and final norm's) come at the loss, each layer's during its backward (its MLP's
output projection first), and the input embedding's last (its backward runs after the first layer's);
a tied embedding gets its gradient at the LM head, first.  Offloaded (ZeRO-Offload): none on the GPU.
"""

from __future__ import annotations

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.gradients import gradient_bytes, tied_embedding_accumulation_bytes
from vramplan.analytic.layout import LoraTargets, RankParams, replicated_embedding_grad
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.terms.sharding import embedding_elements, fsdp2_root_unit, gathered_bytes, split_units
from vramplan.analytic.timeline import END, FORWARD, STEP, TIED_EMBEDDING, Loc, attention, layer_done, mlp
from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.spec.scenario import Peft
from vramplan.units import ceil_div

__all__ = ["REDUCE_BYTES", "embedding_gradient_bytes", "fsdp2_reduce_scatter", "gradients", "gradients_from_start",
           "has_root_reduce_point", "has_tied_embedding_backward", "layer_gradient_bytes", "megatron_grad_buffer",
           "replicated_embedding", "tied_embedding", "total_gradient_bytes", "unsharded_gradients",
           "zero3_flat_gradients"]

# torchtitan's reduce dtype: ``training.mixed_precision_reduce``, default "float32", the only choice
# (torchtitan/config_manager.py at commit 9dec370), passed to ``MixedPrecisionPolicy(reduce_dtype=...)``
REDUCE_BYTES = 4


def replicated_embedding(c: StepContext) -> tuple[int, int]:
    """transformers' tensor parallelism: the vocabulary-parallel embedding's gradient is replicated
    (layout.HF_TP_FRAMEWORKS); the optimizer copies this rank's row shard out of it.
    Returns (the full embedding's elements, the gradient bytes beyond this rank's shard)."""
    emb_full = replicated_embedding_grad(c.m, c.tp, c.framework) if c.peft is None and c.rp.has_embedding else 0
    return emb_full, ceil_div(emb_full - ceil_div(emb_full, c.tp), c.shards[1]) * c.pol.grad_bytes


def zero3_flat_gradients(c: StepContext) -> bool:
    """DeepSpeed ZeRO-3 (on any number of ranks): the gradient shard is a flat buffer made at
    ``DeepSpeedZeroOptimizer_Stage3.__init__`` (deepspeed 0.19.8 runtime/zero/stage3.py
    ``grad_partitions_flat_buffer = torch.zeros(sum(p.partition_numel() ...))``), alive for the whole step."""
    return deepspeed_zero(c.s) and c.s.parallel.zero_stage == 3


def megatron_grad_buffer(c: StepContext) -> bool:
    """Megatron-Core's DDP: every parameter's ``main_grad`` is a view of one grad buffer, a ``torch.zeros`` made when
    the model is wrapped and zeroed, never freed, between steps (core_v0.15.0
    megatron/core/distributed/param_and_grad_buffer.py lines 722-727, 752; facts/megatron.py): all of it exists
    from the forward on."""
    return c.framework == "megatron"


def gradients_from_start(c: StepContext) -> bool:
    """Every gradient exists from the forward on: kept from an earlier micro-batch, DeepSpeed ZeRO-3's flat
    partition, or Megatron-Core's grad buffer."""
    return c.grads_during_fwd or zero3_flat_gradients(c) or megatron_grad_buffer(c)


def total_gradient_bytes(c: StepContext) -> int:
    """All of this rank's gradients (its ZeRO-2/3 / FSDP shard), 0 when offloaded."""
    if c.offload_opt:
        return 0
    return gradient_bytes(c.trainable, c.pol.grad_bytes, c.shards[1]) + replicated_embedding(c)[1]


def _grad_bytes_layer(rp: RankParams, j: int, grad_bytes: int, shards: int, peft: object) -> int:
    n = rp.lora_per_layer[j] if peft is not None else rp.per_layer[j]
    return ceil_div(n, shards) * grad_bytes


def layer_gradient_bytes(c: StepContext) -> list[int]:
    """Each layer's gradient bytes on this rank (its shard), 0 when offloaded."""
    n = len(c.layer_specs)
    if c.offload_opt:
        return [0] * n
    rp, grad_bytes, shards, peft = c.rp, c.pol.grad_bytes, c.shards[1], c.peft
    return [_grad_bytes_layer(rp, j, grad_bytes, shards, peft) for j in range(n)]


def embedding_gradient_bytes(c: StepContext, outside: int) -> int:
    """The untied input embedding's gradient, produced last (within the gradients outside the layers)."""
    m = c.m
    if c.peft is not None or m.tie_word_embeddings or not c.rp.has_embedding:
        return 0
    emb = sum(p.total for p in m.params if p.role in ("embedding", "position"))
    return min(outside, ceil_div(ceil_div(emb, c.tp), c.shards[1]) * c.pol.grad_bytes + replicated_embedding(c)[1])


def gradients(c: StepContext) -> list[Term]:
    """The parameter gradients: outside the layers (head, final norm; the embedding last), each layer's.

    With gradients during the forward all exist from the start.  Otherwise each layer's appear in its
    backward: the MLP's output projection's during the MLP part (``_down_grad_bytes``), the rest by
    the attention part.  After the backward the total is the rank's shard of all trainable parameters,
    which per-layer rounding can make a few bytes smaller than the sum of the layers' shards
    (``gradients.rounding``, zero or negative).
    """
    if c.grads_one_at_a_time:
        return []  # one parameter's at a time (terms/in_backward.py)
    total, per_layer = total_gradient_bytes(c), layer_gradient_bytes(c)
    attention_split = layer_activations(c).attention_split
    outside = max(0, total - sum(per_layer))
    embed = embedding_gradient_bytes(c, outside)
    # DeepSpeed ZeRO-3's gradient partition is one flat buffer made at the optimizer's __init__ (stage3.py
    # grad_partitions_flat_buffer): alive from the forward on, like gradients kept from an earlier micro-batch
    gdf, n = gradients_from_start(c), len(per_layer)
    # torchtitan: the root unit's sharded gradients are its reduce-scatter's output, after the embedding's
    # backward (fsdp2_reduce_scatter); they exist at the optimizer step only
    head_born: Loc = STEP if fsdp2_root_unit(c) and not split_units(c) else mlp(n - 1)
    embed_born: Loc = STEP if fsdp2_root_unit(c) else TIED_EMBEDDING
    out = [Term(K.GRADIENTS, outside - embed, FORWARD if gdf else head_born, END, "gradients.head"),
           Term(K.GRADIENTS, embed, FORWARD if gdf else embed_born, END, "gradients.embedding"),
           Term(K.GRADIENTS, total - outside - sum(per_layer), FORWARD if gdf else TIED_EMBEDDING, END,
                "gradients.rounding")]
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    m, specs, peft, lt, rp, tp, ep = c.m, c.layer_specs, c.peft, c.lt, c.rp, c.tp, c.ep  # read once, not per layer
    lora = rp.lora_per_layer if peft is not None else ()
    # the share depends on what the layer computes (MoE or dense, its MLP width), its gradient bytes and its
    # adapters, not on its index: computed once per kind of layer (the layers of a model are mostly alike)
    shares: dict[tuple[bool, int, int, int], int] = {}
    for j in range(n - 1, -1, -1):
        g, ls = per_layer[j], specs[j]
        if attention_split[j]:
            kind = (ls.moe, ls.intermediate_size, g, lora[j] if j < len(lora) else 0)
            down = shares.get(kind, -1)
            if down < 0:
                down = shares[kind] = _down_grad_bytes(m, ls, g, peft, lt, rp, j, tp, ep)
        else:
            down = g
        rows += [(down, FORWARD if gdf else mlp(j), END, "gradients.layer", j),
                 (g - down, FORWARD if gdf else attention(j), END, "gradients.layer", j)]
    return out + device_terms(K.GRADIENTS, rows)


def unsharded_gradients(c: StepContext) -> list[Term]:
    """ZeRO-3 / FSDP: a layer's full gradients exist before they are reduce-scattered.

    torchtitan (FSDP2, ``fsdp2_root_unit``): autograd computes them in the unsharded parameter's dtype, the
    ``param_dtype`` of ``MixedPrecisionPolicy`` (bf16 under bf16-mixed: 2 B per element, not the sharded
    gradient's 4); their copy in the reduce dtype is ``fsdp2_reduce_scatter``."""
    if c.shards[2] <= 1 or deepspeed_zero(c.s):
        return []  # DeepSpeed copies each gradient into its bucket as it comes (terms/deepspeed.py grad_in_flight)
    rp, grad_bytes, peft = c.rp, c.pol.grad_bytes, c.peft
    if fsdp2_root_unit(c):
        grad_bytes = gathered_bytes(c)
    return device_terms(K.UNSHARDED_GRADS, [(_grad_bytes_layer(rp, j, grad_bytes, 1, peft), mlp(j), layer_done(j),
                                              "gradients.unsharded", j)
                                             for j in range(len(c.layer_specs) - 1, -1, -1)])


def has_root_reduce_point(c: StepContext) -> bool:
    """The step has a moment after the embedding's backward (``TIED_EMBEDDING``): the tied embedding's two
    contributions summed, or torchtitan's root unit reduce-scattered (``fsdp2_reduce_scatter``)."""
    return has_tied_embedding_backward(c) or fsdp2_root_unit(c)


def fsdp2_reduce_scatter(c: StepContext) -> list[Term]:
    """torchtitan (FSDP2): the reduce-scatter input of each unit, and the root unit's unsharded gradients.

    FSDP2's ``post_backward`` (torch 2.4-2.13, ``_fully_shard/_fsdp_param_group.py``) hands a unit's
    unsharded gradients to ``foreach_reduce`` (``_fsdp_collectives.py``), which allocates the reduce-scatter
    input, ``reduce_scatter_input_numel`` elements of the reduce dtype (fp32, ``REDUCE_BYTES``: every
    parameter of the unit, dim 0 padded to a multiple of the world size), copies the gradients into it
    (``foreach_reduce_scatter_copy_in``) and only then frees them.  The input is kept
    (``comm_ctx.reduce_scatter_state``; from 2.11 the ``reduce_scatter_states`` list, capped by
    ``reduce_scatter_max_input_buffers``, default 1) until the next unit's ``post_backward`` drops it before
    allocating its own.  The output, ``1 / world`` of the input, becomes the sharded gradient (``.grad``,
    counted as ``gradients``; under HSDP it is all-reduced in place and ``_all_reduce_state`` keeps that same
    tensor, nothing more).  So block j's input (4 B x its parameters) lives from the end of its backward
    (``layer_done(j)``) through block j - 1's backward, and block 0's until the root's reduce.

    The root unit (embedding, final norm, head) is reduce-scattered last, after the embedding's backward
    (``TIED_EMBEDDING``): the head's unsharded gradient (param dtype) exists from the head's backward
    (``mlp(n - 1)``), the embedding's from its backward; at the root's copy-in both are there beside the
    root's reduce-scatter input (4 B x the root's parameters), and the root is resharded
    (``sharding.root_resharded``).

    Worked example, Llama 3.1 8B on 8 GPUs, bf16-mixed: a block is 218,112,000 parameters, its input
    872,448,000 B (4 x 218,112,000), beside the next block's unsharded bf16 gradients (436,224,000 B) in
    its backward; the root is 2 x 128,256 x 4096 + 4096 = 1,050,677,248 parameters: the head's gradient
    (525,340,672 parameters, final norm included) 1,050,681,344 B from the head's backward, and at the
    root's reduce 1,050,677,248 x (2 + 4) = 6,304,063,488 B.  The padding of dim 0 (at most world - 1
    rows per parameter) is left out.
    """
    if not fsdp2_root_unit(c):
        return []
    rp, n = c.rp, len(c.layer_specs)
    rows: list[tuple[int, Loc, Loc, str, int]] = [
        (rp.per_layer[j] * REDUCE_BYTES, layer_done(j), layer_done(j - 1) if j else TIED_EMBEDDING,
         "fsdp2.reduce_scatter_input", j) for j in range(n - 1, -1, -1)]
    half, emb = gathered_bytes(c), embedding_elements(c)  # a tied head's gradient is the embedding's
    if split_units(c):
        # torchtitan >= 0.2: [norm, output] reduce right after the head's backward (its input kept through the last
        # block's backward); the embedding's own unit after its backward
        head = rp.outside_layers - emb
        rows.append((head * REDUCE_BYTES, mlp(n - 1), layer_done(n - 1), "fsdp2.reduce_scatter_input.head", -1))
        return device_terms(K.REDUCE_SCATTER_INPUT, rows) + [
            Term(K.UNSHARDED_GRADS, emb * half, TIED_EMBEDDING, STEP, "fsdp2.root_unsharded.embedding"),
            Term(K.REDUCE_SCATTER_INPUT, emb * REDUCE_BYTES, TIED_EMBEDDING, STEP,
                 "fsdp2.reduce_scatter_input.embedding")]
    out = [Term(K.UNSHARDED_GRADS, (rp.outside_layers - emb) * half, mlp(n - 1), STEP, "fsdp2.root_unsharded.head"),
           Term(K.UNSHARDED_GRADS, emb * half, TIED_EMBEDDING, STEP, "fsdp2.root_unsharded.embedding"),
           Term(K.REDUCE_SCATTER_INPUT, rp.outside_layers * REDUCE_BYTES, TIED_EMBEDDING, STEP,
                "fsdp2.reduce_scatter_input.root")]
    return device_terms(K.REDUCE_SCATTER_INPUT, rows) + out


def embedding_shard_copy(c: StepContext) -> list[Term]:
    """The optimizer's copy of this rank's row shard of a replicated TP embedding gradient."""
    emb_full = replicated_embedding(c)[0]
    if not emb_full or c.offload_opt:
        return []
    nbytes = ceil_div(ceil_div(emb_full, c.tp), c.shards[0]) * c.pol.grad_bytes
    return [Term(K.OPTIMIZER_STEP, nbytes, STEP, END, "optimizer.step.embedding_shard")]


def has_tied_embedding_backward(c: StepContext) -> bool:
    """The step has a moment at the tied embedding's backward (its two gradient contributions summed)."""
    return c.peft is None and c.m.tie_word_embeddings and c.rp.has_embedding and c.last and not c.offload_opt


def tied_embedding(c: StepContext) -> list[Term]:
    """The embedding's backward, last: all gradients exist and the tied parameter's two contributions
    are summed (gradients.tied_embedding_accumulation_bytes)."""
    if not has_tied_embedding_backward(c) or fsdp2_root_unit(c):
        # torchtitan's root unit (fsdp2_reduce_scatter): the tied weight's unsharded gradient accumulates its two
        # contributions in the param dtype and is held there by ``fsdp2.root_unsharded.head``; the embedding's
        # contribution (2 B per element) is freed before the root's fp32 reduce-scatter input (4 B) is made, so the
        # moment holds at most 2 + 4 B per element, which those two terms count
        return []
    pol = c.pol
    nbytes = tied_embedding_accumulation_bytes(ceil_div(c.m.vocab_size, c.tp), c.m.hidden_size, pol.grad_bytes,
                                               head_grad_is_view=not pol.autocast)
    return [Term(K.TIED_EMBEDDING, nbytes, TIED_EMBEDDING, STEP, "gradients.tied_embedding")]


def _down_grad_bytes(m: ModelSpec, layer: LayerSpec, layer_grad: int, peft: Peft | None, lt: LoraTargets,
                     rp: RankParams, j: int, tp: int = 1, ep: int = 1) -> int:
    """The share of a layer's gradient that belongs to its MLP's output projection (the experts'
    down projections for MoE): the gradient the MLP's backward produces first.  Adapters: the whole
    layer's (small), but for the fused experts' adapters (``ParamWrapper``), which are not small: only
    the down projection's are made by then."""
    h = m.hidden_size
    n_attn = h * (2 * m.q_width + 2 * m.kv_width)
    if peft is not None:
        lora_layer = rp.lora_per_layer[j] if j < len(rp.lora_per_layer) else 0
        if layer.moe and m.moe is not None and lt.experts_wrapped and lora_layer:
            e = m.moe
            inter = e.expert_intermediate_size if ep > 1 else ceil_div(e.expert_intermediate_size, tp)
            down_adapters = lt.down_rank * ceil_div(e.num_experts, ep) * (m.hidden_size + inter)
            return layer_grad * min(down_adapters, lora_layer) // lora_layer
        return layer_grad
    if layer.moe and m.moe is not None:
        down = h * (m.moe.num_experts * m.moe.expert_intermediate_size + m.moe.shared_intermediate_size)
        n_mlp = (3 if m.moe.gated else 2) * down + h * m.moe.num_experts
    elif layer.intermediate_size:
        down = h * layer.intermediate_size
        n_mlp = (3 if m.mlp_gated else 2) * down
    else:
        return layer_grad
    total = n_mlp + n_attn
    return layer_grad * down // total if total else layer_grad
