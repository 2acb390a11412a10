"""ZeRO-3 / FSDP: full (all-gathered) parameters of the running unit and the prefetched one, and the
FSDP root unit (embeddings, head), which stays unsharded.

torchtitan (``fsdp2_root_unit``) wraps each ``TransformerBlock`` with FSDP2's ``fully_shard`` and then the
whole model, whose own unit (the root) holds the embedding, the final norm and the output head
(``parallelisms/parallelize_llama.py`` ``apply_fsdp`` at commit 9dec370, December 2024; the layout until
v0.2.0, commit 83e6941 of July 2025, gave the embedding and ``[norm, output]`` units of their own).  What
that changes against the generic ZeRO-3 / FSDP picture, read off torch's ``_fully_shard/_fsdp_param_group.py``
and ``_fsdp_state.py`` (torch 2.4-2.13):

* the last block is not resharded after the forward (``reshard_after_forward = int(layer_id) <
  len(model.layers) - 1``) and the root's post-forward frees the last all-gather output it kept
  (``comm_ctx.all_gather_state``), so from the end of the forward to the start of the last block's
  backward one block is gathered, not two; from then on the block in backward plus the one its
  ``pre_backward`` prefetched (``_backward_prefetch``) are;
* every block is resharded in its ``post_backward`` (``reshard_after_backward``), so at the root's
  reduce-scatter, after the embedding's backward, no block is gathered, and the root itself reshards
  there (``post_backward`` calls ``reshard()`` before ``foreach_reduce``): the optimizer step runs on
  sharded parameters only (``fsdp2.root_resharded``, a negative record on the root's key).

From v0.2.0 (``software.torchtitan`` >= 0.2, ``split_units``; ``apply_fsdp`` after commit 83e6941, now
``torchtitan/distributed/fsdp.py`` ``apply_fsdp_to_decoder``) an untied model's embedding is a unit resharded
after its forward and ``[norm, output]`` one kept gathered from its forward to its ``post_backward``, right
after the head's backward; every block is resharded after forward.  So at the loss no block is gathered
(the root ``model`` owns no parameter; its post-forward frees the last kept all-gather output), the head's
unit is gathered until the last block's backward starts, blocks are two from then on but at the first
block's, whose ``pre_backward`` prefetches the embedding instead (``_backward_prefetch`` follows the
post-forward order: embedding, blocks, head), and the embedding is gathered from there to its own reduce
(``fsdp2.embedding_gathered``, ``fsdp2.head_gathered``).
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.float8 import converted_layer_linears, float8_on, head_backward_bytes
from vramplan.analytic.layout import RankParams
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import END, FORWARD, STEP, TIED_EMBEDDING, mlp
from vramplan.analytic.weights import weights_bytes
from vramplan.spec.defaults import torch_fsdp2, torchtitan_fsdp2

__all__ = ["embedding_elements", "fsdp2_root_unit", "gathered", "gathered_bytes", "grads_on_reduce_stream",
           "one_layer", "reduce_cast_ratio", "root_gathered", "root_resharded", "split_units", "split_units_gathered"]


def one_layer(rp: RankParams, params: int) -> RankParams:
    """``rp`` cut down to one layer of ``params`` elements (its linears in proportion): a gathered unit's layout."""
    frac = params / rp.total if rp.total else 0
    return replace(rp, total=params, linear=int(rp.linear * frac), linear_out_features=int(
        rp.linear_out_features * frac), lm_head=0, tower_linear_shapes=())


def gathered_bytes(c: StepContext) -> int:
    """Bytes per gathered parameter (``_gather_bytes``): FSDP's ``param_dtype``."""
    return _gather_bytes(c)


def _gather_bytes(c: StepContext) -> int:
    """Bytes per gathered parameter: the compute dtype's (2 for half precision, else 4)."""
    return 2 if c.pol.compute_bytes <= 2 else 4


def _float8_gathered(c: StepContext) -> bool:
    """torchao's float8 all-gather: ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts each converted
    weight's shard to float8, so FSDP2 gathers 1 byte per element of it instead of the half dtype's 2."""
    return float8_on(c.s) and c.s.train.float8.enable_fsdp_float8_all_gather


def _float8_saving(c: StepContext, layer: int) -> int:
    """Bytes the float8 all-gather saves on one gathered layer: 1 per element of its converted linears."""
    if not _float8_gathered(c):
        return 0
    return sum(fan_in * fan_out for _, fan_in, fan_out in converted_layer_linears(c.m, layer, c.tp))


def fsdp2_root_unit(c: StepContext) -> bool:
    """torchtitan's FSDP2 layout (module docstring): blocks and a root unit, one pipeline stage, no PEFT or
    offload (torchtitan trains neither), parameters sharded (``full_shard`` or ``hybrid_shard``)."""
    return torchtitan_fsdp2(c.s) and bool(c.layer_specs)  # spec/defaults.py, which the report's notes read too


def grads_on_reduce_stream(c: StepContext) -> bool:
    """torch FSDP makes each final gradient on a side stream, so the caching allocator keeps the gradients in
    blocks of that stream, which the compute stream's tensors never reuse (and the reverse).

    FSDP2 (``_fully_shard/_fsdp_collectives.py`` ``foreach_reduce``, torch 2.13 :611-612): ``reduce_output`` is
    allocated inside ``with device_handle.stream(reduce_scatter_stream)``, and the sharded ``.grad`` of each
    parameter is a view of it (``torch.as_strided``, :704; a cast to the parameter dtype runs on the post-reduce
    stream, :685-696).  ``foreach_reduce`` runs on one rank too (it copies into ``reduce_output`` there, :618-631),
    so this holds whatever the number of ranks.  FSDP1 (``_runtime_utils.py``): ``_post_backward_hook`` runs
    ``_reduce_grad`` under ``state._post_backward_stream`` (:755), where ``_get_reduce_scatter_tensors`` makes
    ``new_sharded_grad = torch.empty_like(chunks[0])`` (:901) and ``_cast_grad_to_param_dtype`` its fp32 copy
    (:1048).  Unsharded (``no_shard``, or one rank, which FSDP1 clamps to NO_SHARD, ``_init_utils.py`` :430),
    ``_reduce_grad_no_shard`` all-reduces ``.grad`` in place on that stream and the gradient moves to a block of
    it only when it is cast to the parameter dtype (:932-947, :1048-1053: "produced in the computation stream and
    consumed here in the post-backward stream"): under mixed precision (fp32 parameters, half compute), not in
    bf16-true or fp32.  Under HSDP the cast and accumulation run on the all-reduce stream (FSDP2 :652, FSDP1
    :867-877): the final gradients are off the compute stream all the same, one side pool for them.

    The allocator's pools are ordered by (stream, size, address) and ``get_free_block`` returns only a block of
    the requesting stream (``c10/cuda/CUDACachingAllocator.cpp``; with ``expandable_segments`` each stream maps
    its own segment), so a gradient block freed at ``zero_grad`` serves the next step's gradients only, and the
    activations freed late in the backward cannot hold gradients.  Applies while the gradients stay on the GPU
    (no offload); DeepSpeed and Megatron-LM reduce into buffers of their own (not this).  Not modelled: torch
    2.4's FSDP2, which also allocated the reduce-scatter input on that stream (from 2.5 it is allocated before
    the stream context); a symmetric-memory reduce-scatter's private pool (opt-in); under gradient accumulation each
    micro-batch's fresh reduce output (the first micro-batch's, in a reduce dtype below the gradient's, is counted:
    ``reduce_cast_ratio``); a policy without a cast (Lightning's bf16-true) with adapters, whose few MiB take the pool
    as well."""
    par = c.s.parallel
    if par.fsdp == "none" or c.offload_opt or c.s.effective_framework in ("deepspeed", "megatron", "openrlhf"):
        return False
    if par.fsdp in ("full_shard", "shard_grad_op", "hybrid_shard") and c.shards[1] > 1:
        return True
    return torch_fsdp2(c.s) or c.pol.compute_bytes < c.pol.param_bytes


def reduce_cast_ratio(c: StepContext) -> tuple[int, int]:
    """(reduce-dtype bytes, gradient bytes) per element when torch FSDP reduces a unit's gradients in a dtype below the
    gradient's and casts them on the side stream, else (0, 1): the reduce output is a block of that stream's pool,
    made and freed around each unit's final gradient.

    FSDP2 ``foreach_reduce`` (torch 2.13 ``_fsdp_collectives.py``): ``reduce_output`` in the reduce dtype under the
    reduce-scatter stream (:611-612), then ``_to_dtype_if_needed(reduce_output, orig_dtype)`` on the post-reduce stream
    (the same stream but under HSDP, :685-696) makes the fp32 gradient; FSDP1 (``_runtime_utils.py``):
    ``new_sharded_grad`` in the reduce dtype (:901), then ``_cast_grad_to_param_dtype`` (:1048), both on the
    post-backward stream.  The reduce dtype is the mixed-precision dtype under accelerate, for FSDP2 and FSDP1 alike
    (accelerate 1.15 ``utils/dataclasses.py`` ``FullyShardedDataParallelPlugin.set_mixed_precision``: ``{"param_dtype": dtype,
    "reduce_dtype": dtype}``): framework ``accelerate`` and the HF Trainer, which wraps through it.  Elsewhere the reduce
    dtype is the script's or the framework's own (torchtitan's ``mixed_precision_reduce`` fp32, verl's fp32, a
    Lightning script's ``MixedPrecisionPolicy``, a plain script's): no such block is counted there (torchtitan and verl
    reduce in the gradient's dtype; the others are not known)."""
    if not grads_on_reduce_stream(c) or c.s.effective_framework not in ("accelerate", "hf-trainer"):
        return 0, 1
    reduce_bytes, grad_bytes = c.pol.compute_bytes, c.pol.grad_bytes
    return (reduce_bytes, grad_bytes) if reduce_bytes < grad_bytes else (0, 1)


def split_units(c: StepContext) -> bool:
    """torchtitan >= 0.2 on an untied model: the embedding and ``[norm, output]`` are units of their own
    (module docstring); a tied model keeps its embedding, norm and head in one unit, as the root was."""
    return fsdp2_root_unit(c) and c.s.software.torchtitan_split_units and not c.m.tie_word_embeddings


def embedding_elements(c: StepContext) -> int:
    """The untied input embedding's elements on this rank (its vocabulary split over tp), 0 when tied."""
    if c.m.tie_word_embeddings:
        return 0
    emb = sum(p.total for p in c.m.params if p.role in ("embedding", "position"))
    return min(-(-emb // c.tp), c.rp.outside_layers)


def gathered(c: StepContext) -> list[Term]:
    """Current + prefetched unit (FSDP limit_all_gathers; DeepSpeed's prefetch), from the forward to
    the end of the backward.

    torchtitan (module docstring): one unit from the forward (the last block, kept), the second from the
    last block's backward (the prefetched one), both until the root's reduce-scatter (``TIED_EMBEDDING``).
    Worked example, Llama 3.1 8B on 8 GPUs: a block is 218,112,000 parameters, 436,224,000 B in bf16; the
    loss moment holds 436,224,000 B of blocks (the generic record: 872,448,000)."""
    if c.shards[2] <= 1 or deepspeed_zero(c.s):
        return []  # DeepSpeed fetches module by module (terms/deepspeed.py zero3_gathered)
    rp, pol = c.rp, c.pol
    layer_p = max(rp.per_layer) if rp.per_layer else 0
    if c.peft is not None and c.quant != "none":
        layer_p_bytes = weights_bytes(one_layer(rp, layer_p), pol.frozen_param_bytes, c.quant)
    else:
        largest = rp.layers[rp.per_layer.index(layer_p)] if rp.per_layer else 0
        layer_p_bytes = layer_p * _gather_bytes(c) - _float8_saving(c, largest)
    n = len(c.layer_specs)
    if split_units(c):
        # the records are named "gathered": the event stream (analytic/events.py) still sees 2 units
        return [Term(K.GATHERED, layer_p_bytes, mlp(n - 1), TIED_EMBEDDING, "gathered"),
                Term(K.GATHERED, layer_p_bytes, mlp(n - 1), mlp(0), "gathered")]
    if fsdp2_root_unit(c):
        return [Term(K.GATHERED, layer_p_bytes, FORWARD, TIED_EMBEDDING, "gathered"),
                Term(K.GATHERED, layer_p_bytes, mlp(n - 1), TIED_EMBEDDING, "gathered")]
    return [Term(K.GATHERED, 2 * layer_p_bytes, FORWARD, STEP, "gathered")]


def _root_bytes(c: StepContext) -> int:
    root = c.rp.outside_layers * _gather_bytes(c)
    if _float8_gathered(c) and c.rp.lm_head and head_backward_bytes(c.s, c.m, c.tp, 1):
        root -= c.rp.lm_head  # the converted head gathered in float8 (its embedding, an nn.Embedding, is not)
    return root


def root_gathered(c: StepContext) -> list[Term]:
    """The FSDP root unit (embeddings, head) stays unsharded for the whole step (torchtitan >= 0.2:
    ``split_units_gathered`` instead)."""
    if c.shards[2] <= 1 or c.s.parallel.fsdp == "none" or split_units(c):
        return []
    return [resident(K.GATHERED_ROOT, _root_bytes(c), "gathered.root")]


def split_units_gathered(c: StepContext) -> list[Term]:
    """torchtitan >= 0.2 (module docstring): the head's unit (final norm + head) gathered from the forward to
    its ``post_backward``, before the last block's backward; the embedding's from the first block's backward
    (prefetched) to its own ``post_backward``, after its backward.

    Worked example, Llama 3.1 8B on 8 GPUs (bf16): the head's unit 2 x (128,256 x 4096 + 4096) = 1,050,681,344 B,
    the embedding's 2 x 525,336,576 = 1,050,673,152 B (together the v0.1 root's 2,101,354,496)."""
    if not split_units(c):
        return []
    emb, n = embedding_elements(c), len(c.layer_specs)
    half = _gather_bytes(c)
    return [Term(K.GATHERED_ROOT, (c.rp.outside_layers - emb) * half, FORWARD, mlp(n - 1), "fsdp2.head_gathered"),
            Term(K.GATHERED_ROOT, emb * half, mlp(0), TIED_EMBEDDING, "fsdp2.embedding_gathered")]


def root_resharded(c: StepContext) -> list[Term]:
    """torchtitan: the root unit reshards in its ``post_backward``, before its reduce-scatter, and stays
    sharded through the optimizer step (module docstring): the root's gathered bytes taken back from the
    root's reduce-scatter (``TIED_EMBEDDING``) on.  Not a static term: the forward and backward hold them."""
    if not fsdp2_root_unit(c) or split_units(c):
        return []
    return [Term(K.GATHERED_ROOT, -_root_bytes(c), TIED_EMBEDDING, END, "fsdp2.root_resharded")]
