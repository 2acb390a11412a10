"""The analytic engine's training step as a sequence of allocations and frees (``vramplan.alloc`` events).

The closed-form engine (analytic/train.py) knows, per term, how many bytes exist at each moment;
PyTorch's caching allocator also cares about *which* tensors they are and in what order they come
and go: a block freed by the forward pass is cached and later split by smaller requests, so a
larger request further on needs a new segment (fragmentation).  This module turns the engine's
terms into the tensors the allocator sees, in the order one step of transformers' modeling code
makes them, so that ``vramplan.alloc.replay`` can give ``max_memory_reserved``.

Order and tensor list, learnt from the traced engine (``vramplan trace SCENARIO --timeline``) on
Llama and GPT-2 layers (trace/step.py; the op list of a Llama layer is in docs/allocator.md):

* setup: every parameter tensor, in module order (embedding, layers, final norm, head); the fp32
  masters (DeepSpeed); the optimizer states when they already exist; the DDP buckets; the input ids;
* forward, per layer: the input norm (an fp32 ``pow`` temporary, the norm output), then the saved
  tensors of the norm and the attention (the closed form's records, below), RoPE's fp32 temporaries
  before the kernel's query, each projection's weight cast, the output projection's output; then the
  same for the MLP.  Temporaries are freed where the trace frees them;
* loss: logits (c V), their fp32 copy (4 V, freed after the loss), the saved log-softmax (4 V);
* backward: the loss gradients (4 V + 4 V), then per layer in reverse: each linear's input gradient
  and weight gradient (``param.grad``, kept until the optimizer step), the frees of the saved tensors
  as their consumer's backward runs, the elementwise gradients; the embedding's gradient last;
* optimizer: the states on the first step (``zeros_like`` per parameter, in parameter order), the
  foreach temporaries (one per parameter, all allocated, then all freed), then the gradients freed
  (``zero_grad(set_to_none=True)``).

Sizes: each layer's saved tensors are the closed form's own records (analytic/activations.py
``SavedTensor``: name, bytes, the part of the layer whose backward frees it), read from
``LayerActivations.tensors`` (analytic/terms/layers.py), so a layer allocates exactly the bytes the
closed form counts for it, tensor by tensor; a checkpointed layer keeps its ``kept`` bytes (the
checkpointed input) as one tensor.  The other per-layer terms (weight casts, gradients, the backward's
gradient tensors) are split over the layer's linears and widths; the forward's short-lived temporaries
(a norm's fp32 ``pow``, its output, RoPE's fp32 products, the projections' outputs) come from the
model's widths and are freed within the op, so they move no moment of the closed form.

Steady state: ``train_run_events`` replays the first step (states created inside ``step()``, after
the first forward/backward has left its cached blocks) and the second (states exist), and the
allocator never returns memory, so its peak is ``max_memory_reserved`` over the run.

``train_run_stream`` gives the compact stream; ``train_run_parts`` the same events with each run of
layers that share a plan written once, as a ``vramplan.alloc.compact.Repeat`` (the layer's events and
how its block ids move from layer to layer), which ``vramplan.alloc.replay_parts`` replays without
replaying every layer where that is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vramplan.alloc import AllocEvent
from vramplan.alloc.compact import Repeat, expand, split_pools
from vramplan.analytic.activations import SavedTensor
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.layout import RankParams, rank_layer_pairs, rank_tensors
from vramplan.analytic.moment import K
from vramplan.analytic.optimizer import state_tensors_per_param
from vramplan.analytic.stream import AllocStream as _Stream
from vramplan.analytic.terms.base import Term, tables
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.cross_attention import cross_sequence
from vramplan.analytic.terms.deepspeed import gathers_on_side_stream, zero3_sub_groups
from vramplan.analytic.terms.encoder_decoder import encoder_sequence
from vramplan.analytic.terms.gradients import gradients_from_start
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.terms.sharding import grads_on_reduce_stream, reduce_cast_ratio
from vramplan.analytic.terms.vision import tower_sequence
from vramplan.analytic.timeline import FORWARD
from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.spec.defaults import checkpointing
from vramplan.spec.lora_match import experts_are_parameters
from vramplan.spec.model import ModelSpec

__all__ = ["LayerTerms", "StepLayout", "iter_run_parts", "train_run_events", "train_run_parts",
           "train_run_parts_marked", "train_run_pools", "train_run_stream"]


@dataclass(frozen=True)
class LayerTerms:
    """One decoder layer's closed-form terms (bytes) and the widths its tensors have (bytes per token)."""

    kept: int  # saved for backward during the forward (checkpointing: the layer's input only)
    full: int  # saved when the layer runs with autograd recording (= kept without checkpointing)
    mlp_transient: int  # the MLP's backward gradients alive together
    attn_transient: int
    weight_cast: int  # autocast's half copies of the layer's linear weights
    grad: int  # parameter gradient bytes of the layer (this rank's shard)
    linears: tuple[int, ...]  # element counts of the layer's linear weights, in forward order
    norms: tuple[int, ...]  # element counts of the layer's other parameters
    params: tuple[int, ...] = ()  # resident bytes of each parameter tensor of the layer
    trainable: tuple[int, ...] = ()  # element counts of the layer's trainable tensors
    # the saved tensors' bytes in the order the forward makes them (the closed form's records, one entry per
    # tensor; they sum to ``full``): the first ``n_attn`` belong to the norm + attention part
    saved: tuple[int, ...] = ()
    n_attn: int = 0
    rope_at: int = 0  # index in ``saved`` of the first tensor made after RoPE (the kernel's query)
    checkpointed: bool = False  # full checkpointing: the forward keeps ``kept`` only, the backward recomputes
    # selective checkpointing (op-sac, attention-core): the forward keeps ``kept`` (the input and the tensors the
    # policy saves), the backward recomputes the rest, ``full - kept``; the stream runs it as a checkpointed layer
    # whose recompute records that share (analytic/terms/saved.py ``saved.recompute``)
    partial: bool = False


@dataclass(frozen=True)
class StepLayout:
    """What the event stream needs from the closed-form engine, for one pipeline stage's rank.

    Widths are bytes per token (multiplied by ``tokens``); every other field is bytes.
    """

    tokens: int
    hidden: int
    q_width: int  # query width on this rank (heads x head_dim)
    kv_width: int
    inter: int  # MLP intermediate width on this rank (routed experts x top-k for MoE)
    heads: int
    keys: int  # keys per query row for the s x s tensors of eager attention
    gated: bool
    compute_bytes: int
    residual_bytes: int
    quadratic: bool  # eager/math attention: scores and probabilities are materialized
    checkpointing: str  # "none" | "full" | "selective"
    layers: tuple[LayerTerms, ...]
    param_tensors: tuple[int, ...]  # resident bytes of the parameter tensors outside the layers
    trainable_tensors: tuple[int, ...]  # element counts of the trainable tensors outside the layers
    trainable_total: int  # elements of all trainable tensors (states, masters, temporaries are shared by it)
    grad_outside: int  # gradient bytes outside the layers (embedding, head, final norm)
    embed_grad: int  # the (untied) input embedding's gradient, produced last
    states: int
    state_tensors_per_param: int
    step_temporary: int
    master: int
    ddp: int
    workspace: int  # one cuBLAS workspace (two handles: forward and autograd thread)
    gathered: int  # ZeRO-3/FSDP: all-gathered layer parameters (current + prefetched unit)
    shared: int  # RoPE cos/sin, eager mask, embedding dropout mask
    head_saved: int  # final norm + LM-head input
    head_cast: int  # the head's autocast copy (and the fp32 head cast of k-bit PEFT)
    logits: int  # c V tokens
    logits_fp32: int  # 4 V tokens when c < 4 else 0
    log_probs: int  # saved log-softmax (+ soft-cap output)
    grads_during_forward: bool  # gradient accumulation carries gradients into the forward
    has_head: bool
    input_ids: int = 0
    extra_static: tuple[int, ...] = field(default_factory=tuple)  # other resident bytes (root all-gather)
    # train.loss's kernel (analytic/logits.py): (kept from the forward to the backward, forward temporary,
    # backward temporary); the standard loss's logits, fp32 copy and log-probs are then 0
    kernel_loss: tuple[int, int, int] = (0, 0, 0)
    # train.activation_offload: the checkpointed layer inputs leave the GPU after their layer's forward and come
    # back for its backward (terms/saved.py ``offloaded_inputs``)
    offload_inputs: bool = False
    # a vision-language model's tower, trained on the batch's images: its saved tensors, made before the first
    # layer and freed with the shared tensors (terms/vision.py); mllama's projected states, masks and vision output
    # (terms/cross_attention.py ``cross_sequence``) after them; an encoder-decoder model's encoder stack, its output
    # and T5's shared biases (terms/encoder_decoder.py ``encoder_sequence``), alike made before the first (decoder)
    # layer and freed with the shared tensors
    vision_saved: tuple[int, ...] = ()
    # which of vision_saved belong to tower layers after the selected hidden state (LLaVA's last layer): freed
    # with the model output before the backward (terms/vision.py)
    vision_unused: tuple[bool, ...] = ()
    # of ``gathered``, the bytes allocated when the backward reaches the layers instead of at the forward's start:
    # torchtitan's FSDP2 holds one block at the loss (up to v0.1) or none (from v0.2), terms/sharding.py ``gathered``
    gathered_late: int = 0
    # torch FSDP (FSDP1 and FSDP2) makes each sharded gradient on its reduce-scatter stream, so the gradients are a
    # pool of their own in the caching allocator (terms/sharding.py ``grads_on_reduce_stream``; ``train_run_pools``)
    grads_on_side_stream: bool = False
    # on that stream, each unit's gradients first reduced into a block of the reduce dtype, then cast to the
    # gradient's (its bytes = the gradient's x num / den; (0, 1): no such block; terms/sharding.py reduce_cast_ratio)
    grad_reduce_ratio: tuple[int, int] = (0, 1)
    # DeepSpeed ZeRO-3 with overlap_comm gathers parameters on its own all-gather stream (parameter_offload.py
    # ``__allgather_stream``; partitioned_param_coordinator.py ``__all_gather_params_``: ``all_gather_coalesced``
    # under ``get_accelerator().stream(self.__allgather_stream)``, whose flat buffer, partition_parameters.py
    # ``_all_gather_dtype``, is a block of that stream), so the gathered block is a pool of its own
    gathered_on_side_stream: bool = False
    # DeepSpeed ZeRO-3 (on the GPU): the elements of each optimizer sub-group of this rank's partition (stage3.py
    # ``_create_fp16_sub_groups``, sub_group_size 1e9).  Its flat buffers replace the per-tensor ones: the parameter
    # partitions moved into one contiguous buffer (``defragment``, ``lp_param_buffer``), per sub-group an fp32 master
    # made as ``fp16_flat.clone().float()`` (``_create_fp32_partitions``), the optimizer's states per sub-group, and
    # the step one sub-group at a time (``_prepare_sub_group`` ... ``_release_sub_group``)
    zero3_groups: tuple[int, ...] = ()


def split_exact(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, the last part taking the rounding (sums exactly).

    >>> split_exact(10, [1, 1, 1])
    [3, 3, 4]
    """
    if total <= 0 or not weights:
        return [0] * len(weights)
    w = sum(weights)
    if w <= 0:
        return [0] * (len(weights) - 1) + [total]
    parts = [total * x // w for x in weights[:-1]]
    return [*parts, total - sum(parts)]


# ----------------------------------------------------------------------------------------------
# one decoder layer
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LayerPlan:
    """Sizes of one layer's tensors (bytes), in the order the forward makes them."""

    saved: tuple[int, ...]  # the saved tensors (attention part then MLP part): the closed form's records
    n_attn: int  # how many of ``saved`` belong to the norm + attention part
    rope_at: int  # RoPE's fp32 temporaries are made just before ``saved[rope_at]``
    kept: int  # a checkpointed forward's one kept tensor
    checkpointed: bool
    casts: tuple[int, ...]  # per linear weight
    grads: tuple[int, ...]  # per parameter, in the order the backward produces them
    fwd_temps: tuple[int, ...]  # per-op temporaries of the forward (freed within the op)
    mlp_bwd: tuple[int, ...]  # the MLP backward's gradient tensors
    attn_bwd: tuple[int, ...]
    n_mlp_linears: int
    # what the backward's recompute records (a selective policy: ``saved`` scaled to ``full - kept``); () = saved
    recomputed: tuple[int, ...] = ()


def _layer_plan(lay: StepLayout, lt: LayerTerms) -> _LayerPlan:
    t = lay.tokens
    h, c, r = lay.hidden * t, lay.compute_bytes, lay.residual_bytes
    qw, kvw, inter = lay.q_width * t, lay.kv_width * t, lay.inter * t
    lin = lt.linears or (1,)
    casts = split_exact(lt.weight_cast, list(lin)) if lt.weight_cast else []
    params = list(reversed(lin)) + list(lt.norms)
    # torch FSDP makes a unit's gradients as one tensor (FSDP2's ``reduce_output``, each ``.grad`` a view of it;
    # FSDP1's flat ``new_sharded_grad``): in their own pool (``grads_on_side_stream``) nothing else rounds with them
    grads = ([lt.grad] if lay.grads_on_side_stream else split_exact(lt.grad, params)) if lt.grad else []
    fwd_temps = (4 * h, r * h, 4 * qw, 4 * qw, 4 * kvw, c * h, c * h)
    mlp_bwd = split_exact(lt.mlp_transient, [r * h, c * inter, c * inter, c * inter, r * h])
    attn_parts = [r * h, c * qw, c * kvw, c * kvw, 4 * qw, c * qw, r * h]
    if lay.quadratic:
        attn_parts += [4 * lay.heads * lay.keys * t]
    attn_bwd = split_exact(lt.attn_transient, attn_parts)
    n_mlp = min(len(lin), 3 if lay.gated else 2)
    recomputed = tuple(split_exact(lt.full - lt.kept, list(lt.saved))) if lt.partial and lt.saved else ()
    return _LayerPlan(lt.saved, lt.n_attn, lt.rope_at, lt.kept, lt.checkpointed, tuple(casts), tuple(grads),
                      fwd_temps, tuple(mlp_bwd), tuple(attn_bwd), n_mlp, recomputed)


def _forward_part(st: _Stream, sizes: Sequence[int], tmp: tuple[int, ...], rope_at: int, out_tmp: int) -> list[int]:
    """One part of a layer's forward (the norm and the attention, or the norm and the MLP): the norm's fp32
    ``pow`` temporary, its output (alive through the part), the saved tensors (RoPE's fp32 temporaries just
    before ``sizes[rope_at]``), the last one made while the part's output projection output is alive."""
    p = st.alloc(tmp[0])
    st.free(p)
    norm_out = st.alloc(tmp[1])
    ids: list[int] = []
    last = len(sizes) - 1
    for i, nbytes in enumerate(sizes):
        if i == rope_at:
            a, b, kk = st.alloc(tmp[2]), st.alloc(tmp[3]), st.alloc(tmp[4])
            st.free_all((a, b, kk))
        if i == last:
            o = st.alloc(out_tmp)
            st.free(norm_out)
            norm_out = -1
            ids.append(st.alloc(nbytes))
            st.free(o)
        else:
            ids.append(st.alloc(nbytes))
    st.free(norm_out)
    return ids


def _forward_layer(st: _Stream, plan: _LayerPlan, record: bool) -> tuple[list[int], list[int], int]:
    """One layer's forward.  Returns (saved ids, cast ids, id of the layer output).

    ``record``: autograd keeps the saved tensors (False: a checkpointed layer's first forward, which
    frees everything but its output, the ``kept`` tensor the next layer's checkpoint holds).
    """
    n_attn, n_cast = plan.n_attn, max(0, len(plan.casts) - plan.n_mlp_linears)
    tmp = plan.fwd_temps
    casts = [st.alloc(x) for x in plan.casts[:n_cast]] if record else []
    saved = _forward_part(st, plan.saved[:n_attn], tmp, plan.rope_at, tmp[5])
    if record:
        casts += [st.alloc(x) for x in plan.casts[n_cast:]]
    mlp = plan.saved[n_attn:]
    if not record:
        # the last tensor made is the layer's output: the checkpoint keeps it (``kept`` bytes)
        mlp = (*mlp[:-1], plan.kept) if mlp else (plan.kept,)
    saved += _forward_part(st, mlp, tmp, -1, tmp[6])
    out = saved[-1] if saved else -1
    if not record:
        st.free_all([b for b in saved if b != out])
        return [], [], out
    return saved, casts, out


def _side_grad(st: _Stream, size: int, ratio: tuple[int, int], side_ids: list[int]) -> int:
    """A gradient block made on FSDP's side stream; with a reduce dtype below the gradient's (``ratio``), the reduce
    output first, freed once the cast made the gradient (its id appended to ``side_ids``, marked by the caller)."""
    if not ratio[0]:
        return st.alloc(size)
    reduced = st.alloc(size * ratio[0] // ratio[1])
    grad = st.alloc(size)
    st.free(reduced)
    side_ids.append(reduced)
    return grad


def _backward_layer(st: _Stream, plan: _LayerPlan, saved: list[int], casts: list[int], grad_in: int,
                    grads_exist: bool, grad_ids: list[int], ratio: tuple[int, int], side_ids: list[int]) -> int:
    """One layer's backward: the MLP's (gradients, frees of its saved tensors), then the attention's.

    Returns the id of the gradient flowing to the layer below.  New parameter gradients are
    appended to ``grad_ids`` (with gradient accumulation they exist already: none is made); a unit's reduce
    output on FSDP's side stream (``ratio``, ``_side_grad``) to ``side_ids``.
    """
    n_attn = plan.n_attn
    has_mlp = len(saved) > n_attn  # the last tensor made is the layer's output, released after the MLP's backward
    mlp_saved = saved[n_attn:-1]
    attn_saved = saved[:n_attn]
    n_mlp_cast = min(len(casts), plan.n_mlp_linears)
    mlp_casts = casts[len(casts) - n_mlp_cast:]
    attn_casts = casts[: len(casts) - n_mlp_cast]
    grads = list(plan.grads)

    def param_grads(n: int) -> None:
        for _ in range(min(n, len(grads))):
            size = grads.pop(0)
            if not grads_exist:
                grad_ids.append(_side_grad(st, size, ratio, side_ids))

    # MLP: the down projection's input gradient and weight gradient, the elementwise gradients, then
    # the up/gate projections'; saved tensors go from the last made to the first
    mb = plan.mlp_bwd
    live = [st.alloc(mb[1])]
    param_grads(1)
    half = len(mlp_saved) // 2
    st.free_all(list(reversed(mlp_saved[half:])))
    live += [st.alloc(mb[2]), st.alloc(mb[3])]
    st.free(live.pop(0))
    param_grads(plan.n_mlp_linears - 1)
    st.free_all(list(reversed(mlp_saved[:half])))
    st.free_all(mlp_casts)
    g = st.alloc(mb[4])
    st.free_all(live)
    st.free(grad_in)
    # the layer's output (saved by the next layer's norm) is released by now
    if has_mlp:
        st.free(saved[-1])
    # attention: dO, the kernel's dq/dk/dv and accumulator, RoPE's fp32 gradients, the projections'
    ab = plan.attn_bwd
    live = [st.alloc(x) for x in ab[1:-1]]
    param_grads(1)
    half = len(attn_saved) // 2
    st.free_all(list(reversed(attn_saved[half:])))
    param_grads(len(grads))
    st.free_all(list(reversed(attn_saved[:half])))
    st.free_all(attn_casts)
    g2 = st.alloc(ab[-1])
    st.free_all(live)
    st.free(g)
    return g2


# ----------------------------------------------------------------------------------------------
# runs of identical layers
# ----------------------------------------------------------------------------------------------

_Ids = Any  # an id, or a list / tuple of them (nested)


def _moved(x: _Ids, y: _Ids, k: int) -> _Ids:
    """``x`` moved ``k`` times by ``y - x`` elementwise (the ids of window ``k`` from windows 0 and 1)."""
    if isinstance(x, int):
        return x + k * (y - x)
    return type(x)(_moved(a, b, k) for a, b in zip(x, y, strict=True))


def _same_shape(x: _Ids, y: _Ids) -> bool:
    if isinstance(x, int) or isinstance(y, int):
        return isinstance(x, int) and isinstance(y, int) and (x >= 0) == (y >= 0) and (x >= 0 or x == y)
    return len(x) == len(y) and all(_same_shape(a, b) for a, b in zip(x, y, strict=True))


class _Windows:
    """The ids each window of a run returned: the first ``len(head)`` as made, the rest moved on from
    windows 1 and 2 (computed when asked for)."""

    __slots__ = ("count", "head", "o1", "o2")

    def __init__(self, head: list[_Ids], o1: _Ids, o2: _Ids, count: int) -> None:
        self.head, self.o1, self.o2, self.count = head, o1, o2, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: int) -> _Ids:
        if k < 0:
            k += self.count
        return self.head[k] if k < len(self.head) else _moved(self.o1, self.o2, k - 1)


def _layers(st: _Stream, count: int, window: Callable[[int], _Ids]) -> list[_Ids] | _Windows:
    """Run ``window(k)`` for the ``count`` layers of a run with one plan; returns each window's ids.

    Each window's events are a fixed function of the plan and of the ids it is handed (its inputs: the
    previous window's outputs and the forward's saved tensors, or nothing): the control flow reads
    sizes and flags only, and ids only to compare them with each other.  A window allocates ids from
    the stream's counter, ``a`` per window, so when its inputs move by constant steps from window to
    window (they do from the second window on: the first one's gradient comes from outside the run),
    window ``k``'s events and outputs are window 1's with every id moved ``k - 1`` times by the step
    between windows 1 and 2.  With ``st.runs``, windows 1 and later are therefore written as a
    ``Repeat`` of window 1 with those steps as strides (window 2 is made only to find them);
    ``tests/test_analytic_events.py`` checks the expanded stream against the plain one.
    """
    if not st.runs or count < 4:
        return [window(k) for k in range(count)]
    outs = [window(0)]
    ev = st.events
    e0, id0 = len(ev), st.next_id
    o1 = window(1)
    e1, id1 = len(ev), st.next_id
    o2 = window(2)
    w1, w2 = ev[e0:e1], ev[e1:]
    if (st.next_id - id1 != id1 - id0 or len(w1) != len(w2) or not _same_shape(o1, o2)
            or any((x > 0) != (y > 0) or (x > 0 and x != y) for x, y in zip(w1, w2, strict=True))):
        return [*outs, o1, o2] + [window(k) for k in range(3, count)]   # not expected: write it all out
    del ev[e0:]
    st.parts.append(st.events)
    st.events = []
    st.parts.append(Repeat(w1, [0 if x > 0 else x - y for x, y in zip(w1, w2, strict=True)], count - 1))
    st.next_id = id0 + (count - 1) * (id1 - id0)
    return _Windows([*outs, o1, o2], o1, o2, count)


def _plan_runs(plans: list[_LayerPlan], layers: Sequence[int]) -> list[tuple[int, int]]:
    """``layers`` (in the order run) cut where the plan changes: (start position, length) pairs."""
    runs: list[tuple[int, int]] = []
    for pos, i in enumerate(layers):
        if runs and plans[i % len(plans)] is plans[layers[pos - 1] % len(plans)]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((pos, 1))
    return runs


# ----------------------------------------------------------------------------------------------
# the step
# ----------------------------------------------------------------------------------------------


def _trainable(lay: StepLayout, n_layers: int) -> list[int]:
    """Element counts of the trainable tensors of the outside parameters and the first ``n_layers`` layers
    (the layer terms cycle when fewer are given)."""
    out = list(lay.trainable_tensors)
    for i in range(n_layers):
        out += lay.layers[i % len(lay.layers)].trainable
    return out


def _share(total: int, numels: list[int], all_numel: int) -> list[int]:
    """Each tensor's share of a per-element term (states, masters, step temporaries)."""
    if not total or not all_numel:
        return []
    return [total * n // all_numel for n in numels]


def _setup(st: _Stream, lay: StepLayout, states_now: bool, n_layers: int) -> list[int]:
    # parameters (and masters, states) stay literal: small ones fill a small-pool segment one after the
    # other, so these allocations are not periodic in the allocator and a Repeat would not be skipped
    params = list(lay.param_tensors)
    for i in range(n_layers):
        params += lay.layers[i % len(lay.layers)].params
    if lay.zero3_groups:
        # stage3.py _create_fp16_partitions_with_defragmentation: the partitions copied to the host and freed, the
        # cache emptied, then one flat buffer back on the GPU (zero/utils.py ``defragment``: ``empty_cache()``)
        st.alloc(sum(params))
    else:
        st.alloc_all(params)
    st.alloc_all(lay.extra_static)
    tr = _trainable(lay, n_layers)
    if lay.zero3_groups:
        # per sub-group: the half flat's clone, its fp32 copy kept as the master, the clone freed
        masters = split_exact(lay.master, list(lay.zero3_groups))
        for m in masters:
            clone = st.alloc(m // 2)
            st.alloc(m)
            st.free(clone)
        # initialize_optimizer_states: a zero fp32 gradient of the largest sub-group, freed at its end (deepspeed
        # 0.19.8 stage3.py:1306; before, each sub-group's zero gradient for a first _optimizer_step): its block stays
        # cached for the step's fp32 gradients
        st.free(st.alloc(max(masters, default=0)))
    else:
        st.alloc_all(_share(lay.master, tr, lay.trainable_total))
    states = _make_states(st, lay, tr) if states_now else []
    st.alloc(lay.ddp)
    st.alloc(lay.input_ids)
    st.alloc(lay.workspace)
    return states


def _make_states(st: _Stream, lay: StepLayout, tr: list[int]) -> list[int]:
    n = lay.state_tensors_per_param
    if not n:
        return []
    if lay.zero3_groups:
        # the optimizer's states of each sub-group's flat fp32 master
        return st.alloc_all([x // n for x in split_exact(lay.states, list(lay.zero3_groups)) for _ in range(n)])
    return st.alloc_all([x // n for x in _share(lay.states, tr, lay.trainable_total) for _ in range(n)])


def _pass(st: _Stream, lay: StepLayout, plans: list[_LayerPlan], grads: list[int], grads_exist: bool,
          n_layers: int, autograd_ws: list[int]) -> None:
    """One forward + backward over ``n_layers`` layers (layer ``i`` uses ``plans[i % len(plans)]``)."""
    gathered = st.alloc(lay.gathered - lay.gathered_late)
    resid = lay.residual_bytes * lay.hidden * lay.tokens
    # the embedding's output is the first layer's input; each layer's saved list ends with its own
    # output, so the last layer's output stands for the final norm's input (counted in head_saved)
    emb_bytes = min(lay.head_saved, resid) if lay.has_head else resid
    emb = st.alloc(emb_bytes)
    vision = st.alloc_all(lay.vision_saved)
    shared = st.alloc(lay.shared)
    outs: list[Any] = []   # per layer: (saved ids, cast ids)
    order = list(range(n_layers))
    for start, count in _plan_runs(plans, order):
        plan = plans[order[start] % len(plans)]

        def forward(k: int, plan: _LayerPlan = plan) -> tuple[list[int], list[int]]:
            saved, casts, out = _forward_layer(st, plan, record=not plan.checkpointed)
            if plan.checkpointed and lay.offload_inputs:
                st.free(out)
                return [-1], []
            return ([out], []) if plan.checkpointed else (saved, casts)
        done_f = _layers(st, count, forward)
        outs += [(done_f, k) for k in range(count)]
    head_saved = st.alloc(lay.head_saved - emb_bytes if lay.has_head else 0)
    head_cast = st.alloc(lay.head_cast)
    logp = dl = -1
    kernel_kept = st.alloc(lay.kernel_loss[0])
    st.free(st.alloc(lay.kernel_loss[1]))
    if lay.has_head:
        logits = st.alloc(lay.logits)
        up = st.alloc(lay.logits_fp32)
        logp = st.alloc(lay.log_probs)
        st.free(up)
        st.free(logits)
    # compute_loss returns: the model output that holds the unused tower layers' graph (LLaVA's image_outputs) goes
    # before the backward starts
    st.free_all([b for b, gone in zip(vision, lay.vision_unused) if gone])
    vision = [b for b, gone in zip(vision, lay.vision_unused or (False,) * len(vision)) if not gone]
    if not autograd_ws:
        autograd_ws.append(st.alloc(lay.workspace))  # the autograd thread's cuBLAS handle, kept
    if lay.has_head:
        d1 = st.alloc(lay.log_probs)
        d2 = st.alloc(lay.log_probs)
        st.free(d1)
        st.free(logp)
        dl = st.alloc(lay.logits)
        st.free(d2)
    st.free(st.alloc(lay.kernel_loss[2]))
    grad_head = lay.grad_outside - lay.embed_grad
    side: list[int] = []
    if not grads_exist and grad_head > 0:
        grads.append(_side_grad(st, grad_head, lay.grad_reduce_ratio, side))
    g = st.alloc(resid)
    if lay.has_head:
        st.free(dl)
    st.free(kernel_kept)
    st.free(head_cast)
    st.free(head_saved)
    late = st.alloc(lay.gathered_late)  # the block the last layer's pre_backward prefetches (FSDP2, torchtitan)
    if lay.gathered_on_side_stream:
        st.marked.update((gathered, late))
    g = _backward_layers(st, lay, plans, outs, g, grads, grads_exist, n_layers)
    st.free(late)
    st.free(g)
    st.free(emb)
    st.free(shared)
    st.free_all(vision)
    if not grads_exist and lay.embed_grad > 0:
        grads.append(_side_grad(st, lay.embed_grad, lay.grad_reduce_ratio, side))
    st.marked.update(side)
    st.free(gathered)


def _backward_layers(st: _Stream, lay: StepLayout, plans: list[_LayerPlan], outs: list[Any], g: int,
                     grads: list[int], grads_exist: bool, n_layers: int) -> int:
    """The layers' backward, last layer first (``outs``: each layer's forward ids); new parameter
    gradients are appended to ``grads``.  Returns the id of the gradient flowing into the embedding."""
    order = list(range(n_layers - 1, -1, -1))
    for start, count in _plan_runs(plans, order):
        plan = plans[order[start] % len(plans)]
        g_in = [g]

        def backward(k: int, plan: _LayerPlan = plan, start: int = start,
                     g_in: list[int] = g_in) -> tuple[int, list[int], list[int]]:
            run_out, at = outs[order[start + k]]
            saved, casts = run_out[at]
            new_grads: list[int] = []
            new_side: list[int] = []
            ratio = lay.grad_reduce_ratio
            if plan.checkpointed:
                # the checkpoint recomputes the layer from its input, recording; the recomputed output
                # replaces the kept one as the tensor the backward releases
                kept_out = st.alloc(plan.saved[-1] if plan.saved else 0) if lay.offload_inputs else saved[0]
                redo = replace(plan, saved=plan.recomputed) if plan.recomputed else plan
                saved, casts, _ = _forward_layer(st, redo, record=True)
                g_out = _backward_layer(st, plan, saved, casts, g_in[0], grads_exist, new_grads, ratio, new_side)
                st.free(kept_out)
            else:
                g_out = _backward_layer(st, plan, saved, casts, g_in[0], grads_exist, new_grads, ratio, new_side)
            g_in[0] = g_out
            return g_out, new_grads, new_side
        done = _layers(st, count, backward)
        if isinstance(done, _Windows):
            grads += done.head[0][1]
            g1, g2 = done.o1[1], done.o2[1]
            grads += [a + k * (b - a) for k in range(count - 1) for a, b in zip(g1, g2, strict=True)]
            # the reduce outputs of the windows written as a Repeat: their ids moved as the gradients' are
            st.marked.update(done.head[0][2])
            s1, s2 = done.o1[2], done.o2[2]
            st.marked.update(a + k * (b - a) for k in range(count - 1) for a, b in zip(s1, s2, strict=True))
        else:
            for _, new_grads, new_side in done:
                grads += new_grads
                st.marked.update(new_side)
        g = done[count - 1][0]
    return g


def _optimizer(st: _Stream, lay: StepLayout, grads: list[int], states: list[int] | None,
               n_layers: int) -> list[int]:
    """The optimizer step; returns the states (created here, per parameter, when ``states`` is None)."""
    tr = _trainable(lay, n_layers)
    if lay.grads_on_side_stream:
        st.marked.update(g for g in grads if g >= 0)   # every gradient of the step is freed here
    if states is None:
        states = _make_states(st, lay, tr)
    if lay.zero3_groups:
        # one sub-group at a time: its fp32 gradient and the optimizer's temporaries, sized by the largest sub-group
        # (terms/optimizer_state.py step_temporary, terms/deepspeed.py step_norm_and_flatten), freed before the next
        largest = max(lay.zero3_groups)
        for g in lay.zero3_groups:
            st.free(st.alloc(lay.step_temporary * g // largest))
    else:
        temps = st.alloc_all(_share(lay.step_temporary, tr, lay.trainable_total))
        st.free_all(list(reversed(temps)))
    st.free_all(grads)
    grads.clear()
    return states


def _plans(lay: StepLayout) -> list[_LayerPlan]:
    out: list[_LayerPlan] = []
    seen: dict[LayerTerms, _LayerPlan] = {}
    for lt in lay.layers:
        if lt not in seen:
            seen[lt] = _layer_plan(lay, lt)
        out.append(seen[lt])
    return out


def _grad_sizes(lay: StepLayout, plans: list[_LayerPlan], n_layers: int) -> list[int]:
    """The gradients a backward makes, in its order and sizes (``_pass``): the head's, each layer's from the last
    (``_LayerPlan.grads``), the embedding's last; what gradient accumulation finds at the next micro-batch."""
    head = lay.grad_outside - lay.embed_grad
    out: list[int] = [head] if head > 0 else []
    for i in range(n_layers - 1, -1, -1):
        out += plans[i % len(plans)].grads
    if lay.embed_grad > 0:
        out.append(lay.embed_grad)
    return out


def train_run_stream(lay: StepLayout, n_layers: int | None = None) -> list[int]:
    """The first two steps of a run as a compact stream (``vramplan.alloc.replay_compact``): the first
    creates the optimizer states inside ``step()``, after its forward and backward have left their
    cached blocks; the second runs with them (the steady state).  With gradient accumulation the
    second step's micro-batch finds the gradients of an earlier one."""
    st = _Stream()
    for _ in _phases(st, lay, n_layers):
        pass
    return st.events


def train_run_parts(lay: StepLayout, n_layers: int | None = None) -> list[list[int] | Repeat]:
    """``train_run_stream`` with each run of identical layers as a ``vramplan.alloc.compact.Repeat``
    (``vramplan.alloc.compact.expand`` gives the plain stream back), for ``vramplan.alloc.replay_parts``."""
    return list(iter_run_parts(lay, n_layers))


def iter_run_parts(lay: StepLayout, n_layers: int | None = None) -> Iterator[list[int] | Repeat]:
    """``train_run_parts`` made phase by phase (setup, each pass, each optimizer step) as they are
    asked for, so that a replay that runs out of memory early does not wait for the rest."""
    st = _Stream(runs=True)
    for _ in _phases(st, lay, n_layers):
        yield from st.close()
        st.parts = []


def _phases(st: _Stream, lay: StepLayout, n_layers: int | None) -> Iterator[None]:
    """Write the two steps into ``st``, pausing after each phase."""
    plans = _plans(lay)
    n = len(lay.layers) if n_layers is None else n_layers
    _setup(st, lay, False, n)
    yield None
    ws: list[int] = []
    grads: list[int] = []
    _pass(st, lay, plans, grads, False, n, ws)
    yield None
    states = _optimizer(st, lay, grads, None, n)
    if lay.grads_during_forward:
        grads = st.alloc_all(_grad_sizes(lay, plans, n))
    yield None
    _pass(st, lay, plans, grads, lay.grads_during_forward, n, ws)
    yield None
    _optimizer(st, lay, grads, states, n)
    yield None


def train_run_parts_marked(lay: StepLayout, n_layers: int | None = None) -> tuple[list[list[int] | Repeat], set[int]]:
    """``train_run_parts`` and the ids of the blocks a side CUDA stream allocates (the gradients when
    ``lay.grads_on_side_stream``: torch FSDP's reduce-scatter stream; the gathered parameters when
    ``lay.gathered_on_side_stream``: DeepSpeed ZeRO-3's all-gather stream; none otherwise)."""
    st = _Stream(runs=True)
    parts: list[list[int] | Repeat] = []
    for _ in _phases(st, lay, n_layers):
        parts += st.close()
        st.parts = []
    return parts, st.marked


def train_run_pools(lay: StepLayout, n_layers: int | None = None) -> tuple[list[int], list[int]]:
    """``train_run_stream`` cut by CUDA stream (``vramplan.alloc.compact.split_pools``): the compute stream's events,
    and those of the gradients when ``lay.grads_on_side_stream`` (torch FSDP's reduce-scatter stream), each a compact
    stream whose reserved bytes the caching allocator counts apart; the second is empty otherwise."""
    parts, marked = train_run_parts_marked(lay, n_layers)
    return split_pools(expand(parts), marked)


def train_run_events(lay: StepLayout, n_layers: int | None = None) -> list[AllocEvent]:
    """``train_run_stream`` as ``AllocEvent`` objects (block ids count allocations from 0)."""
    out: list[AllocEvent] = []
    next_id = 0
    for x in train_run_stream(lay, n_layers):
        if x > 0:
            out.append(AllocEvent(next_id, x))
            next_id += 1
        else:
            out.append(AllocEvent(-x - 1, -1))
    return out


# ----------------------------------------------------------------------------------------------
# from the closed-form engine's terms
# ----------------------------------------------------------------------------------------------



def _outside_trainable(m: ModelSpec, rp: RankParams, tp: int, frozen: tuple[str, ...]) -> tuple[int, ...]:
    """``rank_tensors``' tensors outside the layers without the frozen ones (``StepContext.frozen_prefixes``)."""
    from dataclasses import replace

    held = replace(m, params=tuple(p for p in m.params if not p.name.startswith(frozen)))
    return tuple(rank_tensors(held, rp, tp)[1])


def _layer_terms(c: StepContext, table: dict[str, list[int]], lin: tuple[int, ...], other: tuple[int, ...],
                 params: Sequence[tuple[int, ...]], trainable: tuple[int, ...]) -> tuple[LayerTerms, ...]:
    """Each layer's terms, read from the step's per-layer term records by name (``table``: analytic/terms/base.py
    ``layer_table``), and its saved tensors from the closed form's records (``LayerActivations.tensors``)."""
    n = len(c.layer_specs)
    la = layer_activations(c)
    selective = checkpoint_policy(c.s) in ("op-sac", "attention-core")
    zero = [0] * n
    kept, recompute = table.get("saved.kept", zero), table.get("saved.recompute", zero)
    casts, grads = table.get("casts.layer", zero), table.get("gradients.layer", zero)
    mlp_transient, attn_transient = table.get("transient.mlp", zero), table.get("transient.attention", zero)
    # alike layers (most of them) share one record: a frozen dataclass costs microseconds to make
    made: dict[tuple[object, ...], LayerTerms] = {}
    plans: dict[int, tuple[tuple[int, ...], int, int]] = {}
    out = []
    for j in range(n):
        tensors = la.tensors[j]
        plan = plans.get(id(tensors))
        if plan is None:
            plan = plans[id(tensors)] = _saved_sizes(tensors)
        # a selective policy keeps part of the layer (kept < full) and recomputes the rest in the backward; without
        # autocast copies it runs as a checkpointed layer whose recompute records only that rest
        partial = selective and not la.checkpointed[j] and recompute[j] > 0 and not casts[j]
        ckpt = la.checkpointed[j] or partial
        v = (kept[j], recompute[j], mlp_transient[j], attn_transient[j], casts[j], grads[j], id(tensors), ckpt, partial,
             id(params[j % len(params)]))
        lt = made.get(v)
        if lt is None:
            lt = made[v] = LayerTerms(kept=v[0], full=v[0] + v[1], mlp_transient=v[2], attn_transient=v[3],
                                      weight_cast=v[4], grad=v[5], linears=lin, norms=other, params=params[j % len(params)],
                                      trainable=trainable, saved=plan[0], n_attn=plan[1], rope_at=plan[2],
                                      checkpointed=ckpt, partial=partial)
        out.append(lt)
    return tuple(out)


def _saved_sizes(tensors: Sequence[SavedTensor]) -> tuple[tuple[int, ...], int, int]:
    """(each saved tensor's bytes, attention part first; how many belong to the attention part; the index of
    the kernel's query, where RoPE's temporaries go) from a layer's records."""
    attn = [t for t in tensors if t.part == "attention"]
    sizes = [t.nbytes for t in attn for _ in range(t.copies)]
    rope_at = next((i for i, t in enumerate(_expanded(attn)) if t.name == "attention.q"), len(sizes))
    sizes += [t.nbytes for t in tensors if t.part != "attention" for _ in range(t.copies)]
    return tuple(sizes), sum(t.copies for t in attn), rope_at


def _expanded(tensors: Sequence[SavedTensor]) -> list[SavedTensor]:
    return [t for t in tensors for _ in range(t.copies)]


def _sharded_blocks(b: Mapping[str, int], table: Mapping[str, Sequence[int]],
                    terms: Sequence[Term], n_layers: int = 1) -> tuple[tuple[int, ...], int, int]:
    """The sharded job's blocks allocated once (the root unit, DeepSpeed's resident buffers), its gathered units as
    one block, and the part of them gathered after the forward (torchtitan's prefetched second unit)."""
    # torchtitan >= 0.2 (terms/sharding.py split_units_gathered): the head's unit, gathered at the loss, is kept for the
    # whole step, as the root unit it replaces; the embedding's, gathered only from the first block's backward to its
    # own, is left out of the stream (as FSDP2's reduce-scatter buffers are: the closed form's moments count them)
    root = b.get("gathered.root", 0) or b.get("fsdp2.head_gathered", 0)
    # DeepSpeed's resident buffers (terms/deepspeed.py): allocated once, like the FSDP root unit; so are the buffers
    # an older transformers release registers at construction (analytic/hf_buffers.py: each layer's rotary tables,
    # one block a layer here, and 4.38's causal_mask), and 4.38's 4-D mask, made at each forward's start from the
    # same sizes (taken as held: its block, freed at the forward's end, stays cached for the next forward's)
    layers, rope = max(1, n_layers), b.get("hf.rope_buffers", 0)
    cache = b.get("saved.train_cache", 0)  # the training forward's cache (use_cache), a block per layer, likewise
    hf = ((rope // layers,) * layers if rope else ()) + (b.get("hf.causal_mask", 0), b.get("saved.release_mask", 0)) + (
        (cache // layers,) * layers if cache else ())
    extra = tuple(x for x in (root, b.get("deepspeed.persistent", 0), b.get("deepspeed.reduce_bucket", 0),
                              b.get("deepspeed.offload_staging", 0), *hf) if x)
    # DeepSpeed ZeRO-3's gathered parameters (head, running module, prefetch, the layers kept for reuse) as one
    # block, as the FSDP-like units are
    gathered = b.get("gathered", 0) + b.get("gathered.head", 0) + b.get("gathered.prefetch", 0) + \
        sum(table.get("gathered.retained", ()))
    late = sum(t.nbytes for t in terms if t.name == "gathered" and t.born is not FORWARD)
    return extra, gathered, late


def _param_bytes(c: StepContext, inner: list[tuple[int, bool]], outside: list[int], fused: bool,
                 resident: int) -> tuple[list[tuple[int, ...]], Callable[[int], int]]:
    """Each layer's own parameter tensors in bytes, and the elements-to-bytes scale of the rest (the resident weights
    over the elements): a hybrid's layers differ, and a tensor's size decides its allocator pool and segment (a 10 MB
    expert averaged over 52 layers would be a 4.4 MB block of a shared 20 MiB segment).  With quantized linears those
    take their format's bytes (``quantized_linear_bytes`` over the rank's linears) and the rest the remainder: one
    average over both would make 4-bit experts blocks of bf16's size."""
    rp = c.rp
    by_layer = rank_layer_pairs(c.m, rp, c.tp, fused) if rp.layers else (tuple(inner),)
    all_numel = sum(n for layer in by_layer for n, _ in layer) + sum(outside)
    lin_numel, lin_bytes = 0, 0
    if c.quant != "none" and rp.linear and all_numel > rp.linear:
        lin_numel, lin_bytes = rp.linear, min(resident, quantized_linear_bytes(rp.linear, rp.linear_out_features, c.quant))

    def wbytes(n: int) -> int:
        rest = all_numel - lin_numel
        return n * (resident - lin_bytes) // rest if rest > 0 else 0

    def lbytes(n: int) -> int:
        return n * lin_bytes // lin_numel if lin_numel else wbytes(n)

    held: dict[tuple[tuple[int, bool], ...], tuple[int, ...]] = {}
    return [held.setdefault(t, tuple(lbytes(x) if lin else wbytes(x) for x, lin in t)) for t in by_layer], wbytes


def build_layout(c: StepContext, terms: Sequence[Term]) -> StepLayout:
    """The event stream's inputs for one stage: the step's term records and the model's widths."""
    m, rp, ctx, tp = c.m, c.rp, c.act, c.tp
    heads = -(-m.num_attention_heads // tp)
    fused = experts_are_parameters(m, c.s.software.fused_moe_experts, c.quant)
    inner, outside = rank_tensors(m, rp, tp, fused)
    b, table, by_key = tables(terms, len(c.layer_specs))
    params, wbytes = _param_bytes(c, inner, outside, fused, b.get("parameters", 0))

    lin = tuple(x for x, is_lin in inner if is_lin)
    other = tuple(x for x, is_lin in inner if not is_lin)
    n_layers = max(1, len(c.layer_specs))
    if c.peft is not None:
        per_layer_tr = -(-c.trainable_shard // n_layers)
        lora_t = max(1, 2 * len(lin)) if lin else 2
        layer_trainable = tuple([per_layer_tr // lora_t] * lora_t)
        outside_trainable: tuple[int, ...] = ()
    else:
        layer_trainable = tuple(x for x, _ in inner)
        outside_trainable = tuple(outside) if not c.frozen_prefixes else _outside_trainable(m, rp, tp, c.frozen_prefixes)
    layers = _layer_terms(c, table, lin, other, params, layer_trainable)
    ls0 = c.layer_specs[0] if c.layer_specs else None
    if ls0 is not None and ls0.moe and m.moe is not None:
        inter = m.moe.expert_intermediate_size * m.moe.top_k
    else:
        inter = -(-(ls0.intermediate_size if ls0 else 0) // tp)
    logits, logits_fp32, log_probs = _loss_tensors(terms)
    states = b.get("optimizer.states", 0)
    extra, gathered, gathered_late = _sharded_blocks(b, table, terms, len(c.layer_specs))
    return StepLayout(
        tokens=c.tokens, hidden=m.hidden_size, q_width=heads * m.head_dim,
        kv_width=max(1, -(-m.num_kv_heads // tp)) * m.head_dim, inter=inter, heads=heads, keys=ctx.seq_len,
        gated=m.mlp_gated, compute_bytes=ctx.compute_bytes, residual_bytes=ctx.residual_bytes,
        quadratic=ctx.attention in ("eager", "math"), checkpointing=checkpointing(c.s),
        layers=layers, param_tensors=tuple(wbytes(x) for x in outside), trainable_tensors=outside_trainable,
        trainable_total=sum(outside_trainable) + sum(layer_trainable) * n_layers,
        grad_outside=b.get("gradients.head", 0) + b.get("gradients.embedding", 0),
        embed_grad=b.get("gradients.embedding", 0), states=states,
        state_tensors_per_param=state_tensors_per_param(c.s.train.optimizer) if states else 0,
        step_temporary=by_key.get(id(K.OPTIMIZER_STEP), 0),
        master=b.get("master", 0), ddp=b.get("ddp", 0),
        workspace=b.get("cublas", 0) // 2, gathered=gathered,
        gathered_late=gathered_late,
        shared=b.get("saved.shared", 0), head_saved=b.get("saved.head", 0),
        head_cast=b.get("casts.head", 0) + b.get("casts.head_kbit", 0), logits=logits,
        logits_fp32=logits_fp32, log_probs=log_probs,
        grads_during_forward=gradients_from_start(c), has_head=c.last,
        input_ids=2 * 8 * c.tokens, extra_static=extra, kernel_loss=_kernel_loss_tensors(terms),
        offload_inputs=c.s.train.activation_offload == "cpu", grads_on_side_stream=grads_on_reduce_stream(c),
        grad_reduce_ratio=reduce_cast_ratio(c),
        gathered_on_side_stream=gathers_on_side_stream(c), zero3_groups=zero3_sub_groups(c),
        vision_saved=tuple(n for n, _ in tower_sequence(c)) + tuple(n for _, n, _ in cross_sequence(c))
        + tuple(n for n, _ in encoder_sequence(c)),
        vision_unused=tuple(u for _, u in tower_sequence(c)) + tuple(u for _, _, u in cross_sequence(c))
        + tuple(u for _, u in encoder_sequence(c)),
    )


def _kernel_loss_tensors(terms: Sequence[Term]) -> tuple[int, int, int]:
    """(kept, forward temporary, backward temporary) of a loss kernel's terms (terms/loss.py ``kernel_loss``)."""
    kept = forward = backward = 0
    for t in reversed(terms):
        if t.name in ("logits.kernel_loss", "logits.loss"):  # the loss's forward term comes after its layers'
            if t.name == "logits.kernel_loss":
                kept, forward = t.tensors
            break
        if t.name == "logits.kernel_loss_gradients":
            backward = t.tensors[1]
    return kept, forward, backward


def _loss_tensors(terms: Sequence[Term]) -> tuple[int, int, int]:
    """(logits, their fp32 copy, the saved log-probabilities): the loss term's tensors (0s without the head).
    Looked for from the end: the loss comes after the per-layer terms in the registry."""
    for t in reversed(terms):
        if t.name == "logits.loss":
            a, b, c = t.tensors
            return a, b, c
    return 0, 0, 0
