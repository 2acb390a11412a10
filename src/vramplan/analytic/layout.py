"""Which parameters live on one GPU: tensor, pipeline and expert parallel splits, and PEFT.

Splits follow Megatron-LM (arXiv 1909.08053 section 3): column-parallel linears
split their output features, row-parallel linears their input features, norms are
replicated, embeddings and the LM head are split along the vocabulary.  Pipeline
stage 0 holds the embedding and the first L/pp layers; the last stage holds the
LM head; with v virtual stages (an interleaved schedule) rank r holds the chunks r, r + pp, ...
of L/(pp x v) layers each (``stage_layers``, style "loop"); under a V schedule (style "v", 2 chunks
per rank) rank r holds chunks r and 2 pp - 1 - r, so rank 0 holds the embedding, the final norm and the
LM head (``chunk_stages``).  Expert parallelism divides each MoE layer's experts by ``ep``.

Everything here is a parameter *count*; bytes are applied by the term modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramplan.facts.peft_targets import completed_targets
from vramplan.facts.quantization import bnb_formats
from vramplan.spec.lora_match import gate_before, quantized_expert_loop, reached_leaves
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Peft
from vramplan.units import ceil_div

LINEAR_ROLES = ("linear", "expert", "lm_head")
# Frameworks whose tensor parallelism is transformers' own ``tp_plan`` on DTensor
# (``from_pretrained(tp_plan="auto")``, transformers/distributed/tensor_parallel.py).  Two of its terms
# differ from Megatron's (DeepSpeed, torchtitan keep the Megatron-style vocabulary-parallel loss):
# * the LM head is ``colwise_gather_output``: the logits are all-gathered, so every rank holds the
#   full-vocabulary logits and loss (``_tp_plan = {"lm_head": "colwise_gather_output"}``);
# * the input embedding is ``embedding_rowwise`` (vocabulary-parallel), but DTensor's embedding backward
#   has no strategy that yields a row-sharded weight gradient (torch/distributed/tensor/_ops/
#   _embedding_ops.py ``embedding_dense_backward_strategy``): the gradient comes out replicated, the full
#   ``vocab x hidden`` on every rank, and the optimizer's ops redistribute it to the row shard (a copy,
#   ``Shard._replicate_to_shard``).
HF_TP_FRAMEWORKS = ("hf-trainer", "accelerate", "plain", "lightning")


def gathers_logits(framework: str, tp: int) -> bool:
    """Whether every tensor-parallel rank holds the full-vocabulary logits (transformers' tp_plan)."""
    return tp > 1 and framework in HF_TP_FRAMEWORKS


def replicated_embedding_grad(model: ModelSpec, tp: int, framework: str) -> int:
    """Elements of the vocabulary-parallel input embedding whose gradient every rank holds whole (see
    HF_TP_FRAMEWORKS); 0 where the gradient is sharded.  (Tied embeddings are left as sharded.)"""
    if tp == 1 or framework not in HF_TP_FRAMEWORKS or model.tie_word_embeddings:
        return 0
    return sum(p.total for p in model.params if p.role == "embedding" and p.tp == "vocab")


@dataclass(frozen=True)
class RankParams:
    """Parameter counts held by one GPU of one pipeline stage (before ZeRO/FSDP sharding)."""

    stage: int
    layers: tuple[int, ...]
    total: int  # every base parameter on this rank
    linear: int  # base parameters in decoder linear weights (quantizable); excludes the LM head
    linear_out_features: int  # sum of out_features of those linears (int8 row scales)
    lm_head: int  # untied LM head parameters on this rank (never quantized)
    largest_linear: int  # elements of the largest single linear weight (dequant temporaries)
    decay: int  # parameters in the weight-decay group (all but biases and norms)
    per_layer: tuple[int, ...]  # base parameters of each layer on this rank
    outside_layers: int
    has_embedding: bool
    has_lm_head: bool
    lora: int  # adapter parameters (0 without PEFT)
    lora_per_layer: tuple[int, ...]
    dora_magnitudes: int
    # each quantizable linear group on this rank: (role, in_features, out_features, elements, instances),
    # the features as this rank holds them; formats sized matrix by matrix read it (weights.weights_bytes)
    linear_shapes: tuple[tuple[str, int, int, int, int], ...] = ()
    expert_bias: int = 0  # routed experts' bias elements on this rank (gpt-oss)
    # parameters held but frozen under full fine-tuning (train.freeze_vision_tower), and those of them in the
    # weight-decay group: no gradient, no optimizer state
    frozen: int = 0
    frozen_decay: int = 0
    # a vision tower's and projector's linears stored quantized when the weights are (first stage only), as
    # (in_features, out_features, instances): VisionSpec.quantized_linears (spec/vision_quant.py); their elements
    # are in ``total``, not in ``linear``
    tower_linear_shapes: tuple[tuple[int, int, int], ...] = ()


def expert_split(tp: int, ep: int, expert_tp: int | None) -> int:
    """Ranks one routed expert's intermediate dimension is split over: ``expert_tp`` where an engine sets it
    (vLLM with data parallelism: tp x dp; SGLang's moe_tp_size: tp / ep), else tp without expert parallelism
    and 1 (whole experts) with it."""
    if expert_tp is not None:
        return expert_tp
    return tp if ep == 1 else 1


def split_on_rank(p: ParamGroup, tp: int, ep: int, expert_tp: int | None = None) -> int:
    """Elements of one instance of ``p`` held by one tensor-parallel rank (``expert_tp``: ``expert_split``)."""
    if p.tp in ("column", "row", "vocab"):
        return ceil_div(p.numel, tp)
    if p.tp == "expert":
        # without expert parallelism each expert is split like a dense MLP; with it each rank holds whole ones
        return ceil_div(p.numel, expert_split(tp, ep, expert_tp))
    return p.numel


def local_features(p: ParamGroup, tp: int, ep: int, expert_tp: int | None = None) -> tuple[int, int]:
    """(in, out) features of one instance of the linear ``p`` on one tensor-parallel rank: a column-parallel
    (and vocabulary-parallel) matrix splits its outputs, a row-parallel one its inputs; routed experts split like
    the dense MLP over ``expert_split`` ranks (vLLM ``FusedMoE``: ``w13`` column-, ``w2`` row-parallel)."""
    if p.tp == "expert":
        et = expert_split(tp, ep, expert_tp)
        if p.module != "down_proj":
            return p.in_features, ceil_div(p.out_features, et)
        return ceil_div(p.in_features, et), p.out_features
    if p.tp in ("column", "vocab"):
        return p.in_features, ceil_div(p.out_features, tp)
    if p.tp == "row":
        return ceil_div(p.in_features, tp), p.out_features
    return p.in_features, p.out_features


def count_on_rank(p: ParamGroup, layers: set[int], ep: int) -> int:
    """Instances of ``p`` on this stage (and this expert-parallel rank)."""
    if not p.layer_span:
        return p.count
    per_layer = p.count // len(p.layer_span)
    held = sum(map(layers.__contains__, p.layer_span))
    if p.role == "expert" or p.tp == "expert":
        per_layer = ceil_div(per_layer, ep)
    return per_layer * held


def stage_layers(num_layers: int, pp: int, stage: int, virtual: int = 1, style: str = "loop") -> tuple[int, ...]:
    """Layers of one pipeline rank: an even split over ``pp x virtual`` chunks, the first chunks taking the
    remainder; with ``virtual`` chunks per rank rank ``stage`` holds the chunks ``chunk_stages`` names.

    >>> stage_layers(8, 2, 0), stage_layers(8, 2, 0, 2), stage_layers(8, 2, 1, 2), stage_layers(8, 2, 0, 2, "v")
    ((0, 1, 2, 3), (0, 1, 4, 5), (2, 3, 6, 7), (0, 1, 6, 7))
    """
    return tuple(i for chunk in chunk_layers(num_layers, pp, stage, virtual, style) for i in chunk)


def chunk_stages(pp: int, stage: int, virtual: int = 1, style: str = "loop") -> tuple[int, ...]:
    """The pipeline stages (global chunk indices) rank ``stage`` holds, in local order: style "loop" (torchtitan
    ``stage_ids_this_rank``; torch ``generate_stage_to_rank_mapping(style="loop")``) ``stage, stage + pp, ...``;
    style "v" (``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``: 2 chunks per rank) ``stage`` and
    ``2 pp - 1 - stage`` (``generate_stage_to_rank_mapping(style="v")`` walks the ranks 0 .. pp - 1, then back).

    >>> chunk_stages(4, 0, 2), chunk_stages(4, 0, 2, "v"), chunk_stages(4, 3, 2, "v")
    ((0, 4), (0, 7), (3, 4))
    """
    if style == "v":
        if virtual != 2:
            raise ValueError(f"a V layout holds 2 chunks per rank, not {virtual}")
        return stage, 2 * pp - 1 - stage
    return tuple(range(stage, pp * virtual, pp))


def head_stage(pp: int, style: str = "loop") -> int:
    """The rank holding the last pipeline stage (the final norm, the LM head and the loss): pp - 1, or 0 in a V."""
    return 0 if style == "v" else pp - 1


def chunk_layers(num_layers: int, pp: int, stage: int, virtual: int = 1,
                 style: str = "loop") -> tuple[tuple[int, ...], ...]:
    """The layers of each of rank ``stage``'s ``virtual`` model chunks, in local order (``chunk_stages``).

    32 layers, pp 4, V (8 chunks of 4): rank 0 chunks 0 and 7, layers 0-3 and 28-31; rank 3 chunks 3 and 4,
    layers 12-15 and 16-19.

    >>> chunk_layers(12, 4, 0, 2), chunk_layers(12, 4, 3, 2), chunk_layers(12, 4, 0, 2, "v")
    (((0, 1), (8,)), ((6, 7), (11,)), ((0, 1), (11,)))
    """
    chunks = pp * virtual
    base, extra = divmod(num_layers, chunks)
    out: list[tuple[int, ...]] = []
    for chunk in chunk_stages(pp, stage, virtual, style):
        start = chunk * base + min(chunk, extra)
        out.append(tuple(range(start, start + base + (1 if chunk < extra else 0))))
    return tuple(out)


# On transformers 5 the routed experts are 3-D parameters and the router a module holding a weight: peft converts
# the 4.x names (``gate_proj``, ``up_proj``, ``down_proj``, ``gate``; Mixtral's ``w1``/``w3``/``w2``, which scenarios
# may spell as the former: the trait ``expert_module_aliases``) into ``target_parameters`` only for the model types of
# ``facts/peft_targets.py`` ``moe_pattern``; elsewhere those names adapt no expert (peft 0.21.2 with transformers 5.24,
# checked in tests/test_moe_lora_targets.py).
_MLP_NAMES = frozenset({"gate_proj", "up_proj", "down_proj"})


@dataclass(frozen=True)
class LoraTargets:
    """Where the adapters go.  ``linear``: modules whose ``nn.Linear`` gets a ``lora.Linear``.  The ranks are
    those of peft's ``ParamWrapper`` on transformers 5's fused MoE parameters (0: not adapted).

    peft's conversion (``_convert_peft_config_moe``) moves every name of its mapping (``gate_proj``,
    ``up_proj``, ``down_proj``, ``gate``; Mixtral's ``w1``/``w3``/``w2``, which scenarios spell as the
    former) from ``target_modules`` to ``target_parameters``.  So on a model with dense or shared-expert
    MLPs (DeepSeek, Qwen2-MoE) those MLPs' linears lose their adapters, and the fused ``gate_up_proj``
    gets one adapter of rank ``r`` x (number of the gate/up names targeted), with alpha scaled alike
    (``rank_pattern``/``alpha_pattern``), where 4.x had two of rank ``r``.
    """

    linear: frozenset[str] = frozenset()
    gate_up_rank: int = 0
    down_rank: int = 0
    router_rank: int = 0
    # the routed experts are per-expert ``nn.Linear`` modules that ``linear`` names adapt (transformers 4.x, or
    # bitsandbytes' per-expert 4-bit linears); False: transformers 5's fused parameters, which no module name reaches
    expert_linears: bool = True

    @property
    def experts_wrapped(self) -> bool:
        return bool(self.gate_up_rank or self.down_rank)


BNB_FORMATS = bnb_formats()  # the bitsandbytes rows of facts/quantization.py
BNB_4BIT_FORMATS = bnb_formats(bits=4)  # bitsandbytes Linear4bit: nf4, nf4-dq, fp4


def lora_targets(peft: Peft | None, model: ModelSpec, fused_experts: bool = True,
                 quant: str = "none") -> LoraTargets:
    """Resolve PEFT's ``target_modules`` on ``model``.

    ``all-linear`` is every ``nn.Linear`` but the LM head (peft ``_maybe_include_all_linear_layers``): the
    experts and the router of 4.x MoE models were linears, transformers 5's fused experts and most of its routers
    are not.  ``fused_experts``: transformers >= 5 (``software.transformers``), where peft converts the expert and
    router names into ``target_parameters`` for the model types of ``moe_pattern`` and nowhere else.  With a
    bitsandbytes ``quant`` the experts are per-expert 4-bit linears (``quantized_expert_loop``), adapted per
    expert as in 4.x; the router is transformers 5's module either way.  A dotted target (``self_attn.q_proj``)
    is matched by its last name (spec/lora_match.py ``partial_lora_targets`` states where that adapts more modules than
    peft would).
    """
    if peft is None:
        return LoraTargets()
    targets = completed_targets(peft.target_modules, model.peft_default_targets)
    fused = fused_experts and model.moe is not None
    pattern = model.peft_moe_pattern if fused else None
    per_expert = not fused or quantized_expert_loop(model, quant)  # the experts are nn.Linear modules
    if targets == "all-linear":
        names = _all_linear(model, fused, per_expert)
    else:
        names = reached_leaves(targets if isinstance(targets, list) else [targets], model, fused and not per_expert)
    if not fused:
        return LoraTargets(linear=frozenset(names))
    # a converted router: peft's ParamWrapper on its weight (the 4-bit per-expert layout keeps that entry too)
    router_rank = peft.rank if pattern is not None and pattern.router in names and any(
        p.role == "router" and p.module == pattern.router for p in model.params) else 0
    if per_expert:
        return LoraTargets(linear=frozenset(names - {"gate"}), router_rank=router_rank)
    if pattern is None:
        return LoraTargets(linear=frozenset(names), expert_linears=False)
    gate_up = len({"gate_proj", "up_proj"} & names)
    return LoraTargets(linear=frozenset(names - _MLP_NAMES - {pattern.router}), gate_up_rank=peft.rank * gate_up,
                       down_rank=peft.rank if "down_proj" in names else 0, router_rank=router_rank,
                       expert_linears=False)


def _all_linear(model: ModelSpec, fused: bool, per_expert: bool) -> set[str]:
    """The module names ``all-linear`` reaches (peft ``_maybe_include_all_linear_layers``: every ``nn.Linear`` but
    the LM head), with the names peft's conversion adds (``_resolve_string_target_modules``: the mapping's keys)."""
    names = {p.module for p in model.params if p.role == "linear"}
    if per_expert and model.traits.experts_are_linears:
        names |= {p.module for p in model.params if p.role == "expert"}
    # 4.x: the router was an nn.Linear where the experts were (gpt-oss's never was)
    names |= {p.module for p in model.params if p.role == "router" and (
        not model.router_kind(p.module) if fused else model.traits.experts_are_linears)}
    pattern = model.peft_moe_pattern if fused else None
    if pattern is not None:
        names |= _MLP_NAMES | {pattern.router}
    return names


def _on_stage(p: ParamGroup, first: bool, last: bool) -> bool:
    """Whether a tensor outside the decoder layers lives on this pipeline stage: the embeddings on the first,
    the LM head and the final norm on the last, anything else everywhere."""
    if p.layer_span:
        return True
    if p.role in ("embedding", "position"):
        return first
    if p.role == "lm_head":
        return last
    final_norm = p.name == "norm.weight" or p.module in ("ln_f", "final_layer_norm", "norm", "final_layernorm")
    return last or not final_norm


def _adapter_rank(p: ParamGroup, peft: Peft, lt: LoraTargets, tp: int) -> tuple[int, int, int]:
    """(rank, fan_in, fan_out) of the adapter on one instance of ``p`` on this rank (rank 0: none)."""
    fan_in = ceil_div(p.in_features, tp) if p.tp == "row" else p.in_features
    fan_out = ceil_div(p.out_features, tp) if p.tp == "column" else p.out_features
    if p.role == "expert" and lt.experts_wrapped:
        # peft ParamWrapper (tuners/lora/layer.py update_layer): lora_A [rank x E, in], lora_B [out, rank x E],
        # i.e. rank x (in + out) per expert; the fused gate_up_proj's out is 2I, counted at the gate group
        if p.module == "gate_proj":
            return lt.gate_up_rank, fan_in, 2 * fan_out
        if p.module == "gate_up_proj":  # a spec that names the fused parameter itself (out: 2I)
            return lt.gate_up_rank, fan_in, fan_out
        return (lt.down_rank if p.module == "down_proj" else 0), fan_in, fan_out
    if p.role == "router" and lt.router_rank:
        return lt.router_rank, fan_in, fan_out  # ParamWrapper on the router weight [E, h]: one 2-D adapter
    if p.module in lt.linear and (p.role in ("linear", "router") or (p.role == "expert" and lt.expert_linears)):
        return peft.rank, fan_in, fan_out
    return 0, fan_in, fan_out


@dataclass
class _Tally:
    """Running sums of ``rank_params``."""

    layers: tuple[int, ...]
    total: int = 0
    linear: int = 0
    outs: int = 0
    largest: int = 0
    decay: int = 0
    outside: int = 0
    lora: int = 0
    dora: int = 0
    frozen: int = 0
    frozen_decay: int = 0
    head: int = 0
    expert_bias: int = 0
    shapes: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    per_layer: dict[int, int] = field(default_factory=dict)
    lora_layer: dict[int, int] = field(default_factory=dict)
    # ``layers`` as a set: ``spread`` asks, for every layer of every group, whether this stage holds it
    held: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.held = frozenset(self.layers)

    def spread(self, into: dict[int, int], p: ParamGroup, size: int) -> None:
        """``size`` shared evenly by the layers of ``p`` on this stage."""
        on = list(filter(self.held.__contains__, p.layer_span))
        share = size // max(1, len(on))
        for i in on:
            into[i] = into.get(i, 0) + share

    def base(self, p: ParamGroup, each: int, n_inst: int, tp: int, ep: int = 1, expert_tp: int | None = None) -> None:
        size = each * n_inst
        self.total += size
        if p.decays:
            self.decay += size
        if p.role == "lm_head":
            self.head += size
        elif p.role in LINEAR_ROLES and p.in_features:
            self.linear += size
            self.outs += (ceil_div(p.out_features, tp) if p.tp in ("column", "vocab") else p.out_features) * n_inst
            self.largest = max(self.largest, each)
            self.shapes.append((p.role, *local_features(p, tp, ep, expert_tp), each, n_inst))
        elif p.role == "bias" and p.tp == "expert":
            self.expert_bias += size
        if p.layer_span:
            self.spread(self.per_layer, p, size)
        else:
            self.outside += size


def rank_params(model: ModelSpec, tp: int, pp: int, ep: int, stage: int, peft: Peft | None,
                lt: LoraTargets | None = None, frozen: tuple[str, ...] = (), virtual: int = 1,
                layers: tuple[int, ...] | None = None, expert_tp: int | None = None,
                style: str = "loop") -> RankParams:
    """``expert_tp``: the ranks a routed expert's intermediate dimension is split over (``expert_split``; None:
    tp without expert parallelism, 1 with it); ``lt``: the resolved adapter targets (default: ``lora_targets(peft, model)``); ``frozen``: name prefixes
    of parameters that full fine-tuning leaves frozen (``RankParams.frozen``); ``virtual``: model chunks per rank
    (``stage_layers``; the embedding is in chunk 0 on rank 0, the head in the last chunk, on rank pp - 1, or on
    rank 0 under ``style`` "v": ``head_stage``);
    ``layers``: the stage's layers where an engine splits them its own way (vLLM's ``get_pp_indices``), else
    ``stage_layers``."""
    if layers is None:
        layers = stage_layers(model.num_layers, pp, stage, virtual, style)
    lset = set(layers)
    first, last = stage == 0, stage == head_stage(pp, style)
    if lt is None:
        lt = lora_targets(peft, model)
    t = _Tally(layers)
    # a vision tower and its projector run before the first decoder layer: on the first stage, as the embeddings
    vision = model.vision.param_prefixes if model.vision is not None else None
    for p in model.params:
        if not _on_stage(p, first, last) or (vision and not first and p.name.startswith(vision)):
            continue
        n_inst = count_on_rank(p, lset, ep)
        if n_inst == 0:
            continue
        t.base(p, split_on_rank(p, tp, ep, expert_tp), n_inst, tp, ep, expert_tp)
        if frozen and p.name.startswith(frozen):
            size = split_on_rank(p, tp, ep, expert_tp) * n_inst
            t.frozen += size
            t.frozen_decay += size if p.decays else 0
        if peft is None or not p.in_features:
            continue
        rank, fan_in, fan_out = _adapter_rank(p, peft, lt, tp)
        if rank:
            # LoRA: A is r x in, B is out x r (arXiv 2106.09685 section 4.1); DoRA adds a magnitude per output row.
            adapter = rank * (fan_in + fan_out) * n_inst
            t.lora += adapter
            if peft.method == "dora":
                t.dora += fan_out * n_inst
            t.spread(t.lora_layer, p, adapter)
    return RankParams(
        stage=stage, layers=layers, total=t.total, linear=t.linear, linear_out_features=t.outs, lm_head=t.head,
        largest_linear=t.largest, decay=t.decay, per_layer=tuple(t.per_layer.get(i, 0) for i in layers),
        outside_layers=t.outside, has_embedding=first, has_lm_head=last, lora=t.lora + t.dora,
        lora_per_layer=tuple(t.lora_layer.get(i, 0) for i in layers), dora_magnitudes=t.dora,
        linear_shapes=tuple(t.shapes), expert_bias=t.expert_bias, frozen=t.frozen, frozen_decay=t.frozen_decay,
        tower_linear_shapes=tuple((i, o, n) for _, i, o, n in model.vision.quantized_linears if n)
        if first and model.vision is not None else (),
    )


def rank_tensors(m: ModelSpec, rp: RankParams, tp: int,
                 fused_experts: bool = False) -> tuple[list[tuple[int, bool]], list[int]]:
    """This rank's parameter tensors: (elements, is a linear) of one layer's (experts: each expert a
    tensor, or with ``fused_experts`` each projection one tensor of the layer's experts, as transformers 5 holds
    them: ``[E, 2I, h]``, ``[E, h, I]``), and the elements of each tensor outside the layers.  A group that spans
    only some layers (a hybrid's mixers, a MoE every other layer) is counted in every layer's list here;
    ``rank_layer_tensors`` gives each layer its own."""
    lset = set(rp.layers)
    inner: list[tuple[int, bool]] = []
    outside: list[int] = []
    for p in m.params:
        n = count_on_rank(p, lset, 1)
        if n == 0:
            continue
        each = split_on_rank(p, tp, 1)
        if p.layer_span:
            per = n // max(1, sum(map(lset.__contains__, p.layer_span)))
            is_lin = p.role in ("linear", "expert") and bool(p.in_features)
            inner += [(each * per, is_lin)] if fused_experts and p.role == "expert" else [(each, is_lin)] * per
        else:
            # a group outside the layers with several instances (a vision tower's encoder layers) is that many
            # tensors; every other such group is one
            outside.extend([each] * n)
    return inner, outside


def rank_layer_tensors(m: ModelSpec, rp: RankParams, tp: int, fused_experts: bool = False) -> tuple[tuple[int, ...], ...]:
    """Each of this rank's layers' parameter tensors (elements), in ``rp.layers`` order: only the groups whose
    ``layer_span`` holds the layer (a Nemotron-H Mamba layer its mixer, a MoE layer its router and experts), the
    experts as ``rank_tensors`` holds them, transformers 5's ``gate_up_proj`` one tensor."""
    return tuple(tuple(n for n, _ in layer) for layer in rank_layer_pairs(m, rp, tp, fused_experts))


def rank_layer_pairs(m: ModelSpec, rp: RankParams, tp: int,
                     fused_experts: bool = False) -> tuple[tuple[tuple[int, bool], ...], ...]:
    """``rank_layer_tensors`` with each tensor's (elements, is a quantizable linear: ``rank_tensors``' flag)."""
    lset = set(rp.layers)
    out: dict[int, list[tuple[int, bool]]] = {j: [] for j in rp.layers}
    for p in m.params:
        if not p.layer_span:
            continue
        held = [j for j in p.layer_span if j in lset]
        if not held:
            continue
        each, per = split_on_rank(p, tp, 1), count_on_rank(p, lset, 1) // len(held)
        is_lin = p.role in ("linear", "expert") and bool(p.in_features)
        fused = fused_experts and p.role == "expert"
        joins = fused and p.module == "up_proj" and gate_before(m.params, p)  # gate_up_proj [E, 2I, h]: one tensor
        for j in held:
            if joins and out[j]:
                out[j][-1] = (out[j][-1][0] + each * per, is_lin)
            else:
                out[j] += [(each * per, is_lin)] if fused else [(each, is_lin)] * per
    return tuple(tuple(out[j]) for j in rp.layers)
