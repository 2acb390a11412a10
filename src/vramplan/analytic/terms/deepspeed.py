"""DeepSpeed ZeRO's own buffers and its ZeRO-3 parameter fetching (deepspeed 0.19.8), in place of the FSDP-like
"two gathered units" and "a layer's unsharded gradients" when DeepSpeed runs the step (``zero_stage`` without
``fsdp``).  The settings are ``parallel.deepspeed`` resolved per framework (analytic/deepspeed.py).

ZeRO-3 (runtime/zero/stage3.py ``DeepSpeedZeroOptimizer_Stage3``, runtime/zero/partitioned_param_coordinator.py
``PartitionedParameterCoordinator``):

* ``deepspeed.reduce_bucket``: with ``contiguous_gradients`` the optimizer's ``__init__`` allocates one
  ``reduce_bucket_size``-element buffer per communication dtype (``ipg_buckets[dtype].buffer = torch.empty(
  self.reduce_bucket_size, ...)`` on the GPU, whatever the offload), the model's half dtype: resident.
* the gradient partition: ``grad_partitions_flat_buffer = torch.zeros(sum(p.partition_numel()), ...)`` on
  ``self.device`` (the GPU, or the host with ``offload_optimizer``), made at ``__init__``: this rank's gradient
  shard exists for the whole step, forward included (terms/gradients.py ``zero3_flat_gradients``).
* ``deepspeed.grad_in_flight``: a parameter's full gradient lives only until ``__add_grad_to_ipg_bucket`` copies
  it into the bucket (``param.grad.data = new_grad_tensor``): one tensor at a time, the layer's largest.  Without
  ``contiguous_gradients`` the gradients stay separate until the bucket holds ``reduce_bucket_size`` elements
  (``reduce_independent_p_g_buckets_and_remove_grads``): up to the bucket plus one tensor, at most the layer's.
* ``gathered``: DeepSpeed fetches module by module (``fetch_sub_module`` gathers the running module's own
  parameters, ``recurse=False``): the largest tensor of a layer, or the head at the loss; ``gathered.prefetch``:
  once the trace is complete it all-gathers the next parameters of the trace up to
  ``min(stage3_prefetch_bucket_size, stage3_max_live_parameters - gathered)`` elements (``_fetch_sub_module_impl``).
* ``gathered.retained``: ``release_sub_module`` releases only ``__params_to_release``: a module's parameters used
  again within ``stage3_max_reuse_distance`` elements of the modules that follow in the trace stay gathered.  The
  trace is the forward then the backward, and a checkpointed layer runs its forward again in the backward, so a
  layer's parameter released in the forward at module i of layer j is reused after

      D = (its layer's modules after i) + F_after + 2 H + B_after + (ckpt(j) ? its modules before i
                                                                     : its modules after i)

  elements (F_after: the later layers' parameters, B_after: the same, twice for a checkpointed layer, H: the
  head's, run at the forward's end and first in the backward).  With D < stage3_max_reuse_distance it stays
  gathered from its forward until its layer's backward ends: the last layers of a model small beside the
  distance (1e9 by default), and fewer with checkpointing (3x rather than 2x the later layers).
* ``deepspeed.persistent``: parameters of at most ``stage3_param_persistence_threshold`` elements
  (``DeepSpeedZeRoOffload.mark_persistent_parameters``: ``ds_persist``) are gathered once and never released: their
  full bytes, less the shard already counted as the parameters.

ZeRO-1/2 (runtime/zero/stage_1_and_2.py ``DeepSpeedZeroOptimizer``):

* ``deepspeed.reduce_bucket``: ``setup_buckets`` allocates ``reduce_bucket_size`` elements in the bit16 dtype when
  the first gradient arrives (gradient hooks exist with ``contiguous_gradients``, ``overlap_comm`` or stage 2), and
  a second with ``overlap_comm`` ("double buffers"); the buffers are kept from micro-step to micro-step.
* ``deepspeed.offload_staging``: with ``offload_optimizer`` the GPU keeps ``temp_grad_buffer_for_gpu_offload``, a
  buffer of the largest parameter's elements in the bit16 dtype (``__init__``, ``if self.cpu_offload``).
* ``deepspeed.step_norm_and_flatten``: ``step()`` before the optimizer runs, read at v0.9.5, v0.14.4, v0.16.3
  and v0.19.8 (the same in each).  First the gradient norm (``scaled_global_norm`` -> ``get_grad_norm_direct``,
  computed at every step, not only when clipping): ``g.data.double()`` (v0.19.8: ``.to(get_norm_dtype())``, fp64
  on CUDA) of each gradient piece of this rank's partition, one at a time: 8 B per element of the largest piece.
  Then per parameter group ``self.flatten(self.averaged_gradients[i]).to(fp32)``: ``_flatten_dense_tensors`` (a
  ``torch.cat``) copies the partition's gradients in the bit16 dtype and ``.to`` makes the fp32 copy the optimizer
  reads, beside the gradients themselves; the flat copy dies before ``_optimizer_step`` (v0.19.8 ``del
  flat_grad_partition``; before, a temporary of the statement), so the step's temporaries come after it.  The
  moment holds the larger of the three; the term is what it adds to the optimizer's own moment (the fp32 copy and
  ``optimizer.step()``'s temporaries, terms/optimizer_state.py).  In fp32 ``.to(fp32)`` returns the flat copy,
  which is then the optimizer's gradient.  (v0.19.8's ``_build_compact_grad_partition_buffer`` replaces the
  flattening only when the gradient-accumulation dtype is fp32 and differs from the model's, which DeepSpeed
  chooses under ZeRO only when ``data_types.grad_accum_dtype`` says so: ``engine.get_data_types``.)
* ``deepspeed.offload_norm``: with ``offload_optimizer`` the norm is taken in the backward instead,
  ``copy_grads_in_partition`` -> ``set_norm_for_param_grad_in_gpu``: the same fp64 copy of each piece of this
  rank's partition, on the GPU, when its bucket is reduced: the layer's largest piece during its backward, the
  untied LM head's when the next gradient's hook reduces it (the last layer's backward), the input embedding's in
  the epilogue after the backward.
* ``allgather_bucket_size`` allocates nothing: ``all_gather_dp_groups`` (runtime/utils.py) gathers with
  ``all_gather_into_tensor`` straight into the bit16 groups wherever torch has it.

Releases: the same buffers since DeepSpeed 0.6 (stage3.py ``__ipg_bucket_flat_buffer`` of reduce_bucket_size and
``grad_partitions_flat_buffer`` at ``__init__`` in v0.6.0, v0.7.0, v0.9.0, v0.14.0, v0.16.0; stage_1_and_2.py's
``ipg_buffer`` made anew at each ``backward`` with a second one under overlap_comm in v0.9.0 and v0.14.0, never
freed between steps), and ``__params_to_release``'s reuse-distance walk over the module trace in
partitioned_param_coordinator.py since v0.7.0 (in stage3.py in v0.6.0), so the published runs of 2022-2025 are
modelled by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable

from vramplan.analytic.checkpointing import checkpointed_layer
from vramplan.analytic.deepspeed import (
    ZeroSettings,
    deepspeed_zero,
    overflow_check_bytes,
    step_overflow_check,
    zero_settings,
)
from vramplan.analytic.layout import split_on_rank
from vramplan.analytic.moment import K, Key
from vramplan.analytic.terms.base import Term, device_terms, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.optimizer_state import (
    SUB_GROUP_SIZE,
    optimizer_cost_of,
    zero3_sub_groups,
    zero_stage_stepping,
    zero_step,
)
from vramplan.analytic.terms.sharding import one_layer
from vramplan.analytic.timeline import END, FORWARD, STEP, layer_done, mlp
from vramplan.analytic.weights import weights_bytes
from vramplan.units import ceil_div

__all__ = ["SUB_GROUP_SIZE", "fetches_copies", "gathers_on_side_stream", "grad_in_flight", "layer_tensors", "offload_norm_copies",
           "persistent", "reduce_buckets", "retained_layers", "reuse_distances", "settings", "step_norm_and_flatten",
           "whole_then_partitioned", "zero3", "zero3_gathered", "zero3_offload_grad_copies", "zero3_sub_groups"]


def settings(c: StepContext) -> ZeroSettings:
    """The resolved ``parallel.deepspeed`` (once per stage)."""
    return c.memo("deepspeed.settings", lambda: zero_settings(c.s, c.m.hidden_size))


def zero3(c: StepContext) -> bool:
    """DeepSpeed's ZeRO-3 runs the step, on any number of data-parallel ranks: on one, ``stage3.py`` still makes its
    reduce bucket, its flat gradient partition (of the trainable parameters) and its sub-groups' fp32 gradients (no
    allocation of ``__init__`` or ``step`` depends on the world size), while fetching copies nothing
    (``fetches_copies``)."""
    return deepspeed_zero(c.s) and c.s.parallel.zero_stage == 3


def fetches_copies(c: StepContext) -> bool:
    """ZeRO-3's fetching allocates gathered parameters: over more than one rank (``all_gather_coalesced`` into a new
    flat buffer), or from host partitions (``offload_param``).  On one rank with the partition on the GPU,
    ``all_gather_coalesced`` returns ``_no_gather_coalesced`` (every parameter's partition world size is 1), whose
    ``NoGatherHandle`` sets ``param.data = param.ds_tensor.data.to(device).view(ds_shape)``: the partition itself,
    no copy (deepspeed 0.19.8 runtime/zero/partition_parameters.py lines 61-76 and 1559-1560)."""
    return zero3(c) and (c.shards[2] > 1 or c.offload_params)


def gathers_on_side_stream(c: StepContext) -> bool:
    """ZeRO-3 with ``overlap_comm`` gathers parameters on a stream of its own (deepspeed 0.19.8
    runtime/zero/parameter_offload.py:195: ``Stream() if overlap_comm else default_stream()``;
    partitioned_param_coordinator.py:606 calls ``all_gather_coalesced`` under ``stream(self.__allgather_stream)``,
    and partition_parameters.py ``_all_gather_dtype`` makes the flat gathered buffer there).  The caching allocator
    never hands that stream's cached blocks to the compute stream nor the other way round, so the gathered
    parameters are a pool of their own in the step's replay (analytic/events.py ``gathered_on_side_stream``)."""
    return fetches_copies(c) and settings(c).overlap_comm


def whole_then_partitioned(c: StepContext) -> bool:
    """DeepSpeed ZeRO-3 on a model not built under zero.Init (``lifecycle.zero_init`` false, not quantized: a
    bitsandbytes base is loaded whole anyway, lifecycle/load.py ``partitions_after_load``): ``deepspeed.initialize``
    moves the whole half model to the GPU, then partitions it (spec/scenario.py ``Lifecycle.zero_init``)."""
    return c.s.lifecycle.zero_init is False and zero3(c) and c.quant == "none"


def _half_bytes(c: StepContext) -> int:
    """Bytes per element of DeepSpeed's bit16 (or fp32) model dtype: its communication and bucket dtype."""
    return 2 if c.pol.compute_bytes <= 2 else 4


def layer_tensors(c: StepContext) -> list[list[int]]:
    """Each of this rank's layers' parameter tensors (elements on this rank), in the model's (forward) order."""
    def make() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in c.rp.layers]
        where = {layer: j for j, layer in enumerate(c.rp.layers)}
        for p in c.m.params:
            if not p.layer_span:
                continue
            per = p.count // len(p.layer_span)
            if p.tp == "expert" and c.ep > 1:
                per = ceil_div(per, c.ep)
            numel = split_on_rank(p, c.tp, c.ep)
            for layer in p.layer_span:
                j = where.get(layer)
                if j is not None:
                    out[j] += [numel] * per
        return out
    return c.memo("deepspeed.layer_tensors", make)


def _head_elements(c: StepContext) -> int:
    """Elements of the LM head the loss runs (the tied embedding's when tied), 0 on a stage without it."""
    if not c.last:
        return 0
    if c.rp.lm_head:
        return c.rp.lm_head
    return ceil_div(c.m.vocab_size, c.tp) * c.m.hidden_size if c.m.tie_word_embeddings else 0


def _bytes_per_gathered(c: StepContext) -> tuple[int, int]:
    """(bytes, elements) of a gathered layer: its stored dtype's (a quantized base's packed bytes)."""
    rp = c.rp
    layer_p = max(rp.per_layer) if rp.per_layer else 0
    if c.peft is not None and c.quant != "none" and layer_p:
        return weights_bytes(one_layer(rp, layer_p), c.pol.frozen_param_bytes, c.quant), layer_p
    return _half_bytes(c), 1


def _gbytes(c: StepContext, elements: int) -> int:
    num, den = _bytes_per_gathered(c)
    return ceil_div(elements * num, den) if den else 0


def reuse_distances(c: StepContext) -> list[list[int]]:
    """Each layer tensor's reuse distance D (module docstring), in elements of the trace."""
    tensors = layer_tensors(c)
    n = len(tensors)
    head = _head_elements(c)
    sizes = [sum(t) for t in tensors]
    out: list[list[int]] = [[] for _ in range(n)]
    f_after = b_after = 0
    for j in range(n - 1, -1, -1):
        ckpt = checkpointed_layer(c.s, j)
        before = 0
        total = sizes[j]
        for t in tensors[j]:
            after = total - before - t
            out[j].append(after + f_after + 2 * head + b_after + (before if ckpt else after))
            before += t
        f_after += total
        b_after += total * (2 if ckpt else 1)
    return out


def _persists(c: StepContext, numel: int) -> bool:
    return numel <= settings(c).param_persistence_threshold


def retained_layers(c: StepContext) -> list[int]:
    """Elements of each layer kept gathered from its forward to its backward (reuse within the distance), less
    its persistent tensors (counted once in ``persistent``)."""
    limit, threshold = settings(c).max_reuse_distance, settings(c).param_persistence_threshold
    return [sum(t for t, d in zip(ts, ds, strict=True) if d < limit and t > threshold)
            for ts, ds in zip(layer_tensors(c), reuse_distances(c), strict=True)]


def _persistent_elements(c: StepContext) -> int:
    """Elements of this rank's parameters at or under the persistence threshold (the adapters aside)."""
    rp = c.rp
    threshold = settings(c).param_persistence_threshold  # ``_persists``, read once for the model's tensors
    out = sum(t for ts in layer_tensors(c) for t in ts if t <= threshold)
    for p in c.m.params:
        if p.layer_span:
            continue
        held = rp.has_embedding if p.role in ("embedding", "position") else c.last
        numel = split_on_rank(p, c.tp, c.ep)
        if held and _persists(c, numel):
            out += numel * p.count
    return out


def _adapter_persistent_elements(c: StepContext) -> int:
    """Elements of this rank's LoRA matrices at or under the persistence threshold: each adapted linear's A
    (rank x in_features) and B (out_features x rank), each its own parameter (peft tuners/lora/layer.py
    ``update_layer``: ``nn.Linear(self.in_features, r)`` and ``nn.Linear(r, self.out_features)``)."""
    if c.peft is None:
        return 0
    r, linear, held = c.peft.rank, c.lt.linear, set(c.rp.layers)
    out = 0
    for p in c.m.params:
        if not p.layer_span or p.module not in linear or not p.in_features:
            continue
        instances = p.count // len(p.layer_span) * sum(1 for layer in p.layer_span if layer in held)
        fan_in = ceil_div(p.in_features, c.tp) if p.tp == "row" else p.in_features
        fan_out = ceil_div(p.out_features, c.tp) if p.tp == "column" else p.out_features
        out += sum(n for n in (r * fan_in, fan_out * r) if _persists(c, n)) * instances
    return out


def persistent(c: StepContext) -> list[Term]:
    """ZeRO-3's persistent parameters (the base's and the LoRA matrices'): gathered once, kept on the GPU
    (offloaded parameters too); their shard is already among the parameters (not when the parameters are
    offloaded)."""
    if not fetches_copies(c):
        return []
    nbytes = 0
    for elems, per in ((_persistent_elements(c), _half_bytes(c)), (_adapter_persistent_elements(c), c.adapter)):
        nbytes += elems * per - (0 if c.offload_params else ceil_div(elems, c.shards[2]) * per)
    return [resident(K.DS_PERSISTENT, max(0, nbytes), "deepspeed.persistent")]


def zero3_gathered(c: StepContext) -> list[Term]:
    """ZeRO-3's gathered parameters: the running module (the head at the loss, then a layer's largest tensor),
    the prefetched ones and the layers kept for their reuse."""
    if not fetches_copies(c):
        return []
    st = settings(c)
    tensors = layer_tensors(c)
    n = len(tensors)
    threshold = st.param_persistence_threshold  # ``_persists``, read once
    largest = max((t for ts in tensors for t in ts if t > threshold), default=0)
    head = _head_elements(c)
    retained = retained_layers(c)
    available = sum(retained)
    trace_rest = sum(sum(ts) for ts in tensors) + head
    prefetch = min(st.prefetch_bucket_size, max(0, st.max_live_parameters - available), trace_rest)
    out: list[Term] = []
    first = mlp(n - 1) if n else STEP
    if head and n:
        out.append(Term(K.GATHERED, head * _half_bytes(c), FORWARD, first, "gathered.head"))
    if n:
        out.append(Term(K.GATHERED, _gbytes(c, largest), first, STEP, "gathered"))
    out.append(Term(K.GATHERED, _gbytes(c, prefetch), FORWARD, STEP, "gathered.prefetch"))
    out += device_terms(K.DS_RETAINED, [(_gbytes(c, retained[j]), FORWARD, layer_done(j), "gathered.retained", j)
                                        for j in range(n - 1, -1, -1)])
    return out


def _largest_trainable(c: StepContext, j: int) -> int:
    """Elements of layer ``j``'s largest trainable tensor (its adapters' total under PEFT: small, an upper bound)."""
    if c.peft is not None:
        return c.rp.lora_per_layer[j] if j < len(c.rp.lora_per_layer) else 0
    return max(layer_tensors(c)[j], default=0)


def grad_in_flight(c: StepContext) -> list[Term]:
    """ZeRO-3: the full gradients alive before they reach the reduce bucket, per layer's backward."""
    if not zero3(c) or c.grads_one_at_a_time:
        return []
    st, gb = settings(c), c.pol.grad_bytes
    rows = []
    for j in range(len(layer_tensors(c)) - 1, -1, -1):
        one = _largest_trainable(c, j)
        layer = c.rp.lora_per_layer[j] if c.peft is not None else c.rp.per_layer[j]
        elems = one if st.contiguous_gradients else min(layer, st.reduce_bucket_size + one)
        rows.append((elems * gb, mlp(j), layer_done(j), "deepspeed.grad_in_flight", j))
    return device_terms(K.UNSHARDED_GRADS, rows)


def reduce_buckets(c: StepContext) -> list[Term]:
    """The reduce buckets (ZeRO-1/2/3) and ZeRO-1/2's offload staging buffer, resident."""
    if not deepspeed_zero(c.s) or c.grads_one_at_a_time or c.trainable == 0:
        return []
    st, half = settings(c), _half_bytes(c)
    stage = c.s.parallel.zero_stage
    if stage == 3:
        if not zero3(c):
            return []
        buckets = 1 if st.contiguous_gradients else 0
    else:
        # setup_buckets allocates them only with contiguous_gradients (its gradient hooks then exist)
        buckets = (1 + (1 if st.overlap_comm else 0)) if st.contiguous_gradients else 0
    out = [resident(K.DS_REDUCE_BUCKETS, buckets * st.reduce_bucket_size * half, "deepspeed.reduce_bucket")]
    if stage < 3 and c.offload_opt:
        largest = max((split_on_rank(p, c.tp, c.ep) for p in c.m.params), default=0) if c.peft is None \
            else max(c.rp.lora_per_layer, default=0)
        out.append(resident(K.DS_REDUCE_BUCKETS, largest * half, "deepspeed.offload_staging"))
    return out


def _largest_tensors(c: StepContext) -> tuple[int, int, int]:
    """Elements of (a layer's largest trainable tensor, the untied LM head, the input embedding) on this rank (the
    adapters' largest layer total under PEFT)."""
    if c.peft is not None:
        return max(c.rp.lora_per_layer, default=0), 0, 0
    layer = max((t for ts in layer_tensors(c) for t in ts), default=0)
    head = c.rp.lm_head if c.last else 0
    emb = max((split_on_rank(p, c.tp, c.ep) for p in c.m.params if p.role == "embedding"), default=0) \
        if c.rp.has_embedding else 0
    return layer, head, emb




def step_norm_and_flatten(c: StepContext) -> list[Term]:
    """ZeRO's step (module docstring): the fp32 gradient the optimizer reads, for the whole step, and before the
    optimizer runs the largest of the overflow check's copies (fp16, or any dtype before DeepSpeed 0.11.2), the
    norm's fp64 copy of a gradient piece and the flat partition beside its fp32 copy, less what the optimizer's own
    moment holds (that fp32 gradient and the step's temporaries).

    A piece: ZeRO-1/2's partition is a contiguous range of the flattened group, so a tensor larger than it is split
    between ranks (ZeRO-1 checks the whole gradients); ZeRO-3 splits every parameter between the ranks and steps one
    sub-group at a time (``SUB_GROUP_SIZE``; stage3.py ``_prepare_fp32_grad_for_sub_group`` flattens it with the same
    ``self.flatten(...).to(fp32)`` and ``_release_sub_group`` frees its fp32 gradient before the next;
    ``get_grad_norm_direct`` makes the same fp64 copies, its overflow check a smaller one; read at v0.14.4, v0.19.5
    and 0.19.8)."""
    if not zero_step(c):
        return []
    stage = c.s.parallel.zero_stage
    shard, half = c.trainable_shard, _half_bytes(c)
    largest = max(_largest_tensors(c))
    piece = ceil_div(largest, c.shards[2]) if stage == 3 else min(largest, shard)
    group = min(shard, SUB_GROUP_SIZE + piece) if stage == 3 else shard
    # the optimizer's gradient: the .to(fp32) copy of the flat half one, or in fp32 the flat copy itself
    fp32 = 4 * group
    flat = half * group if half < 4 else 0
    check = 0
    if step_overflow_check(c.s) and stage < 3:
        # (stage3.py's own _has_inf_or_nan up to 0.19.5 is float(x.float().sum()): a 4 B copy of the piece, below
        # the norm's 8 B fp64 copy of the same piece, so it never sets the moment)
        check = overflow_check_bytes(c.s, half < 4) * (largest if stage == 1 else piece)
    out = [Term(K.OPTIMIZER_STEP, fp32, STEP, END, "optimizer.step.fp32_gradients")]
    extra = max(check, 8 * piece, flat + fp32) - fp32 - optimizer_cost_of(c).step_temporary_bytes
    if extra > 0:
        out.append(Term(K.ZERO_STEP_COPIES, extra, STEP, END, "deepspeed.step_norm_and_flatten"))
    return out


def zero3_offload_grad_copies(c: StepContext) -> list[Term]:
    """ZeRO-3 with the optimizer offloaded: ``partition_grads`` (deepspeed 0.19.8 runtime/zero/stage3.py lines
    2025-2046) copies each reduced gradient partition into its host buffer and then back to the GPU
    (``grad_buffer.to(grad_partition.device)``, or the accumulation's ``cuda_grad_buffer``: the partition in the
    gradient-accumulation dtype), and at the accumulation boundary ``_offload_grad_partition_at_boundary`` (lines
    1443-1457) converts that to fp32 on the GPU (``grad_buffer.to(dtype=master_weights_and_grads_dtype)``) before
    copying it into the host fp32 gradient.  One parameter at a time: (half + 4) B x its partition, the layer's
    largest during its backward, the untied head's with the last layer's, the input embedding's in the epilogue.
    On one rank a partition is the whole tensor: Llama-3.1-8B's head, 128,256 x 4,096 = 525,336,576 elements, in
    bf16 gives 6 x 525,336,576 = 3,152,019,456 B during the last layer's backward."""
    if zero_stage_stepping(c) != 3 or not c.offload_opt or c.trainable == 0:
        return []
    half = _half_bytes(c)
    per = half + (4 if half < 4 else 0)  # an fp32 partition's ``.to(fp32)`` is itself

    return _reduced_piece_terms(c, lambda elements: per * ceil_div(elements, c.shards[2]), K.ZERO3_OFFLOAD_GRAD,
                                "deepspeed.offload_grad_copy")


def _reduced_piece_terms(c: StepContext, copies: Callable[[int], int], key: Key, name: str) -> list[Term]:
    """What the reduction of each gradient makes on the GPU (``copies`` of its elements), one gradient at a time: the
    layer's largest during its backward, the untied head's with the last layer's, the input embedding's in the
    epilogue after the backward."""
    _layer, head, emb = _largest_tensors(c)
    n = len(c.rp.layers)
    rows = []
    for j in range(n - 1, -1, -1):
        nbytes = copies(_largest_trainable(c, j))
        if j == n - 1:
            nbytes = max(nbytes, copies(head))
        rows.append((nbytes, mlp(j), layer_done(j), name, j))
    out = device_terms(key, rows)
    if emb:
        out.append(Term(key, copies(emb), STEP, END, f"{name}.embedding"))
    return out


def offload_norm_copies(c: StepContext) -> list[Term]:
    """ZeRO-1/2 with the optimizer offloaded (module docstring): per gradient of this rank's partition, when its
    bucket is reduced, the norm's fp64 copy of its piece, then (before DeepSpeed 0.19.6) the overflow check's
    copies of the whole gradient: per layer in its backward, the untied head's with the last layer's, the input
    embedding's in the epilogue after the backward.  (ZeRO-3's offload path, stage3.py ``partition_grads``, norms in
    constant-size chunks and checks with ``isinf``/``isnan`` masks of 1 B per element of a piece: not counted.)"""
    if zero_stage_stepping(c) not in (1, 2) or not c.offload_opt:
        return []
    shard = c.trainable_shard
    per = overflow_check_bytes(c.s, _half_bytes(c) < 4)

    return _reduced_piece_terms(c, lambda elements: max(8 * min(elements, shard), per * elements),
                                K.ZERO_OFFLOAD_NORM, "deepspeed.offload_norm")
