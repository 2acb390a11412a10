"""Loading the model onto one GPU, and PEFT's k-bit preparation after it.

The load is the parameters of this rank made one tensor at a time in module order (embedding, layers, the
rest), as the library makes them:

* **direct** (``lifecycle.load_dtype: auto``, the default): each tensor is written in the dtype the step
  holds it in; transformers casts on the host before the copy
  (``modeling_utils._load_state_dict_into_meta_model``: ``param.to(dtype)``, then
  ``set_module_tensor_to_device``), Lit-GPT copies into parameters made under ``fabric.init_module`` in
  the precision's dtype (litgpt ``utils.load_checkpoint``: ``model.load_state_dict``).
* **fp32, then cast** (``load_dtype: fp32``): transformers < 5 without ``torch_dtype`` loads fp32
  (``torch.get_default_dtype()``; PR huggingface/transformers#42805 made ``"auto"`` the default in 5.0);
  the model is cast afterwards, one parameter at a time (torch ``Module._apply``: the half copy is made,
  then ``param.data`` is swapped and the fp32 block freed), so the fp32 blocks stay cached.
* **quantize on load** (bitsandbytes): each quantized linear arrives as a half-precision copy on the GPU
  and is quantized there (bitsandbytes ``Params4bit._quantize``: ``w = self.data.contiguous().to(device)``,
  ``quantize_4bit(w)``; ``Int8Params.cuda``: ``B = self.data.contiguous().half().cuda(device)``,
  ``int8_vectorwise_quant(B)``); the half copy is freed into the cache.  The half dtype is the one the
  script passes, float16 when it passes none (transformers ``Bnb4BitHfQuantizer.update_torch_dtype``).
* **Lit-GPT, quantized as built** (``lifecycle.quantize_at_init``, true by default under ``framework:
  lightning`` with a bitsandbytes 4-bit format): Lit-GPT's finetune scripts build the model under
  ``fabric.init_module(empty_init=(devices > 1))`` (lit-gpt 8641822 ``finetune/lora.py`` ``main``), which
  enters the GPU as the default device, the precision's dtype, and Lightning's class replacement of
  ``torch.nn.Linear`` (``BitsandbytesPrecision.init_context``, lightning 71aed75 ``plugins/precision/
  bitsandbytes.py``), so every linear, the LM head included (``lit_gpt/lora.py`` ``GPT.__init__`` makes
  ``lm_head`` first, its own ``nn.Linear`` even where the checkpoint ties it), is made on the GPU in that
  dtype and quantized in its constructor (``_Linear4bit.__init__`` -> ``_quantize_weight``:
  ``w = weight.contiguous().to(device="cuda", dtype=torch.half)``, ``quantize_4bit(w)``): its half weight,
  the float16 copy (none when the dtype is float16) and the 4-bit result live together, one linear at a
  time.  ``load_checkpoint`` (``lit_gpt/utils.py``: ``lazy_load`` then ``model.load_state_dict``) then
  quantizes every linear again from the checkpoint, in module order (``_quantize_on_load_hook``: the CPU
  tensor's float16 copy on the GPU, a new 4-bit result, then the old one freed), beside the whole
  quantized model: the load peaks at the largest linear's float16 copy there, the LM head's first.
  Whether a quantized linear or the whole model's half weights are ever on the GPU together: no, one
  linear at a time in both passes.
* **torchtune, quantized as built** (``framework: torchtune`` with its NF4 base): the single-device recipes build
  the model under ``with training.set_default_dtype(dtype), self._device`` (recipes/lora_finetune_single_device.py
  ``_setup_model``, v0.1-v0.6.1), so each ``LoRALinear`` / ``FrozenNF4Linear`` makes its weight on the GPU in the
  model's dtype and ``to_nf4`` quantizes it in the constructor; ``model.load_state_dict`` then copies each CPU
  checkpoint tensor to the GPU and quantizes it again (torchao 0.7.0 ``NF4Tensor`` ``copy_``:
  ``NF4Tensor.from_tensor(copy_in.to(original.device), ...)``), one linear at a time beside the whole quantized
  model: Lit-GPT's stream without the float16 copy.  ``to_nf4``'s own temporaries (the scaled blocks, the codes
  before packing and its per-million-element comparisons) are not counted.
* **quantized, then partitioned** (a bitsandbytes base under DeepSpeed ZeRO-3): transformers does not build a
  quantized model under ``deepspeed.zero.Init`` (``get_init_context``: ``if is_deepspeed_zero3_enabled() and
  not is_quantized``: a quantized model is made on the meta device instead; PR huggingface/transformers#32640
  keeps that exclusion; bitsandbytes issue #1249), and the bitsandbytes quantizer puts it on the process's GPU
  (``update_device_map``: ``{"": torch.cuda.current_device()}``): every rank quantizes the whole model on
  its GPU, one linear at a time as above.  DeepSpeed partitions it only in ``deepspeed.initialize``
  (``DeepSpeedZeRoOffload._convert_to_zero_parameters`` -> ``zero.Init(module=...)``: each parameter's
  partition allocated, then its full data freed), so the load peaks at the whole quantized model, whose
  blocks stay cached (peft issue #1844: with QLoRA "parameters first be fully loaded to each GPU and then be
  sharded", without quantization sharded first).
* **sharded** (FSDP, ZeRO-3): each unit's full parameters are on the GPU only while it is sharded.  FSDP
  moves a unit to the GPU, flattens it (``FlatParamHandle.flatten_tensors``: ``torch.cat``) and keeps its
  shard (``FlatParamHandle.shard``); DeepSpeed's ``zero.Init`` partitions each parameter as it is made
  and ``from_pretrained`` loads into it under ``GatheredParameters`` one module at a time
  (transformers ``modeling_utils.load_state_dict_into_zero3_model``).  With parameters offloaded the
  shards live on the host.

k-bit preparation (peft ``prepare_model_for_kbit_training``, ``utils/other.py``) then casts
every half-precision parameter that is not quantized to fp32, in ``model.parameters()`` order
(``param.data = param.data.to(torch.float32)``): the fp32 copy is made beside the half original, which is
then freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vramplan.analytic.inference import litgpt_head_params
from vramplan.analytic.layout import BNB_4BIT_FORMATS, BNB_FORMATS, count_on_rank, split_on_rank
from vramplan.analytic.lifecycle.stream import PhaseStream, StreamPeak
from vramplan.analytic.moment import K
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.deepspeed import whole_then_partitioned
from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.facts.quantization import quant_format
from vramplan.spec.lora_match import experts_are_parameters, gate_before
from vramplan.spec.model import ParamGroup
from vramplan.spec.scenario import Lifecycle
from vramplan.units import ceil_div

__all__ = ["LoadPlan", "LoadTensor", "device_map_for", "host_load_bytes", "litgpt_tensors", "load_mode", "load_peaks", "load_plan",
           "partitions_after_load", "prepares_kbit", "quantizes_at_init", "rank_tensors", "upcasts_half_base"]

# transformers' save_pretrained(max_shard_size="5GB") default: a checkpoint is read one shard at a time
CHECKPOINT_SHARD_BYTES = 5 * 10**9
HALF = 2  # checkpoint tensors are half precision (bf16/fp16 releases)


@dataclass(frozen=True)
class LoadTensor:
    """One parameter tensor of this rank: its elements, rows, unit (layer, -1 outside) and whether
    bitsandbytes quantizes it (a decoder linear; the LM head is skipped, as ``weights_bytes`` counts)."""

    numel: int
    out_features: int
    unit: int
    quantized: bool
    head: bool = False  # transformers' untied LM head
    # transformers 5's fused experts of a checkpoint that holds them one by one: each expert's tensor is materialized
    # on the GPU, then stacked (and gate with up concatenated) there, the pieces freed after (``stacked_staging``)
    stacked: bool = False


def rank_tensors(c: StepContext, flag_linears: bool = False) -> tuple[LoadTensor, ...]:
    """This rank's base parameter tensors in module order: the embedding(s), each layer, the rest (a vision
    tower's layers one tensor per instance, its linears quantized as ``weights_bytes`` counts them:
    ``VisionSpec.quantized_linears`` where the format quantizes dense linears).  ``flag_linears``: a half base's
    decoder linears flagged as bitsandbytes would quantize them (the same tensors, in the same order)."""
    v = c.m.vision
    tower: tuple[tuple[str, int, int], ...] = ()
    if v is not None and c.quant != "none" and "linear" in quant_format(c.quant).quantized_roles:
        tower = tuple((name, o, k) for name, _, o, k in v.quantized_linears if k)
    fused = experts_are_parameters(c.m, c.s.software.fused_moe_experts, c.quant)
    stacked = fused and c.m.stacked_expert_checkpoint
    return _rank_tensors(c.m.params, c.rp.layers, c.tp, c.ep, c.quant != "none" or flag_linears, tower, fused,
                         stacked)


def _add_fused(layer: list[LoadTensor], joins: bool, t: LoadTensor) -> None:
    """A layer's fused expert tensor: an ``up_proj`` after its experts' ``gate_proj`` (``joins``) joins it
    (transformers 5's ``gate_up_proj`` [E, 2I, h]: gate's and up's per-expert tensors stacked, then concatenated,
    as one)."""
    prev = layer[-1] if layer else None
    if joins and prev is not None and prev.stacked == t.stacked:
        layer[-1] = LoadTensor(prev.numel + t.numel, prev.out_features + t.out_features, t.unit, t.quantized,
                               stacked=t.stacked)
    else:
        layer.append(t)


# the planner estimates one model many times with other batch sizes: the tensors are the same
@lru_cache(maxsize=64)
def _rank_tensors(params: tuple[ParamGroup, ...], layers: tuple[int, ...], tp: int, ep: int,
                  quantized: bool, tower: tuple[tuple[str, int, int], ...] = (), fused: bool = False,
                  stacked: bool = False) -> tuple[LoadTensor, ...]:
    """``tower``: the vision tower's quantized linears as (name, out_features, instances quantized); ``fused``: each
    layer's routed experts one tensor per projection (transformers 5), ``stacked`` from per-expert checkpoint
    tensors."""
    quantized_tower = {name: (out, k) for name, out, k in tower}
    lset = set(layers)
    first: list[LoadTensor] = []
    last: list[LoadTensor] = []
    per_layer: dict[int, list[LoadTensor]] = {j: [] for j in layers}
    for p in params:
        n = count_on_rank(p, lset, ep)
        each = split_on_rank(p, tp, ep)
        if n == 0 or each == 0:
            continue
        rows = max(1, p.out_features * each // p.numel) if p.out_features else 1
        quant = quantized and bool(p.layer_span) and p.role in ("linear", "expert") and p.in_features > 0
        if not p.layer_span:
            if p.name in quantized_tower:
                # a vision tower's linear: each of its instances a tensor, the first k quantized (spec/vision_quant.py)
                out, k = quantized_tower[p.name]
                last.extend(LoadTensor(each, out, -1, i < k) for i in range(n))
                continue
            # a group outside the layers with several instances (a vision tower's encoder layers) is that many
            # tensors; every other such group is one
            (first if p.role in ("embedding", "position") else last).extend(
                [LoadTensor(each, rows, -1, False, p.role == "lm_head")] * n)
            continue
        held = [j for j in p.layer_span if j in lset]
        per = n // len(held)
        joins = fused and p.role == "expert" and p.module == "up_proj" and gate_before(params, p)
        for j in held:
            if fused and p.role == "expert":
                _add_fused(per_layer[j], joins, LoadTensor(each * per, rows * per, j, quant, stacked=stacked))
            else:
                per_layer[j] += [LoadTensor(each, rows, j, quant)] * per
    return (*first, *(t for j in layers for t in per_layer[j]), *last)


def litgpt_tensors(c: StepContext) -> tuple[LoadTensor, ...]:
    """Lit-GPT's tensors in the order its ``GPT.__init__`` makes them and ``load_state_dict`` visits them: the LM
    head first (its own quantized ``nn.Linear``, ``litgpt_head_params``), then the embedding, the layers, the
    final norm (``rank_tensors`` without the transformers head)."""
    m = c.m
    head = litgpt_head_params(m, c.rp.lm_head, c.tp) if c.rp.has_lm_head else 0
    rows = max(1, head // m.hidden_size)
    rest = tuple(t for t in rank_tensors(c) if not t.head)
    return ((LoadTensor(head, rows, -1, True),) if head else ()) + rest


def quantizes_at_init(c: StepContext) -> bool:
    """Lit-GPT's path (``lifecycle.quantize_at_init``; null: on under lightning with a bitsandbytes 4-bit
    format, off elsewhere): every linear made on the GPU and quantized as it is built, then again from the
    checkpoint.  Unsharded only (Lit-GPT refuses quantization with more than one device)."""
    flag = c.s.lifecycle.quantize_at_init
    on = flag if flag is not None else c.framework == "lightning"
    return on and c.quant in BNB_4BIT_FORMATS and not c.offload_params and c.shards[2] == 1


def partitions_after_load(c: StepContext) -> bool:
    """A bitsandbytes base under DeepSpeed ZeRO-3 loaded by transformers: quantized whole on every GPU, then
    partitioned by ``deepspeed.initialize`` (mode quantize-partition)."""
    par = c.s.parallel
    return (c.quant in BNB_FORMATS and par.zero_stage == 3 and par.fsdp == "none"
            and c.framework not in ("lightning", "torchtitan") and c.shards[2] > 1)


def load_mode(c: StepContext) -> str:
    """direct | fp32-cast | quantize | litgpt | torchtune | quantize-partition | whole-partition | sharded |
    offloaded: how this rank's parameters reach the GPU."""
    if partitions_after_load(c):
        return "quantize-partition"
    if whole_then_partitioned(c):
        return "whole-partition"
    if c.offload_params:
        return "offloaded"
    if c.shards[2] > 1:
        return "sharded"
    if c.framework == "torchtune" and c.quant != "none":
        return "torchtune"
    if quantizes_at_init(c):
        return "litgpt"
    if c.quant != "none":
        return "quantize"
    if c.s.lifecycle.load_dtype == "fp32" and _held_bytes(c) < 4:
        return "fp32-cast"
    return "direct"


def _held_bytes(c: StepContext) -> int:
    """Bytes per element of a (non-quantized) base parameter as the step holds it, before k-bit preparation."""
    return c.pol.param_bytes if c.peft is None else c.pol.frozen_param_bytes


def _tensor_bytes(c: StepContext, t: LoadTensor, held: int) -> int:
    """A tensor's bytes as the step holds it (``held``: bytes per element of a non-quantized one)."""
    if t.quantized:
        return quantized_linear_bytes(t.numel, t.out_features, c.quant)
    return t.numel * held


@dataclass(frozen=True)
class LoadPlan:
    """What the load and the k-bit preparation make, tensor by tensor, as plain numbers (hashable: the
    streams are replayed once per plan)."""

    mode: str
    sizes: tuple[int, ...]  # each tensor's bytes as the step holds it
    staging: tuple[int, ...]  # each tensor's half copy (quantized) or fp32 original (fp32-cast); 0: none
    units: tuple[int, ...]  # each tensor's unit (sharded: a layer, -1 outside)
    fp32: tuple[int, ...]  # k-bit preparation: each non-quantized tensor's fp32 bytes (0: quantized)
    shard_p: int
    per_tensor: bool  # DeepSpeed: gathered per parameter, not per unit
    prepares: bool
    # Lit-GPT (mode litgpt): each quantized tensor's weight as its constructor makes it (the precision's
    # dtype) and its float16 copy there (0 where that dtype is float16: ``.to`` returns the tensor itself)
    init: tuple[int, ...] = ()
    init_copy: tuple[int, ...] = ()
    offloaded: bool = False  # quantize-partition, whole-partition: the partitions live on the host
    # after the preparation each fp32-cast tensor is converted back to its held dtype, in the module order: axolotl's
    # conversion of the norms and embeddings (facts/trainer_frameworks.py), or DeepSpeed's engine casting the module
    # to its half dtype at initialize (terms/context.py StepContext.kbit)
    casts_back: bool = False


def load_plan(c: StepContext) -> LoadPlan:
    mode, held = load_mode(c), _held_bytes(c)
    tensors = litgpt_tensors(c) if mode == "litgpt" else rank_tensors(c)
    sizes = tuple(_tensor_bytes(c, t, held) for t in tensors)
    staging, init, init_copy = _staging(c, mode, tensors, held)
    if upcasts_half_base(c):
        # axolotl's fp32 upcast of what bitsandbytes would not quantize (embeddings, head, norms), then cast back
        fp32 = tuple(0 if t.quantized else t.numel * 4 for t in rank_tensors(c, flag_linears=True))
        prepares, back = True, True
    else:
        fp32 = tuple(0 if t.quantized else t.numel * 4 for t in tensors)
        prepares = prepares_kbit(c)
        back = prepares and not c.kbit
    return LoadPlan(mode, sizes, staging, tuple(t.unit for t in tensors), fp32, c.shards[2],
                    c.framework == "deepspeed" or c.s.parallel.zero_stage == 3, prepares, init, init_copy,
                    c.offload_params, back)


def upcasts_half_base(c: StepContext) -> bool:
    """axolotl with LoRA on a half-precision base loaded whole onto the GPU: it upcasts the embeddings, the head and
    the norms to fp32 after loading and casts them back for the adapter (facts/trainer_frameworks.py), a preparation
    phase of its own."""
    return c.casts_back and c.peft is not None and c.quant == "none" and load_mode(c) == "direct" \
        and c.pol.frozen_param_bytes < 4


def _staging(c: StepContext, mode: str, tensors: tuple[LoadTensor, ...],
             held: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(staging, init, init_copy) of ``LoadPlan`` for a loading path."""
    init: tuple[int, ...] = ()
    init_copy: tuple[int, ...] = ()
    if mode == "litgpt":
        # the checkpoint pass: a float16 copy of each CPU checkpoint weight (lazy_load) on the GPU
        staging = tuple(t.numel * HALF if t.quantized else 0 for t in tensors)
        init = tuple(t.numel * held if t.quantized else 0 for t in tensors)
        copy = 0 if c.pol.half == "fp16" and held == HALF else HALF
        init_copy = tuple(t.numel * copy if t.quantized else 0 for t in tensors)
    elif mode == "torchtune":
        # LoRALinear / FrozenNF4Linear make their weight on the GPU in the model's dtype (the recipe builds under
        # ``with set_default_dtype(dtype), self._device``) and to_nf4 it in the constructor; load_state_dict then
        # quantizes each checkpoint tensor again from its GPU copy (torchao NF4Tensor ``copy_``:
        # ``NF4Tensor.from_tensor(copy_in.to(original.device), ...)``), in the checkpoint's bf16
        staging = tuple(t.numel * HALF if t.quantized else 0 for t in tensors)
        init = tuple(t.numel * held if t.quantized else 0 for t in tensors)
        init_copy = (0,) * len(tensors)
    elif mode in ("quantize", "quantize-partition"):
        staging = tuple(t.numel * HALF if t.quantized else t.numel * held if t.stacked else 0 for t in tensors)
    elif mode == "fp32-cast":
        staging = tuple(t.numel * 4 for t in tensors)
    else:
        # a stacked expert tensor: its pieces (the per-expert tensors, then gate's and up's stacks before their
        # concatenation) are as large as it and alive while it is made
        staging = tuple(t.numel * held if t.stacked else 0 for t in tensors)
    return staging, init, init_copy


def _litgpt(st: PhaseStream, plan: LoadPlan) -> list[int]:
    """Lit-GPT: each tensor made as ``GPT.__init__`` builds it (a quantized one with its half weight and
    float16 copy beside its 4-bit result until its constructor returns), then each quantized tensor again
    from the checkpoint (its float16 copy, the new 4-bit result, then the copy and the old result freed)."""
    ids = []
    for n, made, copy in zip(plan.sizes, plan.init, plan.init_copy, strict=True):
        weight = st.alloc(K.LOAD_STAGING, made)
        half = st.alloc(K.LOAD_STAGING, copy)
        ids.append(st.alloc(K.PARAMETERS, n))
        st.free(half)
        st.free(weight)
    for i, (n, half_bytes) in enumerate(zip(plan.sizes, plan.staging, strict=True)):
        if not half_bytes:
            continue
        half = st.alloc(K.LOAD_STAGING, half_bytes)
        new = st.alloc(K.PARAMETERS, n)
        st.free(ids[i])  # params4bit.data = w_4bit
        st.free(half)  # w, on return
        ids[i] = new
    return ids


def _per_tensor(st: PhaseStream, plan: LoadPlan) -> list[int]:
    """Direct, quantize on load, or fp32 then cast: the ids of the kept parameters."""
    if plan.mode == "fp32-cast":
        fp32 = [st.alloc(K.PARAMETERS, n) for n in plan.staging]
        ids = []
        for n, old in zip(plan.sizes, fp32, strict=True):
            st.retag(old, K.LOAD_STAGING)
            ids.append(st.alloc(K.PARAMETERS, n))
            st.free(old)
        return ids
    ids = []
    for n, half in zip(plan.sizes, plan.staging, strict=True):
        staging = st.alloc(K.LOAD_STAGING, half)
        ids.append(st.alloc(K.PARAMETERS, n))
        st.free(staging)
    return ids


def _sharded(st: PhaseStream, plan: LoadPlan, keep: bool) -> None:
    """Unit by unit: the unit's full tensors, (FSDP) their flat concatenation, the kept shard."""
    units: list[list[int]] = []
    last_unit = None
    for n, unit in zip(plan.sizes, plan.units, strict=True):
        if plan.per_tensor or not units or last_unit != unit:
            units.append([])
        units[-1].append(n)
        last_unit = unit
    for sizes in units:
        full = [st.alloc(K.LOAD_STAGING, n) for n in sizes]
        flat = -1
        if not plan.per_tensor:
            flat = st.alloc(K.LOAD_STAGING, sum(sizes))
            for bid in full:
                st.free(bid)
            full = []
        if keep:
            st.alloc(K.PARAMETERS, ceil_div(sum(sizes), plan.shard_p))
        for bid in [*full, flat]:
            st.free(bid)


def _partition(st: PhaseStream, plan: LoadPlan, ids: list[int]) -> None:
    """DeepSpeed partitions each loaded parameter in turn: its partition (on the GPU unless parameters are
    offloaded) made, then its full data freed (``partition_parameters.py`` ``_partition_param``)."""
    for n, bid in zip(plan.sizes, ids, strict=True):
        if not plan.offloaded:
            st.alloc(K.PARAMETERS, ceil_div(n, plan.shard_p))
        st.free(bid)


def _prepare(st: PhaseStream, plan: LoadPlan, ids: list[int]) -> None:
    """k-bit preparation's fp32 casts, after the load wrote ``ids`` (replaced by the casts' blocks); then, where the
    framework converts them back (axolotl), each half copy made beside its fp32 one, which is then freed."""
    st.mark()
    for i, (fp32, bid) in enumerate(zip(plan.fp32, ids, strict=True)):
        if not fp32:
            continue
        new = st.alloc(K.PREPARE_CAST, fp32)
        st.free(bid)
        st.retag(new, K.PARAMETERS)
        ids[i] = new
    if not plan.casts_back:
        return
    for i, (fp32, bid) in enumerate(zip(plan.fp32, ids, strict=True)):
        if not fp32:
            continue
        new = st.alloc(K.PREPARE_CAST, plan.sizes[i])
        st.free(bid)
        st.retag(new, K.PARAMETERS)
        ids[i] = new


@lru_cache(maxsize=256)
def load_peaks(plan: LoadPlan) -> tuple[StreamPeak, StreamPeak | None]:
    """The load's peak and, when it runs, the k-bit preparation's (continuing the load's allocator)."""
    st = PhaseStream()
    if plan.mode in ("sharded", "offloaded"):
        _sharded(st, plan, keep=plan.mode == "sharded")
        return st.peak(), None
    ids = _litgpt(st, plan) if plan.mode in ("litgpt", "torchtune") else _per_tensor(st, plan)
    if plan.mode in ("quantize-partition", "whole-partition"):
        _partition(st, plan, ids)
    load = st.peak()
    if not plan.prepares:
        return load, None
    _prepare(st, plan, ids)
    return load, st.peak()


def prepares_kbit(c: StepContext) -> bool:
    """peft's k-bit preparation runs (a bitsandbytes base under the HF Trainer, accelerate or plain PyTorch) on
    an unsharded model with half-precision parameters to cast."""
    return c.kbit_prepares and load_mode(c) == "quantize" and c.pol.frozen_param_bytes < 4


def device_map_for(lc: Lifecycle, quantization: str) -> str:
    """``from_pretrained``'s device map: the scenario's, else auto for a bitsandbytes model (transformers
    ``Bnb4BitHfQuantizer.update_device_map``) and none for the others."""
    if lc.device_map is not None:
        return lc.device_map
    return "auto" if quantization != "none" else "none"


def host_load_bytes(c: StepContext) -> int:
    """Host RAM of one process at the load's peak.

    From a device map (and under Lit-GPT's lazy ``torch.load(mmap=True)`` or DeepSpeed's ``zero.Init``) the
    host holds one checkpoint shard at a time; without one transformers builds the whole model in host RAM
    (in the load dtype) and reads a shard into it; FSDP under transformers/accelerate loads the full model
    on every rank's host (``fsdp_cpu_ram_efficient_loading`` off, its default)."""
    rp = c.rp
    checkpoint = rp.total * HALF
    shard = min(checkpoint, CHECKPOINT_SHARD_BYTES)
    lc = c.s.lifecycle
    if c.framework == "torchtune":
        # torchtune's checkpointers read every shard into one state dict on the host (FullModelHFCheckpointer
        # .load_checkpoint: merged_state_dict.update(safe_torch_load(path)), mmap=True, v0.6.1) while the model is
        # built on the GPU
        return checkpoint
    on_device = (device_map_for(lc, c.quant) == "auto"
                 or c.framework == "lightning" or (c.framework == "deepspeed" and c.s.parallel.zero_stage == 3))
    if on_device:
        return shard
    per_elem = 4 if lc.load_dtype == "fp32" else _held_bytes(c)
    return rp.total * per_elem + shard
